//! The edge of every request, whatever its wire format, written once: `Edge::begin` takes
//! the request id (the client's, or a new one), starts its trace and the span every log line
//! of the request carries, counts it in flight, and builds its `RequestCtx` with the one
//! config snapshot it will see; `Edge::end` is the finish phase, read from that context (what
//! served it, the tenant). The front-ends only read their headers or metadata into an
//! `Arrival` and say how they answered.

use super::finish::{self, Answered, Ending};
use super::{RequestCtx, request_id};
use crate::error::ErrorKind;
use crate::gateway::Gateway;
use crate::log_text::Scope;
use crate::model::Served;
use crate::telemetry::series::{InFlightGauge, Protocol};
use crate::trace::{RequestTrace, TraceHex};
use http::HeaderValue;
use std::sync::Arc;
use tracing::Span;

/// What a front-end read off a request as it arrived.
pub struct Arrival<'a> {
    /// HTTP or gRPC, for the in-flight gauge.
    pub protocol: Protocol,
    /// The client's `x-request-id`.
    pub id: Option<&'a HeaderValue>,
    /// The client's W3C `traceparent`.
    pub traceparent: Option<&'a [u8]>,
    /// The subject of the client's verified certificate (mTLS).
    pub peer: Option<&'a Arc<str>>,
    /// When the client stops waiting, when it said (gRPC's `grpc-timeout`).
    pub deadline: Option<tokio::time::Instant>,
    /// A health probe: not traced, logged at debug level.
    pub probe: bool,
}

/// A request between its edge and its end.
pub struct Edge {
    /// The request's context, for every phase.
    pub ctx: RequestCtx,
    trace: Option<RequestTrace>,
    /// The trace id as the span carries it, for the access-log line written without it.
    trace_id: TraceHex,
    span: Span,
    probe: bool,
    _in_flight: InFlightGauge,
}

impl Edge {
    /// A request has arrived.
    pub fn begin(gateway: &Gateway, arrival: Arrival<'_>) -> Self {
        let id = request_id(arrival.id);
        let trace = RequestTrace::start(arrival.traceparent, !arrival.probe);
        let trace_id = trace.trace_id_hex();
        let span = request_span(&id, &trace_id, arrival.peer.map(|p| &**p));
        let peer = arrival.peer.cloned();
        Self {
            _in_flight: InFlightGauge::start(arrival.protocol),
            ctx: RequestCtx::new(gateway, gateway.live(), (id, arrival.deadline), peer),
            trace: Some(trace),
            trace_id,
            span,
            probe: arrival.probe,
        }
    }

    /// The span every log line of the request carries.
    pub fn span(&self) -> &Span {
        &self.span
    }

    /// The request's trace, to stamp on what goes to a backend.
    pub fn trace(&self) -> Option<&RequestTrace> {
        self.trace.as_ref()
    }

    /// The finish phase: the request's series, its span, its access-log line, with what
    /// served it and the tenant as its context has them. `error` is a failure the gateway
    /// answered itself.
    pub fn end(&mut self, answered: Answered<'_>, error: Option<&ErrorKind>) {
        let scope = (!self.span.is_disabled()).then(|| Scope {
            request_id: self.ctx.id.to_str().unwrap_or_default(),
            trace_id: self.trace_id.as_str(),
            peer: self.ctx.peer.as_deref(),
        });
        let ending = Ending {
            answered,
            served: self.ctx.serving.as_ref().unwrap_or(Served::NONE),
            tenant: self.ctx.tenant().map_or("", |t| t),
            elapsed: self.ctx.started.elapsed(),
            error,
            probe: self.probe,
            scope,
        };
        let _entered = self.span.enter();
        finish::record(&ending, self.trace.take());
    }
}

/// The span every log line of a request carries: its id, its trace id, and the verified
/// client certificate's subject (mTLS), so every line, the access-log line included, names
/// the peer.
fn request_span(id: &HeaderValue, trace_id: &TraceHex, peer: Option<&str>) -> Span {
    let span = tracing::info_span!(
        "request",
        request_id = %id.to_str().unwrap_or_default(),
        trace_id = %trace_id.as_str(),
        peer = tracing::field::Empty
    );
    if let Some(peer) = peer {
        span.record("peer", peer);
    }
    span
}
