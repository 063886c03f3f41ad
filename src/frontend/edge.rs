//! What happens at the edge of every HTTP request, once: the request id, the span every log
//! line of the request carries, the in-flight gauge, the request counter and latency, and the
//! one access-log line. The gRPC front-end uses the same pieces (`request_id`, `InFlightGauge`,
//! `record`), so both protocols count into the same series with their own `protocol` label.

use super::series::{Protocol, RequestSeries};
use crate::Gateway;
use crate::error::{ErrorKind, ErrorSource};
use crate::telemetry;
use crate::trace::{RequestTrace, TRACEPARENT};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderName, HeaderValue};
use std::time::Instant;
use tracing::Instrument;

/// The `x-request-id` header, taken from the client or made here.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `server: infergate/<version>`, on every answer of the KServe listeners: server metadata
/// names the backends, this names the gateway.
pub(crate) const SERVER_HEADER_VALUE: HeaderValue =
    HeaderValue::from_static(crate::protocol::SERVER_HEADER);

/// The request's id, available to handlers as an extension.
#[derive(Clone, Debug)]
pub struct RequestId(pub HeaderValue);

/// What served a request, left on the response by the handler for the log and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Served {
    /// Model name.
    pub model: String,
    /// Version asked for, if any.
    pub version: Option<String>,
    /// Backend that answered.
    pub backend: String,
    /// The route the client called, when its model name was a route.
    pub route: Option<String>,
}

/// The caller's tenant, left on the response by the `auth` stage for the access log (never
/// the credential itself).
#[derive(Clone, Debug)]
pub struct Tenant(pub std::sync::Arc<str>);

/// Client ids are kept when they are short printable ASCII; anything else is replaced so a
/// hostile id cannot break log lines.
pub fn request_id(client: Option<&HeaderValue>) -> HeaderValue {
    client
        .filter(|v| {
            let bytes = v.as_bytes();
            !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(|b| b.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(|| {
            let id = uuid::Uuid::new_v4();
            HeaderValue::from_str(
                id.as_hyphenated()
                    .encode_lower(&mut uuid::Uuid::encode_buffer()),
            )
            .expect("uuid is a valid header value")
        })
}

/// Counts a request in `infergate_requests_in_flight` until dropped.
pub struct InFlightGauge(&'static metrics::Gauge);

impl InFlightGauge {
    /// Starts counting one request of `protocol`.
    pub fn start(protocol: Protocol) -> Self {
        let gauge = protocol.in_flight();
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for InFlightGauge {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// The status class label (`2xx`...) of an HTTP status.
pub fn http_status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// The status class label of a gRPC code: the class of the HTTP status that the gRPC
/// specification maps the code to, so one `status=~"5.."` alert covers both protocols.
pub fn grpc_status_class(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "2xx",
        Code::Cancelled
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unauthenticated => "4xx",
        Code::Unknown
        | Code::DeadlineExceeded
        | Code::Unimplemented
        | Code::Internal
        | Code::Unavailable
        | Code::DataLoss => "5xx",
    }
}

/// Records one answered request in the shared series: the request counter, the latency
/// histogram and, for errors the gateway answered itself, the error counter (with the
/// route and target, so a canary's errors can be told from its stable target's).
pub fn record(
    protocol: Protocol,
    served: &Served,
    status_class: &'static str,
    elapsed: std::time::Duration,
    error: Option<&ErrorKind>,
) {
    let series = RequestSeries::of(protocol, served);
    series.requests(status_class).increment(1);
    series.duration().record(elapsed.as_secs_f64());
    if let Some(error) = error {
        metrics::counter!(telemetry::ERRORS,
            "kind" => error.kind,
            "source" => error.source.as_str(),
            "route" => served.route.clone().unwrap_or_default(),
            "model" => served.model.clone(),
            "version" => served.version.clone().unwrap_or_default())
        .increment(1);
    }
}

/// Puts the verified client certificate's subject (mTLS) on the request's span, so every
/// log line of the request, the access-log line included, names the peer.
pub fn record_peer(span: &tracing::Span, extensions: &http::Extensions) {
    if let Some(peer) = extensions.get::<crate::tls::PeerIdentity>() {
        span.record("peer", peer.subject.as_str());
    }
}

/// Probes would drown the access log; they are logged at debug level.
fn is_probe(path: &str) -> bool {
    path.starts_with("/v2/health/")
}

/// The middleware itself.
pub async fn edge(State(_gateway): State<Gateway>, mut request: Request, next: Next) -> Response {
    let id = request_id(request.headers().get(&X_REQUEST_ID));
    request
        .headers_mut()
        .insert(X_REQUEST_ID.clone(), id.clone());
    request.extensions_mut().insert(RequestId(id.clone()));
    let traceparent = request.headers().get(&TRACEPARENT).map(|v| v.as_bytes());
    let trace = RequestTrace::start(traceparent, !is_probe(request.uri().path()));
    trace.stamp(request.headers_mut());
    let method = request.method().clone();
    let uri = request.uri().clone(); // shares the bytes, unlike copying the path
    let path = uri.path();
    let span = tracing::info_span!(
        "request",
        request_id = %id.to_str().unwrap_or_default(),
        trace_id = %trace.trace_id(),
        peer = tracing::field::Empty
    );
    record_peer(&span, request.extensions());

    let in_flight = InFlightGauge::start(Protocol::Http);
    let started = Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    let elapsed = started.elapsed();
    drop(in_flight);

    let headers = response.headers_mut();
    headers.insert(X_REQUEST_ID.clone(), id);
    headers.insert(http::header::SERVER, SERVER_HEADER_VALUE);
    let status = response.status();
    // Nothing after this middleware reads them: taken, not copied.
    let served = response
        .extensions_mut()
        .remove::<Served>()
        .unwrap_or_default();
    let error = response.extensions_mut().remove::<ErrorKind>();
    let tenant = response.extensions_mut().remove::<Tenant>();
    let tenant = tenant.as_ref().map_or("", |t| &*t.0);
    record(
        Protocol::Http,
        &served,
        http_status_class(status.as_u16()),
        elapsed,
        error.as_ref(),
    );
    trace.finish_http(&method, path, status.as_u16(), &served, error.as_ref());

    let latency_ms = elapsed.as_secs_f64() * 1e3;
    let _entered = span.enter();
    let route = served.route.as_deref().unwrap_or("");
    let version = served.version.as_deref().unwrap_or("");
    match error {
        Some(e) if e.source != ErrorSource::Client => tracing::warn!(
            %method, path, model = served.model, version, backend = served.backend, route, tenant,
            status = status.as_u16(), latency_ms, error = e.kind, source = e.source.as_str(), reason = e.message, "request failed"
        ),
        Some(e) => tracing::info!(
            %method, path, model = served.model, version, backend = served.backend, route, tenant,
            status = status.as_u16(), latency_ms, error = e.kind, reason = e.message, "request refused"
        ),
        None if is_probe(path) => {
            tracing::debug!(%method, path, status = status.as_u16(), latency_ms, "probe")
        }
        None => tracing::info!(
            %method, path, model = served.model, version, backend = served.backend, route, tenant,
            status = status.as_u16(), latency_ms, "request"
        ),
    }
    response
}
