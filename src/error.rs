//! `GatewayError`: every way a request can fail, where the failure came from, and how it is
//! answered on the wire.
//!
//! One enum and one classification so that HTTP and gRPC answer the same failure the same
//! way. The HTTP body is Triton's own error shape, `{"error": "..."}`, and the gRPC status
//! carries the same message, so Triton clients show our messages exactly as they would show
//! Triton's.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use std::time::Duration;

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
        ask: crate::pipeline::Ask,
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
    /// No such endpoint.
    #[error("not found: {path}")]
    NotFound { path: String },
    /// The shared-memory extension's endpoints: a region is local to one host.
    #[error("{}", crate::protocol::NO_SHARED_MEMORY)]
    SharedMemoryUnsupported,
    /// The endpoint exists but not for this method.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    /// The backend could not be reached.
    #[error("backend '{backend}' is unreachable: {reason}")]
    UpstreamUnreachable { backend: String, reason: String },
    /// The backend did not answer in time.
    #[error("backend '{backend}' did not answer within {}ms", .after.as_millis())]
    UpstreamTimeout { backend: String, after: Duration },
    /// The backend broke the exchange after it started.
    #[error("backend '{backend}' failed: {reason}")]
    UpstreamFailed { backend: String, reason: String },
    /// Every target of the route has weight 0 (all rolled back or switched off).
    #[error("route '{route}' has no target with a weight above 0")]
    RouteUnavailable { route: String },
    /// No backend has room for the model, even after evicting what may be evicted.
    #[error("no backend has room for the model: {reason}")]
    NoRoom { reason: String },
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
    /// No valid credential: missing, malformed, expired, badly signed, unknown. `reason`
    /// says which, never repeating the credential.
    #[error("invalid credentials: {reason}")]
    Unauthenticated { reason: String },
    /// A verified caller that may not do this (a model outside its tenant's allow list, an
    /// endpoint that needs the admin role).
    #[error("{message}")]
    Forbidden { message: String },
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
fn not_loaded_message(model: &str, version: &Option<String>, ask: crate::pipeline::Ask) -> String {
    use crate::pipeline::Ask;
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

impl GatewayError {
    /// Who caused it.
    pub fn source(&self) -> ErrorSource {
        match self {
            Self::UnknownModel { .. }
            | Self::NotLoaded { .. }
            | Self::UnknownModelLoad { .. }
            | Self::UnknownVersion { .. }
            | Self::BodyTooLarge { .. }
            | Self::BadRequest(_)
            | Self::InvalidInput { .. }
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
            | Self::SequenceLost { .. } => ErrorSource::Upstream,
            Self::ShuttingDown => ErrorSource::Gateway,
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
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::BadRequest(_) => "bad_request",
            Self::InvalidInput { .. } => "invalid_input",
            Self::NotFound { .. } => "not_found",
            Self::SharedMemoryUnsupported => "shared_memory",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::UpstreamUnreachable { .. } => "upstream_unreachable",
            Self::UpstreamTimeout { .. } => "upstream_timeout",
            Self::UpstreamFailed { .. } => "upstream_failed",
            Self::RouteUnavailable { .. } => "route_unavailable",
            Self::NoRoom { .. } => "no_room",
            Self::Churn { .. } => "churn",
            Self::LoadFailed { .. } => "load_failed",
            Self::LoadTimeout { .. } => "load_timeout",
            Self::SequenceLost { .. } => "sequence_lost",
            Self::ShuttingDown => "shutting_down",
            Self::Unauthenticated { .. } => "unauthenticated",
            Self::Forbidden { .. } => "forbidden",
            Self::RateLimited { .. } => "rate_limited",
        }
    }

    /// The HTTP status this failure is answered with.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) | Self::InvalidInput { .. } => StatusCode::BAD_REQUEST,
            // Triton answers an unknown model or version with 404 and this very message.
            Self::UnknownModel { .. } | Self::UnknownVersion { .. } | Self::NotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            Self::NotLoaded { ask, version, .. } => match (ask, version) {
                (crate::pipeline::Ask::Ready | crate::pipeline::Ask::Statistics, _) => {
                    StatusCode::BAD_REQUEST
                }
                (_, None) => StatusCode::NOT_FOUND,
                (_, Some(_)) => StatusCode::SERVICE_UNAVAILABLE,
            },
            Self::UnknownModelLoad { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            // gRPC's UNIMPLEMENTED, in HTTP: no retry will make it work.
            Self::SharedMemoryUnsupported => StatusCode::NOT_IMPLEMENTED,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ModelNotReady { .. }
            | Self::NoBackendReady
            | Self::RouteUnavailable { .. }
            | Self::NoRoom { .. }
            | Self::Churn { .. }
            | Self::LoadFailed { .. }
            | Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::UpstreamUnreachable { .. } | Self::UpstreamFailed { .. } => {
                StatusCode::BAD_GATEWAY
            }
            Self::UpstreamTimeout { .. } | Self::LoadTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::Unauthenticated { .. } => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } => StatusCode::FORBIDDEN,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            // gRPC's ABORTED in HTTP's words: retrying this request cannot work, the client
            // must start over one level up (a new sequence).
            Self::SequenceLost { .. } => StatusCode::CONFLICT,
        }
    }

    /// Whether the answer tells the client when to retry (`Retry-After` on HTTP,
    /// `retry-after` metadata on gRPC): every 503 and 429 but a model that is not loaded,
    /// which no wait will change (Triton sends none either).
    pub fn retries_after(&self) -> bool {
        !matches!(self, Self::NotLoaded { .. })
            && matches!(
                self.http_status(),
                StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
            )
    }
}

impl GatewayError {
    /// The gRPC status code this failure is answered with: the same classification as
    /// `http_status`, in gRPC's terms (Triton's own codes where Triton has the same failure).
    pub fn grpc_code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Self::BadRequest(_) | Self::InvalidInput { .. } => Code::InvalidArgument,
            Self::UnknownModel { .. } | Self::UnknownVersion { .. } | Self::NotFound { .. } => {
                Code::NotFound
            }
            Self::NotLoaded { .. } => match self.http_status() {
                StatusCode::BAD_REQUEST => Code::InvalidArgument,
                StatusCode::NOT_FOUND => Code::NotFound,
                _ => Code::Unavailable,
            },
            Self::UnknownModelLoad { .. } => Code::Internal,
            Self::MethodNotAllowed { .. } | Self::SharedMemoryUnsupported => Code::Unimplemented,
            // What a gRPC server says of a message over its limit.
            Self::BodyTooLarge { .. } => Code::ResourceExhausted,
            // The pool's memory is spoken for: no retry soon will change that.
            Self::NoRoom { .. } => Code::ResourceExhausted,
            Self::ModelNotReady { .. }
            | Self::NoBackendReady
            | Self::RouteUnavailable { .. }
            | Self::Churn { .. }
            | Self::LoadFailed { .. }
            | Self::ShuttingDown
            | Self::UpstreamUnreachable { .. }
            | Self::UpstreamFailed { .. } => Code::Unavailable,
            Self::UpstreamTimeout { .. } | Self::LoadTimeout { .. } => Code::DeadlineExceeded,
            Self::Unauthenticated { .. } => Code::Unauthenticated,
            Self::Forbidden { .. } => Code::PermissionDenied,
            Self::RateLimited { .. } => Code::ResourceExhausted,
            Self::SequenceLost { .. } => Code::Aborted,
        }
    }

    /// Seconds a client should wait before retrying a 503.
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            Self::Churn { retry_after }
            | Self::LoadFailed { retry_after, .. }
            | Self::RateLimited { retry_after, .. } => retry_secs(*retry_after),
            _ => 1,
        }
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

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = self.http_status();
        let message = self.to_string();
        let mut response = (status, error_body(&message)).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.retries_after() {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(self.retry_after_secs()),
            );
        }
        if let Self::Unauthenticated { reason } = &self {
            headers.insert(header::WWW_AUTHENTICATE, www_authenticate(reason));
        }
        response.extensions_mut().insert(ErrorKind {
            kind: self.kind(),
            source: self.source(),
            message,
        });
        response
    }
}

/// The gRPC status: the same message as on HTTP, and `retry-after` metadata where HTTP sends
/// a `Retry-After` header.
impl From<GatewayError> for tonic::Status {
    fn from(error: GatewayError) -> Self {
        let mut status = tonic::Status::new(error.grpc_code(), error.to_string());
        if error.retries_after() {
            status
                .metadata_mut()
                .insert("retry-after", error.retry_after_secs().into());
        }
        status
    }
}

/// Left on an error response so the edge middleware can count and log it once.
#[derive(Clone, Debug)]
pub struct ErrorKind {
    /// `GatewayError::kind`.
    pub kind: &'static str,
    /// `GatewayError::source`.
    pub source: ErrorSource,
    /// The message the client was sent (never a payload or a credential).
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole mapping table, HTTP status and gRPC code side by side, pinned: changing
    /// either is a user-visible change.
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
                GatewayError::BadRequest("x".into()),
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
            assert_eq!(error.source(), source, "{error:?}");
            let message = error.to_string();
            let answered = tonic::Status::from(error);
            assert_eq!(answered.code(), code, "{message}");
            assert_eq!(answered.message(), message);
            assert_eq!(
                answered.metadata().get("retry-after").is_some(),
                status == 503 || status == 429,
                "{message}"
            );
        }
    }

    /// A model that is not loaded is answered as Triton 2.51 answers it, per question.
    #[test]
    fn a_model_not_loaded_is_answered_in_tritons_words() {
        use crate::pipeline::Ask;
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
    fn a_refused_credential_is_challenged_without_echoing_it() {
        let response = GatewayError::Unauthenticated {
            reason: "token expired".into(),
        }
        .into_response();
        assert_eq!(response.status(), 401);
        assert_eq!(
            response.headers()[header::WWW_AUTHENTICATE],
            "Bearer realm=\"infergate\", error=\"invalid_token\", error_description=\"token expired\""
        );
        let response = GatewayError::RateLimited {
            message: "tenant 'a' is over its limit".into(),
            retry_after: Duration::from_millis(1500),
        }
        .into_response();
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            www_authenticate("a \"quoted\"\nline"),
            "Bearer realm=\"infergate\", error=\"invalid_token\", error_description=\"a quotedline\""
        );
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
