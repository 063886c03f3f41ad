//! A request's sequence, read before it is placed: `sequence_id`, `sequence_start` and
//! `sequence_end` among its top-level parameters, as Triton reads them (an id is a number or
//! a string; 0 and the empty string mean none; a flag that is not a boolean is left to
//! validation and Triton to refuse). Placement keeps each live sequence on the copy that saw
//! it start (`placement::sequences`).

use crate::placement::{SequenceId, SequenceRef};
use crate::protocol::inference::InferParameter;
use crate::protocol::inference::infer_parameter::ParameterChoice;
use std::collections::HashMap;

/// From a request's JSON (an HTTP body, or a binary request's JSON header), read with the
/// reader validation uses (RapidJSON's rules: escapes in names, the first of repeated
/// names). A body that is not JSON carries no sequence here: validation or Triton refuses it.
pub fn from_json(text: &[u8]) -> Option<SequenceRef> {
    let document = crate::validate::json::parse_request(text).ok()?;
    let parameters = document.find("parameters")?;
    let id = parameters.find("sequence_id")?;
    let id = match id.as_u64() {
        Some(number) => SequenceId::Number(number),
        None => SequenceId::Text(String::from_utf8_lossy(id.as_bytes()?).into()),
    };
    let flag = |name| {
        parameters
            .find(name)
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    };
    SequenceRef::new(id, flag("sequence_start"), flag("sequence_end"))
}

/// From a gRPC request's parameters (`int64_param` or `uint64_param` ids, `string_param`
/// ids, `bool_param` flags).
pub fn from_parameters(parameters: &HashMap<String, InferParameter>) -> Option<SequenceRef> {
    let choice = |name: &str| parameters.get(name)?.parameter_choice.as_ref();
    let id = match choice("sequence_id")? {
        ParameterChoice::Int64Param(n) => SequenceId::Number(*n as u64),
        ParameterChoice::Uint64Param(n) => SequenceId::Number(*n),
        ParameterChoice::StringParam(text) => SequenceId::Text(text.as_str().into()),
        _ => return None,
    };
    let flag = |name| matches!(choice(name), Some(ParameterChoice::BoolParam(true)));
    SequenceRef::new(id, flag("sequence_start"), flag("sequence_end"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ids_and_flags_from_json_as_clients_write_it() {
        // tritonclient writes `parameters` after `inputs`; json.dumps adds spaces.
        let body = br#"{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}], "parameters": {"sequence_id": 42, "sequence_start": true, "sequence_end": false, "binary_data_output": true}}"#;
        let sequence = from_json(body).unwrap();
        assert_eq!(sequence.id, SequenceId::Number(42));
        assert!(sequence.start && !sequence.end);
        let text = br#"{"parameters":{"sequence_id":"user-7","sequence_end":true},"inputs":[]}"#;
        let sequence = from_json(text).unwrap();
        assert_eq!(sequence.id, SequenceId::Text("user-7".into()));
        assert!(!sequence.start && sequence.end);
        let escaped = br#"{"parameters":{"\u0073equence_id":"\u0061b"}}"#;
        assert_eq!(
            from_json(escaped).unwrap().id,
            SequenceId::Text("ab".into())
        );
        for none in [
            &br#"{"parameters":{"sequence_id":0,"sequence_start":true}}"#[..],
            br#"{"parameters":{"sequence_id":""}}"#,
            br#"{"parameters":{"priority":1}}"#,
            br#"{"inputs":[]}"#,
            b"not json",
        ] {
            assert!(
                from_json(none).is_none(),
                "{}",
                String::from_utf8_lossy(none)
            );
        }
    }

    #[test]
    fn reads_ids_and_flags_from_grpc_parameters() {
        let param = |choice| InferParameter {
            parameter_choice: Some(choice),
        };
        let mut parameters = HashMap::from([
            (
                "sequence_id".to_string(),
                param(ParameterChoice::Int64Param(9)),
            ),
            (
                "sequence_end".to_string(),
                param(ParameterChoice::BoolParam(true)),
            ),
        ]);
        let sequence = from_parameters(&parameters).unwrap();
        assert_eq!(sequence.id, SequenceId::Number(9));
        assert!(!sequence.start && sequence.end);
        parameters.insert(
            "sequence_id".into(),
            param(ParameterChoice::StringParam("s".into())),
        );
        assert_eq!(
            from_parameters(&parameters).unwrap().id,
            SequenceId::Text("s".into())
        );
        parameters.insert("sequence_id".into(), param(ParameterChoice::Int64Param(0)));
        assert!(from_parameters(&parameters).is_none());
        assert!(from_parameters(&HashMap::new()).is_none());
    }
}
