//! `finish`: the last phase of every request, whatever its wire format. The route's guard
//! counts the answer (`settle`), and `record` counts the request in the shared series
//! (`infergate_requests_total`, the latency histogram, the error counter), ends its trace
//! span and writes its one access-log line. One classification decides what failed: the
//! status class of the answer (`error::status_class`), and `ErrorKind` for a failure the
//! gateway answered itself.

use super::RequestCtx;
use crate::error::{ErrorKind, ErrorSource};
use crate::log_text::{Scope, Value, write_line};
use crate::telemetry;
use crate::telemetry::series::{Protocol, RequestSeries};
use crate::trace::RequestTrace;
use std::time::Duration;

pub use crate::model::Served;

/// Counts the answer for a guarded route, once: `failed` for a failure of the target.
pub fn settle(ctx: &mut RequestCtx, failed: bool) {
    if let Some(tally) = ctx.routed.as_mut().and_then(|r| r.tally.take()) {
        tally.finish(failed);
    }
}

/// How a request was answered, in its protocol's terms, for the log line and the span.
pub enum Answered<'a> {
    /// An HTTP request.
    Http {
        /// Its method.
        method: &'a http::Method,
        /// Its path (never the query: it may carry a credential).
        path: &'a str,
        /// The status sent.
        status: http::StatusCode,
    },
    /// A gRPC call.
    Grpc {
        /// The method (`ModelInfer`).
        rpc: &'a str,
        /// The status code sent (as a number) and its name.
        code: (i32, &'a str),
        /// Its status class (`error::grpc_status_class`).
        class: &'static str,
        /// The status message, when a backend's own failure was passed through.
        message: Option<&'a str>,
        /// A stream's counters (`requests=3 responses=3 refused=0`), empty for a unary call.
        counts: &'a str,
    },
}

impl Answered<'_> {
    fn protocol(&self) -> Protocol {
        match self {
            Self::Http { .. } => Protocol::Http,
            Self::Grpc { .. } => Protocol::Grpc,
        }
    }

    fn class(&self) -> &'static str {
        match self {
            Self::Http { status, .. } => crate::error::status_class(*status),
            Self::Grpc { class, .. } => class,
        }
    }
}

/// One finished request: everything its metrics, span and log line say.
pub struct Ending<'a> {
    /// How it was answered.
    pub answered: Answered<'a>,
    /// What served it.
    pub served: &'a Served,
    /// The caller's tenant ("" when none).
    pub tenant: &'a str,
    /// Time from the edge to the answer.
    pub elapsed: Duration,
    /// A failure the gateway answered itself.
    pub error: Option<&'a ErrorKind>,
    /// A health probe: logged at debug level, as the kubelet probes every few seconds.
    pub probe: bool,
    /// The request span's fields, when the span is on: the text log writes them before the
    /// access-log line.
    pub scope: Option<Scope<'a>>,
}

/// Records a finished request: the series, the span (when traced), the access-log line.
/// Call it inside the request's span.
pub fn record(ending: &Ending<'_>, trace: Option<RequestTrace>) {
    let class = ending.answered.class();
    let series = RequestSeries::of(ending.answered.protocol(), ending.served);
    series.requests(class).increment(1);
    series.duration().record(ending.elapsed.as_secs_f64());
    if let Some(error) = ending.error {
        let served = ending.served;
        metrics::counter!(telemetry::ERRORS,
            "kind" => error.kind,
            "source" => error.source.as_str(),
            "route" => served.route.clone().unwrap_or_default(),
            "model" => served.model.clone(),
            "version" => served.version.clone().unwrap_or_default())
        .increment(1);
    }
    if let Some(trace) = trace {
        match &ending.answered {
            Answered::Http {
                method,
                path,
                status,
            } => trace.finish_http(method, path, status.as_u16(), ending.served, ending.error),
            Answered::Grpc { rpc, code, .. } => {
                trace.finish_grpc(rpc, code.0, ending.served, ending.error)
            }
        }
    }
    match &ending.answered {
        Answered::Http {
            method,
            path,
            status,
        } => log_http(ending, method, path, status.as_u16()),
        Answered::Grpc {
            rpc,
            code,
            message,
            counts,
            ..
        } => log_grpc(ending, rpc, code.1, *message, counts),
    }
}

fn log_http(ending: &Ending<'_>, method: &http::Method, path: &str, status: u16) {
    let Ending { served, tenant, .. } = ending;
    let latency_ms = ending.elapsed.as_secs_f64() * 1e3;
    let route = served.route.as_deref().unwrap_or("");
    let version = served.version.as_deref().unwrap_or("");
    match ending.error {
        Some(e) if e.source != ErrorSource::Client => tracing::warn!(
            %method, path, model = served.model, version, backend = served.backend, route, tenant,
            status, latency_ms, error = e.kind, source = e.source.as_str(), reason = e.message, "request failed"
        ),
        Some(e) => tracing::info!(
            %method, path, model = served.model, version, backend = served.backend, route, tenant,
            status, latency_ms, error = e.kind, reason = e.message, "request refused"
        ),
        None if ending.probe => tracing::debug!(%method, path, status, latency_ms, "probe"),
        None if !tracing::enabled!(tracing::Level::INFO) => {}
        None => {
            let fields = [
                ("method", Value::Shown(method.as_str())),
                ("path", Value::Text(path)),
                ("model", Value::Text(&served.model)),
                ("version", Value::Text(version)),
                ("backend", Value::Text(&served.backend)),
                ("route", Value::Text(route)),
                ("tenant", Value::Text(tenant)),
                ("status", Value::Number(status.into())),
                ("latency_ms", Value::Float(latency_ms)),
            ];
            if !written(ending, &fields) {
                tracing::info!(
                    %method, path, model = served.model, version, backend = served.backend,
                    route, tenant, status, latency_ms, "request"
                );
            }
        }
    }
}

/// Writes a request's access-log line (at info, its message `request`) straight into the
/// text log (`log_text::write_line`): the same bytes as through `tracing`, at a fraction of
/// the cost. False when it could not (another format, or a value that needs escaping).
fn written(ending: &Ending<'_>, fields: &[(&str, Value<'_>)]) -> bool {
    telemetry::write_plain(false, |line| {
        write_line(
            line,
            &tracing::Level::INFO,
            ending.scope.as_ref(),
            "request",
            fields,
        )
    })
}

fn log_grpc(ending: &Ending<'_>, rpc: &str, code: &str, message: Option<&str>, counts: &str) {
    let Ending { served, tenant, .. } = ending;
    let latency_ms = ending.elapsed.as_secs_f64() * 1e3;
    let version = served.version.as_deref().unwrap_or("");
    match ending.error {
        Some(e) if e.source != ErrorSource::Client => tracing::warn!(
            rpc,
            model = served.model,
            version,
            tenant,
            backend = served.backend,
            code,
            latency_ms,
            counts,
            error = e.kind,
            source = e.source.as_str(),
            reason = e.message,
            "request failed"
        ),
        Some(e) => tracing::info!(
            rpc,
            model = served.model,
            version,
            tenant,
            backend = served.backend,
            code,
            latency_ms,
            counts,
            error = e.kind,
            reason = e.message,
            "request refused"
        ),
        None if ending.probe => tracing::debug!(rpc, code, latency_ms, "probe"),
        None if !tracing::enabled!(tracing::Level::INFO) => {}
        None => {
            let reason = message.unwrap_or("");
            let fields = [
                ("rpc", Value::Text(rpc)),
                ("model", Value::Text(&served.model)),
                ("version", Value::Text(version)),
                ("tenant", Value::Text(tenant)),
                ("backend", Value::Text(&served.backend)),
                ("code", Value::Text(code)),
                ("latency_ms", Value::Float(latency_ms)),
                ("counts", Value::Text(counts)),
                ("reason", Value::Text(reason)),
            ];
            if !written(ending, &fields) {
                tracing::info!(
                    rpc,
                    model = served.model,
                    version,
                    tenant,
                    backend = served.backend,
                    code,
                    latency_ms,
                    counts,
                    reason,
                    "request"
                );
            }
        }
    }
}
