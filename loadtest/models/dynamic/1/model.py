"""OUTPUT0 = [sum(INPUT0)]: reads the whole tensor, answers one number."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            total = np.array([x.sum()], dtype=np.float32)
            out = pb_utils.Tensor("OUTPUT0", total)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
