//! The edge of every gRPC call, once, as `frontend::edge` is for HTTP: the request id (taken
//! or made, sent to the backend, returned), the span, the in-flight gauge, the client's
//! deadline, the shared request metrics with `protocol="grpc"`, and one access-log line.
//!
//! `grpc_layer` runs before tonic sees a request: it takes `grpc-timeout` off the headers into
//! a `Deadline` (so the gateway answers DEADLINE_EXCEEDED itself, where tonic's server would
//! answer CANCELLED), and turns tonic's OUT_OF_RANGE for an oversized request message into
//! RESOURCE_EXHAUSTED with a message naming the setting.

use crate::Gateway;
use crate::error::{ErrorKind, ErrorSource, GatewayError};
use crate::frontend::{
    InFlightGauge, Protocol, SERVER_HEADER_VALUE, Served, X_REQUEST_ID, grpc_status_class, record,
    request_id,
};
use crate::trace::RequestTrace;
use crate::upstream::grpc::CallError;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderValue;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::{Code, Status};
use tracing::{Instrument, Span};

/// When the client stops waiting (from its `grpc-timeout`).
#[derive(Clone, Copy, Debug)]
pub struct Deadline(pub Instant);

/// How a call failed, as far as the log and metrics care.
#[derive(Debug)]
pub enum Failure {
    /// The gateway answered the failure itself.
    Gateway(GatewayError),
    /// The backend's own answer, passed through as it is (as HTTP passes Triton's errors).
    Backend(Status),
    /// The client's deadline passed while the gateway was still working on the call.
    Deadline(Duration),
    /// A request message larger than `server.max_grpc_message_size`.
    TooLarge(u64),
}

impl From<GatewayError> for Failure {
    fn from(error: GatewayError) -> Self {
        Self::Gateway(error)
    }
}

impl From<CallError> for Failure {
    fn from(error: CallError) -> Self {
        match error {
            CallError::Gateway(error) => Self::Gateway(error),
            CallError::Backend(status) => Self::Backend(status),
        }
    }
}

impl Failure {
    /// A failure on the server's side (what a 5xx is in HTTP): what route guards count.
    pub fn is_server_error(&self) -> bool {
        match self {
            Self::Gateway(error) => error.http_status().is_server_error(),
            Self::Backend(status) => {
                crate::frontend::edge::grpc_status_class(status.code()) == "5xx"
            }
            Self::Deadline(_) | Self::TooLarge(_) => false,
        }
    }

    /// The status sent to the client, and what the log and the error counter say of it.
    fn into_status(self) -> (Status, Option<ErrorKind>) {
        match self {
            Self::Gateway(error) => {
                let kind = ErrorKind {
                    kind: error.kind(),
                    source: error.source(),
                    message: error.to_string(),
                };
                (error.into(), Some(kind))
            }
            Self::Backend(status) => (status, None),
            Self::Deadline(after) => {
                let message = format!(
                    "deadline exceeded: the client's deadline of {}ms passed in the gateway",
                    after.as_millis()
                );
                let kind = ErrorKind {
                    kind: "deadline_exceeded",
                    source: ErrorSource::Client,
                    message: message.clone(),
                };
                (Status::deadline_exceeded(message), Some(kind))
            }
            Self::TooLarge(limit) => {
                let error = GatewayError::BodyTooLarge { limit };
                let message = too_large_message(limit);
                let kind = ErrorKind {
                    kind: error.kind(),
                    source: error.source(),
                    message: message.clone(),
                };
                (Status::new(error.grpc_code(), message), Some(kind))
            }
        }
    }
}

/// What a client is told when its message is over the limit.
pub fn too_large_message(limit: u64) -> String {
    format!(
        "request message is larger than the limit of {limit} bytes (server.max_grpc_message_size)"
    )
}

/// Tonic's own words for a message over the decoding limit (it answers OUT_OF_RANGE).
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";

/// Whether a status is tonic's refusal of a message over the decoding limit.
pub fn is_too_large(status: &Status) -> bool {
    status.code() == Code::OutOfRange && status.message().starts_with(TONIC_TOO_LARGE)
}

/// Whether a `grpc-message` header (percent-encoded) starts with tonic's words.
fn is_too_large_header(value: &[u8]) -> bool {
    let mut decoded = Vec::with_capacity(TONIC_TOO_LARGE.len());
    let mut rest = value;
    while decoded.len() < TONIC_TOO_LARGE.len() {
        match rest {
            [b'%', hi, lo, tail @ ..] => {
                let hex = [*hi, *lo];
                let Some(byte) = std::str::from_utf8(&hex)
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                else {
                    return false;
                };
                decoded.push(byte);
                rest = tail;
            }
            [byte, tail @ ..] => {
                decoded.push(*byte);
                rest = tail;
            }
            [] => break,
        }
    }
    decoded == TONIC_TOO_LARGE.as_bytes()
}

/// One gRPC call from start to its one log line.
pub struct Call {
    rpc: &'static str,
    id: HeaderValue,
    /// Taken when the call's span ends, in `log`.
    trace: Option<RequestTrace>,
    deadline: Option<Instant>,
    started: Instant,
    probe: bool,
    span: Span,
    served: Mutex<Served>,
    target: Mutex<Option<String>>,
    /// The subject of the client's verified certificate (mTLS), a credential for auth.
    peer: Option<String>,
    tenant: std::sync::OnceLock<std::sync::Arc<str>>,
    _in_flight: InFlightGauge,
}

impl Call {
    /// Starts the edge of a call: the request id from the client's `x-request-id` metadata
    /// (kept when short printable ASCII) or a new one, the deadline from `grpc_layer`.
    pub fn start<T>(rpc: &'static str, request: &tonic::Request<T>) -> Self {
        Self::begin(rpc, request, false)
    }

    /// Starts a health probe's call: logged at debug level, as HTTP's probes are, and
    /// without a span of its own in the exported traces (a kubelet probes every few seconds).
    pub fn start_probe<T>(rpc: &'static str, request: &tonic::Request<T>) -> Self {
        Self::begin(rpc, request, true)
    }

    fn begin<T>(rpc: &'static str, request: &tonic::Request<T>, probe: bool) -> Self {
        let client = request
            .metadata()
            .get("x-request-id")
            .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok());
        let id = request_id(client.as_ref());
        let traceparent = request.metadata().get("traceparent").map(|v| v.as_bytes());
        let trace = RequestTrace::start(traceparent, !probe);
        let span = tracing::info_span!(
            "request",
            request_id = %id.to_str().unwrap_or_default(),
            trace_id = %trace.trace_id(),
            peer = tracing::field::Empty
        );
        crate::frontend::edge::record_peer(&span, request.extensions());
        Self {
            rpc,
            id,
            trace: Some(trace),
            deadline: request.extensions().get::<Deadline>().map(|d| d.0),
            peer: request
                .extensions()
                .get::<crate::tls::PeerIdentity>()
                .map(|p| p.subject.clone()),
            started: Instant::now(),
            probe,
            span,
            served: Mutex::new(Served::default()),
            target: Mutex::new(None),
            tenant: std::sync::OnceLock::new(),
            _in_flight: InFlightGauge::start(Protocol::Grpc),
        }
    }

    /// The request id, as metadata for the backend and the answer.
    pub fn id(&self) -> AsciiMetadataValue {
        AsciiMetadataValue::try_from(self.id.as_bytes()).expect("request ids are ASCII")
    }

    /// Puts the call's trace on the metadata a backend will receive.
    pub fn stamp_trace(&self, metadata: &mut MetadataMap) {
        if let Some(trace) = &self.trace {
            trace.stamp_metadata(metadata);
        }
    }

    /// The span every log line of the call carries.
    pub fn span(&self) -> &Span {
        &self.span
    }

    /// Records what served the call (only once a backend has the model, so unknown names
    /// never become metric labels).
    pub fn served(&self, served: Served) {
        *self.served.lock().expect("served lock") = served;
    }

    /// Records the caller's tenant for the log line.
    pub fn tenant(&self, tenant: std::sync::Arc<str>) {
        let _ = self.tenant.set(tenant);
    }

    /// Records the route target (`model[/version]`) that serves the call: returned to the
    /// client in `infergate-target` metadata, as HTTP returns it in a header.
    pub fn routed_to(&self, label: String) {
        *self.target.lock().expect("target lock") = Some(label);
    }

    /// Adds the call's own metadata to an answer: the request id, the route target.
    fn stamp(&self, metadata: &mut MetadataMap) {
        metadata.insert("x-request-id", self.id());
        if let Some(label) = self.target.lock().expect("target lock").as_deref()
            && let Ok(value) = AsciiMetadataValue::try_from(label)
        {
            metadata.insert(crate::protocol::TARGET_HEADER, value);
        }
    }

    /// The subject of the client's verified certificate, if any.
    pub fn peer(&self) -> Option<&str> {
        self.peer.as_deref()
    }

    /// The client's deadline, if it set one.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Time left for a call to a backend: the configured cap, or less when the client's
    /// deadline comes first.
    pub fn budget(&self, cap: Duration) -> Duration {
        match self.deadline {
            Some(deadline) => cap.min(deadline.saturating_duration_since(Instant::now())),
            None => cap,
        }
    }

    /// Runs the call's work in its span, within the client's deadline.
    pub async fn run<T>(
        &self,
        work: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let work = work.instrument(self.span.clone());
        match self.deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, work).await {
                Ok(outcome) => outcome.map_err(|failure| self.deadline_passed(failure)),
                Err(_) => Err(Failure::Deadline(deadline - self.started)),
            },
            None => work.await,
        }
    }

    /// A backend call given only what was left of the client's deadline ends with the
    /// gateway's own timer at about the moment the deadline passes, and races the timer in
    /// `run`. When the deadline has passed, it is the client's deadline, not a slow backend:
    /// answered and counted as `deadline_exceeded`, and not counted by route guards.
    pub fn deadline_passed(&self, failure: Failure) -> Failure {
        match (failure, self.deadline) {
            (Failure::Gateway(GatewayError::UpstreamTimeout { .. }), Some(deadline))
                if Instant::now() >= deadline =>
            {
                Failure::Deadline(deadline - self.started)
            }
            (failure, _) => failure,
        }
    }

    /// Ends a unary call: the request id on the answer, the metrics, the log line.
    pub fn finish<T>(
        mut self,
        outcome: Result<tonic::Response<T>, Failure>,
    ) -> Result<tonic::Response<T>, Status> {
        match outcome {
            Ok(mut response) => {
                strip_reserved(response.metadata_mut());
                self.stamp(response.metadata_mut());
                self.log(Code::Ok, None, None, &[]);
                Ok(response)
            }
            Err(failure) => Err(self.fail(failure, &[])),
        }
    }

    /// Ends a call with an error status: logged and counted, the request id attached.
    pub fn fail(mut self, failure: Failure, extra: &[(&str, u64)]) -> Status {
        let (mut status, kind) = failure.into_status();
        self.stamp(status.metadata_mut());
        let message = status.message().to_owned();
        self.log(status.code(), kind.as_ref(), Some(&message), extra);
        status
    }

    /// Ends a streaming call that closed cleanly.
    pub fn finish_stream(mut self, extra: &[(&str, u64)]) {
        self.log(Code::Ok, None, None, extra);
    }

    fn log(
        &mut self,
        code: Code,
        error: Option<&ErrorKind>,
        message: Option<&str>,
        extra: &[(&str, u64)],
    ) {
        let elapsed = self.started.elapsed();
        let served = self.served.lock().expect("served lock").clone();
        record(
            Protocol::Grpc,
            &served,
            grpc_status_class(code),
            elapsed,
            error,
        );
        if let Some(trace) = self.trace.take() {
            trace.finish_grpc(self.rpc, code, &served, error);
        }
        let latency_ms = elapsed.as_secs_f64() * 1e3;
        let _entered = self.span.enter();
        let rpc = self.rpc;
        let tenant = self.tenant.get().map_or("", |t| &**t);
        // A string, so the text log quotes it as before (`code="Ok"`).
        let code_name = format!("{code:?}");
        let version = served.version.as_deref().unwrap_or("");
        // Stream counters (messages, responses) as one field, so each line has one shape.
        let counts = extra
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        match error {
            Some(e) if e.source != ErrorSource::Client => tracing::warn!(
                rpc,
                model = served.model,
                version,
                tenant,
                backend = served.backend,
                code = code_name,
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
                code = code_name,
                latency_ms,
                counts,
                error = e.kind,
                reason = e.message,
                "request refused"
            ),
            None if self.probe => {
                tracing::debug!(rpc, code = code_name, latency_ms, "probe")
            }
            None => tracing::info!(
                rpc,
                model = served.model,
                version,
                tenant,
                backend = served.backend,
                code = code_name,
                latency_ms,
                counts,
                reason = message.unwrap_or(""),
                "request"
            ),
        }
    }
}

/// Metadata that belongs to one hop (content type, encodings, timeouts, status) and is
/// never copied from one side of the gateway to the other: tonic writes its own.
pub fn strip_reserved(metadata: &mut MetadataMap) {
    let mut headers = std::mem::take(metadata).into_headers();
    let hop: Vec<_> = headers
        .keys()
        .filter(|name| {
            let name = name.as_str();
            name.starts_with("grpc-")
                || matches!(
                    name,
                    "te" | "content-type" | "content-length" | "user-agent" | "x-request-id"
                )
        })
        .cloned()
        .collect();
    for name in hop {
        headers.remove(name);
    }
    *metadata = MetadataMap::from_headers(headers);
}

/// Parses a `grpc-timeout` value: up to 8 digits and a unit (H, M, S, m, u, n).
pub fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b"H" => Duration::from_secs(amount * 3600),
        b"M" => Duration::from_secs(amount * 60),
        b"S" => Duration::from_secs(amount),
        b"m" => Duration::from_millis(amount),
        b"u" => Duration::from_micros(amount),
        b"n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// A client gets a compressed answer when it compressed its request (`grpc-encoding`) and
/// reads the encoding back (`grpc-accept-encoding`). Left alone, tonic compresses the answer
/// for every client that merely lists encodings it can read, and grpc-core clients (Python's
/// tritonclient, C++) list `identity, deflate, gzip` on every call: Triton answers them
/// plain, and deflating every output tensor would spend CPU on the hot path for clients
/// that never asked.
fn compress_answers_only_when_asked(headers: &mut http::HeaderMap) {
    let compressed = headers
        .get("grpc-encoding")
        .is_some_and(|encoding| encoding != "identity");
    if !compressed {
        headers.remove("grpc-accept-encoding");
    }
}

/// Tower middleware in front of tonic: the deadline, when answers are compressed, and the
/// size-limit answer (see the module doc). A request refused by tonic before any handler
/// ran is logged and counted here.
pub async fn grpc_layer(
    State(gateway): State<Gateway>,
    mut request: Request,
    next: Next,
) -> Response {
    compress_answers_only_when_asked(request.headers_mut());
    if let Some(value) = request.headers_mut().remove("grpc-timeout")
        && let Some(timeout) = parse_timeout(value.as_bytes())
    {
        request
            .extensions_mut()
            .insert(Deadline(Instant::now() + timeout));
    }
    let uri = request.uri().clone(); // shares the bytes: a copy only if it is logged

    let client_id = request.headers().get(&X_REQUEST_ID).cloned();
    let started = Instant::now();
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(http::header::SERVER, SERVER_HEADER_VALUE);
    let too_large = headers.get("grpc-status").is_some_and(|s| s == "11")
        && headers
            .get("grpc-message")
            .is_some_and(|m| is_too_large_header(m.as_bytes()));
    if too_large {
        let limit = gateway.config().server.max_grpc_message_size.bytes();
        let message = too_large_message(limit);
        let id = request_id(client_id.as_ref());
        headers.insert(
            "grpc-status",
            HeaderValue::from(Code::ResourceExhausted as i32),
        );
        headers.insert(
            "grpc-message",
            HeaderValue::from_str(&message).expect("ASCII message"),
        );
        headers.insert(X_REQUEST_ID.clone(), id.clone());
        let error = ErrorKind {
            kind: GatewayError::BodyTooLarge { limit }.kind(),
            source: ErrorSource::Client,
            message,
        };
        let elapsed = started.elapsed();
        record(
            Protocol::Grpc,
            &Served::default(),
            grpc_status_class(Code::ResourceExhausted),
            elapsed,
            Some(&error),
        );
        let span = tracing::info_span!("request", request_id = %id.to_str().unwrap_or_default());
        let _entered = span.enter();
        tracing::info!(
            rpc = uri.path(),
            code = "ResourceExhausted",
            latency_ms = elapsed.as_secs_f64() * 1e3,
            error = error.kind,
            message = error.message,
            "request refused"
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_in_every_unit() {
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_timeout(b"250m"), Some(Duration::from_millis(250)));
        assert_eq!(
            parse_timeout(b"99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_timeout(b"7n"), Some(Duration::from_nanos(7)));
        for bad in [&b""[..], b"S", b"123456789S", b"1x", b"-1S", b"1.5S"] {
            assert_eq!(parse_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tonics_size_refusal_is_recognised_encoded_or_not() {
        assert!(is_too_large_header(
            b"Error,%20decoded%20message%20length%20too%20large:%20found%202%20bytes"
        ));
        assert!(is_too_large_header(
            b"Error, decoded message length too large: found 2 bytes"
        ));
        assert!(!is_too_large_header(b"Error,%20decoded"));
        assert!(!is_too_large_header(b"%zz"));
        let status = Status::out_of_range(format!("{TONIC_TOO_LARGE}: found 9 bytes"));
        assert!(is_too_large(&status));
    }

    #[test]
    fn hop_metadata_is_not_forwarded() {
        let mut map = MetadataMap::new();
        map.insert("grpc-accept-encoding", "gzip".parse().unwrap());
        map.insert("content-type", "application/grpc".parse().unwrap());
        map.insert("x-request-id", "old".parse().unwrap());
        map.insert("authorization", "Bearer t".parse().unwrap());
        map.insert("x-tenant", "a".parse().unwrap());
        strip_reserved(&mut map);
        let mut names: Vec<_> = map
            .keys()
            .map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => k.as_str().to_owned(),
                tonic::metadata::KeyRef::Binary(k) => k.as_str().to_owned(),
            })
            .collect();
        names.sort();
        assert_eq!(names, ["authorization", "x-tenant"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_clients_deadline_ends_the_work_with_deadline_exceeded() {
        let mut request = tonic::Request::new(());
        let deadline = Instant::now() + Duration::from_millis(300);
        request.extensions_mut().insert(Deadline(deadline));
        let call = Call::start("ModelInfer", &request);
        assert_eq!(
            call.budget(Duration::from_secs(60)),
            Duration::from_millis(300)
        );
        let outcome: Result<(), Failure> = call.run(std::future::pending()).await;
        assert_eq!(Instant::now(), deadline);
        let failure = outcome.unwrap_err();
        assert!(matches!(failure, Failure::Deadline(after) if after == Duration::from_millis(300)));
        let status = call.fail(failure, &[]);
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(status.message().contains("300ms"));
        assert!(status.metadata().get("x-request-id").is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_backend_out_of_the_clients_time_is_the_clients_deadline() {
        let mut request = tonic::Request::new(());
        let deadline = Instant::now() + Duration::from_millis(300);
        request.extensions_mut().insert(Deadline(deadline));
        let call = Call::start("ModelInfer", &request);
        let timeout = || {
            Failure::Gateway(GatewayError::UpstreamTimeout {
                backend: "b".into(),
                after: Duration::from_millis(300),
            })
        };
        // Before the deadline, the backend's own timeout (upstream.request_timeout) is its.
        assert!(matches!(
            call.deadline_passed(timeout()),
            Failure::Gateway(GatewayError::UpstreamTimeout { .. })
        ));
        tokio::time::advance(Duration::from_millis(300)).await;
        let outcome: Result<(), Failure> = call.run(async { Err(timeout()) }).await;
        let status = call.fail(outcome.unwrap_err(), &[]);
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(
            status.message().contains("passed in the gateway"),
            "{status:?}"
        );
    }

    #[test]
    fn failures_map_to_codes() {
        let (status, kind) = Failure::TooLarge(10).into_status();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("server.max_grpc_message_size"));
        assert_eq!(kind.unwrap().kind, "body_too_large");
        let (status, kind) = Failure::Deadline(Duration::from_millis(5)).into_status();
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(kind.unwrap().source, ErrorSource::Client);
        let (status, kind) = Failure::Backend(Status::invalid_argument("shape")).into_status();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(kind.is_none());
    }
}
