//! W3C trace context for every request, and the gateway's span over OTLP when asked.
//!
//! A request takes the client's `traceparent` (or starts a trace), carries the trace id on its
//! log span (so the access-log line names it), and sends its backend a `traceparent` that
//! names the gateway's own span as parent: Triton started with `--trace-config
//! mode=opentelemetry` then files its spans under the gateway's. With
//! `telemetry.otlp_endpoint` set, that span is recorded and exported in batches over OTLP/gRPC
//! by a thread of the OpenTelemetry SDK; without it nothing is recorded, and a request costs
//! two random ids, and one header when the client sent a trace to continue. A trace begun
//! here and recorded nowhere is not sent on (as Envoy sends none without a tracer): a
//! backend would only file its own spans under a parent no one has, and the header, unique
//! on every request, costs both sides its encoding (over HTTP/2, Huffman, byte by byte).

use crate::error::ErrorKind;
use crate::model::Served;
use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer, SdkTracerProvider};
use std::sync::OnceLock;

/// The W3C header naming the caller's span: taken from clients, sent to backends.
pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// Vendor data that travels with a trace; dropped when the trace is restarted here.
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Which of a trace's headers a client's request carried (`stamp`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Carried {
    /// A `traceparent`, valid or not.
    pub traceparent: bool,
    /// A `tracestate`.
    pub tracestate: bool,
}

/// One request's place in a distributed trace: the trace it belongs to, the gateway's own
/// span in it, and that span's recording when spans are exported.
pub struct RequestTrace {
    context: SpanContext,
    /// The client sent no valid `traceparent`: the trace began here, and its `tracestate`
    /// (meaningless without the parent) is not passed on.
    restarted: bool,
    span: Option<opentelemetry_sdk::trace::Span>,
}

impl RequestTrace {
    /// Joins the client's trace (its `traceparent` header or metadata value), or starts one;
    /// the span is recorded when spans are exported and `record` (false for health probes).
    pub fn start(traceparent: Option<&[u8]>, record: bool) -> Self {
        let parent = traceparent.and_then(parse_traceparent);
        let restarted = parent.is_none();
        if let Some(export) = EXPORT.get().filter(|_| record) {
            let parent = match parent {
                Some(parent) => Context::new().with_remote_span_context(parent),
                None => Context::new(),
            };
            let span = export
                .tracer
                .span_builder("request")
                .with_kind(SpanKind::Server)
                .start_with_context(&export.tracer, &parent);
            return Self {
                context: span.span_context().clone(),
                restarted,
                span: Some(span),
            };
        }
        let ids = RandomIdGenerator::default();
        let (trace_id, flags) = match parent {
            Some(parent) => (parent.trace_id(), parent.trace_flags()),
            // Nothing records this trace here: not sampled.
            None => (ids.new_trace_id(), TraceFlags::default()),
        };
        Self {
            context: SpanContext::new(trace_id, ids.new_span_id(), flags, false, TraceState::NONE),
            restarted,
            span: None,
        }
    }

    /// The trace id (32 lowercase hex digits when displayed), for the log span.
    pub fn trace_id(&self) -> TraceId {
        self.context.trace_id()
    }

    /// The trace id as `TraceId`'s `Display` writes it (32 lowercase hex digits), made
    /// without `fmt` for the request span, which every request creates.
    pub fn trace_id_hex(&self) -> TraceHex {
        let mut hex = [0; 32];
        write_hex(&mut hex, &self.context.trace_id().to_bytes());
        TraceHex(hex)
    }

    /// The `traceparent` for the backend: this trace, the gateway's span as parent.
    pub fn traceparent(&self) -> HeaderValue {
        let mut value = *b"00-00000000000000000000000000000000-0000000000000000-00";
        write_hex(&mut value[3..35], &self.context.trace_id().to_bytes());
        write_hex(&mut value[36..52], &self.context.span_id().to_bytes());
        write_hex(&mut value[53..55], &[self.context.trace_flags().to_u8()]);
        let mut value = HeaderValue::from_bytes(&value).expect("hex digits and dashes");
        never_indexed(&mut value);
        value
    }

    /// Whether a backend is told of this trace: it continues the client's, or the gateway
    /// records its span (see the module doc).
    fn travels(&self) -> bool {
        !self.restarted || self.span.is_some()
    }

    /// Puts this trace on the headers (or gRPC metadata) a backend will receive, when it
    /// travels; a trace begun here takes off the client's `traceparent` and `tracestate`,
    /// which belong to no valid trace. `carried` says which of them came, so that only
    /// those are looked for.
    pub fn stamp(&self, headers: &mut HeaderMap, carried: Carried) {
        if self.travels() {
            headers.insert(TRACEPARENT.clone(), self.traceparent());
        } else if carried.traceparent {
            headers.remove(&TRACEPARENT);
        }
        if self.restarted && carried.tracestate {
            headers.remove(&TRACESTATE);
        }
    }

    /// Ends an HTTP request's span (when recorded): `POST /v2/models/{model}/infer`.
    pub fn finish_http(
        self,
        method: &http::Method,
        path: &str,
        status: u16,
        served: &Served,
        error: Option<&ErrorKind>,
    ) {
        if self.span.is_none() {
            return;
        }
        let name = format!("{method} {}", route_template(path));
        let attributes = [
            KeyValue::new("http.request.method", method.as_str().to_owned()),
            KeyValue::new("url.path", path.to_owned()),
            KeyValue::new("http.response.status_code", i64::from(status)),
        ];
        self.finish(name, attributes, served, error, status >= 500);
    }

    /// Ends a gRPC call's span (when recorded): `inference.GRPCInferenceService/ModelInfer`.
    pub fn finish_grpc(self, rpc: &str, code: i32, served: &Served, error: Option<&ErrorKind>) {
        if self.span.is_none() {
            return;
        }
        const SERVICE: &str = "inference.GRPCInferenceService";
        let attributes = [
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", SERVICE),
            KeyValue::new("rpc.method", rpc.to_owned()),
            KeyValue::new("rpc.grpc.status_code", i64::from(code)),
        ];
        let server_error = crate::error::grpc_status_class(code) == "5xx";
        self.finish(
            format!("{SERVICE}/{rpc}"),
            attributes,
            served,
            error,
            server_error,
        );
    }

    fn finish(
        self,
        name: String,
        protocol: impl IntoIterator<Item = KeyValue>,
        served: &Served,
        error: Option<&ErrorKind>,
        server_error: bool,
    ) {
        let Some(mut span) = self.span else { return };
        span.update_name(name);
        span.set_attributes(protocol);
        let optional = [
            ("infergate.model", Some(served.model.as_str())),
            ("infergate.version", served.version.as_deref()),
            ("infergate.backend", Some(served.backend.as_str())),
            ("infergate.route", served.route.as_deref()),
        ];
        span.set_attributes(
            optional
                .into_iter()
                .filter_map(|(key, value)| value.filter(|v| !v.is_empty()).map(|v| (key, v)))
                .map(|(key, value)| KeyValue::new(key, value.to_string())),
        );
        if let Some(error) = error {
            span.set_attribute(KeyValue::new("error.type", error.kind));
        }
        if server_error {
            let message = error.map(|e| e.message.clone()).unwrap_or_default();
            span.set_status(Status::error(message));
        }
        span.end();
    }
}

/// A span name that does not grow with every model: the model and version segments of a
/// KServe path become `{model}` and `{version}`.
fn route_template(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut previous = "";
    for segment in path.split('/').skip(1) {
        out.push('/');
        out.push_str(match previous {
            "models" => "{model}",
            "versions" => "{version}",
            _ => segment,
        });
        previous = segment;
    }
    out
}

/// Reads a `traceparent` value (W3C Trace Context, level 1): `version-traceid-parentid-flags`
/// in lowercase hex; a later version may append fields after a dash. Anything else, or an
/// all-zero id, is no parent at all (the trace restarts here, as the specification says).
pub fn parse_traceparent(value: &[u8]) -> Option<SpanContext> {
    let value = value.trim_ascii();
    if value.len() < 55 || [2, 35, 52].iter().any(|&i| value[i] != b'-') {
        return None;
    }
    let version = hex_value(&value[..2])?;
    let tail_ok = match version {
        0 => value.len() == 55,
        0xff => false,
        _ => value.len() == 55 || value[55] == b'-',
    };
    let trace_id = hex_value(&value[3..35])?;
    let span_id = hex_value(&value[36..52])?;
    let flags = hex_value(&value[53..55])?;
    if !tail_ok || trace_id == 0 || span_id == 0 {
        return None;
    }
    Some(SpanContext::new(
        TraceId::from_bytes(trace_id.to_be_bytes()),
        SpanId::from_bytes((span_id as u64).to_be_bytes()),
        TraceFlags::new(flags as u8 & TraceFlags::SAMPLED.to_u8()),
        true,
        TraceState::NONE,
    ))
}

/// The number up to 32 lowercase hex digits spell (uppercase is not allowed in the header).
fn hex_value(digits: &[u8]) -> Option<u128> {
    digits.iter().try_fold(0u128, |value, &digit| {
        let nibble = match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            _ => return None,
        };
        Some(value << 4 | u128::from(nibble))
    })
}

/// A trace id in hex (`RequestTrace::trace_id_hex`).
#[derive(Clone, Copy)]
pub struct TraceHex([u8; 32]);

impl TraceHex {
    /// The 32 digits.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits")
    }
}

/// Writes `bytes` as lowercase hex into `out` (twice as long).
fn write_hex(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
}

/// The exporter of this process: set once, by the first gateway that serves with
/// `telemetry.otlp_endpoint` (the setting is read at start, like the listeners).
struct Export {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    endpoint: String,
}

static EXPORT: OnceLock<Export> = OnceLock::new();

/// Checks `telemetry.otlp_endpoint`: an OTLP/gRPC collector as `http://host:port`.
pub fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| format!("invalid URL {endpoint:?}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "{endpoint:?}: expected http://host:port of an OTLP/gRPC collector (TLS to the \
             collector is not supported: run it beside the gateway or on the private network)"
        ));
    }
    if uri.host().is_none_or(str::is_empty) || uri.port_u16().is_none() {
        return Err(format!(
            "{endpoint:?} needs a host and a port (OTLP/gRPC: 4317)"
        ));
    }
    if uri.path() != "/" {
        return Err(format!(
            "{endpoint:?} has a path; an OTLP/gRPC endpoint is http://host:port"
        ));
    }
    Ok(())
}

/// Starts exporting request spans to `endpoint`. Runs inside the Tokio runtime (the gRPC
/// channel lives there); spans are batched and sent by the SDK's own thread, every
/// `OTEL_BSP_SCHEDULE_DELAY` (default 5 s). A second, different endpoint in the same
/// process is refused with a warning: the first one stays.
pub fn start_export(endpoint: &str) -> Result<(), String> {
    if let Some(export) = EXPORT.get() {
        if export.endpoint != endpoint {
            tracing::warn!(
                running = export.endpoint,
                asked = endpoint,
                "spans already go to another OTLP endpoint in this process"
            );
        }
        return Ok(());
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("OTLP exporter for {endpoint}: {e}"))?;
    let mut resource = opentelemetry_sdk::Resource::builder()
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("infergate");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "infergate");
    let export = Export {
        provider,
        tracer,
        endpoint: endpoint.to_owned(),
    };
    if EXPORT.set(export).is_ok() {
        tracing::info!(endpoint, "exporting request spans over OTLP/gRPC");
    }
    Ok(())
}

/// Sends the spans still batched (at shutdown). Waits for the SDK's thread: call it off
/// the runtime's worker threads.
pub fn flush() {
    if let Some(export) = EXPORT.get()
        && let Err(error) = export.provider.force_flush()
    {
        tracing::warn!(%error, "exporting the last spans failed");
    }
}

/// Marks a value that differs on every request (its id, its `traceparent`) for HTTP/2's
/// header compression (HPACK) to send as a literal, never indexed. Indexed, each one entered
/// the connection's table and pushed out a header that repeats (`content-type`, `te`),
/// which the next request then sent in full, and each entry cost hashing and eviction on
/// both ends (`loadtest/instructions.sh` over gRPC). HTTP/1.1 is unaffected.
pub fn never_indexed(value: &mut HeaderValue) {
    value.set_sensitive(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_joined() {
        let parent = parse_traceparent(VALID.as_bytes()).unwrap();
        assert_eq!(
            parent.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");
        assert!(parent.is_sampled() && parent.is_remote());
        // A later version may carry more fields; unknown flag bits are not passed on.
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-extra";
        let parent = parse_traceparent(future.as_bytes()).unwrap();
        assert_eq!(parent.trace_flags(), TraceFlags::SAMPLED);
        assert!(parse_traceparent(format!(" {VALID} ").as_bytes()).is_some());
    }

    #[test]
    fn a_malformed_traceparent_restarts_the_trace() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad.as_bytes()).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn the_backend_gets_this_trace_with_the_gateways_span_as_parent() {
        let client_headers = || {
            let mut headers = HeaderMap::new();
            headers.insert(&TRACEPARENT, HeaderValue::from_static(VALID));
            headers.insert(&TRACESTATE, HeaderValue::from_static("vendor=1"));
            headers
        };
        let joined = RequestTrace::start(Some(VALID.as_bytes()), true);
        let mut headers = client_headers();
        let both = Carried {
            traceparent: true,
            tracestate: true,
        };
        joined.stamp(&mut headers, both);
        assert_eq!(
            headers[&TRACESTATE], "vendor=1",
            "the client's trace goes on"
        );
        let sent = parse_traceparent(headers[&TRACEPARENT].as_bytes()).unwrap();
        assert_eq!(sent.trace_id(), joined.trace_id());
        assert_eq!(
            joined.trace_id_hex().as_str(),
            joined.trace_id().to_string()
        );
        assert_ne!(sent.span_id().to_string(), "00f067aa0ba902b7");
        assert!(
            sent.is_sampled(),
            "the client's sampling decision travels on"
        );
    }

    /// A trace begun here (the client's was malformed, or there was none) and recorded
    /// nowhere (no exporter in unit tests) goes to no backend: nor does the client's
    /// traceparent or tracestate, which belonged to no valid trace.
    #[test]
    fn a_trace_begun_here_and_recorded_nowhere_is_not_sent_on() {
        assert!(EXPORT.get().is_none());
        let fresh = RequestTrace::start(Some(b"garbage"), true);
        let mut headers = HeaderMap::new();
        headers.insert(&TRACEPARENT, HeaderValue::from_static("garbage"));
        headers.insert(&TRACESTATE, HeaderValue::from_static("vendor=1"));
        let both = Carried {
            traceparent: true,
            tracestate: true,
        };
        fresh.stamp(&mut headers, both);
        assert!(headers.is_empty(), "{headers:?}");
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, HeaderValue::from_static("gw"));
        RequestTrace::start(None, true).stamp(&mut headers, Carried::default());
        assert_eq!(headers.len(), 1, "nothing stamped: {headers:?}");
    }

    /// The `traceparent` sent on, over HTTP or on gRPC metadata, is never indexed by HTTP/2's
    /// header compression: it differs on every request.
    #[test]
    fn a_traceparent_sent_on_is_never_indexed() {
        let trace = RequestTrace::start(Some(VALID.as_bytes()), true);
        let mut headers = http::HeaderMap::new();
        trace.stamp(&mut headers, Carried::default());
        assert!(headers[&TRACEPARENT].is_sensitive());
    }

    #[test]
    fn span_names_do_not_name_models() {
        assert_eq!(
            route_template("/v2/models/add_sub/versions/2/infer"),
            "/v2/models/{model}/versions/{version}/infer"
        );
        assert_eq!(
            route_template("/v2/repository/models/m/load"),
            "/v2/repository/models/{model}/load"
        );
        assert_eq!(route_template("/v2/health/ready"), "/v2/health/ready");
    }
}
