"""Decodes encoded images into Inception's input: RGB, 299x299, x / 127.5 - 1, NHWC."""
import io

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image


def prepare(encoded):
    image = Image.open(io.BytesIO(encoded)).convert("RGB").resize((299, 299), Image.BILINEAR)
    return np.asarray(image, dtype=np.float32) / 127.5 - 1.0


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            encoded = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()  # [N, 1] bytes
            try:
                images = np.stack([prepare(row[0]) for row in encoded])
            except Exception as e:  # not an image: the request fails, the model stays up
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"cannot decode the image: {e}")))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", images)]))
        return responses
