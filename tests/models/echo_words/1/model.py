"""Echoes text_input's words one response at a time (see config.pbtxt)."""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def optional(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        millis = lambda key: int(parameters.get(key, {}).get("string_value", "0")) / 1000.0
        self.delay = millis("delay_ms")
        self.first_delay = millis("first_delay_ms")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = optional(request, "text_input")[0].decode("utf-8")
            words = text.split()
            limit = optional(request, "max_tokens")
            if limit is not None:
                words = words[: int(limit[0])]
            stops = optional(request, "stop_words")
            stops = set() if stops is None else {s.decode("utf-8") for s in stops}
            for i, word in enumerate(words):
                # A request Triton has cancelled (its client gone) is answered no further.
                if word in stops or sender.is_cancelled():
                    break
                time.sleep(self.delay + (self.first_delay if i == 0 else 0))
                piece = word if i == 0 else " " + word
                out = pb_utils.Tensor("text_output", np.array([piece.encode("utf-8")], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
