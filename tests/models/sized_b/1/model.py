"""Identity model: OUTPUT0 = INPUT0. The sibling weights.bin is padding, never read."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out = pb_utils.Tensor("OUTPUT0", x.as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
