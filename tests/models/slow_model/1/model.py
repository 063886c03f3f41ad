"""OUTPUT0 = INPUT0 after a sleep.

The delay is the request parameter "delay_ms" (KServe v2 JSON: {"parameters": {"delay_ms": 50},
"inputs": [...]}; an integer or a string holding one), 200 ms when absent or unparsable.
The python backend runs the requests of one execute() call one after another, and this
model has one instance, so concurrent requests queue behind each other.
"""
import json
import time

import triton_python_backend_utils as pb_utils

DEFAULT_DELAY_MS = 200


def delay_ms(request):
    try:
        params = json.loads(request.parameters() or "{}")
        return max(0, int(params.get("delay_ms", DEFAULT_DELAY_MS)))
    except (TypeError, ValueError):
        return DEFAULT_DELAY_MS


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(delay_ms(request) / 1000.0)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out = pb_utils.Tensor("OUTPUT0", x.as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
