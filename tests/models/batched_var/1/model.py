"""OUTPUT0[b] = sum(INPUT0[b]) + sum(INPUT1[b]) for each batch row b."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            rows = y.shape[0]
            sx = x.reshape(rows, -1).sum(axis=1) if x.size else np.zeros(rows)
            out = (sx + y.sum(axis=1)).reshape(rows, 1).astype(np.float32)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out)])
            )
        return responses
