"""OUTPUT0 = INPUT0 + 100 x the version this file was loaded as: each version answers
differently. A negative INPUT0[0] makes the request take that many seconds (a request that
is still running while the model is loaded again)."""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.offset = 100.0 * int(args["model_version"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x[0] < 0:
                time.sleep(float(-x[0]))
            out = pb_utils.Tensor("OUTPUT0", (x + self.offset).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
