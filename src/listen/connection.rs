//! One client connection, from accept to close: the TLS handshake when the listener speaks
//! TLS, then hyper serving the listener's router on it, with the limits that keep a hostile
//! client from holding it open for nothing:
//! - the request head must arrive within `server.header_read_timeout` (hyper's HTTP/1 header
//!   timer, which also bounds an idle keep-alive connection; and ours until the first request,
//!   for a client that sends nothing, or too little for hyper to tell HTTP/1 from h2c);
//! - a request body may pause at most `server.body_read_timeout` between reads, and must
//!   average `server.min_body_rate` once past `server.min_body_rate_grace` (`read_timeout`);
//!   else the request fails and the connection is closed.

use super::Endpoint;
use super::head_timer::HeadTimer;
use super::read_timeout::{BodyPace, ConnectionState, MinRate, ReadTimeout};
use super::woken::{self, First};
use crate::config;
use crate::telemetry;
use crate::tls::PeerIdentity;
use axum::response::Response;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// The `[server]` keys the accept path enforces.
pub(super) struct Limits {
    pub header_read_timeout: Duration,
    pub body_pace: BodyPace,
    pub max_connections: usize,
}

impl From<&config::Server> for Limits {
    fn from(server: &config::Server) -> Self {
        Self {
            header_read_timeout: server.header_read_timeout.0,
            body_pace: BodyPace {
                gap: server.body_read_timeout.0,
                min_rate: (server.min_body_rate.bytes() > 0).then_some(MinRate {
                    bytes_per_sec: server.min_body_rate.bytes(),
                    grace: server.min_body_rate_grace.0,
                }),
            },
            max_connections: server.max_connections,
        }
    }
}

/// hyper's server settings for every connection of a listener: HTTP/1.1 with keep-alive, or
/// HTTP/2 (h2c by prior knowledge, h2 by ALPN), as `axum::serve` had them, plus the
/// header timeout. Each connection adds its own header timer (`per_connection`): without
/// one, hyper would panic at the first request head. hyper dates every answer unless the
/// listener's are not to be (`Endpoint::dated`).
pub(super) fn builder(limits: &Limits, dated: bool) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .header_read_timeout(limits.header_read_timeout)
        .auto_date_header(dated);
    builder
        .http2()
        .timer(TokioTimer::new())
        .auto_date_header(dated);
    builder
}

/// The listener's settings with a header timer of the connection's own (`HeadTimer`).
fn per_connection(listener: &auto::Builder<TokioExecutor>) -> auto::Builder<TokioExecutor> {
    let mut builder = listener.clone();
    builder.http1().timer(HeadTimer::new());
    builder
}

/// An accepted connection and what it is served with.
pub(super) struct Connection {
    pub endpoint: Endpoint,
    pub limits: Arc<Limits>,
    pub builder: Arc<auto::Builder<TokioExecutor>>,
    /// Cancelled when shutdown begins: HTTP/1 answers close their connection after them,
    /// HTTP/2 connections get a GOAWAY, while the listener still accepts.
    pub drain: CancellationToken,
    pub stop: CancellationToken,
    pub abort: CancellationToken,
}

impl Connection {
    /// Serves the connection until the client closes it, a limit closes it, or shutdown.
    pub async fn serve(self, stream: TcpStream, remote: SocketAddr) {
        let Some(tls) = self.endpoint.tls.clone() else {
            return self.serve_io(stream, None).await;
        };
        let name = self.endpoint.name;
        let handshake = tokio::select! {
            _ = self.abort.cancelled() => return,
            handshake = crate::tls::handshake(&tls, stream, remote, name) => handshake,
        };
        if let Some((stream, identity)) = handshake {
            self.serve_io(stream, identity).await
        }
    }

    async fn serve_io<I>(self, io: I, identity: Option<PeerIdentity>)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let name = self.endpoint.name;
        let state = Arc::new(ConnectionState::new(name, self.drain.clone()));
        let service = PerConnection {
            answers: self.endpoint.answers.clone(),
            identity,
            body_pace: self.limits.body_pace,
            state: state.clone(),
        };
        let builder = per_connection(&self.builder);
        let mut connection =
            pin!(builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service)));
        let first_head = tokio::time::sleep(self.limits.header_read_timeout);
        let mut first_head = pin!(first_head);
        let (mut first_head_armed, mut closing, mut drained) = (true, false, false);
        loop {
            // What else may end or close the connection: rare, so polled only when woken.
            let (armed, head) = (first_head_armed, first_head.as_mut());
            let (abort, stop, state) = (&self.abort, &self.stop, &state);
            let signal = pin!(async move {
                tokio::select! {
                    _ = abort.cancelled() => Signal::Abort,
                    _ = state.drain_begun(), if !closing && !drained => Signal::Drain,
                    _ = stop.cancelled(), if !closing => Signal::Stop,
                    _ = state.notified(), if !closing => Signal::Stalled,
                    _ = head, if armed => Signal::FirstHead,
                }
            });
            let signal = match woken::first(connection.as_mut(), signal).await {
                First::Busy(result) => {
                    if let Err(error) = result {
                        if is_header_timeout(&*error) {
                            count_timeout(name, "header");
                        }
                        tracing::debug!(%error, listener = name, "connection ended with an error");
                    }
                    return;
                }
                First::Rare(signal) => signal,
            };
            match signal {
                Signal::Abort => return,
                // An HTTP/2 client is told at once (GOAWAY; its streams in flight finish), an
                // HTTP/1 one by its next answer (`connection: close`): an idle HTTP/1
                // connection closed now could cross a request already on its way. What is
                // still idle when the listener stops is closed then.
                Signal::Drain => {
                    drained = true;
                    if state.is_http2() {
                        closing = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
                Signal::Stop | Signal::Stalled => {
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                }
                Signal::FirstHead => {
                    first_head_armed = false;
                    if !state.saw_request() {
                        count_timeout(name, "header");
                        tracing::debug!(
                            listener = name,
                            "no request head within server.header_read_timeout"
                        );
                        return;
                    }
                }
            }
        }
    }
}

/// What besides hyper may end or close a connection.
enum Signal {
    /// The listener is aborted: close now.
    Abort,
    /// Shutdown has begun (drain).
    Drain,
    /// The listener stops: close gracefully.
    Stop,
    /// A request body stalled.
    Stalled,
    /// `server.header_read_timeout` after the accept.
    FirstHead,
}

/// Counts a connection closed for a slow client.
pub(super) fn count_timeout(listener: &'static str, phase: &'static str) {
    metrics::counter!(telemetry::CLIENT_TIMEOUTS, "listener" => listener, "phase" => phase)
        .increment(1);
}

/// Whether hyper ended the connection for a request head that did not arrive in time.
fn is_header_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    error
        .downcast_ref::<hyper::Error>()
        .is_some_and(hyper::Error::is_timeout)
}

/// The tower service a connection's requests go through: what answers the listener's
/// requests, with the body's pace and the connection's `PeerIdentity` (mTLS) on every
/// request.
#[derive(Clone)]
struct PerConnection {
    answers: super::Answers,
    identity: Option<PeerIdentity>,
    body_pace: BodyPace,
    state: Arc<ConnectionState>,
}

impl<B> tower::Service<http::Request<B>> for PerConnection
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = CloseIfUnread;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let http1 = request.version() < http::Version::HTTP_2;
        self.state.mark_request(!http1);
        // A gRPC request body is the client's message stream, paced one message at a time.
        // gRPC is HTTP/2's alone: an HTTP/1 request is not looked up (a hash of the name).
        let grpc = !http1
            && (request.headers().get(http::header::CONTENT_TYPE))
                .is_some_and(|t| t.as_bytes().starts_with(b"application/grpc"));
        self.state
            .body_started(http1 && !request.body().is_end_stream());
        let mut request = request.map(|body| {
            axum::body::Body::new(ReadTimeout::new(
                body,
                self.body_pace,
                grpc,
                self.state.clone(),
            ))
        });
        if let Some(identity) = &self.identity {
            request.extensions_mut().insert(identity.clone());
        }
        let response = match &mut self.answers {
            super::Answers::Edge(gateway, answer) => {
                Answering::Direct(answer(gateway.clone(), request))
            }
            super::Answers::Router(router) => Answering::Routed(router.call(request)),
        };
        CloseIfUnread {
            response,
            state: self.state.clone(),
            http1,
        }
    }
}

/// The answer being made: by a router, or by a front-end's edge. Held in place inside
/// hyper's per-request future, never moved around; boxing the router's future too would cost
/// every routed request an allocation.
#[allow(clippy::large_enum_variant)]
enum Answering {
    Routed(<axum::Router as tower::Service<axum::extract::Request>>::Future),
    Direct(Pin<Box<dyn Future<Output = Response> + Send>>),
}

impl Future for Answering {
    type Output = Response;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response> {
        match self.get_mut() {
            Self::Routed(routed) => Pin::new(routed).poll(cx).map(|Ok(response)| response),
            Self::Direct(direct) => direct.as_mut().poll(cx),
        }
    }
}

/// The router's answer; on HTTP/1, with `connection: close` when it is ready before the
/// request body was read to its end (an error answered early: a body over the limit, a
/// stalled one), or once shutdown has begun. hyper then closes the connection after the
/// answer, and says so, so the client does not send its next request on a connection about
/// to close.
pub(super) struct CloseIfUnread {
    response: Answering,
    state: Arc<ConnectionState>,
    http1: bool,
}

impl Future for CloseIfUnread {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut response = std::task::ready!(Pin::new(&mut self.response).poll(cx));
        if self.http1 && (self.state.body_unread() || self.state.draining()) {
            response.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        Poll::Ready(Ok(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    // The service a TLS connection's requests go through puts its peer on each of them;
    // a plain connection's requests carry none.
    #[tokio::test]
    async fn every_request_of_a_connection_carries_its_peer() {
        let router = axum::Router::new().route(
            "/",
            axum::routing::get(|peer: Option<axum::Extension<PeerIdentity>>| async move {
                peer.map(|axum::Extension(p)| p.subject.to_string())
                    .unwrap_or_default()
            }),
        );
        let body = |identity| {
            let service = PerConnection {
                answers: crate::listen::Answers::Router(router.clone()),
                identity,
                body_pace: BodyPace {
                    gap: Duration::from_secs(1),
                    min_rate: None,
                },
                state: Arc::new(ConnectionState::new("http", CancellationToken::new())),
            };
            async move {
                let request = http::Request::new(axum::body::Body::empty());
                let response = service.oneshot(request).await.unwrap();
                let bytes = axum::body::to_bytes(response.into_body(), 1024)
                    .await
                    .unwrap();
                String::from_utf8(bytes.to_vec()).unwrap()
            }
        };
        let alice = PeerIdentity {
            subject: "alice".into(),
        };
        assert_eq!(body(Some(alice)).await, "alice");
        assert_eq!(body(None).await, "");
    }
}
