"""A decoupled model: REPEAT answers per request, then the final flag.

Answer i (from 0) carries OUTPUT0 = INPUT0 + i and INDEX = [i], so a client can check that
every answer arrived, in order, for the request it sent.
"""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            repeat = int(pb_utils.get_input_tensor_by_name(request, "REPEAT").as_numpy()[0])
            for i in range(repeat):
                out = pb_utils.Tensor("OUTPUT0", (x + i).astype(np.float32))
                index = pb_utils.Tensor("INDEX", np.array([i], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out, index]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
