//! Sequence mode (`--sequence-length L`), as `perf_analyzer --sequence-length` runs it
//! against a model with sequence batching: each of the `--concurrency` workers runs
//! sequences of L requests back to back, so N workers keep N sequences going at once. Every
//! request of a sequence carries its id (`sequence_id`: a number, or with
//! `--string-sequence-ids` a string), the first also `sequence_start`, the last
//! `sequence_end`.
//!
//! Each request's first input is filled with one small integer (1 to 9, changing along the
//! sequence), so that with `--check` every answer can be checked: its first output's first
//! element must be the running sum of those integers over the sequence so far. That is what
//! an accumulating sequence model answers (Triton's `simple_sequence` example,
//! `tests/models/sequence_sum`) when every request of the sequence reached the model
//! instance that saw it start; a request sent elsewhere answers another sum, or is refused.
//!
//! Requests are encoded when they are sent (each carries its own id and flags), which the
//! plain mode avoids: sequence mode is for correctness under load more than for the last
//! microsecond.

use anyhow::{Result, bail};
use bytes::Bytes;
use serde::Serialize;

use crate::body::{EncodedBody, Encoding, encode_with};
use crate::data::{DataMode, Tensor, Values};
use crate::spec::{DataType, TensorSpec};

/// The shape of a sequence run (closed loop only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequences {
    /// Requests per sequence.
    pub length: usize,
    /// The id of the first sequence; each next sequence takes the next number.
    pub first_id: u64,
    /// Send ids as strings (`seq-<n>`) instead of numbers.
    pub string_ids: bool,
}

/// A sequence id as it goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SequenceId {
    /// `"sequence_id": 17`
    Number(u64),
    /// `"sequence_id": "seq-17"`
    Text(String),
}

/// One request of a sequence: its id and flags, the value its first input carries, and the
/// running sum the answer must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceRequest {
    /// The sequence's id.
    pub id: SequenceId,
    /// First request of the sequence.
    pub start: bool,
    /// Last request of the sequence.
    pub end: bool,
    /// Every element of the first input.
    pub value: i64,
    /// The sum of `value` over the sequence up to and including this request.
    pub sum: i64,
}

/// The request-level `parameters` of a sequence request, in the order Triton's clients
/// write them.
#[derive(Debug, Clone, Serialize)]
pub struct SequenceParams<'a> {
    /// The id.
    pub sequence_id: &'a SequenceId,
    /// First request.
    pub sequence_start: bool,
    /// Last request.
    pub sequence_end: bool,
}

impl<'a> From<&'a SequenceRequest> for SequenceParams<'a> {
    fn from(r: &'a SequenceRequest) -> Self {
        Self {
            sequence_id: &r.id,
            sequence_start: r.start,
            sequence_end: r.end,
        }
    }
}

impl Sequences {
    /// The requests of sequence number `n` (0-based, over every worker) in order.
    pub fn requests(&self, n: u64) -> impl Iterator<Item = SequenceRequest> + '_ {
        let number = self.first_id + n;
        let id = if self.string_ids {
            SequenceId::Text(format!("seq-{number}"))
        } else {
            SequenceId::Number(number)
        };
        let mut sum = 0;
        (0..self.length).map(move |position| {
            let value = ((n + position as u64) % 9 + 1) as i64;
            sum += value;
            SequenceRequest {
                id: id.clone(),
                start: position == 0,
                end: position + 1 == self.length,
                value,
                sum,
            }
        })
    }
}

/// What every request of a sequence run is made from: the tensors (the first filled with
/// the request's value, the others with the fixed pattern), the outputs asked for and the
/// encoding.
#[derive(Debug, Clone)]
pub struct SequenceTemplate {
    specs: Vec<TensorSpec>,
    outputs: Vec<String>,
    encoding: Encoding,
}

impl SequenceTemplate {
    /// Checks that the first input can carry the values (a number type).
    pub fn new(specs: &[TensorSpec], outputs: &[String], encoding: Encoding) -> Result<Self> {
        let Some(first) = specs.first() else {
            bail!("--sequence-length needs an --input to carry the sequence's values");
        };
        if matches!(first.datatype, DataType::Bool | DataType::Bytes) {
            bail!(
                "--sequence-length fills the first input with numbers: {} is {}",
                first.name,
                first.datatype
            );
        }
        Ok(Self {
            specs: specs.to_vec(),
            outputs: outputs.to_vec(),
            encoding,
        })
    }

    /// The HTTP body of one request of a sequence (JSON, or binary with `--binary`).
    pub fn body(&self, request: &SequenceRequest) -> Result<EncodedBody> {
        let tensors = self.tensors(request.value);
        encode_with(
            &tensors,
            &self.outputs,
            self.encoding,
            Some(SequenceParams::from(request)),
        )
    }

    /// The tensors of a request whose first input carries `value`.
    pub fn tensors(&self, value: i64) -> Vec<Tensor> {
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(0);
        self.specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                if i > 0 {
                    return Tensor::generate(spec, DataMode::Fixed, &mut rng);
                }
                let n = spec.element_count();
                let values = match spec.datatype {
                    DataType::Fp16 | DataType::Fp32 => Values::F32(vec![value as f32; n]),
                    DataType::Fp64 => Values::F64(vec![value as f64; n]),
                    DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => {
                        Values::Uint(vec![value as u64; n])
                    }
                    _ => Values::Int(vec![value; n]),
                };
                Tensor {
                    spec: spec.clone(),
                    values,
                }
            })
            .collect()
    }
}

/// The first element of an output tensor sent as raw little-endian bytes, as a number.
pub fn first_raw_value(datatype: &str, raw: &[u8]) -> Option<f64> {
    fn take<const N: usize>(raw: &[u8]) -> Option<[u8; N]> {
        raw.get(..N)?.try_into().ok()
    }
    Some(match datatype {
        "FP32" => f32::from_le_bytes(take(raw)?) as f64,
        "FP64" => f64::from_le_bytes(take(raw)?),
        "INT8" => i8::from_le_bytes(take(raw)?) as f64,
        "INT16" => i16::from_le_bytes(take(raw)?) as f64,
        "INT32" => i32::from_le_bytes(take(raw)?) as f64,
        "INT64" => i64::from_le_bytes(take(raw)?) as f64,
        "UINT8" => u8::from_le_bytes(take(raw)?) as f64,
        "UINT16" => u16::from_le_bytes(take(raw)?) as f64,
        "UINT32" => u32::from_le_bytes(take(raw)?) as f64,
        "UINT64" => u64::from_le_bytes(take(raw)?) as f64,
        _ => return None,
    })
}

/// The first element of the first output of an HTTP answer: from its JSON `data`, or for a
/// binary answer (`binary_header_len` bytes of JSON, then the tensors) from the raw bytes.
pub fn first_http_value(body: &Bytes, binary_header_len: Option<usize>) -> Option<f64> {
    let header = &body[..binary_header_len.unwrap_or(body.len()).min(body.len())];
    let json: serde_json::Value = serde_json::from_slice(header).ok()?;
    let output = json.get("outputs")?.get(0)?;
    if let Some(data) = output.get("data") {
        return data.get(0)?.as_f64();
    }
    let start = binary_header_len?;
    first_raw_value(output.get("datatype")?.as_str()?, body.get(start..)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_carry_ids_flags_and_running_sums() {
        let plan = Sequences {
            length: 3,
            first_id: 100,
            string_ids: false,
        };
        let first: Vec<_> = plan.requests(0).collect();
        assert_eq!(first.len(), 3);
        assert!(first[0].start && !first[0].end);
        assert!(!first[1].start && !first[1].end);
        assert!(first[2].end);
        assert!(first.iter().all(|r| r.id == SequenceId::Number(100)));
        assert_eq!(
            first.iter().map(|r| (r.value, r.sum)).collect::<Vec<_>>(),
            [(1, 1), (2, 3), (3, 6)]
        );
        let text = Sequences {
            string_ids: true,
            ..plan
        };
        assert_eq!(
            text.requests(8).next().unwrap().id,
            SequenceId::Text("seq-108".into())
        );
        let one = Sequences { length: 1, ..plan };
        let only = one.requests(0).next().unwrap();
        assert!(only.start && only.end);
    }

    #[test]
    fn bodies_carry_the_sequence_parameters_after_the_inputs() {
        let template =
            SequenceTemplate::new(&["INPUT0:FP32:1".parse().unwrap()], &[], Encoding::Json)
                .unwrap();
        let request = Sequences {
            length: 2,
            first_id: 7,
            string_ids: true,
        }
        .requests(0)
        .next()
        .unwrap();
        let body = template.body(&request).unwrap();
        let text = std::str::from_utf8(&body.bytes).unwrap();
        assert_eq!(
            text,
            r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1.0]}],"parameters":{"sequence_id":"seq-7","sequence_start":true,"sequence_end":false}}"#
        );
        let binary = SequenceTemplate::new(&["X:INT32:2".parse().unwrap()], &[], Encoding::Binary)
            .unwrap()
            .body(&request)
            .unwrap();
        let header: serde_json::Value =
            serde_json::from_slice(&binary.bytes[..binary.header_len.unwrap()]).unwrap();
        assert_eq!(header["parameters"]["binary_data_output"], true);
        assert_eq!(header["parameters"]["sequence_id"], "seq-7");
        assert!(
            SequenceTemplate::new(&["S:BYTES:1".parse().unwrap()], &[], Encoding::Json).is_err()
        );
    }

    #[test]
    fn reads_the_first_output_value() {
        let json = Bytes::from_static(
            br#"{"outputs":[{"name":"O","datatype":"FP32","shape":[1],"data":[6.0]}]}"#,
        );
        assert_eq!(first_http_value(&json, None), Some(6.0));
        let header = br#"{"outputs":[{"name":"O","datatype":"INT32","shape":[1],"parameters":{"binary_data_size":4}}]}"#;
        let mut binary = header.to_vec();
        binary.extend_from_slice(&9i32.to_le_bytes());
        assert_eq!(
            first_http_value(&Bytes::from(binary), Some(header.len())),
            Some(9.0)
        );
        assert_eq!(first_raw_value("FP64", &2.5f64.to_le_bytes()), Some(2.5));
        assert_eq!(first_raw_value("BYTES", b"x"), None);
    }
}
