"""What the official health and metadata examples check, against the gateway (or a Triton).

    .venv/bin/python tests/python/server_identity.py GRPC_HOST:PORT HTTP_HOST:PORT NAME

Liveness, readiness, and server metadata naming NAME ("triton" unless `server.name` says
otherwise), on gRPC and HTTP. Exits non-zero on the first failure.
"""
import sys

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

GRPC_URL, HTTP_URL, NAME = sys.argv[1:4]

grpc = grpcclient.InferenceServerClient(GRPC_URL)
assert grpc.is_server_live() and grpc.is_server_ready()
metadata = grpc.get_server_metadata()
assert metadata.name == NAME, metadata
assert metadata.version, metadata
print("ok grpc", metadata.name, metadata.version, list(metadata.extensions))

http = httpclient.InferenceServerClient(HTTP_URL)
assert http.is_server_live() and http.is_server_ready()
metadata = http.get_server_metadata()
assert metadata["name"] == NAME, metadata
assert metadata["version"], metadata
print("ok http", metadata["name"], metadata["version"], metadata["extensions"])
