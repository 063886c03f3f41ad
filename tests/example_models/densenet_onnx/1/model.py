"""Colour classifier with densenet_onnx's signature: the score of class c < 3 is the mean of
channel c of the NCHW input, every other class scores 0."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "data_0").as_numpy()  # [1, 3, H, W]
            scores = np.zeros((1, 1000, 1, 1), dtype=np.float32)
            scores[0, :3, 0, 0] = image.reshape(3, -1).mean(axis=1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("fc6_1", scores)]))
        return responses
