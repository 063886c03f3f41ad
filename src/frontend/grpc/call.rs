//! The edge of every gRPC call, once, as `frontend::http::edge` is for HTTP: the request id
//! (taken or made, sent to the backend, returned), the config snapshot, the span, the
//! in-flight gauge, the client's deadline, and at the end the finish phase
//! (`pipeline::finish::record`) with `protocol="grpc"`.
//!
//! The client's `grpc-timeout` is read here, at the call's edge, and the gateway answers
//! DEADLINE_EXCEEDED itself: the service is served by axum, without the timeout layer of
//! tonic's own server (which would answer CANCELLED).
//!
//! `grpc_layer` runs before tonic sees a request: it decides when an answer is compressed,
//! and turns tonic's OUT_OF_RANGE for an oversized request message into RESOURCE_EXHAUSTED
//! with a message naming the setting.

use crate::error::{ErrorKind, GatewayError};
use crate::frontend::{SERVER_HEADER_VALUE, Sent, X_REQUEST_ID};
use crate::gateway::Gateway;
use crate::model::Served;
use crate::pipeline::RequestCtx;
use crate::pipeline::edge::{Arrival, Edge};
use crate::pipeline::finish::Answered;
use crate::telemetry::scope::LogScope;
use crate::telemetry::series::Protocol;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderValue;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::{Code, Status};

/// The gRPC status of a failure: the backend's own status as it came, or the gateway's
/// (`GatewayError::classify`) with the same message as on HTTP, and `retry-after` metadata
/// where HTTP sends a `Retry-After` header.
impl From<GatewayError> for Status {
    fn from(error: GatewayError) -> Self {
        if let GatewayError::Backend(status) = error {
            return status;
        }
        let mut status = Status::new(error.grpc_code(), error.to_string());
        if error.retries_after() {
            status
                .metadata_mut()
                .insert("retry-after", error.retry_after_secs().into());
        }
        status
    }
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

/// One gRPC call from start to its one log line: the pipeline's `Edge` read from the
/// call's metadata, whose context the call's work runs on.
pub struct Call {
    rpc: &'static str,
    edge: Edge,
}

impl Call {
    /// Starts the edge of a call: the request id from the client's `x-request-id` metadata
    /// (kept when short printable ASCII) or a new one, the client's deadline, and the config
    /// snapshot. The call's trace goes on its metadata, which is what a backend is sent.
    pub fn start<T>(gateway: &Gateway, rpc: &'static str, request: &mut tonic::Request<T>) -> Self {
        Self::begin(gateway, rpc, request, false)
    }

    /// Starts a health probe's call: logged at debug level, as HTTP's probes are, and
    /// without a span of its own in the exported traces (a kubelet probes every few seconds).
    pub fn start_probe<T>(
        gateway: &Gateway,
        rpc: &'static str,
        request: &mut tonic::Request<T>,
    ) -> Self {
        Self::begin(gateway, rpc, request, true)
    }

    fn begin<T>(
        gateway: &Gateway,
        rpc: &'static str,
        request: &mut tonic::Request<T>,
        probe: bool,
    ) -> Self {
        let metadata = request.metadata().as_ref();
        let sent = Sent::of(metadata);
        let deadline = client_timeout(metadata).map(|timeout| Instant::now() + timeout);
        let carried = sent.carried();
        let edge = Edge::begin(
            gateway,
            Arrival {
                protocol: Protocol::Grpc,
                id: sent.id,
                traceparent: sent.traceparent.map(|v| v.as_bytes()),
                peer: request
                    .extensions()
                    .get::<crate::tls::PeerIdentity>()
                    .map(|p| &p.subject),
                deadline,
                probe,
            },
        );
        if let Some(trace) = edge.trace() {
            trace.stamp(request.metadata_mut().as_mut(), carried);
        }
        Self { rpc, edge }
    }

    /// The call's request context.
    pub fn ctx(&self) -> &RequestCtx {
        &self.edge.ctx
    }

    /// The scope every log line of the call carries.
    pub fn scope(&self) -> &LogScope {
        self.edge.scope()
    }

    /// Records what served a stream (its first model): a stream's messages each have a
    /// context of their own.
    pub fn served(&mut self, served: Option<Served>) {
        self.edge.ctx.serving = served;
    }

    /// Adds the call's own metadata to an answer: the request id, and the route target (as
    /// HTTP returns it in a header).
    fn stamp(&self, metadata: &mut MetadataMap) {
        stamp_id(metadata, &self.edge.ctx.id);
        if let Some(label) = self.edge.ctx.target_label()
            && let Ok(value) = AsciiMetadataValue::try_from(label)
        {
            metadata.insert(crate::protocol::TARGET_HEADER, value);
        }
    }

    /// Runs the call's work on its context, in its span, within the client's deadline.
    pub async fn run<T>(
        &mut self,
        work: impl AsyncFnOnce(&mut RequestCtx) -> Result<T, GatewayError>,
    ) -> Result<T, GatewayError> {
        let scope = self.edge.scope().clone();
        let ctx = &mut self.edge.ctx;
        let deadline = ctx.deadline;
        let outcome = {
            let work = scope.wrap(work(ctx));
            match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, work).await.ok(),
                None => Some(work.await),
            }
        };
        match (outcome, deadline) {
            (Some(outcome), _) => outcome.map_err(|error| ctx.deadline_passed(error)),
            (None, Some(deadline)) => Err(ctx.deadline_exceeded(deadline)),
            (None, None) => unreachable!("only a deadline times out"),
        }
    }

    /// Runs a stream's work in its span, within the client's deadline.
    pub async fn run_stream(
        &self,
        work: impl Future<Output = Result<(), GatewayError>>,
    ) -> Result<(), GatewayError> {
        let work = self.scope().wrap(work);
        match self.edge.ctx.deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, work).await {
                Ok(outcome) => outcome,
                Err(_) => Err(self.edge.ctx.deadline_exceeded(deadline)),
            },
            None => work.await,
        }
    }

    /// The gateway the call is served by.
    pub fn gateway(&self) -> &Gateway {
        &self.edge.ctx.gateway
    }

    /// Ends a unary call: the request id on the answer, the metrics, the log line.
    pub fn finish<T>(
        mut self,
        outcome: Result<tonic::Response<T>, GatewayError>,
    ) -> Result<tonic::Response<T>, Status> {
        match outcome {
            Ok(mut response) => {
                *response.metadata_mut() = without_hop(response.metadata());
                self.stamp(response.metadata_mut());
                self.log(Code::Ok, None, None, &[]);
                Ok(response)
            }
            Err(error) => Err(self.fail(error, &[])),
        }
    }

    /// Ends a call with an error status: logged and counted, the request id attached.
    pub fn fail(mut self, error: GatewayError, extra: &[(&str, u64)]) -> Status {
        let report = error.report();
        let mut status = Status::from(error);
        self.stamp(status.metadata_mut());
        let message = status.message().to_owned();
        self.log(status.code(), report.as_ref(), Some(&message), extra);
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
        // Stream counters (messages, responses) as one field, so each line has one shape.
        let counts = extra
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let answered = Answered::Grpc {
            rpc: self.rpc,
            code: code as i32,
            message,
            counts: &counts,
        };
        self.edge.end(answered, error);
    }
}

/// Puts the request id on metadata going out (to a backend, or back to the client): the
/// id's own shared bytes, not a copy.
pub fn stamp_id(metadata: &mut MetadataMap, id: &HeaderValue) {
    metadata.as_mut().insert(X_REQUEST_ID.clone(), id.clone());
}

/// `metadata` without what belongs to one hop (content type, encodings, timeouts, status),
/// which is never copied from one side of the gateway to the other: tonic writes its own.
/// Most of a call's metadata is of one hop: what stays is put in a new map (each value
/// shared, not copied), where cloning the map and taking the rest out would hash and remove
/// each.
pub fn without_hop(metadata: &MetadataMap) -> MetadataMap {
    let hop = |name: &http::HeaderName| {
        let name = name.as_str();
        name.starts_with("grpc-")
            || matches!(
                name,
                "te" | "content-type" | "content-length" | "user-agent" | "x-request-id"
            )
    };
    let mut kept = http::HeaderMap::new();
    for (name, value) in metadata.as_ref() {
        if !hop(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    MetadataMap::from_headers(kept)
}

/// A call's time budget, from the client (and to a backend).
const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// The time the client gives a call (its `grpc-timeout`), when it gave one that parses: read
/// here for a unary call's deadline and a stream's alike.
pub(super) fn client_timeout(metadata: &http::HeaderMap) -> Option<Duration> {
    metadata
        .get(&GRPC_TIMEOUT)
        .and_then(|value| parse_timeout(value.as_bytes()))
}

/// Parses a `grpc-timeout` value: up to 8 digits and a unit (H, M, S, m, u, n).
fn parse_timeout(value: &[u8]) -> Option<Duration> {
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

/// Tower middleware in front of tonic: when answers are compressed, and the size-limit
/// answer (see the module doc). A request refused by tonic before any handler
/// ran is logged and counted here.
pub async fn grpc_layer(
    State(gateway): State<Gateway>,
    mut request: Request,
    next: Next,
) -> Response {
    compress_answers_only_when_asked(request.headers_mut());
    // Kept for the rare refusal below: shared bytes, no copy.
    let rpc = request.uri().path_and_query().cloned();
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
        // No handler ran: the call's edge is made here, for its answer and its log line.
        let mut edge = Edge::begin(
            &gateway,
            Arrival {
                protocol: Protocol::Grpc,
                id: client_id.as_ref(),
                traceparent: None,
                peer: None,
                deadline: None,
                probe: false,
            },
        );
        edge.ctx.started = started;
        let error = GatewayError::MessageTooLarge {
            limit: gateway.fixed_config().server.max_grpc_message_size.bytes(),
        };
        headers.insert("grpc-status", HeaderValue::from(error.grpc_code() as i32));
        headers.insert(
            "grpc-message",
            HeaderValue::from_str(&error.to_string()).expect("ASCII message"),
        );
        headers.insert(X_REQUEST_ID.clone(), edge.ctx.id.clone());
        let answered = Answered::Grpc {
            rpc: rpc.as_ref().map_or("", |p| p.path()),
            code: error.grpc_code() as i32,
            message: None,
            counts: "",
        };
        edge.end(answered, error.report().as_ref());
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
        map.append("x-tenant", "b".parse().unwrap());
        map.append("grpc-timeout", "1S".parse().unwrap());
        let map = without_hop(&map);
        let tenants: Vec<_> = map.get_all("x-tenant").iter().collect();
        assert_eq!(tenants, ["a", "b"], "every value of a kept name, in order");
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

    fn gateway() -> Gateway {
        let config = crate::config::Config::parse(
            "[listen]\nhttp = \"127.0.0.1:0\"\n[[backends]]\nname = \"b\"\nhttp = \"http://127.0.0.1:1\"",
        )
        .unwrap();
        Gateway::new(config).unwrap()
    }

    /// A call whose client gave it `after` (`grpc-timeout`), started now.
    fn with_deadline(after: Duration) -> (Call, Instant) {
        let mut request = tonic::Request::new(());
        let timeout = format!("{}m", after.as_millis());
        request
            .metadata_mut()
            .insert("grpc-timeout", timeout.parse().unwrap());
        let call = Call::start(&gateway(), "ModelInfer", &mut request);
        (call, Instant::now() + after)
    }

    #[tokio::test(start_paused = true)]
    async fn the_clients_deadline_ends_the_work_with_deadline_exceeded() {
        let (mut call, deadline) = with_deadline(Duration::from_millis(300));
        assert_eq!(
            call.ctx().budget(Duration::from_secs(60)),
            Duration::from_millis(300)
        );
        let outcome: Result<(), GatewayError> =
            call.run(async |_| std::future::pending().await).await;
        assert_eq!(Instant::now(), deadline);
        let error = outcome.unwrap_err();
        assert!(
            matches!(error, GatewayError::DeadlineExceeded { after } if after == Duration::from_millis(300))
        );
        let status = call.fail(error, &[]);
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(status.message().contains("300ms"));
        assert!(status.metadata().get("x-request-id").is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_backend_out_of_the_clients_time_is_the_clients_deadline() {
        let (mut call, _) = with_deadline(Duration::from_millis(300));
        let timeout = || GatewayError::UpstreamTimeout {
            backend: "b".into(),
            after: Duration::from_millis(300),
        };
        // Before the deadline, the backend's own timeout (upstream.request_timeout) is its.
        assert!(matches!(
            call.ctx().deadline_passed(timeout()),
            GatewayError::UpstreamTimeout { .. }
        ));
        tokio::time::advance(Duration::from_millis(300)).await;
        let outcome: Result<(), GatewayError> = call.run(async |_| Err(timeout())).await;
        let status = call.fail(outcome.unwrap_err(), &[]);
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(
            status.message().contains("passed in the gateway"),
            "{status:?}"
        );
    }

    #[test]
    fn failures_map_to_statuses() {
        let status = Status::from(GatewayError::MessageTooLarge { limit: 10 });
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("server.max_grpc_message_size"));
        let passed = Status::from(GatewayError::Backend(Status::invalid_argument("shape")));
        assert_eq!(
            (passed.code(), passed.message()),
            (Code::InvalidArgument, "shape")
        );
        let busy = Status::from(GatewayError::Churn {
            retry_after: Duration::from_secs(3),
        });
        assert_eq!(busy.metadata().get("retry-after").unwrap(), "3");
    }
}
