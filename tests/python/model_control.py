"""Model control as the official client examples do it, against one server (Triton or the
gateway): load, a load with a malformed override, a load with a config override, the
overridden config in use, unload, what a model that is not loaded answers, a model that
does not exist, model files in the load request, a plain load back to the repository config.

    python model_control.py http|grpc URL MODEL

Prints a JSON list of [step, outcome] pairs; tests/model_control.rs runs it against real
Triton and through the gateway and compares the two. An outcome is a value, or
["error", status, message]; where the gateway answers differently on purpose
(docs/drop-in.md), only what both must share is recorded.
"""
import json
import sys

import numpy as np
from tritonclient.utils import InferenceServerException

protocol, url, model = sys.argv[1:4]
if protocol == "http":
    import tritonclient.http as client_lib
else:
    import tritonclient.grpc as client_lib

client = client_lib.InferenceServerClient(url)
steps = []


def record(step, call, shared=None):
    """Runs `call`; records its value, or its error (`shared` picks what is compared)."""
    try:
        steps.append([step, call()])
    except InferenceServerException as e:
        outcome = ["error", e.status(), e.message()]
        steps.append([step, shared(outcome) if shared else outcome])


def config_value(key):
    config = client.get_model_config(model)
    if protocol == "http":
        return config[key]
    return getattr(config.config, key)


def infer(batch):
    data = np.ones((batch, 4), dtype=np.float32)
    tensor = client_lib.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor])
    return result.as_numpy("OUTPUT0").tolist()


def failed_to_load(outcome):
    return ["error", "failed to load" in outcome[2]]


def error_class(outcome):
    status = outcome[1] or ""
    # HTTP: the status code; gRPC: the code's name. 5xx and INTERNAL are one class here.
    server_side = status.startswith("5") or status == "StatusCode.INTERNAL"
    return ["error", "server" if server_side else status, "failed to load" in outcome[2]]


override = json.dumps(
    {
        "name": model,
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": [{"kind": "KIND_CPU"}],
    }
)

record("ready before any load", lambda: client.is_model_ready(model))
record("load", lambda: client.load_model(model))
record("ready", lambda: client.is_model_ready(model))
record("max_batch_size", lambda: config_value("max_batch_size"))
# The examples' malformed override: Triton answers 500, the gateway 400; both "failed to load".
record(
    "malformed override",
    lambda: client.load_model(model, config='"parameters": {"config": {{"max_batch_size": "16"}}}'),
    failed_to_load,
)
record("ready after the malformed override", lambda: client.is_model_ready(model))
record("load with an override", lambda: client.load_model(model, config=override))
record("max_batch_size with the override", lambda: config_value("max_batch_size"))
record("batch of 4 with the override", lambda: len(infer(4)))
record("batch of 6 with the override", lambda: len(infer(6)))
record("unload", lambda: client.unload_model(model))
record("ready after unload", lambda: client.is_model_ready(model))
record("metadata after unload", lambda: client.get_model_metadata(model) and "answered")
record("config after unload", lambda: config_value("max_batch_size"))
record("statistics after unload", lambda: client.get_inference_statistics(model) and "answered")
record("infer after unload", lambda: infer(1))
record("ready after that infer", lambda: client.is_model_ready(model))
record("load a model that does not exist", lambda: client.load_model("wrong_model_name"), error_class)
# Model files in the request: refused by the gateway (each copy loads from its repository).
record(
    "load with model files",
    lambda: client.load_model(model, config="{}", files={"file:1/model.py": b"pass"}),
    lambda outcome: ["error"],
)
record("plain load", lambda: client.load_model(model))
record("max_batch_size after the plain load", lambda: config_value("max_batch_size"))
record("batch of 6 after the plain load", lambda: len(infer(6)))
record("unload at the end", lambda: client.unload_model(model))
print(json.dumps(steps))
