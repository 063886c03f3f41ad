"""OUTPUT = INPUT (+1 on START, + the correlation id on END), from the control inputs."""
import triton_python_backend_utils as pb_utils


def control(request, name, shape, dtype):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(shape).astype(dtype)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = control(request, "START", value.shape, value.dtype)
            end = control(request, "END", value.shape, value.dtype)
            corrid = control(request, "CORRID", value.shape, value.dtype)
            out = value + start + end * corrid
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
        return responses
