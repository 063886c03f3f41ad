"""OUTPUT0 = INPUT0, plus INPUT1 when present (INPUT1 is optional in config.pbtxt)."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            if y is not None:
                x = x + y.as_numpy()
            out = pb_utils.Tensor("OUTPUT0", x.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
