//! The KServe v2 gRPC transport (`inference.GRPCInferenceService/ModelInfer`), on tonic.
//!
//! Requests are encoded to protobuf once, before the run, from the same pre-built bodies as
//! HTTP's binary mode (the JSON header names the tensors, the raw bytes become
//! `raw_input_contents`), and sent as bytes through a pass-through codec: the per-request
//! cost on the client is one copy into the HTTP/2 frame, so what is measured is the server.
//!
//! `connections` channels (one HTTP/2 connection each) are opened and requests are spread
//! over them by sequence number; every channel multiplexes any number of requests.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::body::EncodedBody;
use crate::outcome::ErrorKind;
use crate::sequence::{SequenceId, SequenceRequest, SequenceTemplate, first_raw_value};
use crate::transport::Transport;

/// Triton's protobuf messages, compiled from the repository's `proto/` by build.rs.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("inference");
}

/// The path of a `ModelInfer` call (the fake answers it too).
pub(crate) const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";

/// The URI requests go to, for messages and the report: `{url}/inference.GRPCInferenceService/ModelInfer`.
pub fn infer_uri(url: &str) -> Result<http::Uri> {
    let base = url.trim_end_matches('/');
    if !base.starts_with("http://") {
        bail!("--url must be http://host:port of a gRPC endpoint (got {url:?})");
    }
    format!("{base}{MODEL_INFER}")
        .parse()
        .with_context(|| format!("invalid --url {url:?}"))
}

/// Per-step knobs of the gRPC transport.
#[derive(Debug, Clone, Copy)]
pub struct GrpcOptions {
    /// HTTP/2 connections to open; requests are spread over them.
    pub connections: usize,
    /// Decode each response and require output tensors (`--check`).
    pub check: bool,
}

/// Sends pre-encoded `ModelInferRequest`s over tonic channels.
pub struct GrpcTransport {
    channels: Vec<tonic::client::Grpc<Channel>>,
    requests: Vec<Bytes>,
    metadata: MetadataMap,
    /// Sequence mode: what each request is made from, and the model it names.
    sequences: Option<(SequenceTemplate, String, String)>,
    check: bool,
}

impl GrpcTransport {
    /// Prepares `options.connections` lazily connected channels to `url`
    /// (`http://host:port`), and one protobuf request per body.
    pub fn new(
        url: &str,
        model: &str,
        version: Option<&str>,
        bodies: &[EncodedBody],
        headers: &http::HeaderMap,
        options: GrpcOptions,
    ) -> Result<Self> {
        if !url.starts_with("http://") {
            bail!("--url must be http://host:port of a gRPC endpoint (got {url:?})");
        }
        let endpoint = Endpoint::from_shared(url.trim_end_matches('/').to_owned())
            .with_context(|| format!("invalid --url {url:?}"))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .http2_adaptive_window(true);
        let channels = (0..options.connections.max(1))
            .map(|_| {
                tonic::client::Grpc::new(endpoint.connect_lazy())
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX)
            })
            .collect();
        let requests = bodies
            .iter()
            .map(|body| infer_request(model, version, body).map(|r| Bytes::from(r.encode_to_vec())))
            .collect::<Result<_>>()?;
        let mut metadata = MetadataMap::new();
        for (name, value) in headers {
            let key = MetadataKey::from_bytes(name.as_str().as_bytes())
                .with_context(|| format!("header {name} is not valid gRPC metadata"))?;
            let value = MetadataValue::try_from(value.as_bytes())
                .with_context(|| format!("header {name} is not valid gRPC metadata"))?;
            metadata.insert(key, value);
        }
        Ok(Self {
            channels,
            requests,
            metadata,
            sequences: None,
            check: options.check,
        })
    }

    /// Sequence mode: `infer_sequence` builds each request from `template` (binary
    /// encoding: tensors as raw contents) for `model` and `version`.
    pub fn with_sequences(
        mut self,
        template: SequenceTemplate,
        model: &str,
        version: Option<&str>,
    ) -> Self {
        self.sequences = Some((
            template,
            model.to_owned(),
            version.unwrap_or_default().to_owned(),
        ));
        self
    }

    async fn send(&self, channel: usize, body: Bytes) -> Result<Bytes, ErrorKind> {
        let mut client = self.channels[channel % self.channels.len()].clone();
        let mut request = tonic::Request::new(body);
        *request.metadata_mut() = self.metadata.clone();
        client.ready().await.map_err(|_| ErrorKind::Connect)?;
        let path = http::uri::PathAndQuery::from_static(MODEL_INFER);
        match client.unary(request, path, RawCodec).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(classify(&status)),
        }
    }
}

impl Transport for GrpcTransport {
    async fn infer(&self, seq: u64) -> Result<(), ErrorKind> {
        let body = self.requests[seq as usize % self.requests.len()].clone();
        let answer = self.send(seq as usize, body).await?;
        if self.check {
            check_response(&answer)
        } else {
            Ok(())
        }
    }

    async fn infer_sequence(&self, request: &SequenceRequest) -> Result<(), ErrorKind> {
        let (template, model, version) = self.sequences.as_ref().ok_or(ErrorKind::Request)?;
        let message =
            sequence_request(template, model, version, request).map_err(|_| ErrorKind::Request)?;
        // One sequence stays on one channel, as a client keeps one connection.
        let channel = match &request.id {
            SequenceId::Number(n) => *n as usize,
            SequenceId::Text(text) => text.bytes().map(usize::from).sum(),
        };
        let answer = self
            .send(channel, Bytes::from(message.encode_to_vec()))
            .await?;
        if !self.check {
            return Ok(());
        }
        let response =
            pb::ModelInferResponse::decode(answer).map_err(|_| ErrorKind::CheckBadJson)?;
        let output = response.outputs.first().ok_or(ErrorKind::CheckNoOutputs)?;
        let value = match response.raw_output_contents.first() {
            Some(raw) => first_raw_value(&output.datatype, raw),
            None => output.contents.as_ref().and_then(first_typed_value),
        };
        if value == Some(request.sum as f64) {
            Ok(())
        } else {
            Err(ErrorKind::CheckSequenceSum)
        }
    }
}

/// A sequence's `ModelInferRequest`: its tensors as raw contents, and `sequence_id`
/// (`int64_param`, or `string_param`), `sequence_start` and `sequence_end` (`bool_param`)
/// among its parameters, as Triton's gRPC clients send them.
pub fn sequence_request(
    template: &SequenceTemplate,
    model: &str,
    version: &str,
    request: &SequenceRequest,
) -> Result<pb::ModelInferRequest> {
    use pb::infer_parameter::ParameterChoice;
    let body = template.body(request)?;
    let mut message = infer_request(model, Some(version), &body)?;
    let id = match &request.id {
        SequenceId::Number(n) => ParameterChoice::Int64Param(*n as i64),
        SequenceId::Text(text) => ParameterChoice::StringParam(text.clone()),
    };
    for (name, choice) in [
        ("sequence_id", id),
        ("sequence_start", ParameterChoice::BoolParam(request.start)),
        ("sequence_end", ParameterChoice::BoolParam(request.end)),
    ] {
        message.parameters.insert(
            name.to_owned(),
            pb::InferParameter {
                parameter_choice: Some(choice),
            },
        );
    }
    Ok(message)
}

/// The first element of an output sent as typed `contents`.
fn first_typed_value(contents: &pb::InferTensorContents) -> Option<f64> {
    None.or_else(|| contents.fp32_contents.first().map(|v| *v as f64))
        .or_else(|| contents.fp64_contents.first().copied())
        .or_else(|| contents.int_contents.first().map(|v| *v as f64))
        .or_else(|| contents.int64_contents.first().map(|v| *v as f64))
        .or_else(|| contents.uint_contents.first().map(|v| *v as f64))
        .or_else(|| contents.uint64_contents.first().map(|v| *v as f64))
}

/// A transport failure (tonic made the status from an error: it has a source) is `connect`
/// or `request`; the server's own status is `grpc_<code>`.
fn classify(status: &Status) -> ErrorKind {
    let Some(source) = std::error::Error::source(status) else {
        return ErrorKind::Grpc(status.code() as i32);
    };
    let mut next = Some(source);
    while let Some(error) = next {
        if error.is::<tonic::ConnectError>() {
            return ErrorKind::Connect;
        }
        next = error.source();
    }
    if status.code() == Code::Unavailable {
        ErrorKind::Request
    } else {
        ErrorKind::Grpc(status.code() as i32)
    }
}

/// `--check`: the answer is a `ModelInferResponse` with outputs.
fn check_response(bytes: &Bytes) -> Result<(), ErrorKind> {
    match pb::ModelInferResponse::decode(bytes.clone()) {
        Ok(response) if !response.outputs.is_empty() => Ok(()),
        Ok(_) => Err(ErrorKind::CheckNoOutputs),
        Err(_) => Err(ErrorKind::CheckBadJson),
    }
}

/// A `ModelInferRequest` from a binary-extension body: the JSON header gives each input's
/// name, datatype, shape and `binary_data_size`, the raw bytes follow in input order.
pub fn infer_request(
    model: &str,
    version: Option<&str>,
    body: &EncodedBody,
) -> Result<pb::ModelInferRequest> {
    let Some(header_len) = body.header_len else {
        bail!("the gRPC transport needs binary bodies (tensors as raw bytes)");
    };
    let header: serde_json::Value =
        serde_json::from_slice(&body.bytes[..header_len]).context("request header is not JSON")?;
    let mut raw = body.bytes.slice(header_len..);
    let mut request = pb::ModelInferRequest {
        model_name: model.to_owned(),
        model_version: version.unwrap_or_default().to_owned(),
        ..Default::default()
    };
    for input in header["inputs"].as_array().into_iter().flatten() {
        let size = input["parameters"]["binary_data_size"]
            .as_u64()
            .context("an input has no binary_data_size")? as usize;
        if size > raw.len() {
            bail!("an input's binary_data_size is past the end of the body");
        }
        request
            .inputs
            .push(pb::model_infer_request::InferInputTensor {
                name: input["name"].as_str().unwrap_or_default().to_owned(),
                datatype: input["datatype"].as_str().unwrap_or_default().to_owned(),
                shape: input["shape"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(serde_json::Value::as_i64)
                    .collect(),
                ..Default::default()
            });
        request.raw_input_contents.push(raw.split_to(size));
    }
    for output in header["outputs"].as_array().into_iter().flatten() {
        request
            .outputs
            .push(pb::model_infer_request::InferRequestedOutputTensor {
                name: output["name"].as_str().unwrap_or_default().to_owned(),
                ..Default::default()
            });
    }
    if request.inputs.is_empty() {
        bail!("a request needs at least one input tensor");
    }
    Ok(request)
}

/// Sends and receives messages as the bytes they already are.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::{Encoding, encode};
    use crate::data::{DataMode, Tensor};
    use rand::SeedableRng;

    #[test]
    fn binary_bodies_become_infer_requests() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let tensors: Vec<Tensor> = ["INPUT0:FP32:4", "INPUT1:BYTES:2"]
            .iter()
            .map(|s| Tensor::generate(&s.parse().unwrap(), DataMode::Fixed, &mut rng))
            .collect();
        let body = encode(&tensors, &["OUTPUT0".into()], Encoding::Binary).unwrap();
        let request = infer_request("add_sub", Some("2"), &body).unwrap();
        assert_eq!(request.model_name, "add_sub");
        assert_eq!(request.model_version, "2");
        assert_eq!(request.inputs.len(), 2);
        assert_eq!(request.inputs[0].name, "INPUT0");
        assert_eq!(request.inputs[0].shape, [4]);
        assert_eq!(request.inputs[1].datatype, "BYTES");
        assert_eq!(request.raw_input_contents[0].len(), 16);
        let mut expected = Vec::new();
        tensors[1].write_raw(&mut expected);
        assert_eq!(request.raw_input_contents[1], expected);
        assert_eq!(request.outputs[0].name, "OUTPUT0");

        let json = encode(&tensors, &[], Encoding::Json).unwrap();
        assert!(infer_request("add_sub", None, &json).is_err());
    }

    #[test]
    fn server_statuses_are_named_by_code() {
        assert_eq!(
            classify(&Status::unavailable("no backend")),
            ErrorKind::Grpc(14)
        );
        assert_eq!(ErrorKind::Grpc(14).name(), "grpc_14");
    }
}
