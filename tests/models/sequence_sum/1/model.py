"""A sequence accumulator: per correlation id, the running sum of INPUT0.

The sequence start flag resets the sum, the end flag forgets it. A request in the middle of
a sequence this server never saw start is answered as if the sum were 0, which is what a
sequence split across two servers looks like.
"""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            flags = request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[key] = 0.0
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            total = self.sums.get(key, 0.0) + float(x[0])
            self.sums[key] = total
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                self.sums.pop(key, None)
            out = pb_utils.Tensor("OUTPUT0", np.array([total], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
