//! The edge of every request, whatever its wire format, written once: `Edge::begin` takes
//! the request id (the client's, or a new one), starts its trace and the scope every log line
//! of the request carries (`telemetry::scope`), counts it in flight, and builds its `RequestCtx` with the one
//! config snapshot it will see; `Edge::end` is the finish phase, read from that context (what
//! served it, the tenant). The front-ends only read their headers or metadata into an
//! `Arrival` and say how they answered.

use super::finish::{self, Answered, Ending};
use super::{RequestCtx, request_id};
use crate::error::ErrorKind;
use crate::gateway::Gateway;
use crate::log_text::ScopeFields;
use crate::model::Served;
use crate::telemetry::scope::LogScope;
use crate::telemetry::series::{InFlightGauge, Protocol};
use crate::trace::RequestTrace;
use http::HeaderValue;
use std::sync::Arc;

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
    scope: LogScope,
    probe: bool,
    _in_flight: InFlightGauge,
}

impl Edge {
    /// A request has arrived.
    pub fn begin(gateway: &Gateway, arrival: Arrival<'_>) -> Self {
        let id = request_id(arrival.id);
        let trace = RequestTrace::start(arrival.traceparent, !arrival.probe);
        let scope = LogScope::new(&id, trace.trace_id_hex(), arrival.peer);
        let peer = arrival.peer.cloned();
        Self {
            _in_flight: InFlightGauge::start(arrival.protocol),
            ctx: RequestCtx::new(gateway, gateway.live(), (id, arrival.deadline), peer),
            trace: Some(trace),
            scope,
            probe: arrival.probe,
        }
    }

    /// The scope every log line of the request carries.
    pub fn scope(&self) -> &LogScope {
        &self.scope
    }

    /// The request's trace, to stamp on what goes to a backend.
    pub fn trace(&self) -> Option<&RequestTrace> {
        self.trace.as_ref()
    }

    /// The finish phase: the request's series, its span, its access-log line, with what
    /// served it and the tenant as its context has them. `error` is a failure the gateway
    /// answered itself.
    pub fn end(&mut self, answered: Answered<'_>, error: Option<&ErrorKind>) {
        let ending = Ending {
            answered,
            served: self.ctx.serving.as_ref().unwrap_or(Served::NONE),
            tenant: self.ctx.tenant().map_or("", |t| t),
            elapsed: self.ctx.started.elapsed(),
            error,
            probe: self.probe,
            scope: self.scope.fields().map(ScopeFields::view),
        };
        let trace = self.trace.take();
        self.scope.run(|| finish::record(&ending, trace));
    }
}
