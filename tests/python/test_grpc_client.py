"""KServe v2 gRPC checks with the official tritonclient.grpc client.

Runs against infergate's gRPC listener (most checks would pass against a plain Triton too;
those about the gateway itself say so). The suite loads add_sub, string_echo,
batched_double and slow_model itself, through the repository API, as a user of explicit
mode does. The pool must have the streaming models decoupled_repeat and sequence_sum loaded
on every backend, and add_sub_int in its repository but not loaded (it is loaded by the
first request for it). The gateway's server.max_grpc_message_size must be 1MiB.

    INFERGATE_GRPC_URL=127.0.0.1:8001 .venv/bin/python -m pytest -q tests/python/test_grpc_client.py

INFERGATE_GRPC_URL is host:port without a scheme. Without it every test is skipped.
INFERGATE_TRITON_GRPC_URLS (host:port of each backend, comma-separated) lets the checks
that compare the gateway's answers with Triton's, and see which backend served, run;
INFERGATE_DESCRIPTORS (a serialized FileDescriptorSet the gateway served by reflection)
lets the .proto check run.
INFERGATE_KILLED=1 selects the one check for a pool whose only backend was killed.
"""
import os
import queue
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
from google.protobuf import descriptor_pb2
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

URL = os.environ.get("INFERGATE_GRPC_URL")
TRITONS = [u for u in os.environ.get("INFERGATE_TRITON_GRPC_URLS", "").split(",") if u]
DESCRIPTORS = os.environ.get("INFERGATE_DESCRIPTORS")
KILLED = os.environ.get("INFERGATE_KILLED") == "1"
LOADED = ["add_sub", "string_echo", "batched_double", "slow_model"]

pytestmark = pytest.mark.skipif(not URL, reason="set INFERGATE_GRPC_URL=host:port of the gateway's gRPC listener")
live_pool = pytest.mark.skipif(KILLED, reason="the pool's backend was killed for this run")

A = np.array([1.5, 2.0, -3.0, 4.25], dtype=np.float32)
B = np.array([10.0, 0.5, 3.0, -4.0], dtype=np.float32)


@pytest.fixture(scope="module", autouse=True)
def loaded():
    """Loads LOADED through the server (all at once, as the gateway may place them on
    different backends), unless the pool was killed for this run."""
    if KILLED:
        return
    with grpcclient.InferenceServerClient(URL) as c, ThreadPoolExecutor(len(LOADED)) as pool:
        list(pool.map(c.load_model, LOADED))


@pytest.fixture(scope="module")
def client():
    c = grpcclient.InferenceServerClient(URL)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub():
    channel = grpc.insecure_channel(URL)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def add_sub_inputs(a, b):
    inputs = [grpcclient.InferInput("INPUT0", list(a.shape), "FP32"), grpcclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def status_of(excinfo):
    return excinfo.value.status()


@live_pool
def test_server_live_ready(client):
    assert client.is_server_live()
    assert client.is_server_ready()


@live_pool
def test_server_metadata_is_the_backends(client):
    md = client.get_server_metadata()
    assert md.name == "triton"
    assert md.version
    assert "model_repository" in md.extensions
    assert "binary_tensor_data" in md.extensions
    assert "system_shared_memory" not in md.extensions
    for url in TRITONS:
        triton = grpcclient.InferenceServerClient(url).get_server_metadata()
        assert (md.name, md.version) == (triton.name, triton.version)


@live_pool
@pytest.mark.parametrize("model", LOADED)
def test_model_ready(client, model):
    assert client.is_model_ready(model)
    assert client.is_model_ready(model, model_version="1")


@live_pool
def test_unknown_model_is_not_ready_and_not_found(client):
    assert not client.is_model_ready("no_such_model")
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("no_such_model")
    assert status_of(err) == "StatusCode.NOT_FOUND"
    assert "no_such_model" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("no_such_model", add_sub_inputs(A, B))
    assert status_of(err) == "StatusCode.NOT_FOUND"


@live_pool
def test_model_metadata(client):
    md = client.get_model_metadata("add_sub")
    assert md.name == "add_sub"
    assert "1" in md.versions
    assert [(i.name, i.datatype, list(i.shape)) for i in md.inputs] == [
        ("INPUT0", "FP32", [4]),
        ("INPUT1", "FP32", [4]),
    ]
    assert [(o.name, o.datatype, list(o.shape)) for o in md.outputs] == [
        ("OUTPUT0", "FP32", [4]),
        ("OUTPUT1", "FP32", [4]),
    ]
    assert client.get_model_metadata("add_sub", model_version="1").name == "add_sub"
    as_json = client.get_model_metadata("add_sub", as_json=True)
    assert as_json["platform"] or as_json["name"] == "add_sub"


@live_pool
def test_model_config_passes_through_whole(client):
    cfg = client.get_model_config("add_sub").config
    assert cfg.name == "add_sub"
    assert cfg.backend == "python"
    assert cfg.max_batch_size == 0
    assert [i.name for i in cfg.input] == ["INPUT0", "INPUT1"]
    assert cfg.instance_group[0].kind == 2  # KIND_CPU
    assert client.get_model_config("batched_double").config.max_batch_size == 8


@live_pool
def test_infer_raw_contents(client):
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    res = client.infer("add_sub", add_sub_inputs(A, B), outputs=outputs, request_id="req-1")
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), A - B)
    resp = res.get_response()
    assert resp.model_name == "add_sub"
    assert resp.id == "req-1"
    assert len(resp.raw_output_contents) == 2


@live_pool
def test_infer_typed_contents(stub):
    # Tensors in the typed `contents` fields rather than raw bytes.
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    for name, values in (("INPUT0", A), ("INPUT1", B)):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[4])
        tensor.contents.fp32_contents.extend(values.tolist())
    response = stub.ModelInfer(request, timeout=30)
    out0 = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    np.testing.assert_array_equal(out0, A + B)


@live_pool
def test_infer_bytes(client):
    data = np.array([b"hello", b"world", b"", "gr\u00fc\u00df".encode()], dtype=np.object_)
    inp = grpcclient.InferInput("INPUT0", [len(data)], "BYTES")
    inp.set_data_from_numpy(data)
    res = client.infer("string_echo", [inp])
    assert list(res.as_numpy("OUTPUT0")) == list(data)


@live_pool
def test_infer_batched(client):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    inp = grpcclient.InferInput("INPUT0", [3, 4], "FP32")
    inp.set_data_from_numpy(x)
    res = client.infer("batched_double", [inp])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), 2 * x)


@live_pool
def test_bad_shape_is_invalid_argument(client):
    # Refused by the gateway's validation in Triton's own words (the Rust side checks the
    # gateway's rejection counter, proving the backend never saw it).
    a = np.zeros(3, dtype=np.float32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("add_sub", add_sub_inputs(a, a), request_id="bad-shape")
    assert status_of(err) == "StatusCode.INVALID_ARGUMENT"
    assert err.value.message() == (
        "[request id: bad-shape] unexpected shape for input 'INPUT1' for model 'add_sub'. Expected [4], got [3]. "
    )


@live_pool
def test_streaming_several_requests_on_one_stream(client):
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        sent = {}
        for i in range(6):
            a = A + i
            rid = f"stream-{i}"
            sent[rid] = a
            client.async_stream_infer("add_sub", add_sub_inputs(a, B), request_id=rid)
        x = np.ones((2, 4), dtype=np.float32)
        batched = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
        batched.set_data_from_numpy(x)
        client.async_stream_infer("batched_double", [batched], request_id="stream-batched")
        # Requests the gateway refuses (no such model, a wrong shape) are answered on the
        # stream, as Triton answers them; the stream goes on.
        client.async_stream_infer("no_such_model", add_sub_inputs(A, B), request_id="stream-unknown")
        short = np.zeros(3, dtype=np.float32)
        client.async_stream_infer("add_sub", add_sub_inputs(short, short), request_id="stream-bad-shape")
        client.async_stream_infer("add_sub", add_sub_inputs(A, B), request_id="stream-last")
        got, errors = {}, []
        for _ in range(10):
            result, error = results.get(timeout=30)
            if error is not None:
                errors.append(error)
            else:
                got[result.get_response().id] = result
    finally:
        client.stop_stream()
    for rid, a in sent.items():
        np.testing.assert_array_equal(got[rid].as_numpy("OUTPUT0"), a + B)
    np.testing.assert_array_equal(got["stream-batched"].as_numpy("OUTPUT0"), 2 * x)
    np.testing.assert_array_equal(got["stream-last"].as_numpy("OUTPUT1"), A - B)
    messages = sorted(e.message() for e in errors)
    assert len(messages) == 2, messages
    assert "no_such_model" in messages[0], messages
    assert "unexpected shape for input 'INPUT1' for model 'add_sub'" in messages[1], messages


def stream_results(client, send, count):
    """Opens a stream, calls send(), and collects `count` (result, error) answers; then
    checks that nothing more comes."""
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        send()
        answers = [results.get(timeout=30) for _ in range(count)]
        with pytest.raises(queue.Empty):
            results.get(timeout=0.5)
    finally:
        client.stop_stream()
    return answers


@live_pool
def test_decoupled_model_answers_n_times_per_request(client):
    repeats = {"dec-0": 3, "dec-1": 1, "dec-2": 5}
    base = {rid: A + 100 * i for i, rid in enumerate(repeats)}

    def send():
        for rid, n in repeats.items():
            x = grpcclient.InferInput("INPUT0", [4], "FP32")
            x.set_data_from_numpy(base[rid])
            r = grpcclient.InferInput("REPEAT", [1], "INT32")
            r.set_data_from_numpy(np.array([n], dtype=np.int32))
            client.async_stream_infer("decoupled_repeat", [x, r], request_id=rid)

    got = {rid: [] for rid in repeats}
    for result, error in stream_results(client, send, sum(repeats.values())):
        assert error is None, error
        got[result.get_response().id].append(result)
    for rid, n in repeats.items():
        assert [int(r.as_numpy("INDEX")[0]) for r in got[rid]] == list(range(n)), rid
        for i, r in enumerate(got[rid]):
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), base[rid] + i)
    # A decoupled model cannot answer a unary call; Triton says so through the gateway.
    x = grpcclient.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(A)
    r = grpcclient.InferInput("REPEAT", [1], "INT32")
    r.set_data_from_numpy(np.array([2], dtype=np.int32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("decoupled_repeat", [x, r])
    assert "decoupled" in err.value.message(), err.value.message()


@live_pool
def test_sequences_keep_their_running_sums_on_one_stream(client):
    # Two sequences interleaved on one stream, over a pool where every backend has the
    # model: each sum is right only if every request of a sequence reached the same Triton.
    sequences = {1001: [1.0, 2.0, 3.0, 4.0], 2002: [10.0, 20.0, 30.0]}

    def send():
        for step in range(max(len(v) for v in sequences.values())):
            for seq, values in sequences.items():
                if step >= len(values):
                    continue
                x = grpcclient.InferInput("INPUT0", [1], "FP32")
                x.set_data_from_numpy(np.array([values[step]], dtype=np.float32))
                client.async_stream_infer(
                    "sequence_sum",
                    [x],
                    request_id=f"{seq}-{step}",
                    sequence_id=seq,
                    sequence_start=step == 0,
                    sequence_end=step == len(values) - 1,
                )

    def served():
        counts = []
        for url in TRITONS:
            with grpcclient.InferenceServerClient(url) as direct:
                stats = direct.get_inference_statistics("sequence_sum").model_stats
                counts.append(sum(s.inference_stats.success.count for s in stats))
        return counts

    before = served()
    sums = {}
    for result, error in stream_results(client, send, sum(len(v) for v in sequences.values())):
        assert error is None, error
        sums[result.get_response().id] = float(result.as_numpy("OUTPUT0")[0])
    for seq, values in sequences.items():
        assert [sums[f"{seq}-{i}"] for i in range(len(values))] == list(np.cumsum(values)), sums
    if TRITONS:
        # Every request went to one backend (both have the model loaded).
        grown = sorted(after - b for b, after in zip(before, served()))
        assert grown == [0] * (len(TRITONS) - 1) + [len(sums)], grown


def describe(file):
    """A FileDescriptorProto as comparable rows: every message (nested ones by full name)
    with its fields' number, type, label, type name and oneof; every enum with its values;
    every service method with its types and streaming."""
    rows = {}

    def message(prefix, m):
        name = f"{prefix}.{m.name}"
        rows[f"message {name}"] = sorted(
            (f.name, f.number, f.type, f.label, f.type_name, f.oneof_index if f.HasField("oneof_index") else -1)
            for f in m.field
        )
        rows[f"oneofs {name}"] = [o.name for o in m.oneof_decl]
        for nested in m.nested_type:
            message(name, nested)
        for e in m.enum_type:
            enum(name, e)

    def enum(prefix, e):
        rows[f"enum {prefix}.{e.name}"] = sorted((v.name, v.number) for v in e.value)

    for m in file.message_type:
        message(file.package, m)
    for e in file.enum_type:
        enum(file.package, e)
    for s in file.service:
        for m in s.method:
            rows[f"rpc {s.name}.{m.name}"] = (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
    return rows


@pytest.mark.skipif(not DESCRIPTORS, reason="set INFERGATE_DESCRIPTORS to the gateway's reflected descriptors")
def test_protos_match_what_tritonclient_ships():
    # prost drops fields it does not know, so a field missing from proto/ (or numbered
    # differently) would silently lose data on its way through the gateway.
    served = descriptor_pb2.FileDescriptorSet()
    with open(DESCRIPTORS, "rb") as f:
        served.ParseFromString(f.read())
    served = {file.name: file for file in served.file}
    for module in (service_pb2, model_config_pb2):
        shipped = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(shipped)
        assert shipped.name in served, (shipped.name, list(served))
        ours, theirs = describe(served[shipped.name]), describe(shipped)
        assert served[shipped.name].package == shipped.package
        missing = sorted(set(theirs) - set(ours))
        extra = sorted(set(ours) - set(theirs))
        differ = sorted(k for k in set(ours) & set(theirs) if ours[k] != theirs[k])
        assert (missing, extra, differ) == ([], [], []), {
            "missing": missing,
            "extra": extra,
            "differ": {k: (ours[k], theirs[k]) for k in differ},
        }


@live_pool
@pytest.mark.skipif(not TRITONS, reason="set INFERGATE_TRITON_GRPC_URLS to compare with Triton")
@pytest.mark.parametrize("model", LOADED + ["decoupled_repeat", "sequence_sum"])
def test_config_and_metadata_are_tritons(client, model):
    with grpcclient.InferenceServerClient(holder(model)) as direct:
        assert client.get_model_config(model, as_json=True) == direct.get_model_config(model, as_json=True)
        assert client.get_model_metadata(model, as_json=True) == direct.get_model_metadata(model, as_json=True)


def holder(model):
    """A backend that has `model` loaded (where the gateway placed it)."""
    for url in TRITONS:
        with grpcclient.InferenceServerClient(url) as direct:
            if direct.is_model_ready(model):
                return url
    pytest.fail(f"no backend has {model} loaded")


@live_pool
def test_statistics(client):
    client.infer("add_sub", add_sub_inputs(A, B))
    stats = client.get_inference_statistics("add_sub").model_stats
    assert stats[0].name == "add_sub"
    assert stats[0].inference_stats.success.count >= 1
    everything = client.get_inference_statistics().model_stats
    names = {s.name for s in everything}
    assert set(LOADED) <= names


def ready_in_index(client):
    return {m.name for m in client.get_model_repository_index().models if m.state == "READY"}


@live_pool
def test_repository_index(client, stub):
    index = client.get_model_repository_index().models
    assert set(LOADED) <= ready_in_index(client)
    assert "add_sub_int" in {m.name for m in index}
    only_ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), timeout=30).models
    assert {m.name for m in only_ready} == ready_in_index(client)
    assert all(m.state == "READY" for m in only_ready)


@live_pool
def test_cold_model_loads_on_first_request_then_unload_and_load(client):
    assert "add_sub_int" not in ready_in_index(client)
    a = np.array([1, 2, 3, 4], dtype=np.int32)
    inputs = [grpcclient.InferInput("INPUT0", [4], "INT32"), grpcclient.InferInput("INPUT1", [4], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    res = client.infer("add_sub_int", inputs)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), 2 * a)
    assert "add_sub_int" in ready_in_index(client)
    client.unload_model("add_sub_int")
    assert "add_sub_int" not in ready_in_index(client)
    client.load_model("add_sub_int")
    assert "add_sub_int" in ready_in_index(client)
    # Model files in the request are refused (each copy loads from its backend's repository).
    with pytest.raises(InferenceServerException) as err:
        client.load_model("add_sub_int", config="{}", files={"file:1/model.py": b"pass"})
    assert status_of(err) == "StatusCode.INVALID_ARGUMENT"
    assert "('file:1/model.py') are not supported through infergate" in err.value.message()
    # A model no repository has: Triton's class of answer (INTERNAL) and words.
    with pytest.raises(InferenceServerException) as err:
        client.load_model("no_such_model")
    assert status_of(err) == "StatusCode.INTERNAL"
    assert "failed to load 'no_such_model'" in err.value.message()


@live_pool
def test_shared_memory_and_settings_are_unimplemented(client):
    for call in (
        client.get_system_shared_memory_status,
        client.get_cuda_shared_memory_status,
        lambda: client.register_system_shared_memory("r", "/k", 64),
        client.unregister_system_shared_memory,
        client.get_trace_settings,
        client.get_log_settings,
    ):
        with pytest.raises(InferenceServerException) as err:
            call()
        assert status_of(err) == "StatusCode.UNIMPLEMENTED"
        assert "infergate" in err.value.message() or "gateway" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.get_system_shared_memory_status()
    unimplemented = err.value.message()
    # An inference naming a region gets the same words, before any backend sees it.
    in_region = grpcclient.InferInput("INPUT0", [4], "FP32")
    in_region.set_shared_memory("r", 16)
    plain = add_sub_inputs(A, B)
    out_region = grpcclient.InferRequestedOutput("OUTPUT0")
    out_region.set_shared_memory("r", 16)
    for inputs, outputs in [([in_region, plain[1]], None), (plain, [out_region])]:
        with pytest.raises(InferenceServerException) as err:
            client.infer("add_sub", inputs, outputs=outputs)
        assert status_of(err) == "StatusCode.INVALID_ARGUMENT"
        assert err.value.message() == unimplemented


@live_pool
def test_request_id_metadata_round_trip(stub):
    request = service_pb2.ModelReadyRequest(name="add_sub")
    _, call = stub.ModelReady.with_call(request, metadata=[("x-request-id", "grpc-req-42")], timeout=30)
    assert dict(call.initial_metadata())["x-request-id"] == "grpc-req-42"
    _, call = stub.ServerMetadata.with_call(service_pb2.ServerMetadataRequest(), timeout=30)
    made = dict(call.initial_metadata())["x-request-id"]
    uuid.UUID(made)
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="no_such_model"), metadata=[("x-request-id", "bad-1")], timeout=30)
    assert dict(err.value.trailing_metadata())["x-request-id"] == "bad-1"


@live_pool
def test_deadline_is_honoured(client):
    inp = grpcclient.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(A)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        client.infer("slow_model", [inp], parameters={"delay_ms": 3000}, client_timeout=0.3)
    assert status_of(err) == "StatusCode.DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 2.0
    res = client.infer("slow_model", [inp], parameters={"delay_ms": 10}, client_timeout=20)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), A)


@live_pool
def test_message_over_the_limit_is_resource_exhausted(client):
    big = np.zeros(300_000, dtype=np.float32)  # 1.2 MB, over the gateway's 1MiB
    inp = grpcclient.InferInput("INPUT0", [len(big)], "FP32")
    inp.set_data_from_numpy(big)
    with pytest.raises(InferenceServerException) as err:
        client.infer("add_sub", [inp])
    assert status_of(err) == "StatusCode.RESOURCE_EXHAUSTED"
    assert "max_grpc_message_size" in err.value.message()
    assert client.is_server_live()


@pytest.mark.skipif(not KILLED, reason="run with INFERGATE_KILLED=1 after killing the pool's backend")
def test_killed_backend_is_unavailable_not_a_hang(client):
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        client.infer("add_sub", add_sub_inputs(A, B), client_timeout=20)
    assert status_of(err) == "StatusCode.UNAVAILABLE"
    assert time.monotonic() - started < 5.0
    assert not client.is_server_ready()
    assert client.is_server_live()
