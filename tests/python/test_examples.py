"""What the official Triton client examples do and check, in their own order, from a cold start.

Each test does what one example of triton-inference-server/client (src/python/examples) does,
on models with the names and signatures it expects (tests/example_models), with the same
calls IN THE SAME ORDER and the same checks. Most examples ask for model metadata, config or
readiness before their first inference, so a server that passes these runs the examples
unchanged, including their first call to a model nothing has loaded yet.

    EXAMPLES_HTTP=host:port EXAMPLES_GRPC=host:port [EXAMPLES_ADMIN=http://host:port] \\
        .venv/bin/python -m pytest tests/python/test_examples.py

Against a plain tritonserver started as the examples' READMEs start it, which proves the
tests: with its default flags (every model of the repository loaded at start) for all but
the model-control tests (`-k "not model_control"`), and in explicit model control, started
empty, for those (`-k model_control`: the mode they document). Through infergate, set
EXAMPLES_ADMIN to the gateway's admin API: before each test the models it uses are unloaded there
(`POST /admin/models/M/unload`, after which a request loads them again), so every test meets
its models cold, as a user running that example first would. The suite itself never loads a
model, except where the model-control examples do. Without EXAMPLES_HTTP and EXAMPLES_GRPC
every test is skipped.

Examples not covered: the shared-memory ones (simple_*_shm_*, *_cudashm_*,
reuse_infer_objects_client.py), which need the server to map the client's memory, and
vllm_client.py, which needs a vLLM model.
"""
import asyncio
import io
import os
import queue
import threading
import time
import urllib.request
import uuid
from functools import partial

import grpc as grpclib
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.grpc.model_config_pb2 as mc
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from PIL import Image
from tritonclient import utils
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

HTTP = os.environ.get("EXAMPLES_HTTP")
GRPC = os.environ.get("EXAMPLES_GRPC")
ADMIN = os.environ.get("EXAMPLES_ADMIN")
REPOSITORY = os.path.join(os.path.dirname(__file__), "..", "example_models")
# What loads with each model (an ensemble loads its composing models).
COMPOSING = {"preprocess_inception_ensemble": ["image_preprocess_inception", "inception_graphdef"]}

pytestmark = pytest.mark.skipif(not (HTTP and GRPC), reason="set EXAMPLES_HTTP and EXAMPLES_GRPC")


def uses(*models):
    """The models a test's example calls: cold at its start when EXAMPLES_ADMIN is set."""
    def mark(test):
        test.models = models
        return test
    return mark


@pytest.fixture(autouse=True)
def cold(request):
    if ADMIN:
        for model in getattr(request.function, "models", ()):
            for name in [model] + COMPOSING.get(model, []):
                call = urllib.request.Request(f"{ADMIN}/admin/models/{name}/unload", method="POST", data=b"")
                try:
                    urllib.request.urlopen(call, timeout=60).close()
                except urllib.error.HTTPError as e:  # not loaded anywhere: already cold
                    assert e.code < 500, f"admin unload of {name}: {e.code} {e.read()!r}"
    yield


def http_client(**kwargs):
    return httpclient.InferenceServerClient(HTTP, **kwargs)


def grpc_client(**kwargs):
    return grpcclient.InferenceServerClient(GRPC, **kwargs)


def grpc_stub():
    return service_pb2_grpc.GRPCInferenceServiceStub(grpclib.insecure_channel(GRPC))


# The two tensors every `simple` example sends: 0..15 and all ones (or all minus ones).
INPUT0 = np.expand_dims(np.arange(16, dtype=np.int32), axis=0)
ONES = np.ones((1, 16), dtype=np.int32)
MINUS_ONES = np.full((1, 16), -1, dtype=np.int32)


def assert_sum_and_difference(result, a, b):
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)


def simple_inputs(module, b=ONES, binary=None):
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    if binary is None:
        inputs[0].set_data_from_numpy(INPUT0)
        inputs[1].set_data_from_numpy(b)
    else:
        inputs[0].set_data_from_numpy(INPUT0, binary_data=binary[0])
        inputs[1].set_data_from_numpy(b, binary_data=binary[1])
    return inputs


# --- simple_{http,grpc}[_aio]_health_metadata.py: readiness and metadata BEFORE any inference ---

@uses("simple")
def test_http_health_metadata():
    client = http_client()
    assert client.is_server_live(query_params={"test_1": 1, "test_2": 2})
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.get_server_metadata()["name"] == "triton"
    assert client.get_model_metadata("simple", query_params={"test_1": 1, "test_2": 2})["name"] == "simple"
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_metadata("wrong_model_name")
    assert "Request for unknown model" in refused.value.message()
    client.close()


@uses("simple")
def test_http_aio_health_metadata():
    async def example():
        client = httpaio.InferenceServerClient(HTTP)
        assert await client.is_server_live(query_params={"test_1": 1, "test_2": 2})
        assert await client.is_server_ready()
        assert await client.is_model_ready("simple")
        assert (await client.get_server_metadata())["name"] == "triton"
        metadata = await client.get_model_metadata("simple", query_params={"test_1": 1, "test_2": 2})
        assert metadata["name"] == "simple"
        with pytest.raises(InferenceServerException) as refused:
            await client.get_model_metadata("wrong_model_name")
        assert "Request for unknown model" in refused.value.message()
        await client.close()
    asyncio.run(example())


@uses("simple")
def test_grpc_health_metadata():
    client = grpc_client()
    assert client.is_server_live(headers={"test": "1", "dummy": "2"})
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.get_server_metadata().name == "triton"
    assert client.get_model_metadata("simple", headers={"test": "1", "dummy": "2"}).name == "simple"
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_metadata("wrong_model_name")
    assert "Request for unknown model" in refused.value.message()
    assert client.get_model_config("simple").config.name == "simple"
    client.close()


@uses("simple")
def test_grpc_aio_health_metadata():
    async def example():
        client = grpcaio.InferenceServerClient(GRPC)
        assert await client.is_server_live(headers={"test": "1", "dummy": "2"})
        assert await client.is_server_ready()
        assert await client.is_model_ready("simple")
        assert (await client.get_server_metadata()).name == "triton"
        assert (await client.get_model_metadata("simple", headers={"test": "1", "dummy": "2"})).name == "simple"
        with pytest.raises(InferenceServerException) as refused:
            await client.get_model_metadata("wrong_model_name")
        assert "Request for unknown model" in refused.value.message()
        assert (await client.get_model_config("simple")).config.name == "simple"
        await client.close()
    asyncio.run(example())


# --- simple_http_infer_client.py, simple_http_aio_infer_client.py, simple_http_async_infer_client.py ---

def http_requested_outputs(module):
    return [module.InferRequestedOutput("OUTPUT0", binary_data=True),
            module.InferRequestedOutput("OUTPUT1", binary_data=False)]


@uses("simple")
@pytest.mark.parametrize("compression", [(None, None), ("gzip", "deflate"), ("deflate", "gzip")])
def test_http_infer(compression):
    client = http_client()
    request_compression, response_compression = compression

    def infer(model, outputs, headers=None):
        return client.infer(model, simple_inputs(httpclient, MINUS_ONES, (False, True)), outputs=outputs,
                            query_params={"test_1": 1, "test_2": 2}, headers=headers,
                            request_compression_algorithm=request_compression,
                            response_compression_algorithm=response_compression)

    result = infer("simple", http_requested_outputs(httpclient), {"test": "1"})
    assert len(client.get_inference_statistics(model_name="simple", headers={"test": "1"})["model_stats"]) == 1
    assert_sum_and_difference(result, INPUT0, MINUS_ONES)
    assert_sum_and_difference(infer("simple", None, {"test": "1"}), INPUT0, MINUS_ONES)
    with pytest.raises(InferenceServerException) as refused:
        infer("wrong_model_name", http_requested_outputs(httpclient))
    assert refused.value.message().startswith("Request for unknown model")
    client.close()


@uses("simple")
def test_http_aio_infer():
    async def example():
        client = httpaio.InferenceServerClient(HTTP)

        async def infer(model, outputs):
            return await client.infer(model, simple_inputs(httpaio, MINUS_ONES, (False, True)), outputs=outputs,
                                      query_params={"test_1": 1, "test_2": 2})

        result = await infer("simple", http_requested_outputs(httpaio))
        assert len((await client.get_inference_statistics(model_name="simple"))["model_stats"]) == 1
        assert_sum_and_difference(result, INPUT0, MINUS_ONES)
        assert_sum_and_difference(await infer("simple", None), INPUT0, MINUS_ONES)
        with pytest.raises(InferenceServerException) as refused:
            await infer("wrong_model_name", http_requested_outputs(httpaio))
        assert refused.value.message().startswith("Request for unknown model")
        for result in await asyncio.gather(infer("simple", http_requested_outputs(httpaio)), infer("simple", None)):
            assert_sum_and_difference(result, INPUT0, MINUS_ONES)
        await client.close()
    asyncio.run(example())


@uses("simple")
def test_http_async_infer():
    # Two requests in flight on a client with concurrency 2, both to the cold model.
    client = http_client(concurrency=2)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    pending = [client.async_infer("simple", simple_inputs(httpclient, ONES, (True, True)), outputs=outputs)
               for _ in range(2)]
    for request in pending:
        assert_sum_and_difference(request.get_result(), INPUT0, ONES)
    client.close()


# --- simple_grpc_infer_client.py, simple_grpc_aio_infer_client.py, simple_grpc_async_infer_client.py ---

@uses("simple")
@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_grpc_infer(compression):
    client = grpc_client()
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer(model_name="simple", inputs=simple_inputs(grpcclient), outputs=outputs,
                          client_timeout=30.0, headers={"test": "1"}, compression_algorithm=compression)
    assert len(client.get_inference_statistics(model_name="simple").model_stats) == 1
    assert_sum_and_difference(result, INPUT0, ONES)
    result = client.infer(model_name="simple", inputs=simple_inputs(grpcclient), outputs=None,
                          compression_algorithm=compression)
    assert_sum_and_difference(result, INPUT0, ONES)
    client.close()


@uses("simple")
def test_grpc_aio_infer():
    async def example():
        client = grpcaio.InferenceServerClient(GRPC)
        outputs = [grpcaio.InferRequestedOutput("OUTPUT0"), grpcaio.InferRequestedOutput("OUTPUT1")]
        result = await client.infer(model_name="simple", inputs=simple_inputs(grpcaio), outputs=outputs,
                                    client_timeout=30.0, headers={"test": "1"})
        assert len((await client.get_inference_statistics(model_name="simple")).model_stats) == 1
        assert_sum_and_difference(result, INPUT0, ONES)
        both = await asyncio.gather(client.infer(model_name="simple", inputs=simple_inputs(grpcaio), outputs=None),
                                    client.infer(model_name="simple", inputs=simple_inputs(grpcaio), outputs=None))
        for result in both:
            assert_sum_and_difference(result, INPUT0, ONES)
        await client.close()
    asyncio.run(example())


@uses("simple")
def test_grpc_async_infer():
    # The example's callback and its patience: the answer must come within 10 s.
    client = grpc_client()
    received = []
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    client.async_infer(model_name="simple", inputs=simple_inputs(grpcclient),
                       callback=lambda result, error: received.append(error or result), outputs=outputs)
    deadline = time.monotonic() + 10
    while not received and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(received) == 1, "no answer within the example's 10 s"
    assert not isinstance(received[0], InferenceServerException), received[0]
    assert_sum_and_difference(received[0], INPUT0, ONES)
    client.close()


@uses("simple")
@pytest.mark.parametrize("aio", [False, True])
def test_grpc_keepalive_and_custom_args(aio):
    # simple_grpc[_aio]_keepalive_client.py and simple_grpc[_aio]_custom_args_client.py: a
    # channel that pings often, with its own message limits; calls keep working across pings.
    keepalive = grpcclient.KeepAliveOptions(keepalive_time_ms=200, keepalive_timeout_ms=5000,
                                            keepalive_permit_without_calls=True, http2_max_pings_without_data=0)
    channel_args = [("grpc.max_send_message_length", 1024 * 1024), ("grpc.max_receive_message_length", 1024 * 1024)]
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    if not aio:
        client = grpcclient.InferenceServerClient(GRPC, keepalive_options=keepalive, channel_args=channel_args)
        for _ in range(3):
            assert_sum_and_difference(client.infer("simple", simple_inputs(grpcclient), outputs=outputs,
                                                   headers={"test": "1"}), INPUT0, ONES)
            time.sleep(0.5)
        client.close()
        return

    async def example():
        client = grpcaio.InferenceServerClient(GRPC, keepalive_options=keepalive, channel_args=channel_args)
        for _ in range(3):
            assert_sum_and_difference(await client.infer("simple", simple_inputs(grpcaio), outputs=outputs,
                                                         headers={"test": "1"}), INPUT0, ONES)
            await asyncio.sleep(0.5)
        await client.close()
    asyncio.run(example())


# --- grpc_explicit_{int,int8,byte}_content_client.py: raw stubs, tensors in `contents` ---

def explicit_request(model, datatype, fill):
    request = service_pb2.ModelInferRequest(model_name=model, model_version="")
    for name, values in (("INPUT0", list(range(16))), ("INPUT1", [1] * 16)):
        tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=[1, 16])
        fill(tensor.contents, values)
        request.inputs.append(tensor)
    for name in ("OUTPUT0", "OUTPUT1"):
        request.outputs.append(service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=name))
    return request


def raw_outputs(response, decode):
    assert len(response.outputs) == 2
    return [decode(raw).reshape(list(out.shape)) for out, raw in zip(response.outputs, response.raw_output_contents)]


@uses("simple")
def test_grpc_explicit_int_content():
    stub = grpc_stub()
    request = explicit_request("simple", "INT32", lambda c, v: c.int_contents.extend(v))
    sums, differences = raw_outputs(stub.ModelInfer(request), lambda raw: np.frombuffer(raw, dtype=np.int32))
    assert sums[0].tolist() == [i + 1 for i in range(16)] and differences[0].tolist() == [i - 1 for i in range(16)]
    # Both raw contents and `contents` for one input: Triton refuses the request.
    request.raw_input_contents.append(np.arange(8, dtype=np.int64).tobytes())
    request.inputs[0].contents.int_contents[:] = list(range(8, 16))
    with pytest.raises(grpclib.RpcError) as refused:
        stub.ModelInfer(request)
    assert ("contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
            in str(refused.value))


@uses("simple_int8")
def test_grpc_explicit_int8_content():
    stub = grpc_stub()
    request = explicit_request("simple_int8", "INT8", lambda c, v: c.int_contents.extend(v))
    sums, differences = raw_outputs(stub.ModelInfer(request), lambda raw: np.frombuffer(raw, dtype=np.int8))
    assert sums[0].tolist() == [i + 1 for i in range(16)] and differences[0].tolist() == [i - 1 for i in range(16)]
    request.model_version = "wrong_specification"
    with pytest.raises(grpclib.RpcError) as refused:
        stub.ModelInfer(request)
    assert "failed to get model version from specified version string 'wrong_specification'" in str(refused.value)


@uses("simple_string")
def test_grpc_explicit_byte_content():
    stub = grpc_stub()
    request = explicit_request("simple_string", "BYTES",
                               lambda c, v: c.bytes_contents.extend(str(x).encode() for x in v))
    sums, differences = raw_outputs(stub.ModelInfer(request), utils.deserialize_bytes_tensor)
    assert [int(x) for x in sums[0]] == [i + 1 for i in range(16)]
    assert [int(x) for x in differences[0]] == [i - 1 for i in range(16)]


# --- simple_{http,grpc}[_aio]_string_infer_client.py: simple_string, then simple_identity ---

def string_inputs(module, binary):
    a = np.array([str(x).encode() for x in range(16)], dtype=np.object_).reshape(1, 16)
    b = np.array([b"1"] * 16, dtype=np.object_).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "BYTES"), module.InferInput("INPUT1", [1, 16], "BYTES")]
    if binary is None:
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
    else:
        inputs[0].set_data_from_numpy(a, binary_data=binary[0])
        inputs[1].set_data_from_numpy(b, binary_data=binary[1])
    return inputs


def assert_string_sum_and_difference(result):
    assert [int(x) for x in result.as_numpy("OUTPUT0")[0]] == [x + 1 for x in range(16)]
    assert [int(x) for x in result.as_numpy("OUTPUT1")[0]] == [x - 1 for x in range(16)]


NUL_STRINGS = np.array(["he\x00llo".encode()] * 16, dtype=np.object_).reshape(1, 16)
BLOBS = np.array([b"\x00\x01\x02\x03"] * 16, dtype=np.bytes_).reshape(1, 16)


def assert_identity(sent, received, json_strings=False):
    if sent.dtype == np.object_:
        if json_strings:  # strings that came back as JSON text
            received = np.array([bytes(str(x), encoding="utf-8") for x in received.flatten()],
                                dtype=np.object_).reshape(1, 16)
        assert np.array_equal(sent, received)
    else:
        assert np.array_equal(sent, np.char.encode(received.astype(str)))


@uses("simple_string", "simple_identity")
def test_http_string_infer():
    client = http_client()
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    assert_string_sum_and_difference(client.infer("simple_string", string_inputs(httpclient, (True, False)),
                                                  outputs=outputs))
    for data in (NUL_STRINGS, BLOBS):
        for binary in (True, False):
            tensor = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
            tensor.set_data_from_numpy(data, binary_data=binary)
            result = client.infer("simple_identity", [tensor],
                                  outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
            assert_identity(data, result.as_numpy("OUTPUT0"), json_strings=not binary)
    client.close()


@uses("simple_string", "simple_identity")
def test_http_aio_string_infer():
    async def example():
        client = httpaio.InferenceServerClient(HTTP)
        outputs = [httpaio.InferRequestedOutput("OUTPUT0", binary_data=True),
                   httpaio.InferRequestedOutput("OUTPUT1", binary_data=False)]
        assert_string_sum_and_difference(await client.infer("simple_string", string_inputs(httpaio, (True, False)),
                                                            outputs=outputs))
        for data in (NUL_STRINGS, BLOBS):
            tensor = httpaio.InferInput("INPUT0", list(data.shape), "BYTES")
            tensor.set_data_from_numpy(data, binary_data=True)
            result = await client.infer("simple_identity", [tensor],
                                        outputs=[httpaio.InferRequestedOutput("OUTPUT0", binary_data=True)])
            assert_identity(data, result.as_numpy("OUTPUT0"))
        await client.close()
    asyncio.run(example())


@uses("simple_string", "simple_identity")
def test_grpc_string_infer():
    client = grpc_client()
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    assert_string_sum_and_difference(client.infer("simple_string", string_inputs(grpcclient, None), outputs=outputs))
    for data in (NUL_STRINGS, BLOBS):
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        result = client.infer("simple_identity", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
        assert_identity(data, result.as_numpy("OUTPUT0"))
    client.close()


@uses("simple_string", "simple_identity")
def test_grpc_aio_string_infer():
    async def example():
        client = grpcaio.InferenceServerClient(GRPC)
        outputs = [grpcaio.InferRequestedOutput("OUTPUT0"), grpcaio.InferRequestedOutput("OUTPUT1")]
        assert_string_sum_and_difference(await client.infer("simple_string", string_inputs(grpcaio, None),
                                                            outputs=outputs))
        for data in (NUL_STRINGS, BLOBS):
            tensor = grpcaio.InferInput("INPUT0", list(data.shape), "BYTES")
            tensor.set_data_from_numpy(data)
            result = await client.infer("simple_identity", [tensor], outputs=[grpcaio.InferRequestedOutput("OUTPUT0")])
            assert_identity(data, result.as_numpy("OUTPUT0"))
        await client.close()
    asyncio.run(example())


# --- sequences: simple_{http,grpc}[_aio]_sequence_sync_infer_client.py,
#     simple_grpc[_aio]_sequence_stream_infer_client.py ---

VALUES = [11, 7, 5, 3, 2, 0, 1]
SEQUENCE_MODELS = ["simple_sequence", "simple_dyna_sequence", "simple_string_dyna_sequence"]


def sequence_ids(dyna, offset, string_offset=None):
    # Numeric ids, and a string id: an integer's text for the dynamic model, else a UUID.
    text = str(1002 + (offset if string_offset is None else string_offset)) if dyna else str(uuid.uuid4())
    return 1000 + offset * 2, 1001 + offset * 2, text


def sequence_plan(dyna, ids):
    """(sequence id, model, values) of the three sequences every sequence example sends."""
    int_model = "simple_dyna_sequence" if dyna else "simple_sequence"
    text_model = "simple_string_dyna_sequence" if dyna else "simple_sequence"
    return [(ids[0], int_model, [0] + VALUES), (ids[1], int_model, [100] + [-v for v in VALUES]),
            (ids[2], text_model, [20] + [-v for v in VALUES])]


def sequence_input(module, value):
    data = np.full((1, 1), value, dtype=np.int32)
    tensor = module.InferInput("INPUT", list(data.shape), "INT32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def check_sequences(dyna, ids, int0, int1, text0):
    """The examples' own expectations for the three sequences."""
    id0, id1, text_id = ids
    assert len(int0) == len(int1) == len(text0) == len(VALUES) + 1
    for i in range(len(VALUES) + 1):
        expected0 = 1 if i == 0 else VALUES[i - 1]
        expected1 = 101 if i == 0 else -VALUES[i - 1]
        if i == 0:
            expected_text = 20 if dyna else 21
        elif dyna:
            expected_text = -VALUES[i - 1] + int(text0[i - 1])
        else:
            expected_text = -VALUES[i - 1]
        if dyna and i != 0 and VALUES[i - 1] == 1:
            expected0 += id0
            expected1 += id1
            expected_text += int(text_id)
        assert (int0[i], int1[i], text0[i]) == (expected0, expected1, expected_text), f"step {i}"


def run_sync_sequences(client, module, dyna, ids):
    results = []
    for sequence_id, model, values in sequence_plan(dyna, ids):
        answers = []
        for i, value in enumerate(values):
            result = client.infer(model, sequence_input(module, value),
                                  outputs=[module.InferRequestedOutput("OUTPUT")], sequence_id=sequence_id,
                                  sequence_start=(i == 0), sequence_end=(i == len(values) - 1))
            answers.append(int(result.as_numpy("OUTPUT")[0][0]))
        results.append(answers)
    check_sequences(dyna, ids, *results)


@uses(*SEQUENCE_MODELS)
@pytest.mark.parametrize("dyna", [False, True])
def test_http_sequence_sync(dyna):
    # The HTTP example's string id has no offset.
    run_sync_sequences(http_client(), httpclient, dyna, sequence_ids(dyna, 0, string_offset=0))


@uses(*SEQUENCE_MODELS)
@pytest.mark.parametrize("dyna", [False, True])
def test_grpc_sequence_sync(dyna):
    run_sync_sequences(grpc_client(), grpcclient, dyna, sequence_ids(dyna, 10))


@uses(*SEQUENCE_MODELS)
@pytest.mark.parametrize("dyna", [False, True])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_aio_sequence_sync(protocol, dyna):
    module, address = (httpaio, HTTP) if protocol == "http" else (grpcaio, GRPC)
    ids = sequence_ids(dyna, 30)

    async def example():
        client = module.InferenceServerClient(address)
        results = []
        for sequence_id, model, values in sequence_plan(dyna, ids):
            answers = []
            for i, value in enumerate(values):
                result = await client.infer(model, sequence_input(module, value),
                                            outputs=[module.InferRequestedOutput("OUTPUT")], sequence_id=sequence_id,
                                            sequence_start=(i == 0), sequence_end=(i == len(values) - 1))
                answers.append(int(result.as_numpy("OUTPUT")[0][0]))
            results.append(answers)
        await client.close()
        return results
    check_sequences(dyna, ids, *asyncio.run(example()))


def sort_stream_answers(ids, answers):
    """Answers matched to their sequence by request id `<sequence id>_<n>`, in send order."""
    by_id = {str(s): [] for s in ids}
    for response_id, value in answers:
        sequence, n = response_id.rsplit("_", 1)
        by_id[sequence].append((int(n), value))
    return [[value for _, value in sorted(by_id[str(s)])] for s in ids]


@uses(*SEQUENCE_MODELS)
@pytest.mark.parametrize("dyna", [False, True])
def test_grpc_sequence_stream(dyna):
    # Three sequences on one stream, the stream being the first thing to reach the models.
    ids = sequence_ids(dyna, 20)
    answers = queue.Queue()
    with grpc_client() as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for sequence_id, model, values in sequence_plan(dyna, ids):
            for i, value in enumerate(values):
                client.async_stream_infer(model, sequence_input(grpcclient, value),
                                          outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                                          request_id=f"{sequence_id}_{i + 1}", sequence_id=sequence_id,
                                          sequence_start=(i == 0), sequence_end=(i == len(values) - 1))
        received = []
        for _ in range(3 * (len(VALUES) + 1)):
            result, error = answers.get(timeout=60)
            assert error is None, error
            received.append((result.get_response().id, int(result.as_numpy("OUTPUT")[0][0])))
        client.stop_stream()
    check_sequences(dyna, ids, *sort_stream_answers(ids, received))


@uses(*SEQUENCE_MODELS)
@pytest.mark.parametrize("dyna", [False, True])
def test_grpc_aio_sequence_stream(dyna):
    ids = sequence_ids(dyna, 40)

    async def requests():
        for sequence_id, model, values in sequence_plan(dyna, ids):
            for i, value in enumerate(values):
                yield {"model_name": model, "inputs": sequence_input(grpcaio, value),
                       "outputs": [grpcaio.InferRequestedOutput("OUTPUT")], "request_id": f"{sequence_id}_{i + 1}",
                       "sequence_id": sequence_id, "sequence_start": i == 0, "sequence_end": i == len(values) - 1}

    async def example():
        received = []
        async with grpcaio.InferenceServerClient(GRPC) as client:
            async for result, error in client.stream_infer(inputs_iterator=requests(), stream_timeout=60):
                assert error is None, error
                received.append((result.get_response().id, int(result.as_numpy("OUTPUT")[0][0])))
                if len(received) == 3 * (len(VALUES) + 1):
                    break
        return received
    check_sequences(dyna, ids, *sort_stream_answers(ids, asyncio.run(example())))


@uses(*SEQUENCE_MODELS)
def test_sequences_from_several_clients_at_once():
    # Several example processes at once, HTTP and gRPC, dynamic and not, each with its own ids
    # (the examples' --offset), all starting on cold models.
    errors = []

    def run(protocol, dyna, offset):
        try:
            if protocol == "http":
                run_sync_sequences(http_client(), httpclient, dyna, sequence_ids(dyna, offset))
            else:
                run_sync_sequences(grpc_client(), grpcclient, dyna, sequence_ids(dyna, offset))
        except BaseException as e:  # reported below, with the run it came from
            errors.append((protocol, dyna, offset, repr(e)))

    runs = [threading.Thread(target=run, args=(protocol, dyna, 100 + n))
            for n, (protocol, dyna) in enumerate([(p, d) for p in ("http", "grpc") for d in (False, True)] * 2)]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in runs), "a sequence run hung"
    assert not errors, errors


# --- simple_grpc_custom_repeat.py: decoupled model over the stream ---

@uses("repeat_int32")
def test_grpc_decoupled_repeat():
    # The example's values and count; delays shortened from 1 s to 20 ms to keep the suite quick.
    count, offset = 10, 100
    inputs = [grpcclient.InferInput("IN", [count], "INT32"), grpcclient.InferInput("DELAY", [count], "UINT32"),
              grpcclient.InferInput("WAIT", [1], "UINT32")]
    inputs[0].set_data_from_numpy(np.arange(offset, offset + count, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.full(count, 20, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([20], dtype=np.uint32))
    answers = queue.Queue()
    with grpc_client() as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("repeat_int32", inputs, outputs=[grpcclient.InferRequestedOutput("OUT")])
        received = []
        for _ in range(count):
            result, error = answers.get(timeout=60)
            assert error is None, error
            received.append(result.as_numpy("OUT"))
    assert all(len(out) == 1 for out in received)
    assert [int(out[0]) for out in received] == list(range(offset, offset + count))


# --- memory_growth_test.py: a new client for every request ---

@uses("custom_identity_int32")
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_memory_growth_client_per_request(protocol):
    module, make = (httpclient, http_client) if protocol == "http" else (grpcclient, grpc_client)
    for _ in range(20):
        client = make()
        tensor = module.InferInput("INPUT0", [1, 16], "INT32")
        if module is httpclient:
            tensor.set_data_from_numpy(INPUT0, binary_data=True)
            outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
        else:
            tensor.set_data_from_numpy(INPUT0)
            outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
        output = client.infer(model_name="custom_identity_int32", inputs=[tensor], outputs=outputs).as_numpy("OUTPUT0")
        assert output.dtype == INPUT0.dtype and output.shape == INPUT0.shape and np.array_equal(output, INPUT0)
        client.close()


# --- image_client.py, grpc_image_client.py, grpc_client.py: a classifier, metadata and config first ---

# Three plain pictures of different sizes (the examples resize them), and the class each is.
PICTURES = {"blue.png": ((0, 0, 255), (40, 30), "BLUE", 2), "green.jpg": ((0, 200, 0), (300, 200), "GREEN", 1),
            "red.jpg": ((220, 0, 0), (640, 480), "RED", 0)}


def picture_bytes(name):
    colour, size, _, _ = PICTURES[name]
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG" if name.endswith(".png") else "JPEG")
    return out.getvalue()


def field(message, name):
    """A field of an HTTP JSON answer or of a gRPC message, the same way for both."""
    return message[name] if isinstance(message, dict) else getattr(message, name)


def parse_classifier(metadata, config):
    """The image examples' checks of a classifier: one input and one FP32 output in the
    metadata, one input in the config, a vector output, a 3-dimensional image input in NCHW
    or NHWC. Returns (max_batch_size, input, output, c, h, w, format, datatype)."""
    inputs, outputs = field(metadata, "inputs"), field(metadata, "outputs")
    assert len(inputs) == 1 and len(outputs) == 1 and len(field(config, "input")) == 1
    input_metadata, output_metadata, input_config = inputs[0], outputs[0], field(config, "input")[0]
    assert field(output_metadata, "datatype") == "FP32"
    max_batch_size = field(config, "max_batch_size")
    dims = [int(d) for d in field(output_metadata, "shape")][1 if max_batch_size > 0 else 0:]
    assert sum(1 for d in dims if d > 1) <= 1, "expecting model output to be a vector"
    shape = [int(d) for d in field(input_metadata, "shape")]
    assert len(shape) == 3 + (1 if max_batch_size > 0 else 0)
    image_format = field(input_config, "format")
    if isinstance(image_format, str):
        image_format = mc.ModelInput.Format.Value(image_format)
    assert image_format in (mc.ModelInput.FORMAT_NCHW, mc.ModelInput.FORMAT_NHWC)
    dims = shape[1:] if max_batch_size > 0 else shape
    c, h, w = (dims[2], dims[0], dims[1]) if image_format == mc.ModelInput.FORMAT_NHWC else dims
    return (max_batch_size, field(input_metadata, "name"), field(output_metadata, "name"), c, h, w, image_format,
            field(input_metadata, "datatype"))


def preprocess(name, image_format, datatype, c, h, w, scaling):
    """The image examples' preprocessing: RGB, resized with bilinear filtering, typed, scaled,
    transposed to CHW for an NCHW model."""
    image = Image.open(io.BytesIO(picture_bytes(name))).convert("L" if c == 1 else "RGB")
    pixels = np.array(image.resize((w, h), Image.BILINEAR))
    if pixels.ndim == 2:
        pixels = pixels[:, :, np.newaxis]
    typed = pixels.astype(triton_to_np_dtype(datatype))
    scaled = typed / 127.5 - 1 if scaling == "INCEPTION" else typed
    return np.transpose(scaled, (2, 0, 1)) if image_format == mc.ModelInput.FORMAT_NCHW else scaled


def assert_classes(rows, name, classes, first_class=0):
    """Classification answers `score:index:label`, best first: the picture's colour first
    (densenet's colour classes start at 0, inception's at 1, after BACKGROUND)."""
    _, _, label, index = PICTURES[name]
    index += first_class
    rows = [(x.decode() if isinstance(x, bytes) else "".join(chr(b) for b in x)).split(":") for x in rows]
    assert len(rows) == classes, rows
    assert (rows[0][1], rows[0][2]) == (str(index), label), rows
    scores = [float(row[0]) for row in rows]
    assert scores == sorted(scores, reverse=True), rows


@uses("densenet_onnx")
@pytest.mark.parametrize("mode", ["http", "http-async", "grpc", "grpc-async", "grpc-streaming"])
def test_image_client(mode):
    # image_client.py -m densenet_onnx -c 3 -s INCEPTION <folder of three pictures>
    classes, model = 3, "densenet_onnx"
    protocol = mode.split("-")[0]
    module = httpclient if protocol == "http" else grpcclient
    client = http_client(concurrency=20 if mode == "http-async" else 1) if protocol == "http" else grpc_client()
    metadata = client.get_model_metadata(model_name=model, model_version="")
    config = client.get_model_config(model_name=model, model_version="")
    if protocol == "grpc":
        config = config.config
    max_batch_size, input_name, output_name, c, h, w, image_format, datatype = parse_classifier(metadata, config)
    assert max_batch_size == 0 and (c, h, w) == (3, 224, 224) and image_format == mc.ModelInput.FORMAT_NCHW
    names = sorted(PICTURES)
    images = [preprocess(name, image_format, datatype, c, h, w, "INCEPTION") for name in names]

    completed = queue.Queue()
    if mode == "grpc-streaming":
        client.start_stream(partial(lambda q, result, error: q.put((result, error)), completed))
    pending, responses = [], []
    for n, image in enumerate(images, start=1):
        inputs = [module.InferInput(input_name, list(image.shape), datatype)]
        inputs[0].set_data_from_numpy(image)
        outputs = [module.InferRequestedOutput(output_name, class_count=classes)]
        if mode == "grpc-streaming":
            client.async_stream_infer(model, inputs, request_id=str(n), model_version="", outputs=outputs)
        elif mode == "grpc-async":
            client.async_infer(model, inputs, partial(lambda q, result, error: q.put((result, error)), completed),
                               request_id=str(n), model_version="", outputs=outputs)
        elif mode == "http-async":
            pending.append(client.async_infer(model, inputs, request_id=str(n), model_version="", outputs=outputs))
        else:
            responses.append(client.infer(model, inputs, request_id=str(n), model_version="", outputs=outputs))
    if mode == "grpc-streaming":
        client.stop_stream()
    if mode in ("grpc-async", "grpc-streaming"):
        for _ in images:
            result, error = completed.get(timeout=60)
            assert error is None, error
            responses.append(result)
    responses.extend(request.get_result() for request in pending)

    assert len(responses) == len(images)
    for result in responses:
        response = result.get_response()
        request_id = response["id"] if protocol == "http" else response.id
        assert_classes(result.as_numpy(output_name), names[int(request_id) - 1], classes)
    client.close()


def raw_classifier_request(model, input_name, output_name, image, datatype, classes):
    request = service_pb2.ModelInferRequest(model_name=model, model_version="")
    output = service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=output_name)
    output.parameters["classification"].int64_param = classes
    request.outputs.append(output)
    request.inputs.append(service_pb2.ModelInferRequest.InferInputTensor(name=input_name, datatype=datatype,
                                                                         shape=list(image.shape)))
    request.raw_input_contents.append(image.tobytes())
    return request


@uses("densenet_onnx")
@pytest.mark.parametrize("mode", ["sync", "async", "streaming"])
def test_grpc_image_client_raw_stubs(mode):
    # grpc_image_client.py -m densenet_onnx -c 3 -s INCEPTION <folder>: generated stubs only.
    classes, model = 3, "densenet_onnx"
    stub = grpc_stub()
    metadata = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=model, version=""))
    config = stub.ModelConfig(service_pb2.ModelConfigRequest(name=model, version="")).config
    max_batch_size, input_name, output_name, c, h, w, image_format, datatype = parse_classifier(metadata, config)
    names = sorted(PICTURES)
    requests = [raw_classifier_request(model, input_name, output_name,
                                       preprocess(name, image_format, datatype, c, h, w, "INCEPTION"),
                                       datatype, classes) for name in names]
    if mode == "streaming":
        responses = []
        for answer in stub.ModelStreamInfer(iter(requests)):
            assert answer.error_message == "", answer.error_message
            responses.append(answer.infer_response)
            if len(responses) == len(requests):
                break
    elif mode == "async":
        responses = [future.result() for future in [stub.ModelInfer.future(r) for r in requests]]
    else:
        responses = [stub.ModelInfer(r) for r in requests]
    for name, response in zip(names, responses):
        assert len(response.outputs) == 1 and len(response.raw_output_contents) == 1
        rows = utils.deserialize_bytes_tensor(response.raw_output_contents[0]).reshape(list(response.outputs[0].shape))
        assert_classes(rows, name, classes)


@uses("inception_graphdef")
def test_grpc_client_raw_stubs():
    # grpc_client.py: health, readiness, metadata and config of a model nothing has asked for
    # yet, then an inference of 299x299x3 floats made of the byte 'a'.
    model = "inception_graphdef"
    stub = grpc_stub()
    assert stub.ServerLive(service_pb2.ServerLiveRequest()).live
    assert stub.ServerReady(service_pb2.ServerReadyRequest()).ready
    stub.ModelReady(service_pb2.ModelReadyRequest(name=model, version=""))  # printed, not checked
    assert stub.ServerMetadata(service_pb2.ServerMetadataRequest()).name == "triton"
    metadata = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=model, version=""))
    assert metadata.name == model
    config = stub.ModelConfig(service_pb2.ModelConfigRequest(name=model, version=""))
    assert config.config.name == model
    request = service_pb2.ModelInferRequest(model_name=model, model_version="", id="my request id")
    request.inputs.append(service_pb2.ModelInferRequest.InferInputTensor(name="input", datatype="FP32",
                                                                         shape=[1, 299, 299, 3]))
    request.outputs.append(service_pb2.ModelInferRequest.InferRequestedOutputTensor(
        name="InceptionV3/Predictions/Softmax"))
    request.raw_input_contents.append(b"a" * 1072812)
    response = stub.ModelInfer(request)
    assert response.id == "my request id" and response.model_name == model
    assert [o.name for o in response.outputs] == ["InceptionV3/Predictions/Softmax"]
    assert list(response.outputs[0].shape) == [1, 1001]
    assert len(response.raw_output_contents[0]) == 1001 * 4


# --- ensemble_image_client.py: encoded pictures in, through the ensemble's two steps ---

@uses("preprocess_inception_ensemble")
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_image_client(protocol):
    classes, model = 1, "preprocess_inception_ensemble"
    module = httpclient if protocol == "http" else grpcclient
    client = http_client() if protocol == "http" else grpc_client()
    metadata = client.get_model_metadata(model_name=model)
    config = client.get_model_config(model_name=model)
    if protocol == "grpc":
        config = config.config
    assert len(field(metadata, "inputs")) == 1 and len(field(config, "input")) == 1
    input_name = field(field(metadata, "inputs")[0], "name")
    output_names = [field(output, "name") for output in field(metadata, "outputs")]
    names = sorted(PICTURES)
    batch_size = min(len(names), field(config, "max_batch_size"))
    assert batch_size == len(names)
    batch = np.stack([np.array([picture_bytes(name)], dtype=bytes) for name in names[:batch_size]], axis=0)
    inputs = [module.InferInput(input_name, list(batch.shape), "BYTES")]
    if protocol == "http":
        inputs[0].set_data_from_numpy(batch, binary_data=True)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=True, class_count=classes) for n in output_names]
    else:
        inputs[0].set_data_from_numpy(batch)
        outputs = [grpcclient.InferRequestedOutput(n, class_count=classes) for n in output_names]
    result = client.infer(model, inputs, outputs=outputs)
    for output_name in output_names:
        rows = result.as_numpy(output_name)
        assert len(rows) == batch_size
        for name, row in zip(names, rows):
            assert_classes(row, name, classes, first_class=1)
    client.close()


# --- simple_{http,grpc}[_aio]_model_control.py: the one place the suite loads and unloads ---

REPOSITORY_SIZE = len([d for d in os.listdir(REPOSITORY) if os.path.isfile(os.path.join(REPOSITORY, d, "config.pbtxt"))])
BAD_OVERRIDE = '"parameters": {"config": {{"max_batch_size": "16"}}}'


@uses("simple")
def test_http_model_control():
    client = http_client()
    assert len(client.get_model_repository_index()) == REPOSITORY_SIZE
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("simple", config=BAD_OVERRIDE)
    assert "failed to load" in refused.value.message()
    client.load_model("simple", config='{"max_batch_size":"16"}')
    assert client.get_model_config("simple")["max_batch_size"] == 16
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("wrong_model_name")
    assert "failed to load" in refused.value.message()
    # Not the example's: the repository's `simple` back for the tests after this one.
    client.load_model("simple")
    assert client.get_model_config("simple")["max_batch_size"] == 8
    client.close()


@uses("simple")
def test_grpc_model_control():
    client = grpc_client()
    assert len(client.get_model_repository_index().models) == REPOSITORY_SIZE
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("simple", config=BAD_OVERRIDE)
    assert "failed to load" in refused.value.message()
    client.load_model("simple", config='{"max_batch_size":"16"}')
    assert client.get_model_config("simple").config.max_batch_size == 16
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    # The example's `file:` load with an over-long name is left out: Triton 2.51 (the wheel's)
    # crashes on it. The gateway refuses `file:` parameters itself (tests/model_control.rs).
    assert client.is_server_live()
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("wrong_model_name")
    assert "failed to load" in refused.value.message()
    client.load_model("simple")
    assert client.get_model_config("simple").config.max_batch_size == 8
    client.close()


@uses("simple")
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_aio_model_control(protocol):
    async def example():
        if protocol == "http":
            client = httpaio.InferenceServerClient(HTTP)
            assert len(await client.get_model_repository_index()) == REPOSITORY_SIZE
        else:
            client = grpcaio.InferenceServerClient(GRPC)
            assert len((await client.get_model_repository_index()).models) == REPOSITORY_SIZE
        await client.load_model("simple")
        assert await client.is_model_ready("simple")
        await client.unload_model("simple")
        assert not await client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as refused:
            await client.load_model("wrong_model_name")
        assert "failed to load" in refused.value.message()
        await client.load_model("simple")  # not the example's: `simple` back for what follows
        await client.close()
    asyncio.run(example())
