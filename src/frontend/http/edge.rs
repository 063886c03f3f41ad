//! What happens at the edge of every HTTP request, once, on the KServe and admin listeners:
//! the request id, the request's context (`RequestCtx`, with the one config snapshot it
//! will see), the span every log line of the request carries, the in-flight gauge, the
//! admit phase, and at the end the finish phase (`pipeline::finish::record`: the request
//! metrics, the span, the access-log line), all read from that one context.

use crate::Gateway;
use crate::error::GatewayError;
use crate::frontend::{SERVER_HEADER_VALUE, X_REQUEST_ID};
use crate::pipeline::admit::{self, CREDENTIAL_HEADERS};
use crate::pipeline::finish::{self, Answered, Ending};
use crate::pipeline::series::{InFlightGauge, Protocol};
use crate::pipeline::{RequestCtx, request_id};
use crate::trace::{RequestTrace, TRACEPARENT};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::HeaderValue;
use tracing::Instrument;

/// Who may pass a listener's edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// KServe: every caller auth lets in; health probes unauthenticated.
    Clients,
    /// Admin: callers with the admin role (when auth is on).
    Admins,
}

/// Health probes: not authenticated, and logged at debug level (they would drown the
/// access log). The one place that knows their path.
pub(crate) fn is_probe(path: &str) -> bool {
    path.starts_with("/v2/health/")
}

/// The edge around `inner`, the rest of the request's walk, which gets the admitted
/// request's context and answers, or fails with what the client is told.
pub(crate) async fn around(
    gateway: &Gateway,
    mut request: Request,
    gate: Gate,
    inner: impl AsyncFnOnce(&mut RequestCtx, Request) -> Result<Response, GatewayError>,
) -> Response {
    let id = request_id(request.headers().get(&X_REQUEST_ID));
    request
        .headers_mut()
        .insert(X_REQUEST_ID.clone(), id.clone());
    let traceparent = request.headers().get(&TRACEPARENT).map(|v| v.as_bytes());
    let probe = gate == Gate::Clients && is_probe(request.uri().path());
    let trace = RequestTrace::start(traceparent, !probe);
    trace.stamp(request.headers_mut());
    let method = request.method().clone();
    let uri = request.uri().clone(); // shares the bytes, unlike copying the path
    let span = crate::frontend::request_span(&id, &trace, request.extensions());

    let in_flight = InFlightGauge::start(Protocol::Http);
    let mut ctx = RequestCtx::new(gateway, gateway.live(), id.clone(), None);
    let outcome = async {
        if !probe {
            admit(&mut ctx, &mut request, gate).await?;
        }
        inner(&mut ctx, request).await
    }
    .instrument(span.clone())
    .await;
    let elapsed = ctx.started.elapsed();
    drop(in_flight);

    let error = outcome.as_ref().err().and_then(GatewayError::report);
    let mut response = outcome.unwrap_or_else(IntoResponse::into_response);
    let headers = response.headers_mut();
    headers.insert(X_REQUEST_ID.clone(), id);
    headers.insert(http::header::SERVER, SERVER_HEADER_VALUE);
    if let Some(label) = ctx.target_label()
        && let Ok(value) = HeaderValue::from_str(label)
    {
        headers.insert(TARGET_HEADER, value);
    }
    let ending = Ending {
        answered: Answered::Http {
            method: &method,
            path: uri.path(),
            status: response.status(),
        },
        served: &ctx.served(),
        tenant: ctx.tenant().map_or("", |t| t),
        elapsed,
        error: error.as_ref(),
        probe,
    };
    let _entered = span.enter();
    finish::record(&ending, Some(trace));
    response
}

const TARGET_HEADER: http::HeaderName =
    http::HeaderName::from_static(crate::protocol::TARGET_HEADER);

/// The admit phase's first half, on the request's own config snapshot: the credential
/// becomes the context's caller (or the answer is 401), and the credential headers are
/// taken off so they never reach a backend. The admin listener also needs the admin role.
async fn admit(
    ctx: &mut RequestCtx,
    request: &mut Request,
    gate: Gate,
) -> Result<(), GatewayError> {
    let headers = request.headers();
    let peer = request
        .extensions()
        .get::<crate::tls::PeerIdentity>()
        .map(|p| p.subject.as_str());
    let credentials = admit::credentials(|name| headers.get(name).map(HeaderValue::as_bytes), peer);
    let strip = admit::authenticate(ctx, credentials).await?;
    if strip {
        for name in &CREDENTIAL_HEADERS {
            request.headers_mut().remove(name);
        }
    }
    if gate == Gate::Admins {
        admit::admin(ctx, "the admin API")?;
    }
    Ok(())
}
