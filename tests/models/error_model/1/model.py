"""Loads fine; every request is answered with a TritonError "injected failure"."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError("injected failure")
            )
            for _ in requests
        ]
