"""Identity model: OUTPUT0 = INPUT0, with a load that takes 1.5 s."""
import time

import triton_python_backend_utils as pb_utils

LOAD_SECONDS = 1.5


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(LOAD_SECONDS)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out = pb_utils.Tensor("OUTPUT0", x.as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
