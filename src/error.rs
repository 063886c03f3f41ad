//! `GatewayError`: every way a request can fail, where the failure came from, and how it is
//! answered on the wire.
//!
//! One enum and one classification so that HTTP and gRPC answer the same failure the same
//! way. The HTTP body is Triton's own error shape, `{"error": "..."}`, and the gRPC status
//! carries the same message, so Triton clients show our messages exactly as they would show
//! Triton's.

use http::{HeaderValue, StatusCode};
use std::time::Duration;
use tonic::Code;

/// Who caused a failure: decides the log level and the `source` metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorSource {
    /// The request was wrong.
    Client,
    /// A backend failed or is missing.
    Upstream,
    /// The gateway itself (shutting down, a bug).
    Gateway,
}

impl ErrorSource {
    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Upstream => "upstream",
            Self::Gateway => "gateway",
        }
    }
}

/// A failed request, answered by the gateway itself.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No backend knows the model.
    #[error("Request for unknown model: '{model}' is not found")]
    UnknownModel { model: String },
    /// The model is known but has no such version (Triton's words for a version it lacks).
    #[error("Request for unknown model: '{model}' version {version} is not found")]
    UnknownVersion { model: String, version: u64 },
    /// Some backend knows the model but none has it ready.
    #[error("model '{model}'{} is not ready on any backend", version_suffix(.version))]
    ModelNotReady {
        model: String,
        version: Option<String>,
    },
    /// The model is loaded nowhere and this request may not load it: a readiness, metadata,
    /// config or statistics call (which never load), or any request after an explicit
    /// unload. Worded and classified as Triton answers a model it has not loaded.
    #[error("{}", not_loaded_message(.model, .version, *.ask))]
    NotLoaded {
        model: String,
        version: Option<String>,
        ask: crate::model::Ask,
    },
    /// A load through the repository API names a model no backend's repository has. Triton
    /// answers this 500 ("failed to load ..."), and so does the gateway.
    #[error("failed to load '{model}': no backend's model repository has a model of that name")]
    UnknownModelLoad { model: String },
    /// No backend passes its health checks.
    #[error("no backend is ready to serve requests")]
    NoBackendReady,
    /// The body exceeds `server.max_body_size`.
    #[error("request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: u64 },
    /// A gRPC request message over `server.max_grpc_message_size`.
    #[error(
        "request message is larger than the limit of {limit} bytes (server.max_grpc_message_size)"
    )]
    MessageTooLarge { limit: u64 },
    /// The request body came slower than `server.min_body_rate` (the whole message says by
    /// how much): the client holds a connection for nothing, as a slow POST does.
    #[error("{reason}")]
    BodyTooSlow { reason: String },
    /// The client's deadline passed while the gateway was still working on the request.
    #[error("deadline exceeded: the client's deadline of {}ms passed in the gateway", .after.as_millis())]
    DeadlineExceeded { after: Duration },
    /// A backend's own failure answer, passed through as the backend wrote it (as HTTP
    /// passes Triton's error bodies through): the backend's code and message, not the
    /// gateway's, so it is neither logged nor counted as the gateway's error.
    #[error("{}", .0.message())]
    Backend(tonic::Status),
    /// A backend's refusal of a control question the gateway asked on its client's behalf
    /// (statistics, the repository index), passed on as the backend worded it: the status
    /// Triton's control API answered with and its message. Like `Backend`, the backend's
    /// answer rather than the gateway's failure; each front-end writes it as Triton's own
    /// server of that protocol would (the status with `{"error": ...}`, or the gRPC code
    /// Triton's gRPC server gives the same failure).
    #[error("{message}")]
    BackendRefused { status: StatusCode, message: String },
    /// The request is malformed in a way the gateway can tell.
    #[error("{0}")]
    BadRequest(String),
    /// An inference request does not match the model's signature; `reason` is a short
    /// stable label for metrics (`shape`, `datatype`, ...), the message says what was wrong.
    #[error("{message}")]
    InvalidInput {
        reason: &'static str,
        message: String,
    },
    /// A request parameter the gateway cannot honour or read (the OpenAI endpoints):
    /// refused rather than dropped, naming the parameter (`param`) so that OpenAI's error
    /// shape can point at it.
    #[error("{message}")]
    InvalidParameter { param: String, message: String },
    /// A prompt (with its `max_tokens`) longer than the model's context (the OpenAI
    /// endpoints): refused before any backend work, as OpenAI refuses it
    /// (`context_length_exceeded`), naming the parameter that holds the prompt.
    #[error("{message}")]
    ContextLengthExceeded {
        param: &'static str,
        message: String,
    },
    /// No such endpoint.
    #[error("not found: {path}")]
    NotFound { path: String },
    /// The shared-memory extension's endpoints: a region is local to one host.
    #[error("{}", crate::protocol::NO_SHARED_MEMORY)]
    SharedMemoryUnsupported,
    /// The endpoint exists but not for this method.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    /// The backend could not be reached. `refused`: its host turned the connection away
    /// (refused it, or reset it as it was made), so nothing there takes requests (the
    /// request never reached it; any copy it had went with the process, or is out of reach
    /// until the backend is back and its models are read again), unlike a connection that
    /// timed out.
    #[error("backend '{backend}' is unreachable: {reason}")]
    UpstreamUnreachable {
        backend: String,
        reason: String,
        refused: bool,
    },
    /// The backend did not answer in time.
    #[error("backend '{backend}' did not answer within {}ms", .after.as_millis())]
    UpstreamTimeout { backend: String, after: Duration },
    /// The backend broke the exchange after it started.
    #[error("backend '{backend}' failed: {reason}")]
    UpstreamFailed { backend: String, reason: String },
    /// The backend closed or reset the connection before any of its answer came (a
    /// keep-alive connection it dropped as the request went out, as a Triton stalled and
    /// resumed does): nothing came back, so the request may go again (`pipeline::forward`).
    #[error("backend '{backend}' closed the connection before answering")]
    UpstreamClosed { backend: String },
    /// Triton's python backend gave up on the model's stub process, which did not answer
    /// within a second (stalled, or starved of CPU): a passing trouble of that backend, not
    /// the model's own failure, so the client may retry (`forward::stub_stalled`).
    #[error("backend '{backend}' could not run the request: {reason}")]
    UpstreamStalled { backend: String, reason: String },
    /// Every target of the route has weight 0 (all rolled back or switched off).
    #[error("route '{route}' has no target with a weight above 0")]
    RouteUnavailable { route: String },
    /// No backend has room for the model, even after evicting what may be evicted.
    #[error("no backend has room for the model: {reason}")]
    NoRoom { reason: String },
    /// `[cluster]`: a model no copy serves, while the pool's registry cannot be reached.
    /// Loading it blind could overcommit a backend or load it twice; copies already loaded
    /// keep serving.
    #[error(
        "model '{model}' is not loaded and the pool's registry (etcd) cannot be reached; loaded models are still served, new loads wait until it is back"
    )]
    RegistryUnreachable { model: String },
    /// Making room would evict a model in recent use; the client should retry later.
    #[error("all backends are busy with recently used models; retry in {}s", retry_secs(*.retry_after))]
    Churn { retry_after: Duration },
    /// The model failed to load; `reason` is the backend's own message.
    #[error("model '{model}' failed to load: {reason}")]
    LoadFailed {
        model: String,
        reason: String,
        retry_after: Duration,
    },
    /// A later request of a sequence whose copy has gone (unloaded, its backend down or
    /// restarted): the sequence's state went with it, and the gateway does not restart it
    /// elsewhere behind the client's back.
    #[error(
        "sequence {sequence} of model '{model}' was started on a copy that is gone (unloaded, or its backend went down): its state is lost; start the sequence again with sequence_start"
    )]
    SequenceLost { model: String, sequence: String },
    /// The model did not finish loading in time.
    #[error("model '{model}' did not load within {}s", .after.as_secs())]
    LoadTimeout { model: String, after: Duration },
    /// The gateway is draining for shutdown.
    #[error("the gateway is shutting down")]
    ShuttingDown,
    /// A replica that has not read the pool's registry yet: it knows no copy the others
    /// placed, so its readiness waits (a load balancer sends it nothing it would refuse).
    #[error(
        "this replica has not read the pool's registry (etcd) yet; it takes traffic once it has"
    )]
    NotJoined,
    /// No valid credential: missing, malformed, expired, badly signed, unknown. `reason`
    /// says which, never repeating the credential.
    #[error("invalid credentials: {reason}")]
    Unauthenticated { reason: String },
    /// A verified caller that may not do this (a model outside its tenant's allow list, an
    /// endpoint that needs the admin role).
    #[error("{message}")]
    Forbidden { message: String },
    /// Flow control refused the request: its model's copies are saturated and its queue
    /// could not serve it in time, or was full (`reason`). Not the route target's failure.
    #[error(
        "model '{model}' is saturated: this {band} request was shed ({reason}); retry in {}s",
        retry_secs(*.retry_after)
    )]
    Shed {
        model: String,
        band: &'static str,
        reason: &'static str,
        retry_after: Duration,
    },
    /// The caller's tenant is over one of its limits.
    #[error("{message}; retry in {}s", retry_secs(*.retry_after))]
    RateLimited {
        message: String,
        retry_after: Duration,
    },
}

fn retry_secs(after: Duration) -> u64 {
    after.as_secs_f64().ceil().max(1.0) as u64
}

/// Triton 2.51's words for a model it has not loaded, by what was asked.
fn not_loaded_message(model: &str, version: &Option<String>, ask: crate::model::Ask) -> String {
    use crate::model::Ask;
    match (ask, version) {
        (Ask::Ready, _) => "Model version not ready".into(),
        (Ask::Statistics, _) => format!("requested model '{model}' is not available"),
        (_, None) => format!("Request for unknown model: '{model}' has no available versions"),
        (_, Some(v)) => {
            format!("Request for unknown model: '{model}' version {v} is not at ready state")
        }
    }
}

fn version_suffix(version: &Option<String>) -> String {
    version
        .as_deref()
        .map(|v| format!(" version {v}"))
        .unwrap_or_default()
}

/// A version Triton would not read: its 400 / INVALID_ARGUMENT, in its words.
impl From<crate::model::BadVersion> for GatewayError {
    fn from(bad: crate::model::BadVersion) -> Self {
        Self::BadRequest(bad.0)
    }
}

impl GatewayError {
    /// Who caused it: the log level and the `source` metric label.
    pub fn origin(&self) -> ErrorSource {
        match self {
            Self::UnknownModel { .. }
            | Self::NotLoaded { .. }
            | Self::UnknownModelLoad { .. }
            | Self::UnknownVersion { .. }
            | Self::BodyTooLarge { .. }
            | Self::MessageTooLarge { .. }
            | Self::BodyTooSlow { .. }
            | Self::DeadlineExceeded { .. }
            | Self::BadRequest(_)
            | Self::InvalidInput { .. }
            | Self::InvalidParameter { .. }
            | Self::ContextLengthExceeded { .. }
            | Self::NotFound { .. }
            | Self::SharedMemoryUnsupported
            | Self::MethodNotAllowed { .. }
            | Self::Unauthenticated { .. }
            | Self::Forbidden { .. }
            | Self::RateLimited { .. } => ErrorSource::Client,
            Self::ModelNotReady { .. }
            | Self::NoBackendReady
            | Self::RouteUnavailable { .. }
            | Self::NoRoom { .. }
            | Self::Churn { .. }
            | Self::LoadFailed { .. }
            | Self::LoadTimeout { .. }
            | Self::UpstreamUnreachable { .. }
            | Self::UpstreamTimeout { .. }
            | Self::UpstreamFailed { .. }
            | Self::UpstreamClosed { .. }
            | Self::UpstreamStalled { .. }
            | Self::SequenceLost { .. }
            | Self::Backend(_)
            | Self::BackendRefused { .. } => ErrorSource::Upstream,
            Self::ShuttingDown
            | Self::NotJoined
            | Self::RegistryUnreachable { .. }
            | Self::Shed { .. } => ErrorSource::Gateway,
        }
    }

    /// A short stable name for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::UnknownModel { .. } => "unknown_model",
            Self::UnknownVersion { .. } => "unknown_version",
            Self::ModelNotReady { .. } => "model_not_ready",
            Self::NotLoaded { .. } => "model_not_loaded",
            Self::UnknownModelLoad { .. } => "unknown_model",
            Self::NoBackendReady => "no_backend",
            Self::BodyTooLarge { .. } | Self::MessageTooLarge { .. } => "body_too_large",
            Self::BodyTooSlow { .. } => "body_too_slow",
            Self::DeadlineExceeded { .. } => "deadline_exceeded",
            Self::BadRequest(_) => "bad_request",
            Self::InvalidInput { .. } => "invalid_input",
            Self::InvalidParameter { .. } => "invalid_parameter",
            Self::ContextLengthExceeded { .. } => "context_length_exceeded",
            Self::NotFound { .. } => "not_found",
            Self::SharedMemoryUnsupported => "shared_memory",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::UpstreamUnreachable { .. } => "upstream_unreachable",
            Self::UpstreamTimeout { .. } => "upstream_timeout",
            Self::UpstreamFailed { .. } => "upstream_failed",
            Self::UpstreamClosed { .. } => "upstream_closed",
            Self::UpstreamStalled { .. } => "upstream_stalled",
            Self::RouteUnavailable { .. } => "route_unavailable",
            Self::NoRoom { .. } => "no_room",
            Self::Churn { .. } => "churn",
            Self::RegistryUnreachable { .. } => "registry_unreachable",
            Self::LoadFailed { .. } => "load_failed",
            Self::LoadTimeout { .. } => "load_timeout",
            Self::SequenceLost { .. } => "sequence_lost",
            Self::ShuttingDown => "shutting_down",
            Self::NotJoined => "not_joined",
            Self::Unauthenticated { .. } => "unauthenticated",
            Self::Forbidden { .. } => "forbidden",
            Self::RateLimited { .. } => "rate_limited",
            Self::Shed { .. } => "shed",
            Self::Backend(_) | Self::BackendRefused { .. } => "backend",
        }
    }

    /// The one table: the HTTP status and the gRPC code each failure is answered with, side
    /// by side (Triton's own where Triton has the same failure). `http_status` and
    /// `grpc_code` read it; nothing else maps a failure to a status.
    pub fn classify(&self) -> (StatusCode, Code) {
        use crate::model::Ask;
        match self {
            Self::BadRequest(_)
            | Self::InvalidInput { .. }
            | Self::InvalidParameter { .. }
            | Self::ContextLengthExceeded { .. } => {
                (StatusCode::BAD_REQUEST, Code::InvalidArgument)
            }
            // Triton answers an unknown model or version with 404 and this very message.
            Self::UnknownModel { .. } | Self::UnknownVersion { .. } | Self::NotFound { .. } => {
                (StatusCode::NOT_FOUND, Code::NotFound)
            }
            Self::NotLoaded { ask, version, .. } => match (ask, version) {
                (Ask::Ready | Ask::Statistics, _) => {
                    (StatusCode::BAD_REQUEST, Code::InvalidArgument)
                }
                (_, None) => (StatusCode::NOT_FOUND, Code::NotFound),
                (_, Some(_)) => (StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable),
            },
            Self::UnknownModelLoad { .. } => (StatusCode::INTERNAL_SERVER_ERROR, Code::Internal),
            Self::MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, Code::Unimplemented),
            // gRPC's UNIMPLEMENTED, in HTTP: no retry will make it work.
            Self::SharedMemoryUnsupported => (StatusCode::NOT_IMPLEMENTED, Code::Unimplemented),
            // What a gRPC server says of a message over its limit.
            Self::BodyTooLarge { .. } | Self::MessageTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, Code::ResourceExhausted)
            }
            // HTTP's own status for a client too slow to send its request; gRPC's closest
            // is the time running out.
            Self::BodyTooSlow { .. } => (StatusCode::REQUEST_TIMEOUT, Code::DeadlineExceeded),
            // The pool's memory is spoken for: no retry soon will change that.
            Self::NoRoom { .. } => (StatusCode::SERVICE_UNAVAILABLE, Code::ResourceExhausted),
            Self::ModelNotReady { .. }
            | Self::NoBackendReady
            | Self::RouteUnavailable { .. }
            | Self::Churn { .. }
            | Self::LoadFailed { .. }
            | Self::RegistryUnreachable { .. }
            | Self::NotJoined
            | Self::Shed { .. }
            | Self::UpstreamClosed { .. }
            | Self::UpstreamStalled { .. }
            | Self::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable),
            Self::UpstreamUnreachable { .. } | Self::UpstreamFailed { .. } => {
                (StatusCode::BAD_GATEWAY, Code::Unavailable)
            }
            Self::UpstreamTimeout { .. } | Self::LoadTimeout { .. } => {
                (StatusCode::GATEWAY_TIMEOUT, Code::DeadlineExceeded)
            }
            Self::DeadlineExceeded { .. } => (StatusCode::GATEWAY_TIMEOUT, Code::DeadlineExceeded),
            Self::Unauthenticated { .. } => (StatusCode::UNAUTHORIZED, Code::Unauthenticated),
            Self::Forbidden { .. } => (StatusCode::FORBIDDEN, Code::PermissionDenied),
            Self::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, Code::ResourceExhausted),
            // gRPC's ABORTED in HTTP's words: retrying this request cannot work, the client
            // must start over one level up (a new sequence).
            Self::SequenceLost { .. } => (StatusCode::CONFLICT, Code::Aborted),
            Self::Backend(status) => (http_status_of(status.code()), status.code()),
            Self::BackendRefused { status, .. } => (*status, grpc_code_of(*status)),
        }
    }

    /// The HTTP status this failure is answered with (`classify`).
    pub fn http_status(&self) -> StatusCode {
        self.classify().0
    }

    /// The gRPC status code this failure is answered with (`classify`).
    pub fn grpc_code(&self) -> Code {
        self.classify().1
    }

    /// Whether a route's guard counts this against the target that was chosen: a failure on
    /// the server's side (5xx). The client's own deadline is not the target's failure.
    /// A request shed under overload is no more the target's failure: a guard that counted
    /// it would roll a canary back for the pool's load.
    pub fn fails_target(&self) -> bool {
        !matches!(self, Self::Shed { .. })
            && self.origin() != ErrorSource::Client
            && self.http_status().is_server_error()
    }

    /// Whether the answer tells the client when to retry (`Retry-After` on HTTP,
    /// `retry-after` metadata on gRPC): every 503 and 429 the gateway answers itself but a
    /// model that is not loaded, which no wait will change (Triton sends none either).
    pub fn retries_after(&self) -> bool {
        !matches!(
            self,
            Self::NotLoaded { .. } | Self::Backend(_) | Self::BackendRefused { .. }
        ) && matches!(
            self.http_status(),
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        )
    }

    /// Seconds a client should wait before retrying a 503.
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            Self::Churn { retry_after }
            | Self::LoadFailed { retry_after, .. }
            | Self::RateLimited { retry_after, .. }
            | Self::Shed { retry_after, .. } => retry_secs(*retry_after),
            _ => 1,
        }
    }

    /// What the log line and the error counter say of a failure the gateway answered
    /// itself; `None` for a backend's own answer passed through, which is the backend's.
    pub fn report(&self) -> Option<ErrorKind> {
        if let Self::Backend(_) | Self::BackendRefused { .. } = self {
            return None;
        }
        Some(ErrorKind {
            kind: self.kind(),
            source: self.origin(),
            message: self.to_string(),
        })
    }

    /// A backend's refusal over Triton's HTTP control API (`{"error": "..."}` with its
    /// status), to pass on to any client (`BackendRefused`): the body's `error`, or the whole
    /// body when it has none, with the status it came with.
    pub fn from_backend_http(status: StatusCode, body: &[u8]) -> Self {
        let message = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
        Self::BackendRefused { status, message }
    }
}

/// Triton's HTTP status for a gRPC code, as the gRPC specification maps them: what the
/// status class of a gRPC answer is counted as, so one `status=~"5.."` alert covers both
/// protocols.
pub fn http_status_of(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::from_u16(499).expect("valid status"),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The gRPC code Triton's gRPC server gives a failure its HTTP server answers with `status`.
fn grpc_code_of(status: StatusCode) -> Code {
    match status {
        StatusCode::BAD_REQUEST => Code::InvalidArgument,
        StatusCode::NOT_FOUND => Code::NotFound,
        StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
        StatusCode::GATEWAY_TIMEOUT => Code::DeadlineExceeded,
        _ => Code::Internal,
    }
}

/// The status class label (`2xx`...) of an HTTP status: the `status` label of the request
/// metrics, and what route guards count (a 5xx is a failure of the target).
pub fn status_class(status: StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// The status class of a gRPC status code as sent (through `http_status_of`); a number the
/// specification does not name is `Unknown`'s, as tonic reads it.
pub fn grpc_status_class(code: i32) -> &'static str {
    status_class(http_status_of(Code::from_i32(code)))
}

/// A gRPC status code's name as logged (`code="Ok"`): its `Debug` text, without formatting
/// a string for every call.
pub fn grpc_code_name(code: i32) -> &'static str {
    match Code::from_i32(code) {
        Code::Ok => "Ok",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// RFC 6750's challenge for a refused bearer credential; the description is the reason
/// (our own words, never the token), with characters a quoted string cannot hold dropped.
pub fn www_authenticate(reason: &str) -> HeaderValue {
    let description: String = reason
        .chars()
        .filter(|c| (' '..='~').contains(c) && *c != '"' && *c != '\\')
        .collect();
    HeaderValue::from_str(&format!(
        "Bearer realm=\"infergate\", error=\"invalid_token\", error_description=\"{description}\""
    ))
    .unwrap_or_else(|_| {
        HeaderValue::from_static("Bearer realm=\"infergate\", error=\"invalid_token\"")
    })
}

/// Triton's error body for a message.
pub fn error_body(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

/// What `finish` counts and logs of a failure the gateway answered itself (on HTTP it rides
/// on the error response to the edge).
#[derive(Clone, Debug)]
pub struct ErrorKind {
    /// `GatewayError::kind`.
    pub kind: &'static str,
    /// `GatewayError::origin`.
    pub source: ErrorSource,
    /// The message the client was sent (never a payload or a credential).
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole mapping table, HTTP status and gRPC code side by side, pinned: changing
    /// either is a user-visible change. One table, so it is long: a row per error.
    #[test]
    fn every_error_maps_to_its_status_code_and_source() {
        use ErrorSource::*;
        use tonic::Code::*;
        let backend = || "b".to_string();
        let table: Vec<(GatewayError, u16, tonic::Code, ErrorSource)> = vec![
            (
                GatewayError::UnknownModel { model: "m".into() },
                404,
                NotFound,
                Client,
            ),
            (
                GatewayError::UnknownVersion {
                    model: "m".into(),
                    version: 9,
                },
                404,
                NotFound,
                Client,
            ),
            (
                GatewayError::ModelNotReady {
                    model: "m".into(),
                    version: None,
                },
                503,
                Unavailable,
                Upstream,
            ),
            (GatewayError::NoBackendReady, 503, Unavailable, Upstream),
            (
                GatewayError::RegistryUnreachable { model: "m".into() },
                503,
                Unavailable,
                Gateway,
            ),
            (
                GatewayError::UnknownModelLoad { model: "m".into() },
                500,
                Internal,
                Client,
            ),
            (
                GatewayError::BodyTooLarge { limit: 1 },
                413,
                ResourceExhausted,
                Client,
            ),
            (
                GatewayError::BodyTooSlow { reason: "x".into() },
                408,
                DeadlineExceeded,
                Client,
            ),
            (
                GatewayError::BadRequest("x".into()),
                400,
                InvalidArgument,
                Client,
            ),
            (
                GatewayError::InvalidParameter {
                    param: "n".into(),
                    message: "x".into(),
                },
                400,
                InvalidArgument,
                Client,
            ),
            (
                GatewayError::ContextLengthExceeded {
                    param: "prompt",
                    message: "x".into(),
                },
                400,
                InvalidArgument,
                Client,
            ),
            (
                GatewayError::InvalidInput {
                    reason: "shape",
                    message: "x".into(),
                },
                400,
                InvalidArgument,
                Client,
            ),
            (
                GatewayError::NotFound { path: "/x".into() },
                404,
                NotFound,
                Client,
            ),
            (
                GatewayError::SharedMemoryUnsupported,
                501,
                Unimplemented,
                Client,
            ),
            (
                GatewayError::MethodNotAllowed {
                    method: "GET".into(),
                    path: "/x".into(),
                },
                405,
                Unimplemented,
                Client,
            ),
            (
                GatewayError::UpstreamUnreachable {
                    backend: backend(),
                    reason: "r".into(),
                    refused: true,
                },
                502,
                Unavailable,
                Upstream,
            ),
            (
                GatewayError::UpstreamTimeout {
                    backend: backend(),
                    after: Duration::from_secs(1),
                },
                504,
                DeadlineExceeded,
                Upstream,
            ),
            (
                GatewayError::UpstreamFailed {
                    backend: backend(),
                    reason: "r".into(),
                },
                502,
                Unavailable,
                Upstream,
            ),
            (
                GatewayError::UpstreamClosed { backend: backend() },
                503,
                Unavailable,
                Upstream,
            ),
            (
                GatewayError::UpstreamStalled {
                    backend: backend(),
                    reason: "r".into(),
                },
                503,
                Unavailable,
                Upstream,
            ),
            (
                GatewayError::NoRoom { reason: "r".into() },
                503,
                ResourceExhausted,
                Upstream,
            ),
            (
                GatewayError::RouteUnavailable { route: "r".into() },
                503,
                Unavailable,
                Upstream,
            ),
            (
                GatewayError::Shed {
                    model: "m".into(),
                    band: "standard",
                    reason: "deadline",
                    retry_after: Duration::from_millis(2500),
                },
                503,
                Unavailable,
                Gateway,
            ),
            (
                GatewayError::Churn {
                    retry_after: Duration::from_secs(3),
                },
                503,
                Unavailable,
                Upstream,
            ),
            (
                GatewayError::LoadFailed {
                    model: "m".into(),
                    reason: "r".into(),
                    retry_after: Duration::from_secs(3),
                },
                503,
                Unavailable,
                Upstream,
            ),
            (
                GatewayError::LoadTimeout {
                    model: "m".into(),
                    after: Duration::from_secs(3),
                },
                504,
                DeadlineExceeded,
                Upstream,
            ),
            (
                GatewayError::SequenceLost {
                    model: "m".into(),
                    sequence: "7".into(),
                },
                409,
                Aborted,
                Upstream,
            ),
            (GatewayError::ShuttingDown, 503, Unavailable, Gateway),
            (GatewayError::NotJoined, 503, Unavailable, Gateway),
            (
                GatewayError::MessageTooLarge { limit: 1 },
                413,
                ResourceExhausted,
                Client,
            ),
            (
                GatewayError::DeadlineExceeded {
                    after: Duration::from_millis(300),
                },
                504,
                DeadlineExceeded,
                Client,
            ),
            (
                GatewayError::Backend(tonic::Status::invalid_argument("bad shape")),
                400,
                InvalidArgument,
                Upstream,
            ),
            (
                GatewayError::Backend(tonic::Status::unavailable("gone")),
                503,
                Unavailable,
                Upstream,
            ),
            (
                GatewayError::BackendRefused {
                    status: StatusCode::BAD_REQUEST,
                    message: "requested model 'm' is not available".into(),
                },
                400,
                InvalidArgument,
                Upstream,
            ),
            (
                GatewayError::BackendRefused {
                    status: StatusCode::CONFLICT,
                    message: "busy".into(),
                },
                409,
                Internal,
                Upstream,
            ),
            (
                GatewayError::Unauthenticated {
                    reason: "token expired".into(),
                },
                401,
                Unauthenticated,
                Client,
            ),
            (
                GatewayError::Forbidden {
                    message: "no".into(),
                },
                403,
                PermissionDenied,
                Client,
            ),
            (
                GatewayError::RateLimited {
                    message: "slow down".into(),
                    retry_after: Duration::from_millis(300),
                },
                429,
                ResourceExhausted,
                Client,
            ),
        ];
        for (error, status, code, source) in table {
            assert_eq!(error.http_status().as_u16(), status, "{error:?}");
            assert_eq!(error.grpc_code(), code, "{error:?}");
            assert_eq!(error.origin(), source, "{error:?}");
            let passed_through = matches!(
                error,
                GatewayError::Backend(_) | GatewayError::BackendRefused { .. }
            );
            assert_eq!(
                error.retries_after(),
                (status == 503 || status == 429) && !passed_through,
                "{error:?}"
            );
            assert_eq!(error.report().is_none(), passed_through, "{error:?}");
            // A shed is the pool's load, not the target's failure.
            let shed = matches!(error, GatewayError::Shed { .. });
            assert_eq!(
                error.fails_target(),
                status >= 500 && source != Client && !shed,
                "{error:?}"
            );
            if shed {
                assert_eq!(
                    error.retry_after_secs(),
                    3,
                    "rounded up from the drain time"
                );
            }
        }
    }

    /// A model that is not loaded is answered as Triton 2.51 answers it, per question.
    #[test]
    fn a_model_not_loaded_is_answered_in_tritons_words() {
        use crate::model::Ask;
        use tonic::Code;
        let not_loaded = |ask, version: Option<&str>| GatewayError::NotLoaded {
            model: "m".into(),
            version: version.map(Into::into),
            ask,
        };
        let table = [
            (
                not_loaded(Ask::Ready, None),
                400,
                Code::InvalidArgument,
                "Model version not ready",
            ),
            (
                not_loaded(Ask::Statistics, Some("1")),
                400,
                Code::InvalidArgument,
                "requested model 'm' is not available",
            ),
            (
                not_loaded(Ask::Metadata, None),
                404,
                Code::NotFound,
                "Request for unknown model: 'm' has no available versions",
            ),
            (
                not_loaded(Ask::Inference, Some("2")),
                503,
                Code::Unavailable,
                "Request for unknown model: 'm' version 2 is not at ready state",
            ),
        ];
        for (error, status, code, message) in table {
            assert_eq!(error.http_status().as_u16(), status, "{error:?}");
            assert_eq!(error.grpc_code(), code, "{error:?}");
            assert_eq!(error.to_string(), message);
            assert!(!error.retries_after(), "{error:?}");
        }
    }

    #[test]
    fn a_challenge_never_breaks_its_quoted_string() {
        assert_eq!(
            www_authenticate("a \"quoted\"\nline"),
            "Bearer realm=\"infergate\", error=\"invalid_token\", error_description=\"a quotedline\""
        );
    }

    /// Every gRPC code has the status class of the HTTP status the gRPC specification maps
    /// it to, and a backend's HTTP refusal reaches gRPC clients with Triton's own code.
    #[test]
    fn codes_and_statuses_meet_in_one_table() {
        use tonic::Code::*;
        for (code, class) in [
            (Ok, "2xx"),
            (Cancelled, "4xx"),
            (InvalidArgument, "4xx"),
            (NotFound, "4xx"),
            (AlreadyExists, "4xx"),
            (PermissionDenied, "4xx"),
            (ResourceExhausted, "4xx"),
            (FailedPrecondition, "4xx"),
            (Aborted, "4xx"),
            (OutOfRange, "4xx"),
            (Unauthenticated, "4xx"),
            (Unknown, "5xx"),
            (DeadlineExceeded, "5xx"),
            (Unimplemented, "5xx"),
            (Internal, "5xx"),
            (Unavailable, "5xx"),
            (DataLoss, "5xx"),
        ] {
            assert_eq!(grpc_status_class(code as i32), class, "{code:?}");
            assert_eq!(grpc_code_name(code as i32), format!("{code:?}"));
        }
        assert_eq!(
            (grpc_code_name(99), grpc_status_class(99)),
            ("Unknown", "5xx")
        );
        let refused =
            GatewayError::from_backend_http(StatusCode::BAD_REQUEST, br#"{"error":"bad index"}"#);
        assert_eq!(refused.grpc_code(), InvalidArgument);
        assert_eq!(refused.to_string(), "bad index");
        // HTTP answers with Triton's own status, whatever the gRPC code it maps to.
        assert_eq!(refused.http_status(), StatusCode::BAD_REQUEST);
        let refused = GatewayError::from_backend_http(StatusCode::BAD_GATEWAY, b"oops");
        assert_eq!(
            (refused.grpc_code(), refused.to_string()),
            (Internal, "oops".into())
        );
        assert_eq!(refused.http_status(), StatusCode::BAD_GATEWAY);
    }

    #[test]
    fn messages_name_what_was_wrong() {
        let e = GatewayError::ModelNotReady {
            model: "add_sub".into(),
            version: Some("2".into()),
        };
        assert_eq!(
            e.to_string(),
            "model 'add_sub' version 2 is not ready on any backend"
        );
        let e = GatewayError::UpstreamTimeout {
            backend: "t0".into(),
            after: Duration::from_millis(250),
        };
        assert_eq!(e.to_string(), "backend 't0' did not answer within 250ms");
        assert_eq!(
            error_body("a \"quoted\" word"),
            r#"{"error":"a \"quoted\" word"}"#
        );
    }
}
