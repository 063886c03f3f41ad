//! Reading a body of Triton's generate extension (`POST .../generate`, `.../generate_stream`)
//! into the neutral `InferRequest`, as Triton 2.51 converts it, so the checker can refuse it
//! with Triton's words before it costs a backend anything.
//!
//! The body is a flat JSON object: a member named as a model input is that input's tensor,
//! `parameters` holds request parameters (and, like the top level, inputs), `id` is the
//! request id, anything else a parameter. An input's shape comes from the model, not the
//! request: the value's element count (an array's length, 1 for anything else) fills the
//! first variable dimension (the batch dimension of a batching model), others are 1; a
//! count that does not fit is refused with Triton's "The schema can not convert input ...".
//! What Triton reads after that (each value against the datatype) is left to Triton when it
//! would refuse: such a body is forwarded unvalidated, so the gateway never refuses what
//! Triton accepts, and answers with Triton's words what it refuses. Measured request by
//! request against Triton 2.51 (tests/generate.rs).
//!
//! Generate bodies are prompts: small. They are read with serde_json, which takes a subset
//! of the JSON Triton's reader takes; a body it does not read is forwarded unvalidated.

use super::datatype::DataType;
use super::request::{InferRequest, InputTensor, Reason, Rejection, TensorData, Verdict};
use super::signature::{InputSpec, Signature};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::HashSet;

/// What the reader made of a generate body.
#[derive(Debug, PartialEq)]
pub enum Generate {
    /// The request as Triton converts it: check it against the signature.
    Request(InferRequest<'static>),
    /// Something Triton reads its own way (and would refuse with its own words): forwarded
    /// as it came. The text says why, for debug logs.
    Unvalidated(&'static str),
}

/// Reads a generate body and checks it against `signature`: the generate endpoints' side of
/// the `validate` phase.
pub fn verdict(body: &[u8], signature: &Signature) -> Verdict {
    match parse(body, signature) {
        Ok(Generate::Request(request)) => Verdict::of(super::check(&request, signature)),
        Ok(Generate::Unvalidated(why)) => Verdict::Unvalidated(why),
        Err(rejection) => Verdict::Refused(rejection),
    }
}

/// Reads a generate body for the model of `signature`.
pub fn parse(body: &[u8], signature: &Signature) -> Result<Generate, Rejection> {
    let Ok(Members(members)) = serde_json::from_slice::<Members>(body) else {
        return Ok(Generate::Unvalidated("not a JSON object"));
    };
    if signature.inputs.iter().any(|i| i.is_shape_tensor) {
        return Ok(Generate::Unvalidated("a model with shape tensors"));
    }
    let mut reader = Reader {
        signature,
        request: InferRequest::default(),
        names: HashSet::new(),
    };
    for (name, member) in &members {
        let outcome = match (name.as_str(), member) {
            ("id", Member::Value(Value::String(id))) => {
                reader.request.id = Cow::Owned(id.clone());
                Ok(None)
            }
            ("id", _) => Ok(Some("an id that is not a string")),
            ("parameters", Member::Object(parameters)) => reader.parameters(parameters),
            ("parameters", Member::Value(_)) => Ok(Some("parameters that are not an object")),
            (name, Member::Value(value)) => reader.member(name, value, ""),
            (_, Member::Object(_)) => unreachable!("only `parameters` is read as members"),
        };
        if let Some(why) = outcome? {
            return Ok(Generate::Unvalidated(why));
        }
    }
    Ok(Generate::Request(reader.request))
}

struct Reader<'a> {
    signature: &'a Signature,
    request: InferRequest<'static>,
    names: HashSet<String>,
}

/// `Ok(Some(why))`: leave the body to Triton.
type Step = Result<Option<&'static str>, Rejection>;

impl Reader<'_> {
    fn parameters(&mut self, parameters: &[(String, Value)]) -> Step {
        for (name, value) in parameters {
            if let Some(why) = self.member(name, value, "Converting keyword: 'parameters': ")? {
                return Ok(Some(why));
            }
        }
        Ok(None)
    }

    /// One member: a model input becomes a tensor; anything else is a parameter, which
    /// Triton takes as a string, an integer or a boolean.
    fn member(&mut self, name: &str, value: &Value, context: &str) -> Step {
        let Some(spec) = self.signature.input(name) else {
            let scalar =
                matches!(value, Value::String(_) | Value::Bool(_)) || value.as_i64().is_some();
            return Ok((!scalar).then_some("a parameter Triton refuses"));
        };
        let count = value.as_array().map_or(1, Vec::len) as u64;
        let Some(shape) = shape(spec, self.signature.max_batch_size, count) else {
            return Err(Rejection::new(
                Reason::Shape,
                format!(
                    "{context}The schema can not convert input '{name}' to tensor with proper shape"
                ),
            ));
        };
        if !self.names.insert(name.to_string()) {
            return Err(Rejection::new(
                Reason::DuplicateInput,
                format!(
                    "{}input '{name}' already exists in request",
                    self.request.log_prefix()
                ),
            ));
        }
        let Some(data) = data(value, spec.datatype, shape.iter().product::<i64>() as u64) else {
            return Ok(Some("a value Triton reads its own way"));
        };
        self.request.inputs.push(InputTensor {
            name: Cow::Owned(name.to_string()),
            datatype: Cow::Borrowed(spec.datatype.as_str()),
            shape: Cow::Owned(shape),
            data,
        });
        Ok(None)
    }
}

/// The shape Triton gives `count` elements of an input: the model's shape (a leading batch
/// dimension when it batches), its first variable dimension taking what the fixed ones
/// leave, any other one 1; `None` when the count does not fit.
fn shape(spec: &InputSpec, max_batch_size: i32, count: u64) -> Option<Vec<i64>> {
    let mut shape: Vec<i64> = Vec::with_capacity(spec.dims.len() + 1);
    if max_batch_size > 0 {
        shape.push(-1);
    }
    shape.extend_from_slice(&spec.dims);
    let fixed: u64 = shape
        .iter()
        .filter(|&&d| d >= 0)
        .map(|&d| d as u64)
        .product();
    match shape.iter().position(|&d| d < 0) {
        None => (count == fixed).then_some(shape),
        Some(first) => {
            if fixed == 0 || !count.is_multiple_of(fixed) {
                return None;
            }
            for d in shape.iter_mut().skip(first + 1).filter(|d| **d < 0) {
                *d = 1;
            }
            shape[first] = i64::try_from(count / fixed).ok()?;
            Some(shape)
        }
    }
}

/// The tensor's data by size, when every element (arrays flattened) reads as `datatype`
/// and there are `elements` of them; `None` for what Triton refuses in its own words.
fn data(value: &Value, datatype: DataType, elements: u64) -> Option<TensorData> {
    let mut leaves = Vec::new();
    flatten(value, &mut leaves);
    if leaves.len() as u64 != elements {
        return None;
    }
    let fits = |leaf: &&Value| match datatype {
        DataType::Bool => leaf.is_boolean(),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => leaf.is_u64(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => leaf.is_i64(),
        DataType::Fp32 | DataType::Fp64 => leaf.is_number(),
        DataType::Bytes => leaf.is_string(),
        DataType::Fp16 | DataType::Bf16 => false,
    };
    if !leaves.iter().all(fits) {
        return None;
    }
    let byte_size = match datatype.size() {
        Some(size) => elements * size,
        None => leaves
            .iter()
            .map(|leaf| leaf.as_str().map_or(0, str::len) as u64 + 4)
            .sum(),
    };
    Some(TensorData::Elements {
        count: elements,
        byte_size,
    })
}

fn flatten<'a>(value: &'a Value, leaves: &mut Vec<&'a Value>) {
    match value {
        Value::Array(items) => items.iter().for_each(|item| flatten(item, leaves)),
        leaf => leaves.push(leaf),
    }
}

/// A top-level member: `parameters` keeps its members in order, like the top level.
#[derive(Debug)]
enum Member {
    Value(Value),
    Object(Vec<(String, Value)>),
}

/// An object's members in document order, repeated names kept (serde_json's map sorts and
/// drops them; Triton walks members in order and refuses an input given twice).
struct Members(Vec<(String, Member)>);

struct Ordered(Vec<(String, Value)>);

/// `parameters` as an object (its members in order) or as whatever else it is.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Parameters {
    Object(Ordered),
    Other(Value),
}

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Top;
        impl<'de> Visitor<'de> for Top {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    let member = if name == "parameters" {
                        match map.next_value::<Parameters>()? {
                            Parameters::Object(Ordered(members)) => Member::Object(members),
                            Parameters::Other(other) => Member::Value(other),
                        }
                    } else {
                        Member::Value(map.next_value()?)
                    };
                    members.push((name, member));
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Top)
    }
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Inner;
        impl<'de> Visitor<'de> for Inner {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut members = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    members.push((name, map.next_value()?));
                }
                Ok(Ordered(members))
            }
        }
        deserializer.deserialize_map(Inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(dims: &[i64]) -> InputSpec {
        InputSpec {
            name: "INPUT0".into(),
            datatype: DataType::Fp32,
            dims: dims.to_vec(),
            optional: false,
            allow_ragged_batch: false,
            is_shape_tensor: false,
        }
    }

    #[test]
    fn the_count_fills_the_first_variable_dimension() {
        assert_eq!(shape(&input(&[4]), 0, 4), Some(vec![4]));
        assert_eq!(shape(&input(&[4]), 0, 8), None);
        assert_eq!(shape(&input(&[4]), 8, 8), Some(vec![2, 4]));
        assert_eq!(shape(&input(&[4]), 8, 3), None);
        assert_eq!(shape(&input(&[-1, 2]), 4, 4), Some(vec![2, 1, 2]));
        assert_eq!(shape(&input(&[-1]), 0, 0), Some(vec![0]));
        assert_eq!(shape(&input(&[0, -1]), 0, 3), None);
    }

    #[test]
    fn inputs_come_from_the_top_level_and_from_parameters_in_order() {
        let signature = Signature {
            name: "m".into(),
            platform: "python".into(),
            max_batch_size: 0,
            instances: 1,
            decoupled: false,
            inputs: vec![
                input(&[2]),
                InputSpec {
                    name: "TEXT".into(),
                    datatype: DataType::Bytes,
                    dims: vec![1],
                    ..input(&[1])
                },
            ],
            outputs: vec![],
        };
        let body = br#"{"id": "r1", "TEXT": "hi", "parameters": {"INPUT0": [1, 2], "t": 0.5}}"#;
        let parsed = parse(body, &signature).unwrap();
        assert_eq!(
            parsed,
            Generate::Unvalidated("a parameter Triton refuses"),
            "a float parameter"
        );
        let body = br#"{"id": "r1", "TEXT": "hi", "parameters": {"INPUT0": [1, 2], "t": 1}}"#;
        let Generate::Request(request) = parse(body, &signature).unwrap() else {
            panic!("read")
        };
        assert_eq!(request.id, "r1");
        let names: Vec<_> = request
            .inputs
            .iter()
            .map(|i| (&*i.name, i.shape.to_vec(), i.data.byte_size()))
            .collect();
        assert_eq!(names, [("TEXT", vec![1], 6), ("INPUT0", vec![2], 8)]);
        let refused = parse(br#"{"parameters": {"INPUT0": 3}}"#, &signature).unwrap_err();
        assert_eq!(
            refused.message,
            "Converting keyword: 'parameters': The schema can not convert input 'INPUT0' to tensor with proper shape"
        );
        let twice = parse(br#"{"INPUT0": [1, 2], "INPUT0": [3, 4]}"#, &signature).unwrap_err();
        assert_eq!(
            twice.message,
            "[request id: <id_unknown>] input 'INPUT0' already exists in request"
        );
        assert_eq!(
            parse(b"[1]", &signature).unwrap(),
            Generate::Unvalidated("not a JSON object")
        );
        assert_eq!(
            parse(br#"{"INPUT0": [1, "x"]}"#, &signature).unwrap(),
            Generate::Unvalidated("a value Triton reads its own way")
        );
    }
}
