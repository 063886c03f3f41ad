//! gRPC request builders the tests share.

use infergate::protocol::inference::infer_parameter::ParameterChoice;
use infergate::protocol::inference::model_infer_request::InferInputTensor;
use infergate::protocol::inference::{InferParameter, ModelInferRequest};

/// A `ModelInfer` request for `model` with FP32 `[4]` inputs, sent as raw contents.
pub fn fp32_infer(model: &str, inputs: &[(&str, [f32; 4])]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        inputs: inputs
            .iter()
            .map(|(name, _)| InferInputTensor {
                name: (*name).into(),
                datatype: "FP32".into(),
                shape: vec![4],
                ..Default::default()
            })
            .collect(),
        raw_input_contents: inputs
            .iter()
            .map(|(_, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect())
            .collect(),
        ..Default::default()
    }
}

/// A `slow_model` request that takes `delay_ms` on the backend.
pub fn slow(delay_ms: i64) -> ModelInferRequest {
    let mut request = fp32_infer("slow_model", &[("INPUT0", [0.0; 4])]);
    request.parameters.insert(
        "delay_ms".into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::Int64Param(delay_ms)),
        },
    );
    request
}
