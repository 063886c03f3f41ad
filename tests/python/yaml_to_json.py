"""Prints the YAML documents of the files given (or of standard input, with `-`) as one JSON
array, for tests in Rust that read YAML (compose, Kubernetes, Prometheus files)."""

import json
import sys

import yaml

documents = []
for path in sys.argv[1:]:
    with open(0 if path == "-" else path) as f:
        documents.extend(d for d in yaml.safe_load_all(f) if d is not None)
json.dump(documents, sys.stdout)
