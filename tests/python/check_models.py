"""Check every model of tests/models against a running tritonserver (explicit model control).

    scripts/triton.sh start 1 18000
    .venv/bin/python tests/python/check_models.py 127.0.0.1:18000

Loads each model, runs one inference with known results, and unloads it again;
failing_model must fail to load and error_model must answer "injected failure".
Exits non-zero on the first mismatch.
"""
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

URL = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:18000"
client = httpclient.InferenceServerClient(URL)


def infer(model, inputs, params=None):
    tensors = []
    for name, arr in inputs.items():
        t = httpclient.InferInput(name, list(arr.shape), "BYTES" if arr.dtype == object else
                                  {np.float32: "FP32", np.int32: "INT32"}[arr.dtype.type])
        t.set_data_from_numpy(arr, binary_data=True)
        tensors.append(t)
    return client.infer(model, tensors, parameters=params)


def check(model, fn):
    client.load_model(model)
    assert client.is_model_ready(model), model
    fn()
    client.unload_model(model)
    print(f"ok {model}")


a = np.array([1, 2, 3, 4], dtype=np.float32)
b = np.array([10, 20, 30, 40], dtype=np.float32)


def add_sub():
    r = infer("add_sub", {"INPUT0": a, "INPUT1": b})
    assert np.array_equal(r.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(r.as_numpy("OUTPUT1"), a - b)


def add_sub_int():
    ai, bi = a.astype(np.int32), b.astype(np.int32)
    r = infer("add_sub_int", {"INPUT0": ai, "INPUT1": bi})
    assert r.as_numpy("OUTPUT0").dtype == np.int32
    assert np.array_equal(r.as_numpy("OUTPUT0"), ai + bi)
    assert np.array_equal(r.as_numpy("OUTPUT1"), ai - bi)


def string_echo():
    s = np.array([b"hello", b"", b"\x00\xffbin", "héllo".encode()], dtype=object)
    r = infer("string_echo", {"INPUT0": s})
    assert list(r.as_numpy("OUTPUT0")) == list(s), r.as_numpy("OUTPUT0")


def batched_double():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    r = infer("batched_double", {"INPUT0": x})
    assert np.array_equal(r.as_numpy("OUTPUT0"), 2 * x)


def optional_input():
    assert np.array_equal(infer("optional_input", {"INPUT0": a}).as_numpy("OUTPUT0"), a)
    r = infer("optional_input", {"INPUT0": a, "INPUT1": b})
    assert np.array_equal(r.as_numpy("OUTPUT0"), a + b)


def error_model():
    try:
        infer("error_model", {"INPUT0": a})
    except InferenceServerException as e:
        assert "injected failure" in str(e), e
        return
    raise AssertionError("error_model did not fail")


def slow_model():
    for params, lo, hi in [(None, 0.2, 1.0), ({"delay_ms": 50}, 0.05, 0.19), ({"delay_ms": 600}, 0.6, 1.5)]:
        t = time.monotonic()
        r = infer("slow_model", {"INPUT0": a}, params)
        dt = time.monotonic() - t
        assert lo <= dt <= hi, (params, dt)
        assert np.array_equal(r.as_numpy("OUTPUT0"), a)


def identity(model):
    def run():
        assert np.array_equal(infer(model, {"INPUT0": a}).as_numpy("OUTPUT0"), a), model

    return run


for name, fn in [("add_sub", add_sub), ("add_sub_int", add_sub_int), ("string_echo", string_echo),
                 ("batched_double", batched_double), ("optional_input", optional_input),
                 ("error_model", error_model), ("slow_model", slow_model),
                 ("sized_a", identity("sized_a")), ("sized_b", identity("sized_b")),
                 ("sized_c", identity("sized_c")),
                 ("slow_load", identity("slow_load"))]:
    check(name, fn)

try:
    client.load_model("failing_model")
    raise AssertionError("failing_model loaded")
except InferenceServerException as e:
    assert "initialize always fails" in str(e), e
    print(f"ok failing_model (load refused: {str(e)[:120]}...)")
print("all models ok")
