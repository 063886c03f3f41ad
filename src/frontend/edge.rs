//! What happens at the edge of every HTTP request, once: the request id, the span every log
//! line of the request carries, the in-flight gauge, the request counter and latency, and the
//! one access-log line.

use crate::Gateway;
use crate::error::{ErrorKind, ErrorSource};
use crate::telemetry;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderName, HeaderValue};
use std::time::Instant;
use tracing::Instrument;

/// The `x-request-id` header, taken from the client or made here.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request's id, available to handlers as an extension.
#[derive(Clone, Debug)]
pub struct RequestId(pub HeaderValue);

/// What served a request, left on the response by the handler for the log and metrics.
#[derive(Clone, Debug, Default)]
pub struct Served {
    /// Model name.
    pub model: String,
    /// Version asked for, if any.
    pub version: Option<String>,
    /// Backend that answered.
    pub backend: String,
}

/// Client ids are kept when they are short printable ASCII; anything else is replaced so a
/// hostile id cannot break log lines.
fn request_id(request: &Request) -> HeaderValue {
    request
        .headers()
        .get(&X_REQUEST_ID)
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

/// Probes would drown the access log; they are logged at debug level.
fn is_probe(path: &str) -> bool {
    path.starts_with("/v2/health/")
}

/// The middleware itself.
pub async fn edge(State(_gateway): State<Gateway>, mut request: Request, next: Next) -> Response {
    let id = request_id(&request);
    request
        .headers_mut()
        .insert(X_REQUEST_ID.clone(), id.clone());
    request.extensions_mut().insert(RequestId(id.clone()));
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let span = tracing::info_span!("request", request_id = %id.to_str().unwrap_or_default());

    let in_flight = metrics::gauge!(telemetry::IN_FLIGHT, "protocol" => "http");
    in_flight.increment(1.0);
    let started = Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    let elapsed = started.elapsed();
    in_flight.decrement(1.0);

    response.headers_mut().insert(X_REQUEST_ID.clone(), id);
    let status = response.status();
    let served = response
        .extensions()
        .get::<Served>()
        .cloned()
        .unwrap_or_default();
    let error = response.extensions().get::<ErrorKind>().cloned();
    let status_class = match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    metrics::counter!(telemetry::REQUESTS,
        "protocol" => "http",
        "model" => served.model.clone(),
        "version" => served.version.clone().unwrap_or_default(),
        "backend" => served.backend.clone(),
        "status" => status_class)
    .increment(1);
    metrics::histogram!(telemetry::REQUEST_DURATION, "protocol" => "http", "model" => served.model.clone())
        .record(elapsed.as_secs_f64());
    if let Some(error) = &error {
        metrics::counter!(telemetry::ERRORS, "kind" => error.kind, "source" => error.source.as_str())
            .increment(1);
    }

    let latency_ms = elapsed.as_secs_f64() * 1e3;
    let _entered = span.enter();
    let version = served.version.as_deref().unwrap_or("");
    match error {
        Some(e) if e.source != ErrorSource::Client => tracing::warn!(
            %method, path, model = served.model, version, backend = served.backend,
            status = status.as_u16(), latency_ms, error = e.kind, source = e.source.as_str(), message = e.message, "request failed"
        ),
        Some(e) => tracing::info!(
            %method, path, model = served.model, version, backend = served.backend,
            status = status.as_u16(), latency_ms, error = e.kind, message = e.message, "request refused"
        ),
        None if is_probe(&path) => {
            tracing::debug!(%method, path, status = status.as_u16(), latency_ms, "probe")
        }
        None => tracing::info!(
            %method, path, model = served.model, version, backend = served.backend,
            status = status.as_u16(), latency_ms, "request"
        ),
    }
    response
}
