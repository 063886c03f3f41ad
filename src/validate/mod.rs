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
use bytes::Bytes;
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
    let body = collect(body, gateway.config().server.max_body_size.bytes()).await?;
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
/// `BodyTooLarge` once it passes it).
async fn collect(body: Body, limit: u64) -> Result<Bytes, GatewayError> {
    match body.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) => {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
            while let Some(e) = source {
                if e.is::<crate::body::BodyTooLarge>() {
                    return Err(GatewayError::BodyTooLarge { limit });
                }
                source = e.source();
            }
            Err(GatewayError::BadRequest(format!(
                "could not read request body: {error}"
            )))
        }
    }
}
