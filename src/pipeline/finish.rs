//! `finish`: the last phase of every request, whatever its wire format. The route's guard
//! counts the answer (`settle`), and `record` counts the request in the shared series
//! (`infergate_requests_total`, the latency histogram, the error counter), ends its trace
//! span and writes its one access-log line. One classification decides what failed: the
//! status class of the answer (`error::status_class`), and `ErrorKind` for a failure the
//! gateway answered itself.

use super::RequestCtx;
use crate::error::{ErrorKind, ErrorSource};
use crate::log_text::{Scope, Value, lead, write_line};
use crate::telemetry;
use crate::telemetry::series::{Protocol, RequestSeries};
use crate::trace::RequestTrace;
use std::time::Duration;

pub use crate::model::Served;

/// Counts the backend's answer for a guarded route, once, as `settle` does; but a token
/// stream (`streams`) on a route whose guard times first tokens is left to its clock
/// (`tokens::clock`), which counts it when its first event comes.
pub fn settle_answer(ctx: &mut RequestCtx, failed: bool, streams: bool) {
    let tally = ctx.routed.as_ref().and_then(|r| r.tally.as_ref());
    if streams && !failed && tally.is_some_and(crate::routing::Tally::times_first_token) {
        return;
    }
    settle(ctx, failed);
}

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
        /// The status code sent, whose name and class are read here (`error::grpc_code_name`,
        /// `error::grpc_status_class`), as an HTTP answer's are from its status.
        code: i32,
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
            Self::Grpc { code, .. } => crate::error::grpc_status_class(*code),
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
                trace.finish_grpc(rpc, *code, ending.served, ending.error)
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
        } => log_grpc(
            ending,
            rpc,
            crate::error::grpc_code_name(*code),
            *message,
            counts,
        ),
    }
}

/// One request's log line, its fields listed once: written straight into the text log
/// (`log_text::write_line`) when it can be, else through `tracing` with the same fields in the
/// same order (JSON, colours, a value that needs escaping). Each field is
/// `name: Kind [= value]` (the value defaults to the variable `name`), `Kind` one of
/// `log_text::Value`'s.
macro_rules! request_line {
    ($ending:expr, $level:ident, $message:literal,
     { $($name:ident : $kind:ident $(= $value:expr)?),* $(,)? }) => {{
        if tracing::enabled!(tracing::Level::$level) {
            $( let $name = request_line!(@typed $kind, request_line!(@value $name $(, $value)?)); )*
            let fields = [$((lead!($name), Value::$kind($name))),*];
            if !written($ending, &tracing::Level::$level, $message, &fields) {
                tracing::event!(tracing::Level::$level,
                    $($name = request_line!(@traced $kind, $name)),*, $message);
            }
        }
    }};
    (@value $name:ident) => { $name };
    (@value $name:ident, $value:expr) => { $value };
    (@typed Number, $value:expr) => { u64::from($value) };
    (@typed Float, $value:expr) => { { let value: f64 = $value; value } };
    (@typed $text:ident, $value:expr) => { { let value: &str = $value; value } };
    (@traced Shown, $value:expr) => { tracing::field::display($value) };
    (@traced $kind:ident, $value:expr) => { $value };
}

/// Writes a request's log line straight into the text log (`log_text::write_line`), in the
/// request's span as the text format shows it; a warning or an error is written out at once.
/// False when it could not (another format, or a value that needs escaping).
fn written(
    ending: &Ending<'_>,
    level: &tracing::Level,
    message: &str,
    fields: &[(&str, Value<'_>)],
) -> bool {
    let urgent = *level <= tracing::Level::WARN;
    telemetry::write_plain(urgent, |line| {
        write_line(line, level, ending.scope.as_ref(), message, fields)
    })
}

fn log_http(ending: &Ending<'_>, method: &http::Method, path: &str, status: u16) {
    let Ending { served, tenant, .. } = ending;
    let latency_ms = ending.elapsed.as_secs_f64() * 1e3;
    let route = served.route.as_deref().unwrap_or("");
    let version = served.version.as_deref().unwrap_or("");
    let (method, model, backend) = (method.as_str(), &served.model, &served.backend);
    match ending.error {
        Some(e) if e.source != ErrorSource::Client => {
            request_line!(ending, WARN, "request failed", {
                method: Shown, path: Text, model: Text, version: Text, backend: Text, route: Text,
                tenant: Text, status: Number, latency_ms: Float, error: Text = e.kind,
                source: Text = e.source.as_str(), reason: Text = &e.message,
            })
        }
        Some(e) => request_line!(ending, INFO, "request refused", {
            method: Shown, path: Text, model: Text, version: Text, backend: Text, route: Text,
            tenant: Text, status: Number, latency_ms: Float, error: Text = e.kind,
            reason: Text = &e.message,
        }),
        None if ending.probe => request_line!(ending, DEBUG, "probe", {
            method: Shown, path: Text, status: Number, latency_ms: Float,
        }),
        None => request_line!(ending, INFO, "request", {
            method: Shown, path: Text, model: Text, version: Text, backend: Text, route: Text,
            tenant: Text, status: Number, latency_ms: Float,
        }),
    }
}

fn log_grpc(ending: &Ending<'_>, rpc: &str, code: &str, message: Option<&str>, counts: &str) {
    let Ending { served, tenant, .. } = ending;
    let latency_ms = ending.elapsed.as_secs_f64() * 1e3;
    let version = served.version.as_deref().unwrap_or("");
    let (model, backend) = (&served.model, &served.backend);
    match ending.error {
        Some(e) if e.source != ErrorSource::Client => {
            request_line!(ending, WARN, "request failed", {
                rpc: Text, model: Text, version: Text, tenant: Text, backend: Text, code: Text,
                latency_ms: Float, counts: Text, error: Text = e.kind,
                source: Text = e.source.as_str(), reason: Text = &e.message,
            })
        }
        Some(e) => request_line!(ending, INFO, "request refused", {
            rpc: Text, model: Text, version: Text, tenant: Text, backend: Text, code: Text,
            latency_ms: Float, counts: Text, error: Text = e.kind, reason: Text = &e.message,
        }),
        None if ending.probe => request_line!(ending, DEBUG, "probe", {
            rpc: Text, code: Text, latency_ms: Float,
        }),
        None => request_line!(ending, INFO, "request", {
            rpc: Text, model: Text, version: Text, tenant: Text, backend: Text, code: Text,
            latency_ms: Float, counts: Text, reason: Text = message.unwrap_or(""),
        }),
    }
}
