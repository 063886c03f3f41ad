//! Wire formats: each front-end decodes its protocol into a `pipeline::RequestCtx`, runs
//! the pipeline's phases, and encodes the answer back. No rule lives here that another
//! front-end would have to repeat.

pub mod admin;
pub mod grpc;
pub mod http;
pub mod metrics;

use crate::trace::{Carried, TRACEPARENT, TRACESTATE};
use ::http::{HeaderMap, HeaderName, HeaderValue};

/// The `x-request-id` header (and gRPC metadata key), taken from the client or made here.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `server: infergate/<version>`, on every answer of the KServe listeners: server metadata
/// names the backends, this names the gateway.
pub(crate) const SERVER_HEADER_VALUE: HeaderValue =
    HeaderValue::from_static(crate::protocol::SERVER_HEADER);

/// The headers (or gRPC metadata) of a request that its edge reads, found in one walk over
/// them: a lookup hashes its name byte by byte, and the three lookups cost more than the
/// walk (`loadtest/instructions.sh`).
#[derive(Default)]
pub(crate) struct Sent<'a> {
    /// The first `x-request-id`.
    pub id: Option<&'a HeaderValue>,
    /// The first `traceparent`.
    pub traceparent: Option<&'a HeaderValue>,
    /// Whether there is a `tracestate`.
    pub tracestate: bool,
}

impl<'a> Sent<'a> {
    pub fn of(headers: &'a HeaderMap) -> Self {
        let mut sent = Self::default();
        for (name, value) in headers {
            if *name == X_REQUEST_ID {
                sent.id.get_or_insert(value);
            } else if *name == TRACEPARENT {
                sent.traceparent.get_or_insert(value);
            } else if *name == TRACESTATE {
                sent.tracestate = true;
            }
        }
        sent
    }

    /// Which trace headers came, for the trace to take off what it does not continue.
    pub fn carried(&self) -> Carried {
        Carried {
            traceparent: self.traceparent.is_some(),
            tracestate: self.tracestate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk finds what three lookups found: the first id, the first `traceparent`, and
    /// whether a `tracestate` came, among other headers and repeated values.
    #[test]
    fn one_walk_finds_what_the_edge_reads() {
        let mut headers = HeaderMap::new();
        headers.insert(::http::header::HOST, HeaderValue::from_static("gw"));
        headers.insert("inference-header-content-length", HeaderValue::from(7));
        let sent = Sent::of(&headers);
        assert_eq!(
            (sent.id, sent.traceparent, sent.tracestate),
            (None, None, false)
        );

        headers.append(&X_REQUEST_ID, HeaderValue::from_static("first"));
        headers.append(&X_REQUEST_ID, HeaderValue::from_static("second"));
        headers.insert(&TRACEPARENT, HeaderValue::from_static("00-ab-cd-01"));
        headers.insert(&TRACESTATE, HeaderValue::from_static("vendor=1"));
        let sent = Sent::of(&headers);
        assert_eq!(sent.id, headers.get(&X_REQUEST_ID));
        assert_eq!(sent.id.unwrap(), "first");
        assert_eq!(sent.traceparent, headers.get(&TRACEPARENT));
        assert!(sent.tracestate);
        let carried = sent.carried();
        assert!(carried.traceparent && carried.tracestate);
    }
}
