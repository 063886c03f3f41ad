//! What happens at the edge of every HTTP request, once, on the KServe and admin listeners:
//! the request id, the one config snapshot the request will see (`Snapshot`), the span every
//! log line of the request carries, the in-flight gauge, and at the end the finish phase
//! (`pipeline::finish::record`: the request metrics, the span, the access-log line).

use crate::Gateway;
use crate::error::ErrorKind;
use crate::frontend::{SERVER_HEADER_VALUE, X_REQUEST_ID};
use crate::model::Served;
use crate::pipeline::Live;
use crate::pipeline::finish::{self, Answered, Ending};
use crate::pipeline::request_id;
use crate::pipeline::series::{InFlightGauge, Protocol};
use crate::trace::{RequestTrace, TRACEPARENT};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// The config snapshot the edge took for a request: every later step reads this one, never
/// the gateway's current one, so a reload mid-request cannot mix two configs.
#[derive(Clone)]
pub(crate) struct Snapshot(pub Arc<Live>);

/// The caller's tenant, left on the response by `authenticate` for the access log (never
/// the credential itself).
#[derive(Clone, Debug)]
pub(crate) struct Tenant(pub Arc<str>);

/// Health probes: not authenticated, and logged at debug level (they would drown the
/// access log). The one place that knows their path.
pub(crate) fn is_probe(path: &str) -> bool {
    path.starts_with("/v2/health/")
}

/// The middleware itself.
pub(crate) async fn edge(State(gateway): State<Gateway>, request: Request, next: Next) -> Response {
    around(&gateway, request, |request| next.run(request)).await
}

/// The edge around `inner`, the rest of the request's walk: the router's middleware, or the
/// inference path that goes without the router (`super::infer`).
pub(crate) async fn around<F, Fut>(gateway: &Gateway, mut request: Request, inner: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    let id = request_id(request.headers().get(&X_REQUEST_ID));
    request
        .headers_mut()
        .insert(X_REQUEST_ID.clone(), id.clone());
    request.extensions_mut().insert(Snapshot(gateway.live()));
    let traceparent = request.headers().get(&TRACEPARENT).map(|v| v.as_bytes());
    let probe = is_probe(request.uri().path());
    let trace = RequestTrace::start(traceparent, !probe);
    trace.stamp(request.headers_mut());
    let method = request.method().clone();
    let uri = request.uri().clone(); // shares the bytes, unlike copying the path
    let span = crate::frontend::request_span(&id, &trace, request.extensions());

    let in_flight = InFlightGauge::start(Protocol::Http);
    let started = Instant::now();
    let mut response = inner(request).instrument(span.clone()).await;
    let elapsed = started.elapsed();
    drop(in_flight);

    let headers = response.headers_mut();
    headers.insert(X_REQUEST_ID.clone(), id);
    headers.insert(http::header::SERVER, SERVER_HEADER_VALUE);
    // Nothing after this middleware reads them: taken, not copied.
    let served = response
        .extensions_mut()
        .remove::<Served>()
        .unwrap_or_default();
    let error = response.extensions_mut().remove::<ErrorKind>();
    let tenant = response.extensions_mut().remove::<Tenant>();
    let ending = Ending {
        answered: Answered::Http {
            method: &method,
            path: uri.path(),
            status: response.status(),
        },
        served: &served,
        tenant: tenant.as_ref().map_or("", |t| &*t.0),
        elapsed,
        error: error.as_ref(),
        probe,
    };
    let _entered = span.enter();
    finish::record(&ending, Some(trace));
    response
}
