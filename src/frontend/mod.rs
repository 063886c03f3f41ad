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

/// The span every log line of a request carries: its id, its trace id, and the verified
/// client certificate's subject (mTLS), so every line, the access-log line included, names
/// the peer.
pub(crate) fn request_span(
    id: &HeaderValue,
    trace: &crate::trace::RequestTrace,
    extensions: &::http::Extensions,
) -> tracing::Span {
    let trace_id = trace.trace_id_hex();
    let span = tracing::info_span!(
        "request",
        request_id = %id.to_str().unwrap_or_default(),
        trace_id = %trace_id.as_str(),
        peer = tracing::field::Empty
    );
    if let Some(peer) = extensions.get::<crate::tls::PeerIdentity>() {
        span.record("peer", peer.subject.as_str());
    }
    span
}
