//! The HTTP side of the edge, on the KServe and admin listeners: the headers read into the
//! pipeline's `Edge` (which builds the request's one `RequestCtx`), the admit phase, and
//! the answer's headers (request id, server, route target) before `Edge::end` records it.

use crate::error::GatewayError;
use crate::frontend::{SERVER_HEADER_VALUE, Sent, X_REQUEST_ID};
use crate::gateway::Gateway;
use crate::pipeline::RequestCtx;
use crate::pipeline::admit;
use crate::pipeline::edge::{Arrival, Edge};
use crate::pipeline::finish::Answered;
use crate::telemetry::series::Protocol;
use crate::tls::PeerIdentity;
use axum::extract::Request;
use axum::response::Response;
use http::HeaderValue;

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
/// request's context and answers, or fails with what the client is told, written by
/// `encode` (Triton's error shape, or OpenAI's on its endpoints).
pub(crate) async fn around(
    gateway: &Gateway,
    mut request: Request,
    gate: Gate,
    encode: fn(GatewayError) -> Response,
    inner: impl AsyncFnOnce(&mut RequestCtx, Request) -> Result<Response, GatewayError>,
) -> Response {
    let probe = gate == Gate::Clients && is_probe(request.uri().path());
    let sent = Sent::of(request.headers());
    let carried = sent.carried();
    let peer = request.extensions().get::<PeerIdentity>();
    let mut edge = Edge::begin(
        gateway,
        Arrival {
            protocol: Protocol::Http,
            id: sent.id,
            traceparent: sent.traceparent.map(HeaderValue::as_bytes),
            peer: peer.map(|p| &p.subject),
            deadline: None,
            probe,
        },
    );
    let id = edge.ctx.id.clone();
    let headers = request.headers_mut();
    headers.insert(X_REQUEST_ID.clone(), id.clone());
    if let Some(trace) = edge.trace() {
        trace.stamp(headers, carried);
    }
    let method = request.method().clone();
    let uri = request.uri().clone(); // shares the bytes, unlike copying the path

    let scope = edge.scope().clone();
    let ctx = &mut edge.ctx;
    let outcome = scope
        .wrap(async {
            if !probe {
                admit(ctx, &mut request, gate).await?;
            }
            inner(ctx, request).await
        })
        .await;

    let error = outcome.as_ref().err().and_then(GatewayError::report);
    let mut response = outcome.unwrap_or_else(encode);
    let headers = response.headers_mut();
    headers.insert(X_REQUEST_ID.clone(), id);
    headers.insert(http::header::SERVER, SERVER_HEADER_VALUE);
    if let Some(label) = edge.ctx.target_label()
        && let Ok(value) = HeaderValue::from_str(label)
    {
        headers.insert(TARGET_HEADER, value);
    }
    let answered = Answered::Http {
        method: &method,
        path: uri.path(),
        status: response.status(),
    };
    edge.end(answered, error.as_ref());
    response
}

const TARGET_HEADER: http::HeaderName =
    http::HeaderName::from_static(crate::protocol::TARGET_HEADER);

/// The admit phase's first half (`admit::authenticate`); the admin listener also needs
/// the admin role.
async fn admit(
    ctx: &mut RequestCtx,
    request: &mut Request,
    gate: Gate,
) -> Result<(), GatewayError> {
    admit::authenticate(ctx, request.headers_mut()).await?;
    if gate == Gate::Admins {
        admit::admin(ctx, "the admin API")?;
    }
    Ok(())
}
