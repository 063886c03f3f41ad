//! `validate`: every inference request is checked against the model's signature before it
//! is sent to a backend, so a malformed request costs Triton nothing and the client still
//! gets Triton's own words for what was wrong (HTTP 400, `{"error": "..."}`).
//!
//! The phase has three parts, so gRPC can reuse all but the first:
//! - a reader turns the wire format into a protocol-neutral `InferRequest` (input names,
//!   datatypes, shapes, and where the data is, by size): `http::parse` for HTTP/REST's JSON
//!   and binary bodies, with the checks Triton's HTTP reader makes while reading, and the
//!   gRPC front-end's for `ModelInferRequest`; each front-end feeds its reader the bytes;
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
pub mod generate;
pub mod http;
pub mod json;
pub mod request;
pub mod signature;
pub mod triton_order;

pub use check::check;
pub use datatype::DataType;
pub use request::{InferRequest, InputTensor, Rejection, TensorData};
pub use signature::{InputSpec, Signature, SignatureCache};

use crate::error::GatewayError;
use crate::model::ModelRef;

/// The answer to a request the checks refused, counted in
/// `infergate_validation_rejections_total`: one place for both front-ends.
pub(crate) fn refuse(rejection: Rejection, model: &ModelRef) -> GatewayError {
    metrics::counter!(crate::telemetry::VALIDATION_REJECTIONS,
        "model" => model.name.clone(),
        "reason" => rejection.reason.as_str())
    .increment(1);
    GatewayError::InvalidInput {
        reason: rejection.reason.as_str(),
        message: rejection.message,
    }
}
