"""Streams text_input back one word per response (text_output), for the generate extension.

Optional max_tokens caps the number of words; optional delay_ms waits before each word, so a
client can tell events that are forwarded as they come from an answer buffered whole.
"""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def optional_int(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            words = text.reshape(-1)[0].decode("utf-8").split()
            limit = optional_int(request, "max_tokens", len(words))
            delay = optional_int(request, "delay_ms", 0) / 1000.0
            for word in words[:limit]:
                time.sleep(delay)
                out = pb_utils.Tensor("text_output", np.array([word.encode("utf-8")], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
