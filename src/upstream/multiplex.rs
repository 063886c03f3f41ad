//! HTTP/2 connections to a backend's gRPC endpoint, one per worker, each made on the worker
//! that uses it.
//!
//! tonic's `Channel` puts a buffer (a task of its own) in front of its connection, and runs
//! both on whichever runtime used it first: with shared-nothing workers, a call from any other
//! worker crossed to that thread and back, through two tasks. Here each worker keeps its own
//! connection (hyper's `client::conn::http2`), whose task runs on that worker, and a call goes
//! straight to it. A connection that closes is replaced on the next call; concurrent first
//! calls share one connection attempt.

use super::failure::connect_reason;
use crate::listen::PerWorker;
use crate::tls::HttpsConnector;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::OnceCell;
use tower::ServiceExt;

type Body = tonic::body::Body;
type Sender = http2::SendRequest<Body>;
/// A worker's connection, once made; replaced by an empty cell when it closes.
type Slot = Mutex<Arc<OnceCell<Sender>>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connection attempt that failed: the backend is unreachable (refused, timed out, TLS).
/// Its own type so that `grpc::classify` tells it from a failure on a working connection.
#[derive(Debug, Clone)]
pub struct ConnectFailed(pub String);

impl std::fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectFailed {}

/// Where and how to connect, and a slot per worker for its connection (`PerWorker`).
#[derive(Debug)]
pub struct Connections {
    uri: Uri,
    connector: HttpsConnector,
    /// Named when an attempt runs out of it.
    connect_timeout: Duration,
    http2: http2::Builder<TokioExecutor>,
    slots: PerWorker<Slot>,
}

impl Connections {
    /// Connections to `uri` (`http://` or `https://host:port`) through `connector` (which
    /// gives up after `connect_timeout`), with keep-alive pings every `keep_alive.0` (answered
    /// within `keep_alive.1`), busy or idle.
    pub fn new(
        uri: Uri,
        connector: HttpsConnector,
        connect_timeout: Duration,
        keep_alive: (Duration, Duration),
    ) -> Self {
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .keep_alive_interval(keep_alive.0)
            .keep_alive_timeout(keep_alive.1)
            .keep_alive_while_idle(true)
            // Large tensors: let the windows grow with the measured bandwidth instead of
            // stalling on the 64 KiB default.
            .adaptive_window(true);
        Self {
            uri,
            connector,
            connect_timeout,
            http2,
            slots: PerWorker::new(Slot::default),
        }
    }

    /// The service tonic's client sends its calls through.
    pub fn link(self: &Arc<Self>) -> Link {
        Link {
            connections: self.clone(),
        }
    }

    /// The origin (scheme and authority) every request names: HTTP/2 requires both.
    pub fn origin(&self) -> Uri {
        self.uri.clone()
    }

    /// Sends on this worker's connection, connecting first when it has none or it has closed.
    async fn send(&self, request: Request<Body>) -> Result<Response<Incoming>, BoxError> {
        let mut sender = self.sender().await?;
        Ok(sender.send_request(request).await?)
    }

    /// This worker's open connection, made if need be (once, however many calls wait for it),
    /// its task on this worker's runtime.
    async fn sender(&self) -> Result<Sender, ConnectFailed> {
        let slot = self.slots.get();
        loop {
            let cell = slot.lock().expect("poisoned").clone();
            let sender = cell.get_or_try_init(|| self.connect()).await?;
            if !sender.is_closed() {
                return Ok(sender.clone());
            }
            // Closed (the backend went away, or its runtime ended): the next attempt is a new
            // connection, unless another call has already put one in.
            let mut current = slot.lock().expect("poisoned");
            if Arc::ptr_eq(&current, &cell) {
                *current = Arc::default();
            }
        }
    }

    /// Opens a connection and runs it as a task on this thread's runtime.
    async fn connect(&self) -> Result<Sender, ConnectFailed> {
        let io = self
            .connector
            .clone()
            .oneshot(self.uri.clone())
            .await
            .map_err(|e| ConnectFailed(connect_reason(e.as_ref(), self.connect_timeout)))?;
        let (sender, connection) = self
            .http2
            .handshake(io)
            .await
            .map_err(|e| ConnectFailed(connect_reason(&e, self.connect_timeout)))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "gRPC backend connection ended");
            }
        });
        Ok(sender)
    }
}

/// A call's way to its worker's connection: the tower service under tonic's client.
#[derive(Debug, Clone)]
pub struct Link {
    connections: Arc<Connections>,
}

impl tower::Service<Request<Body>> for Link {
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let connections = self.connections.clone();
        Box::pin(async move { connections.send(request).await })
    }
}
