"""A model that never loads: initialize() raises, so POST .../failing_model/load fails."""


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("failing_model: initialize always fails (test fixture)")

    def execute(self, requests):  # never reached
        raise RuntimeError("unreachable")
