//! `validate`: every inference request is checked against the model's signature before it
//! is sent to a backend, so a malformed request costs Triton nothing and the client still
//! gets Triton's own words for what was wrong (HTTP 400, `{"error": "..."}`).
//!
//! The stage has three parts, so gRPC can reuse all but the first:
//! - a front-end reader turns the wire format into a protocol-neutral `InferRequest` (input
//!   names, datatypes, shapes, and where the data is, by size): `http::parse` for HTTP/REST,
//!   with the checks Triton's HTTP reader makes while reading;
//! - `check` compares that request with the model's `Signature`, in Triton's order;
//! - `SignatureCache` holds signatures per (model, version), fetched from a backend that
//!   serves the model.
//!
//! Never refuse what Triton would accept: when the signature cannot be had, or the request
//! is of a kind the gateway does not read (compressed, raw binary), it is forwarded as it
//! came. Checks were measured against Triton 2.51 request by request (tests/validation.rs
//! replays them against a real server).

pub mod check;
pub mod datatype;
pub mod http;
pub mod json;
pub mod request;
pub mod signature;
pub mod triton_order;

pub use check::check;
pub use datatype::DataType;
pub use request::{InferRequest, InputTensor, Reason, Rejection, TensorData};
pub use signature::{InputSpec, Signature, SignatureCache};

use crate::Gateway;
use crate::error::GatewayError;
use crate::pipeline::ModelRef;
use crate::upstream::Backend;
use axum::body::Body;
use axum::extract::Request;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use std::sync::Arc;

/// The `Inference-Header-Content-Length` header of the binary tensor extension.
const HEADER_LENGTH: &str = "inference-header-content-length";

/// Checks an HTTP request to `model` before it is forwarded to `backend`, and returns the
/// request to forward. Only inference requests with `validation.enabled` are read (their
/// body is collected once and forwarded as those same bytes); anything else, and any
/// inference request whose signature is unavailable, passes through untouched and streaming.
pub async fn http_request(
    gateway: &Gateway,
    backend: &Arc<Backend>,
    model: &ModelRef,
    request: Request,
) -> Result<Request, GatewayError> {
    let is_infer =
        request.method() == ::http::Method::POST && request.uri().path().ends_with("/infer");
    if !gateway.config().validation.enabled || !is_infer {
        return Ok(request);
    }
    let Some(signature) = gateway.signatures().get(backend, model).await else {
        return Ok(request);
    };
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let body = collect(
        body,
        gateway.config().server.max_body_size.bytes(),
        declared,
    )
    .await?;
    let header = |name| parts.headers.get(name).map(::http::HeaderValue::as_bytes);
    let outcome = match http::parse(
        &body,
        header(HEADER_LENGTH),
        header(::http::header::CONTENT_ENCODING.as_str()),
        &model.name,
    ) {
        Ok(http::Parsed::Request(parsed)) => check(&parsed, &signature),
        Ok(http::Parsed::Raw) => check::check_raw(body.len() as u64, &signature),
        Ok(http::Parsed::Unvalidated(why)) => {
            tracing::debug!(model = %model.name, why, "inference request forwarded unvalidated");
            Ok(())
        }
        Err(rejection) => Err(rejection),
    };
    match outcome {
        Ok(()) => Ok(Request::from_parts(parts, Body::from(body))),
        Err(rejection) => {
            metrics::counter!(crate::telemetry::VALIDATION_REJECTIONS,
                "model" => model.name.clone(),
                "reason" => rejection.reason.as_str())
            .increment(1);
            Err(GatewayError::InvalidInput {
                reason: rejection.reason.as_str(),
                message: rejection.message,
            })
        }
    }
}

/// The whole body, read within the body limit (a body that is already limited answers with
/// `BodyTooLarge` once it passes it). A body that arrives in one chunk is kept as it is; one
/// in several is copied once into a buffer sized by `Content-Length`, so a request never
/// holds much more than its own size.
pub(crate) async fn collect(
    mut body: Body,
    limit: u64,
    declared: Option<u64>,
) -> Result<Bytes, GatewayError> {
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| read_error(&error, limit))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        match (&mut joined, first.take()) {
            (Some(buffer), _) => buffer.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(head)) => {
                let capacity = declared.unwrap_or(0).min(limit) as usize;
                let mut buffer = BytesMut::with_capacity(capacity.max(head.len() + data.len()));
                buffer.extend_from_slice(&head);
                buffer.extend_from_slice(&data);
                joined = Some(buffer);
            }
        }
    }
    Ok(match joined {
        Some(buffer) => buffer.freeze(),
        None => first.unwrap_or_default(),
    })
}

fn read_error(error: &axum::Error, limit: u64) -> GatewayError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<crate::body::BodyTooLarge>() {
            return GatewayError::BodyTooLarge { limit };
        }
        source = e.source();
    }
    GatewayError::BadRequest(format!("could not read request body: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(chunks: &[&'static str]) -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        Body::from_stream(futures_util::stream::iter(chunks))
    }

    #[tokio::test]
    async fn collects_a_body_once_within_the_limit() {
        let body = collect(chunked(&["ab", "cd", "e"]), 100, Some(5))
            .await
            .unwrap();
        assert_eq!(body, "abcde");
        let whole = Bytes::from_static(b"one chunk");
        let kept = collect(Body::from(whole.clone()), 100, None).await.unwrap();
        assert_eq!(
            kept.as_ptr(),
            whole.as_ptr(),
            "a single chunk is not copied"
        );
        assert!(collect(chunked(&[]), 100, None).await.unwrap().is_empty());
        let limited = crate::body::limited(chunked(&["abc", "def"]), 4);
        assert!(matches!(
            collect(limited, 4, None).await,
            Err(GatewayError::BodyTooLarge { limit: 4 })
        ));
    }
}
