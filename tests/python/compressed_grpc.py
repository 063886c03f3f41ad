"""Compression with the official clients, against the gateway (or a Triton).

    .venv/bin/python tests/python/compressed_grpc.py GRPC_HOST:PORT [HTTP_HOST:PORT]

gRPC: `compression_algorithm` on infer (gzip, deflate), and a channel that compresses every
call (`grpc.default_compression_algorithm`), ServerLive included. HTTP, when its address is
given: `request_compression_algorithm` and `response_compression_algorithm` on infer.
Exits non-zero on the first failure.
"""
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

GRPC_URL = sys.argv[1]
HTTP_URL = sys.argv[2] if len(sys.argv) > 2 else None
A = np.array([1.5, 2.0, -3.0, 4.25], dtype=np.float32)
B = np.array([10.0, 0.5, 3.0, -4.0], dtype=np.float32)
# grpc's compression algorithm enum: 1 deflate, 2 gzip.
CHANNEL_ALGORITHMS = {"deflate": 1, "gzip": 2}


def inputs(module):
    tensors = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    tensors[0].set_data_from_numpy(A)
    tensors[1].set_data_from_numpy(B)
    return tensors


def check(result, how):
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert np.array_equal(out0, A + B) and np.array_equal(out1, A - B), (how, out0, out1)
    print("ok", how)


client = grpcclient.InferenceServerClient(GRPC_URL)
for algorithm in ["gzip", "deflate"]:
    check(client.infer("add_sub", inputs(grpcclient), compression_algorithm=algorithm), f"grpc infer {algorithm}")
    channel_args = [("grpc.default_compression_algorithm", CHANNEL_ALGORITHMS[algorithm])]
    compressing = grpcclient.InferenceServerClient(GRPC_URL, channel_args=channel_args)
    assert compressing.is_server_live(), algorithm
    print("ok", f"grpc ServerLive on a {algorithm} channel")
    check(compressing.infer("add_sub", inputs(grpcclient)), f"grpc infer on a {algorithm} channel")
    compressing.close()
client.close()

if HTTP_URL:
    client = httpclient.InferenceServerClient(HTTP_URL)
    for algorithm in ["gzip", "deflate"]:
        result = client.infer(
            "add_sub",
            inputs(httpclient),
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        check(result, f"http infer {algorithm}")
    client.close()
