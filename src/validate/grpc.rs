//! The gRPC reader: a `ModelInferRequest` described as the protocol-neutral `InferRequest`,
//! then checked against the model's signature by the same `check` as HTTP's requests.
//!
//! Only what the gateway can describe exactly is checked: tensors in `raw_input_contents`
//! (what tritonclient and most clients send), as slices of the decoded message. Typed
//! `contents`, or a count of raw contents that does not match the inputs, are forwarded as
//! they came, and Triton answers them: never refuse what Triton would accept. An input or
//! output in shared memory is refused, as on HTTP: no Triton behind a gateway has the region.

use super::{InferRequest, InputTensor, Rejection, Signature, TensorData, Verdict, check};
use crate::protocol::inference::ModelInferRequest;
use std::borrow::Cow;

/// Reads a gRPC inference message and checks it against `signature`: the gRPC side of the
/// `validate` phase (unary calls and each message of a stream alike).
pub fn read(message: &ModelInferRequest, signature: &Signature) -> Verdict {
    if let Err(rejection) = no_shared_memory(message) {
        return Verdict::Refused(rejection);
    }
    match describe(message) {
        Ok(request) => Verdict::of(check(&request, signature)),
        Err(why) => Verdict::Unvalidated(why),
    }
}

/// Refuses a request whose inputs or outputs name a shared-memory region.
fn no_shared_memory(message: &ModelInferRequest) -> Result<(), Rejection> {
    let inputs = message.inputs.iter().map(|i| &i.parameters);
    let outputs = message.outputs.iter().map(|o| &o.parameters);
    if inputs
        .chain(outputs)
        .any(|parameters| parameters.contains_key("shared_memory_region"))
    {
        return Err(Rejection::shared_memory());
    }
    Ok(())
}

/// The request as the checker reads it, or why it is not checked.
fn describe(message: &ModelInferRequest) -> Result<InferRequest<'_>, &'static str> {
    if message.raw_input_contents.len() != message.inputs.len() {
        return Err("not every input is in raw_input_contents");
    }
    let inputs = message
        .inputs
        .iter()
        .zip(&message.raw_input_contents)
        .map(|(input, raw)| {
            if input.contents.is_some() {
                return Err("an input has both typed and raw contents");
            }
            Ok(InputTensor {
                name: Cow::Borrowed(&input.name),
                datatype: Cow::Borrowed(&input.datatype),
                shape: Cow::Borrowed(&input.shape),
                data: TensorData::Raw(raw.clone()),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(InferRequest {
        id: Cow::Borrowed(&message.id),
        inputs,
        outputs: message
            .outputs
            .iter()
            .map(|o| Cow::Borrowed(&*o.name))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::inference::InferTensorContents;
    use crate::protocol::inference::model_infer_request::{
        InferInputTensor, InferRequestedOutputTensor,
    };
    use bytes::Bytes;

    fn input(name: &str) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: "FP32".into(),
            shape: vec![4],
            ..Default::default()
        }
    }

    #[test]
    fn raw_contents_are_described_without_copies() {
        let raw = Bytes::from(vec![0u8; 16]);
        let message = ModelInferRequest {
            id: "r1".into(),
            inputs: vec![input("INPUT0")],
            outputs: vec![InferRequestedOutputTensor {
                name: "OUTPUT0".into(),
                ..Default::default()
            }],
            raw_input_contents: vec![raw.clone()],
            ..Default::default()
        };
        let request = describe(&message).unwrap();
        assert_eq!(request.id, "r1");
        assert_eq!(request.outputs, ["OUTPUT0"]);
        let TensorData::Raw(described) = &request.inputs[0].data else {
            panic!("raw contents are described as raw");
        };
        assert_eq!(described.as_ptr(), raw.as_ptr());
    }

    #[test]
    fn what_cannot_be_described_exactly_goes_unchecked() {
        let typed = ModelInferRequest {
            inputs: vec![InferInputTensor {
                contents: Some(InferTensorContents {
                    fp32_contents: vec![1.0; 4],
                    ..Default::default()
                }),
                ..input("INPUT0")
            }],
            ..Default::default()
        };
        assert!(describe(&typed).is_err());
        let short = ModelInferRequest {
            inputs: vec![input("INPUT0"), input("INPUT1")],
            raw_input_contents: vec![Bytes::new()],
            ..Default::default()
        };
        assert!(describe(&short).is_err());
    }

    #[test]
    fn an_input_or_output_in_shared_memory_is_refused() {
        let mut shared = input("INPUT0");
        shared
            .parameters
            .insert("shared_memory_region".into(), Default::default());
        let shared_input = ModelInferRequest {
            inputs: vec![shared],
            ..Default::default()
        };
        let shared_output = ModelInferRequest {
            inputs: vec![input("INPUT0")],
            outputs: vec![InferRequestedOutputTensor {
                name: "OUTPUT0".into(),
                parameters: [("shared_memory_region".to_owned(), Default::default())].into(),
            }],
            raw_input_contents: vec![Bytes::new()],
            ..Default::default()
        };
        for message in [shared_input, shared_output] {
            assert_eq!(no_shared_memory(&message), Err(Rejection::shared_memory()));
        }
        let plain = ModelInferRequest {
            inputs: vec![input("INPUT0")],
            ..Default::default()
        };
        assert_eq!(no_shared_memory(&plain), Ok(()));
    }
}
