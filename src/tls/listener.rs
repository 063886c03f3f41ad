//! A TLS listener for `axum::serve`: TCP connections are accepted in a task of their own and
//! each handshake runs in its own task (with a deadline), so a slow or silent client never
//! holds up the next one; finished handshakes are handed to axum, which serves HTTP/1.1 or
//! HTTP/2 on them as it does on plain TCP (gRPC clients pick h2 by ALPN).

use super::{PeerIdentity, ServerTls};
use crate::telemetry;
use axum::extract::Request;
use axum::response::Response;
use axum::serve::{IncomingStream, Listener};
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Finished handshakes waiting for axum to take them.
const BACKLOG: usize = 128;

/// What axum learns about a TLS connection: who the client certificate says it is.
#[derive(Clone, Debug)]
pub struct TlsPeer {
    /// From a verified client certificate (mTLS), if one was presented.
    pub identity: Option<PeerIdentity>,
}

/// Accepts TLS connections on a bound TCP socket.
pub struct TlsListener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, TlsPeer)>,
}

impl TlsListener {
    /// Starts accepting on `tcp` with the (reloadable) `tls` state. `name` labels the
    /// handshake-failure metric (`http`, `grpc`, `admin`). The accept task ends when this
    /// listener is dropped (axum drops it when graceful shutdown begins).
    pub fn new(tcp: TcpListener, tls: Arc<ServerTls>, name: &'static str) -> std::io::Result<Self> {
        let (sender, incoming) = mpsc::channel(BACKLOG);
        tokio::spawn(accept_loop(tcp, tls, sender, name));
        Ok(Self { incoming })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = TlsPeer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The accept task only ends once this listener is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(TlsPeer { identity: None })
    }
}

async fn accept_loop(
    tcp: TcpListener,
    tls: Arc<ServerTls>,
    sender: mpsc::Sender<(TlsStream<TcpStream>, TlsPeer)>,
    name: &'static str,
) {
    loop {
        let (stream, remote) = tokio::select! {
            _ = sender.closed() => return,
            accepted = tcp.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    tracing::warn!(%error, listener = name, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Small HTTP/2 frames (gRPC headers, data, trailers) must not wait for delayed ACKs.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        let acceptor = TlsAcceptor::from(tls.server_config());
        let (tls, sender) = (tls.clone(), sender.clone());
        tokio::spawn(async move {
            let failure =
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let identity = tls.peer_identity(stream.get_ref().1);
                        let _ = sender.send((stream, TlsPeer { identity })).await;
                        return;
                    }
                    Ok(Err(error)) => error.to_string(),
                    Err(_) => "handshake timed out".to_string(),
                };
            // Scanners and health checkers that only open a TCP connection end up here too:
            // counted, logged at debug level.
            tracing::debug!(%remote, listener = name, error = failure, "TLS handshake failed");
            metrics::counter!(telemetry::TLS_HANDSHAKE_FAILURES, "listener" => name).increment(1);
        });
    }
}

/// The per-connection service for a TLS listener: the router, with the connection's
/// `PeerIdentity` put on every request.
#[derive(Clone)]
pub struct WithPeer {
    router: axum::Router,
    identity: Option<PeerIdentity>,
}

impl WithPeer {
    /// The make-service to give `axum::serve` with a `TlsListener`.
    pub fn make(router: axum::Router) -> MakeWithPeer {
        MakeWithPeer(router)
    }
}

/// Makes a `WithPeer` for each accepted connection.
#[derive(Clone)]
pub struct MakeWithPeer(axum::Router);

impl tower::Service<IncomingStream<'_, TlsListener>> for MakeWithPeer {
    type Response = WithPeer;
    type Error = Infallible;
    type Future = Ready<Result<WithPeer, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, incoming: IncomingStream<'_, TlsListener>) -> Self::Future {
        ready(Ok(WithPeer {
            router: self.0.clone(),
            identity: incoming.remote_addr().identity.clone(),
        }))
    }
}

impl tower::Service<Request> for WithPeer {
    type Response = Response;
    type Error = Infallible;
    type Future = <axum::Router as tower::Service<Request>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<Request>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        if let Some(identity) = &self.identity {
            request.extensions_mut().insert(identity.clone());
        }
        self.router.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn every_request_of_a_connection_carries_its_peer() {
        let router = axum::Router::new().route(
            "/",
            axum::routing::get(|peer: Option<axum::Extension<PeerIdentity>>| async move {
                peer.map(|axum::Extension(p)| p.subject).unwrap_or_default()
            }),
        );
        let body = |service: WithPeer| async move {
            let response = service
                .oneshot(Request::new(axum::body::Body::empty()))
                .await
                .unwrap();
            let bytes = axum::body::to_bytes(response.into_body(), 1024)
                .await
                .unwrap();
            String::from_utf8(bytes.to_vec()).unwrap()
        };
        let alice = WithPeer {
            router: router.clone(),
            identity: Some(PeerIdentity {
                subject: "alice".into(),
            }),
        };
        assert_eq!(body(alice).await, "alice");
        let anonymous = WithPeer {
            router,
            identity: None,
        };
        assert_eq!(body(anonymous).await, "");
    }
}
