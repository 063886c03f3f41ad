"""Colour classifier with inception_graphdef's signature: a softmax over 1001 classes whose
logits are 4 x the channel means (classes 1-3) and 0 elsewhere."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "input").as_numpy()  # [N, H, W, 3]
            batch = images.shape[0]
            logits = np.zeros((batch, 1001), dtype=np.float64)
            logits[:, 1:4] = 4.0 * images.reshape(batch, -1, 3).astype(np.float64).mean(axis=1)
            logits -= logits.max(axis=1, keepdims=True)
            exp = np.exp(logits)
            softmax = (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("InceptionV3/Predictions/Softmax", softmax)]))
        return responses
