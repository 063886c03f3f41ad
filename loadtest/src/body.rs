//! KServe v2 HTTP request bodies: plain JSON tensors or the binary tensor
//! extension, plus the `--body-size` shape search.
//!
//! Bodies are encoded once before the run; the transport then sends the same
//! `Bytes` (a cheap reference-counted clone) over and over, so encoding cost
//! never shows up in the measured latency.

use anyhow::{Result, bail};
use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::Serialize;

use crate::data::{DataMode, Tensor, Values};
use crate::sequence::SequenceParams;
use crate::spec::{DataType, TensorSpec};

/// How tensors are carried in the HTTP body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Tensor data as JSON arrays in `"data"`.
    Json,
    /// The binary tensor extension: a JSON header followed by raw bytes,
    /// with `Inference-Header-Content-Length` giving the header's length.
    Binary,
}

/// A ready-to-send request body and the content headers that go with it.
#[derive(Debug, Clone)]
pub struct EncodedBody {
    /// The full body.
    pub bytes: Bytes,
    /// Length of the JSON header, for the `Inference-Header-Content-Length`
    /// header; `None` for plain JSON bodies.
    pub header_len: Option<usize>,
}

impl EncodedBody {
    /// The `Content-Type` to send with this body.
    pub fn content_type(&self) -> &'static str {
        if self.header_len.is_some() {
            "application/octet-stream"
        } else {
            "application/json"
        }
    }
}

#[derive(Serialize)]
struct RequestJson<'a> {
    inputs: Vec<InputJson<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    outputs: Vec<OutputJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<RequestParams<'a>>,
}

#[derive(Serialize)]
struct InputJson<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<InputParams>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<DataJson<'a>>,
}

#[derive(Serialize)]
struct InputParams {
    binary_data_size: usize,
}

#[derive(Serialize)]
struct OutputJson<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<OutputParams>,
}

#[derive(Serialize)]
struct OutputParams {
    binary_data: bool,
}

#[derive(Serialize)]
struct RequestParams<'a> {
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    sequence: Option<SequenceParams<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    binary_data_output: bool,
}

#[derive(Serialize)]
#[serde(untagged)]
enum DataJson<'a> {
    Bool(&'a [bool]),
    Int(&'a [i64]),
    Uint(&'a [u64]),
    F32(&'a [f32]),
    F64(&'a [f64]),
    Str(&'a [String]),
}

impl<'a> From<&'a Values> for DataJson<'a> {
    fn from(v: &'a Values) -> Self {
        match v {
            Values::Bool(v) => DataJson::Bool(v),
            Values::Int(v) => DataJson::Int(v),
            Values::Uint(v) => DataJson::Uint(v),
            Values::F32(v) => DataJson::F32(v),
            Values::F64(v) => DataJson::F64(v),
            Values::Str(v) => DataJson::Str(v),
        }
    }
}

/// Encodes an inference request.
///
/// `outputs` names the outputs to request; when empty the server returns all
/// of them. In binary mode each named output asks for
/// `"parameters":{"binary_data":true}`, and with no names the request-level
/// `"binary_data_output":true` asks for every output in binary form.
pub fn encode(tensors: &[Tensor], outputs: &[String], encoding: Encoding) -> Result<EncodedBody> {
    encode_with(tensors, outputs, encoding, None)
}

/// `encode`, with a sequence's `sequence_id`, `sequence_start` and `sequence_end` among the
/// request's `parameters` when given (sequence mode).
pub fn encode_with(
    tensors: &[Tensor],
    outputs: &[String],
    encoding: Encoding,
    sequence: Option<SequenceParams<'_>>,
) -> Result<EncodedBody> {
    if tensors.is_empty() {
        bail!("a request needs at least one input tensor");
    }
    let binary = encoding == Encoding::Binary;
    let request = RequestJson {
        inputs: tensors
            .iter()
            .map(|t| InputJson {
                name: &t.spec.name,
                datatype: t.spec.datatype.as_str(),
                shape: &t.spec.shape,
                parameters: binary.then(|| InputParams {
                    binary_data_size: t.raw_len(),
                }),
                data: (!binary).then(|| DataJson::from(&t.values)),
            })
            .collect(),
        outputs: outputs
            .iter()
            .map(|name| OutputJson {
                name,
                parameters: binary.then_some(OutputParams { binary_data: true }),
            })
            .collect(),
        parameters: {
            let binary_data_output = binary && outputs.is_empty();
            (binary_data_output || sequence.is_some()).then_some(RequestParams {
                sequence,
                binary_data_output,
            })
        },
    };
    let mut body = serde_json::to_vec(&request)?;
    if !binary {
        return Ok(EncodedBody {
            bytes: body.into(),
            header_len: None,
        });
    }
    let header_len = body.len();
    body.reserve_exact(tensors.iter().map(Tensor::raw_len).sum());
    for t in tensors {
        t.write_raw(&mut body);
    }
    Ok(EncodedBody {
        bytes: body.into(),
        header_len: Some(header_len),
    })
}

/// Generates `count` bodies for the same specs with different random values
/// (or one body for fixed data), so a server that caches by content cannot
/// flatter the numbers. The RNG is seeded from `seed` for reproducibility.
pub fn build_bodies(
    specs: &[TensorSpec],
    outputs: &[String],
    encoding: Encoding,
    mode: DataMode,
    seed: u64,
    count: usize,
) -> Result<Vec<EncodedBody>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let count = if mode == DataMode::Fixed {
        1
    } else {
        count.max(1)
    };
    (0..count)
        .map(|_| {
            let tensors: Vec<Tensor> = specs
                .iter()
                .map(|s| Tensor::generate(s, mode, &mut rng))
                .collect();
            encode(&tensors, outputs, encoding)
        })
        .collect()
}

/// Finds the shape `[N]` of a single FP32 input named `name` whose encoded
/// request is as close as possible to `target` bytes without exceeding it
/// (`--body-size`). Used to benchmark body-size limits and validation cost.
///
/// Binary bodies are exact (4 bytes per element after the header). JSON
/// bodies depend on how many digits each random number prints, so the
/// element count is estimated from a sample and then corrected.
pub fn spec_for_body_size(
    name: &str,
    target: u64,
    outputs: &[String],
    encoding: Encoding,
    mode: DataMode,
    seed: u64,
) -> Result<TensorSpec> {
    let measure = |n: usize| -> Result<u64> {
        let spec = TensorSpec {
            name: name.to_string(),
            datatype: DataType::Fp32,
            shape: vec![n],
        };
        let body = build_bodies(&[spec], outputs, encoding, mode, seed, 1)?;
        Ok(body[0].bytes.len() as u64)
    };
    let base = measure(1)?;
    if target <= base {
        bail!("--body-size {target} B is smaller than the smallest possible request ({base} B)");
    }
    // Estimate bytes per element from a sample, then refine a few times.
    let sample = 1024usize;
    let per_elem = ((measure(sample)? - base) as f64 / (sample - 1) as f64).max(1.0);
    let mut n = 1 + ((target - base) as f64 / per_elem) as usize;
    for _ in 0..8 {
        let size = measure(n)?;
        if size <= target && target - size < per_elem.ceil() as u64 * 2 {
            break;
        }
        let delta = (target as f64 - size as f64) / per_elem;
        let next = (n as f64 + delta).floor().max(1.0) as usize;
        if next == n {
            break;
        }
        n = next;
    }
    while n > 1 && measure(n)? > target {
        n -= (n / 1000).max(1);
    }
    Ok(TensorSpec {
        name: name.to_string(),
        datatype: DataType::Fp32,
        shape: vec![n],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn tensor(spec: &str, values: Values) -> Tensor {
        Tensor {
            spec: spec.parse().unwrap(),
            values,
        }
    }

    fn add_sub_inputs() -> Vec<Tensor> {
        vec![
            tensor("INPUT0:FP32:4", Values::F32(vec![1.0, 2.0, 3.0, 4.5])),
            tensor("INPUT1:FP32:4", Values::F32(vec![0.5, 0.25, 0.0, 1.0])),
        ]
    }

    #[test]
    fn json_body_matches_kserve_v2() {
        let body = encode(&add_sub_inputs(), &[], Encoding::Json).unwrap();
        assert_eq!(body.header_len, None);
        assert_eq!(body.content_type(), "application/json");
        let v: Value = serde_json::from_slice(&body.bytes).unwrap();
        assert_eq!(
            v,
            json!({"inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.5]},
                {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [0.5, 0.25, 0.0, 1.0]}
            ]})
        );
    }

    #[test]
    fn json_body_carries_every_type_family() {
        let tensors = vec![
            tensor("B:BOOL:2", Values::Bool(vec![true, false])),
            tensor("I:INT64:1x2", Values::Int(vec![-5, 7])),
            tensor("U:UINT16:2", Values::Uint(vec![1, 2])),
            tensor("H:FP16:1", Values::F32(vec![0.5])),
            tensor("D:FP64:1", Values::F64(vec![0.25])),
            tensor("S:BYTES:2", Values::Str(vec!["ab".into(), "c".into()])),
        ];
        let body = encode(&tensors, &["OUT".to_string()], Encoding::Json).unwrap();
        let v: Value = serde_json::from_slice(&body.bytes).unwrap();
        assert_eq!(v["inputs"][0]["data"], json!([true, false]));
        assert_eq!(v["inputs"][1]["data"], json!([-5, 7]));
        assert_eq!(v["inputs"][1]["shape"], json!([1, 2]));
        assert_eq!(v["inputs"][2]["data"], json!([1, 2]));
        assert_eq!(v["inputs"][3]["data"], json!([0.5]));
        assert_eq!(v["inputs"][3]["datatype"], "FP16");
        assert_eq!(v["inputs"][4]["data"], json!([0.25]));
        assert_eq!(v["inputs"][5]["data"], json!(["ab", "c"]));
        // JSON mode asks for outputs by name, without binary parameters.
        assert_eq!(v["outputs"], json!([{"name": "OUT"}]));
        assert!(v.get("parameters").is_none());
    }

    #[test]
    fn binary_body_has_header_then_raw_tensors() {
        let body = encode(&add_sub_inputs(), &[], Encoding::Binary).unwrap();
        let hlen = body.header_len.unwrap();
        assert_eq!(body.content_type(), "application/octet-stream");
        let header: Value = serde_json::from_slice(&body.bytes[..hlen]).unwrap();
        assert_eq!(
            header,
            json!({
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
                    {"name": "INPUT1", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}}
                ],
                "parameters": {"binary_data_output": true}
            })
        );
        let raw = &body.bytes[hlen..];
        assert_eq!(raw.len(), 32);
        let first: Vec<f32> = raw[..16]
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(first, vec![1.0, 2.0, 3.0, 4.5]);
        assert_eq!(&raw[16..20], &0.5f32.to_le_bytes());
    }

    #[test]
    fn binary_body_requests_named_outputs_as_binary() {
        let outs = vec!["OUTPUT0".to_string(), "OUTPUT1".to_string()];
        let body = encode(&add_sub_inputs(), &outs, Encoding::Binary).unwrap();
        let hlen = body.header_len.unwrap();
        let header: Value = serde_json::from_slice(&body.bytes[..hlen]).unwrap();
        assert_eq!(
            header["outputs"],
            json!([
                {"name": "OUTPUT0", "parameters": {"binary_data": true}},
                {"name": "OUTPUT1", "parameters": {"binary_data": true}}
            ])
        );
        assert!(header.get("parameters").is_none());
    }

    #[test]
    fn binary_bytes_tensor_uses_length_prefixes() {
        let tensors = vec![tensor(
            "S:BYTES:3",
            Values::Str(vec!["hi".into(), "".into(), "xyz".into()]),
        )];
        let body = encode(&tensors, &[], Encoding::Binary).unwrap();
        let hlen = body.header_len.unwrap();
        let header: Value = serde_json::from_slice(&body.bytes[..hlen]).unwrap();
        assert_eq!(
            header["inputs"][0]["parameters"]["binary_data_size"],
            4 + 2 + 4 + 4 + 3
        );
        assert_eq!(
            &body.bytes[hlen..],
            &[
                2, 0, 0, 0, b'h', b'i', 0, 0, 0, 0, 3, 0, 0, 0, b'x', b'y', b'z'
            ][..]
        );
    }

    #[test]
    fn binary_fp16_and_ints_are_narrowed() {
        let tensors = vec![
            tensor("H:FP16:2", Values::F32(vec![1.0, -2.0])),
            tensor("I:INT8:2", Values::Int(vec![-1, 5])),
            tensor("U:UINT32:1", Values::Uint(vec![258])),
        ];
        let body = encode(&tensors, &[], Encoding::Binary).unwrap();
        let hlen = body.header_len.unwrap();
        assert_eq!(
            &body.bytes[hlen..],
            &[0x00, 0x3c, 0x00, 0xc0, 0xff, 0x05, 0x02, 0x01, 0x00, 0x00][..]
        );
    }

    #[test]
    fn empty_request_is_refused() {
        assert!(encode(&[], &[], Encoding::Json).is_err());
    }

    #[test]
    fn random_bodies_differ_fixed_bodies_do_not_multiply() {
        let specs = vec!["INPUT0:FP32:4".parse().unwrap()];
        let r = build_bodies(&specs, &[], Encoding::Json, DataMode::Random, 1, 4).unwrap();
        assert_eq!(r.len(), 4);
        assert_ne!(r[0].bytes, r[1].bytes);
        let again = build_bodies(&specs, &[], Encoding::Json, DataMode::Random, 1, 4).unwrap();
        assert_eq!(r[0].bytes, again[0].bytes, "same seed, same bodies");
        let f = build_bodies(&specs, &[], Encoding::Json, DataMode::Fixed, 1, 4).unwrap();
        assert_eq!(f.len(), 1);
    }

    #[test]
    fn body_size_search_lands_close_below_target() {
        for (encoding, mode) in [
            (Encoding::Binary, DataMode::Random),
            (Encoding::Json, DataMode::Random),
            (Encoding::Json, DataMode::Fixed),
        ] {
            let target = 100_000;
            let spec = spec_for_body_size("INPUT0", target, &[], encoding, mode, 9).unwrap();
            assert_eq!(spec.datatype, DataType::Fp32);
            let body = build_bodies(&[spec], &[], encoding, mode, 9, 1).unwrap();
            let len = body[0].bytes.len() as u64;
            assert!(len <= target, "{encoding:?}: {len} > {target}");
            assert!(
                len > target * 98 / 100,
                "{encoding:?}: {len} too far below {target}"
            );
        }
        assert!(spec_for_body_size("INPUT0", 10, &[], Encoding::Json, DataMode::Fixed, 0).is_err());
    }
}
