"""Sum and difference of integers written as strings, as Triton's QA `simple_string` answers."""
import numpy as np
import triton_python_backend_utils as pb_utils


def as_ints(tensor):
    return np.vectorize(lambda s: int(s.decode() if isinstance(s, bytes) else s))(tensor.as_numpy())


def as_texts(values):
    return np.vectorize(lambda v: str(v).encode())(values).astype(np.object_)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = as_ints(pb_utils.get_input_tensor_by_name(request, "INPUT0"))
            b = as_ints(pb_utils.get_input_tensor_by_name(request, "INPUT1"))
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", as_texts(a + b)),
                pb_utils.Tensor("OUTPUT1", as_texts(a - b)),
            ]))
        return responses
