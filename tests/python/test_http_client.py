"""KServe v2 HTTP conformance checks with the official tritonclient.http client.

Runs against any server speaking the KServe v2 / Triton HTTP protocol: a plain tritonserver
or the infergate gateway, with tests/models as its repository in explicit model-control
mode. The suite loads add_sub, string_echo and batched_double itself, through the repository
API, as a user of explicit mode does.

    scripts/triton.sh start 1 18000
    INFERGATE_URL=127.0.0.1:18000 .venv/bin/python -m pytest -q tests/python/test_http_client.py

INFERGATE_URL is host:port without a scheme. Without it every test is skipped. With
INFERGATE_CA (a PEM CA bundle) the client speaks https and verifies the server against it.
"""
import os

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

URL = os.environ.get("INFERGATE_URL")
CA = os.environ.get("INFERGATE_CA")
LOADED = ["add_sub", "string_echo", "batched_double"]

pytestmark = pytest.mark.skipif(not URL, reason="set INFERGATE_URL=host:port of the server under test")


@pytest.fixture(scope="module")
def client():
    tls = {"ssl": True, "ssl_options": {"ca_certs": CA}} if CA else {}
    c = httpclient.InferenceServerClient(URL, connection_timeout=10.0, network_timeout=30.0, **tls)
    for model in LOADED:
        c.load_model(model)
    yield c
    c.close()


def add_sub_inputs(a, b, binary):
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


A = np.array([1.5, 2.0, -3.0, 4.25], dtype=np.float32)
B = np.array([10.0, 0.5, 3.0, -4.0], dtype=np.float32)


def test_server_live_ready(client):
    assert client.is_server_live()
    assert client.is_server_ready()


def test_server_metadata(client):
    md = client.get_server_metadata()
    # What the official health and metadata example checks; the gateway reports its
    # backends' name.
    assert md["name"] == "triton"
    assert md["version"]
    assert isinstance(md.get("extensions", []), list)


@pytest.mark.parametrize("model", LOADED)
def test_model_ready(client, model):
    assert client.is_model_ready(model)


def test_model_metadata(client):
    md = client.get_model_metadata("add_sub")
    assert md["name"] == "add_sub"
    assert "1" in md["versions"]
    assert [(i["name"], i["datatype"], i["shape"]) for i in md["inputs"]] == [
        ("INPUT0", "FP32", [4]),
        ("INPUT1", "FP32", [4]),
    ]
    assert [(o["name"], o["datatype"], o["shape"]) for o in md["outputs"]] == [
        ("OUTPUT0", "FP32", [4]),
        ("OUTPUT1", "FP32", [4]),
    ]
    md = client.get_model_metadata("add_sub", model_version="1")
    assert md["name"] == "add_sub"


def test_model_config(client):
    cfg = client.get_model_config("add_sub")
    assert cfg["name"] == "add_sub"
    assert cfg["backend"] == "python"
    assert cfg["max_batch_size"] == 0
    assert [i["name"] for i in cfg["input"]] == ["INPUT0", "INPUT1"]
    assert client.get_model_config("batched_double")["max_batch_size"] == 8


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_add_sub(client, binary):
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    res = client.infer("add_sub", add_sub_inputs(A, B, binary), outputs=outputs, request_id="req-1")
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), A - B)
    assert res.as_numpy("OUTPUT0").dtype == np.float32
    resp = res.get_response()
    assert resp["model_name"] == "add_sub"
    assert resp["id"] == "req-1"
    if binary:
        assert all("binary_data_size" in o.get("parameters", {}) for o in resp["outputs"])
    else:
        assert all("data" in o for o in resp["outputs"])


def test_infer_add_sub_default_outputs(client):
    # No outputs requested: the server returns all outputs (JSON with this client).
    res = client.infer("add_sub", add_sub_inputs(A, B, binary=True))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), A - B)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_string_echo(client, binary):
    data = np.array([b"hello", b"world", b"", "gr\u00fc\u00df".encode()], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [len(data)], "BYTES")
    inp.set_data_from_numpy(data, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    res = client.infer("string_echo", [inp], outputs=[out])
    got = res.as_numpy("OUTPUT0")
    assert got.shape == (4,)
    assert [x if isinstance(x, bytes) else x.encode() for x in got] == list(data)


def test_infer_batched_double(client):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    inp = httpclient.InferInput("INPUT0", [3, 4], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    res = client.infer("batched_double", [inp])
    out = res.as_numpy("OUTPUT0")
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(out, 2 * x)


def test_repository_index(client):
    index = client.get_model_repository_index()
    ready = {m["name"] for m in index if m.get("state") == "READY"}
    for model in LOADED:
        assert model in ready, index


def test_unknown_model(client):
    assert not client.is_model_ready("no_such_model")
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("no_such_model")
    with pytest.raises(InferenceServerException) as err:
        client.infer("no_such_model", add_sub_inputs(A, B, binary=False))
    assert "no_such_model" in str(err.value)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_wrong_shape(client, binary):
    short = np.array([1, 2, 3], dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [3], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(short, binary_data=binary)
    inputs[1].set_data_from_numpy(B, binary_data=binary)
    with pytest.raises(InferenceServerException) as err:
        client.infer("add_sub", inputs)
    assert "shape" in str(err.value)
    assert err.value.status() == "400"
