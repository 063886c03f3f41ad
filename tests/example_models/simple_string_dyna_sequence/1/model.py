"""Running sum per string correlation id, plus the id (as an integer) on the last request."""
import numpy as np
import triton_python_backend_utils as pb_utils


def flag(request, name):
    return bool(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = str(request.correlation_id())
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if flag(request, "START"):
                self.sums[key] = 0
            total = self.sums.get(key, 0) + int(value.reshape(-1)[0])
            self.sums[key] = total
            answer = total
            if flag(request, "END"):
                answer += int(key)
                self.sums.pop(key, None)
            out = np.full(value.shape, answer, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
        return responses
