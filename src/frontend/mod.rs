//! Wire formats: each front-end decodes its protocol into a `pipeline::RequestCtx`, runs
//! the pipeline's phases, and encodes the answer back. No rule lives here that another
//! front-end would have to repeat.

pub mod admin;
pub mod grpc;
pub mod http;
pub mod metrics;

use ::http::{HeaderName, HeaderValue};

/// The `x-request-id` header (and gRPC metadata key), taken from the client or made here.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `server: infergate/<version>`, on every answer of the KServe listeners: server metadata
/// names the backends, this names the gateway.
pub(crate) const SERVER_HEADER_VALUE: HeaderValue =
    HeaderValue::from_static(crate::protocol::SERVER_HEADER);
