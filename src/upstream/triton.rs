//! Triton's control API, typed: every call the gateway itself makes to a backend (health,
//! repository index, load, unload, model metadata, config and statistics, server metadata,
//! metrics) goes through `TritonClient`, so each URL is built in one place, with one encoder
//! for model names and versions, and each answer comes back parsed or as a `TritonError`
//! that keeps what Triton said.

use super::{Backend, ModelIndex};
use crate::error::GatewayError;
use bytes::Bytes;
use http::{Method, StatusCode};
use serde::de::DeserializeOwned;
use std::fmt;
use std::time::Duration;

/// Percent-encodes a model name or version as one URL path segment onto `out`: names are
/// usually plain, but Triton takes any, and a space, slash or non-ASCII letter must reach it
/// as the same name.
fn push_segment(out: &mut String, name: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.extend([
                '%',
                HEX[usize::from(byte >> 4)] as char,
                HEX[usize::from(byte & 15)] as char,
            ]);
        }
    }
}

/// `/v2/models/{name}[/versions/{version}]{tail}`, each segment encoded. Public because the
/// HTTP front-end writes the same path when it retargets a request to a routed model.
pub fn model_path(name: &str, version: Option<&str>, tail: &str) -> String {
    let mut path = String::with_capacity(11 + name.len() + 10 + 8 + tail.len());
    path.push_str("/v2/models/");
    push_segment(&mut path, name);
    if let Some(version) = version {
        path.push_str("/versions/");
        push_segment(&mut path, version);
    }
    path.push_str(tail);
    path
}

/// `/v2/repository/models/{name}/{action}`.
fn repository_path(name: &str, action: &str) -> String {
    let mut path = String::from("/v2/repository/models/");
    push_segment(&mut path, name);
    path.push('/');
    path.push_str(action);
    path
}

/// What a control call to Triton came to when it was not a 200 with a readable answer.
/// Kept apart from `GatewayError` because some callers pass Triton's own refusal on to their
/// client as it is (the repository API, statistics), while the rest word it for a log line
/// or a load failure.
#[derive(Debug)]
pub enum TritonError {
    /// Triton answered with another status: its status and body (`{"error": "..."}`).
    Refused {
        /// The call, as `GET /v2/...`, for log lines that say which call it was.
        request: String,
        /// Triton's status.
        status: StatusCode,
        /// Triton's body, as it wrote it.
        body: Bytes,
    },
    /// Triton answered 200 with a body that is not what the call reads.
    Unreadable {
        /// The backend's config name.
        backend: String,
        /// What was wrong with the answer.
        reason: String,
    },
    /// No answer: refused or broken connection, or no answer within the call's timeout
    /// (`GatewayError::UpstreamUnreachable`, `UpstreamFailed` or `UpstreamTimeout`, each
    /// naming the backend).
    Unanswered {
        /// The call, as `GET /v2/...`.
        request: String,
        /// Why there was no answer.
        error: GatewayError,
    },
}

impl TritonError {
    /// The call got no answer within its timeout: a busy Triton, not necessarily a down one
    /// (health checks keep a backend as it was when it is busy with the gateway's own load).
    pub fn timed_out(&self) -> bool {
        matches!(
            self,
            Self::Unanswered {
                error: GatewayError::UpstreamTimeout { .. },
                ..
            }
        )
    }

    /// Triton's own words: the `error` of a refusal (or the status when its body has none),
    /// else what went wrong. For load failures and unload log lines, which quote Triton.
    pub fn reason(&self) -> String {
        match self {
            Self::Refused { status, body, .. } => serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.get("error")?.as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("backend answered {status}")),
            Self::Unreadable { reason, .. } => reason.clone(),
            Self::Unanswered { error, .. } => error.to_string(),
        }
    }

    /// The failure of a call named `what` ("liveness check"): a refusal is "`what` answered
    /// 503 Service Unavailable", the rest say what went wrong. For health and identity
    /// checks, which report a status, not Triton's message.
    pub fn describe(&self, what: &str) -> String {
        match self {
            Self::Refused { status, .. } => format!("{what} answered {status}"),
            _ => self.reason(),
        }
    }

    /// What the client of a question the gateway asked for it (statistics, the repository
    /// index) is told of this failure: Triton's refusal passed on, its status and its
    /// message (`GatewayError::from_backend_http`); a call that got no usable answer is the
    /// gateway's failure, naming the backend.
    pub fn passed_on(self) -> GatewayError {
        match self.refusal() {
            Ok((status, body)) => GatewayError::from_backend_http(status, &body),
            Err(error) => error,
        }
    }

    /// Triton's refusal (status and body), to pass on to the client as Triton wrote it; a
    /// call that got no usable answer is the gateway's `GatewayError`, naming the backend.
    pub fn refusal(self) -> Result<(StatusCode, Bytes), GatewayError> {
        match self {
            Self::Refused { status, body, .. } => Ok((status, body)),
            Self::Unreadable { backend, reason } => {
                Err(GatewayError::UpstreamFailed { backend, reason })
            }
            Self::Unanswered { error, .. } => Err(error),
        }
    }
}

/// Names the call and, for a refusal, the start of Triton's body (for log lines).
impl fmt::Display for TritonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused {
                request,
                status,
                body,
            } => write!(
                f,
                "{request} answered {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ),
            Self::Unreadable { reason, .. } => f.write_str(reason),
            Self::Unanswered { request, error } => write!(f, "{request}: {error}"),
        }
    }
}

impl std::error::Error for TritonError {}

/// Triton's control API on one backend, over that backend's pooled connection, each call
/// within `timeout`. Cheap to make: one per question (health checks, placement and the
/// repository API each ask with their own timeout).
#[derive(Clone, Copy, Debug)]
pub struct TritonClient<'a> {
    backend: &'a Backend,
    timeout: Duration,
}

impl<'a> TritonClient<'a> {
    /// The API of `backend`, each call allowed `timeout`.
    pub fn new(backend: &'a Backend, timeout: Duration) -> Self {
        Self { backend, timeout }
    }

    /// `GET /v2/health/live`: the server is up (not that any model is ready).
    pub async fn live(&self) -> Result<(), TritonError> {
        self.call(Method::GET, "/v2/health/live".into(), Bytes::new())
            .await
            .map(drop)
    }

    /// `POST /v2/repository/index` with `body` (Triton's index request, `{}` or
    /// `{"ready": true}`): every model the backend's repository has, and in which state.
    pub async fn repository_index(&self, body: Bytes) -> Result<ModelIndex, TritonError> {
        let answer = self
            .call(Method::POST, "/v2/repository/index".into(), body)
            .await?;
        ModelIndex::from_json(&answer)
            .map_err(|e| self.unreadable(format!("repository index is not valid JSON: {e}")))
    }

    /// `POST /v2/repository/models/{model}/load` with `body`: `{}` for a plain load (the
    /// repository's config.pbtxt), or `{"parameters": {"config": ...}}` for an override or
    /// chosen versions.
    pub async fn load(&self, model: &str, body: Bytes) -> Result<(), TritonError> {
        self.call(Method::POST, repository_path(model, "load"), body)
            .await
            .map(drop)
    }

    /// `POST /v2/repository/models/{model}/unload`: every version of the model goes.
    pub async fn unload(&self, model: &str) -> Result<(), TritonError> {
        let body = Bytes::from_static(b"{}");
        self.call(Method::POST, repository_path(model, "unload"), body)
            .await
            .map(drop)
    }

    /// `GET /v2/models/{model}[/versions/{version}]`: the model's metadata as Triton wrote
    /// it. Raw JSON, because validation reads it with its own schema (and refuses what does
    /// not agree with the config).
    pub async fn model_metadata(
        &self,
        model: &str,
        version: Option<&str>,
    ) -> Result<Bytes, TritonError> {
        self.call(Method::GET, model_path(model, version, ""), Bytes::new())
            .await
    }

    /// `GET /v2/models/{model}[/versions/{version}]/config`: the model's config as Triton
    /// wrote it. Raw JSON, because validation (inputs and outputs) and placement (the
    /// sequence batcher) each read their own part of it.
    pub async fn model_config(
        &self,
        model: &str,
        version: Option<&str>,
    ) -> Result<Bytes, TritonError> {
        self.call(
            Method::GET,
            model_path(model, version, "/config"),
            Bytes::new(),
        )
        .await
    }

    /// `GET /v2/models/{model}[/versions/{version}]/stats`, or `GET /v2/models/stats` for
    /// every model when `model` is `None`: Triton's `{"model_stats": [...]}`, read into the
    /// caller's `T` (the statistics service's typed rows, which it sums over copies).
    pub async fn model_statistics<T: DeserializeOwned>(
        &self,
        model: Option<(&str, Option<&str>)>,
    ) -> Result<T, TritonError> {
        let path = match model {
            Some((name, version)) => model_path(name, version, "/stats"),
            None => "/v2/models/stats".into(),
        };
        let answer = self.call(Method::GET, path, Bytes::new()).await?;
        serde_json::from_slice(&answer)
            .map_err(|e| self.unreadable(format!("statistics are not valid JSON: {e}")))
    }

    /// `GET /v2`: the server's name, version and extensions, read into the caller's `T`
    /// (server metadata keeps only the fields it passes on).
    pub async fn server_metadata<T: DeserializeOwned>(&self) -> Result<T, TritonError> {
        let answer = self.call(Method::GET, "/v2".into(), Bytes::new()).await?;
        serde_json::from_slice(&answer)
            .map_err(|e| self.unreadable(format!("server metadata is not what Triton sends: {e}")))
    }

    /// The backend's Prometheus text from its metrics URL (another port, same pool), or
    /// `None` when it has none configured.
    pub async fn metrics_text(&self) -> Option<Result<String, TritonError>> {
        let url = self.backend.metrics_url.as_deref()?;
        let request = || format!("GET {url}");
        let uri = match url.parse() {
            Ok(uri) => uri,
            Err(e) => {
                let error = GatewayError::BadRequest(format!("invalid metrics URL: {e}"));
                let request = request();
                return Some(Err(TritonError::Unanswered { request, error }));
            }
        };
        let answer = self
            .backend
            .client
            .fetch(
                &self.backend.name,
                Method::GET,
                uri,
                Bytes::new(),
                self.timeout,
            )
            .await;
        Some(ok_or_refused(request, answer).map(|body| String::from_utf8_lossy(&body).into()))
    }

    /// Sends one call; a 200's body, else the refusal or why there was no answer.
    async fn call(&self, method: Method, path: String, body: Bytes) -> Result<Bytes, TritonError> {
        let answer = self
            .backend
            .client
            .call(self.backend, method.clone(), &path, body, self.timeout)
            .await;
        ok_or_refused(|| format!("{method} {path}"), answer)
    }

    fn unreadable(&self, reason: String) -> TritonError {
        TritonError::Unreadable {
            backend: self.backend.name.clone(),
            reason,
        }
    }
}

/// A 200's body, or the answer as a `TritonError` for the call `request` names (written
/// only when it failed).
fn ok_or_refused(
    request: impl FnOnce() -> String,
    answer: Result<(StatusCode, Bytes), GatewayError>,
) -> Result<Bytes, TritonError> {
    match answer {
        Ok((StatusCode::OK, body)) => Ok(body),
        Ok((status, body)) => Err(TritonError::Refused {
            request: request(),
            status,
            body,
        }),
        Err(error) => Err(TritonError::Unanswered {
            request: request(),
            error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use axum::response::IntoResponse;
    use std::sync::{Arc, Mutex};

    #[test]
    fn names_and_versions_are_one_encoded_segment_each() {
        let path_segment = |name: &str| {
            let mut out = String::new();
            push_segment(&mut out, name);
            out
        };
        assert_eq!(path_segment("add_sub-1.x"), "add_sub-1.x");
        assert_eq!(path_segment("~"), "~");
        assert_eq!(path_segment("a b/c"), "a%20b%2Fc");
        assert_eq!(path_segment("modèle"), "mod%C3%A8le");
        assert_eq!(path_segment("?#%"), "%3F%23%25");
        assert_eq!(model_path("a b", None, ""), "/v2/models/a%20b");
        assert_eq!(
            model_path("a/b", Some("2 1"), "/config"),
            "/v2/models/a%2Fb/versions/2%201/config"
        );
        assert_eq!(
            repository_path("ünï", "unload"),
            "/v2/repository/models/%C3%BCn%C3%AF/unload"
        );
    }

    /// What the stand-in saw of one request: `METHOD /raw/path body`.
    type Seen = Arc<Mutex<Vec<String>>>;

    /// A stand-in Triton that answers every request with `status` and `body` (or never,
    /// for `None`), recording what it was asked; and a backend `b` pointed at it, with
    /// its metrics URL on the same port.
    async fn stand_in(answer: Option<(u16, &'static str)>) -> (Backend, Seen) {
        let seen = Seen::default();
        let log = seen.clone();
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let log = log.clone();
            async move {
                let (parts, body) = request.into_parts();
                let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
                log.lock().unwrap().push(format!(
                    "{} {} {}",
                    parts.method,
                    parts.uri,
                    String::from_utf8_lossy(&body)
                ));
                let Some((status, body)) = answer else {
                    return std::future::pending().await;
                };
                (StatusCode::from_u16(status).unwrap(), body).into_response()
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (backend_at(&format!("http://127.0.0.1:{port}")), seen)
    }

    fn backend_at(url: &str) -> Backend {
        let config = config::Config::parse(&format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\n[[backends]]\nname = \"b\"\nhttp = \"{url}\"\n\
             metrics = \"{url}/metrics\""
        ))
        .unwrap();
        Backend::new(&config.backends[0], &config.upstream, 1).unwrap()
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn each_call_asks_tritons_own_path() {
        let (backend, seen) = stand_in(Some((200, r#"{"model_stats": []}"#))).await;
        let triton = TritonClient::new(&backend, SECOND);
        let (name, version) = ("my model/ü", Some("3"));
        triton.live().await.unwrap();
        triton
            .load(name, Bytes::from_static(b"{\"x\":1}"))
            .await
            .unwrap();
        triton.unload(name).await.unwrap();
        triton.model_metadata(name, version).await.unwrap();
        triton.model_config(name, None).await.unwrap();
        triton
            .model_statistics::<serde_json::Value>(Some((name, version)))
            .await
            .unwrap();
        (triton.model_statistics::<serde_json::Value>(None))
            .await
            .unwrap();
        assert_eq!(
            triton.metrics_text().await.unwrap().unwrap(),
            r#"{"model_stats": []}"#
        );
        let model = "my%20model%2F%C3%BC";
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "GET /v2/health/live ".to_string(),
                format!("POST /v2/repository/models/{model}/load {{\"x\":1}}"),
                format!("POST /v2/repository/models/{model}/unload {{}}"),
                format!("GET /v2/models/{model}/versions/3 "),
                format!("GET /v2/models/{model}/config "),
                format!("GET /v2/models/{model}/versions/3/stats "),
                "GET /v2/models/stats ".to_string(),
                "GET /metrics ".to_string(),
            ]
        );
    }

    #[tokio::test]
    async fn answers_are_parsed_into_what_the_caller_reads() {
        let index = r#"[{"name":"a","version":"1","state":"READY"},{"name":"b"}]"#;
        let (backend, seen) = stand_in(Some((200, index))).await;
        let triton = TritonClient::new(&backend, SECOND);
        let read = triton.repository_index(Bytes::from_static(b"{\"ready\":true}"));
        let read = read.await.unwrap();
        assert_eq!(read.ready_versions("a"), [1].into());
        assert!(read.knows("b"));
        assert_eq!(
            seen.lock().unwrap()[0],
            "POST /v2/repository/index {\"ready\":true}"
        );

        let (backend, _) = stand_in(Some((200, r#"{"name":"triton","version":"2"}"#))).await;
        let metadata: serde_json::Value = TritonClient::new(&backend, SECOND)
            .server_metadata()
            .await
            .unwrap();
        assert_eq!(metadata["name"], "triton");
    }

    #[tokio::test]
    async fn a_refusal_keeps_tritons_status_and_message() {
        let said = r#"{"error":"failed to load 'm': no such file"}"#;
        let (backend, _) = stand_in(Some((400, said))).await;
        let error = TritonClient::new(&backend, SECOND)
            .load("m", Bytes::from_static(b"{}"))
            .await
            .unwrap_err();
        assert_eq!(error.reason(), "failed to load 'm': no such file");
        assert_eq!(error.describe("load"), "load answered 400 Bad Request");
        assert_eq!(
            error.to_string(),
            format!("POST /v2/repository/models/m/load answered 400 Bad Request: {said}")
        );
        assert!(!error.timed_out());
        let (status, body) = error.refusal().unwrap();
        assert_eq!((status.as_u16(), &body[..]), (400, said.as_bytes()));

        let (backend, _) = stand_in(Some((500, "oops"))).await;
        let error = TritonClient::new(&backend, SECOND)
            .unload("m")
            .await
            .unwrap_err();
        assert_eq!(error.reason(), "backend answered 500 Internal Server Error");
    }

    #[tokio::test]
    async fn an_unreadable_answer_is_the_backends_failure() {
        let (backend, _) = stand_in(Some((200, "not json"))).await;
        let triton = TritonClient::new(&backend, SECOND);
        let error = triton.repository_index(Bytes::new()).await.unwrap_err();
        assert!(
            error
                .describe("repository index")
                .starts_with("repository index is not valid JSON: "),
            "{error}"
        );
        let error = (triton.model_statistics::<serde_json::Value>(None))
            .await
            .unwrap_err();
        match error.refusal() {
            Err(GatewayError::UpstreamFailed { backend, reason }) => {
                assert_eq!(backend, "b");
                assert!(
                    reason.starts_with("statistics are not valid JSON: "),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn no_answer_names_the_backend_and_says_whether_it_timed_out() {
        let (backend, _) = stand_in(None).await;
        let triton = TritonClient::new(&backend, Duration::from_millis(200));
        let error = triton.live().await.unwrap_err();
        assert!(error.timed_out());
        assert_eq!(error.reason(), "backend 'b' did not answer within 200ms");
        assert_eq!(
            error.to_string(),
            "GET /v2/health/live: backend 'b' did not answer within 200ms"
        );

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let refusing = backend_at(&url);
        let error = TritonClient::new(&refusing, SECOND)
            .model_config("m", None)
            .await
            .unwrap_err();
        assert!(!error.timed_out());
        assert!(
            matches!(error.refusal(), Err(GatewayError::UpstreamUnreachable { backend, .. }) if backend == "b")
        );
    }

    #[tokio::test]
    async fn a_backend_without_a_metrics_url_has_no_metrics_text() {
        let config = config::Config::parse(
            "[listen]\nhttp = \"127.0.0.1:0\"\n[[backends]]\nname = \"b\"\nhttp = \"http://127.0.0.1:1\"",
        )
        .unwrap();
        let backend = Backend::new(&config.backends[0], &config.upstream, 1).unwrap();
        assert!(
            TritonClient::new(&backend, SECOND)
                .metrics_text()
                .await
                .is_none()
        );
    }
}
