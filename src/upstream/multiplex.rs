//! HTTP/2 connections to a backend's gRPC endpoint, one per worker, each made on the worker
//! that uses it.
//!
//! tonic's `Channel` puts a buffer (a task of its own) in front of its connection, and runs
//! both on whichever runtime used it first: with shared-nothing workers, a call from any other
//! worker crossed to that thread and back, through two tasks. Here each worker keeps its own
//! connection (hyper's `client::conn::http2`), whose task runs on that worker, and a call goes
//! straight to it. A connection that closes is replaced on the next call; concurrent first
//! calls share one connection attempt.

use super::ends::EndsWithLast;
use super::failure::connect_reason;
use crate::connection_tasks::Tasks;
use crate::tls::HttpsConnector;
use crate::worker::PerWorker;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::TokioTimer;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::OnceCell;
use tower::ServiceExt;

type Body = tonic::body::Body;
/// What goes to the backend: tonic's body, read one frame ahead (`ends`), so that a unary
/// call's message ends its stream.
type Sent = Request<EndsWithLast<Body>>;
type Sender = http2::SendRequest<EndsWithLast<Body>>;
/// A worker's connection, once made; replaced by an empty cell when it closes.
type Slot = Mutex<Arc<OnceCell<Sender>>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connection attempt that failed: the backend is unreachable (refused, timed out, TLS).
/// Its own type so that `grpc::classify` tells it from a failure on a working connection.
#[derive(Debug, Clone)]
pub struct ConnectFailed {
    /// What failed, in words (`failure::connect_reason`).
    pub reason: String,
    /// Whether the backend's host turned the connection away: refused, or reset as it was
    /// made (`failure::refused`).
    pub refused: bool,
}

impl ConnectFailed {
    /// The failure of an attempt that ran within `connect_timeout`.
    fn new(error: &(dyn std::error::Error + 'static), connect_timeout: Duration) -> Self {
        Self {
            reason: connect_reason(error, connect_timeout),
            refused: super::failure::refused(error),
        }
    }
}

impl std::fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
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
    /// Keep-alive pings every `.0`, answered within `.1`.
    keep_alive: (Duration, Duration),
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
        Self {
            uri,
            connector,
            connect_timeout,
            keep_alive,
            slots: PerWorker::new(Slot::default),
        }
    }

    /// How a connection is made: its requests' own tasks (`tasks`) run in its task.
    fn http2(&self, tasks: Tasks) -> http2::Builder<Tasks> {
        let mut http2 = http2::Builder::new(tasks);
        http2
            .timer(TokioTimer::new())
            .keep_alive_interval(self.keep_alive.0)
            .keep_alive_timeout(self.keep_alive.1)
            .keep_alive_while_idle(true)
            // Large tensors: let the windows grow with the measured bandwidth instead of
            // stalling on the 64 KiB default.
            .adaptive_window(true);
        http2
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
    /// A connection can close between the check and the send (the backend went away, or the
    /// connection failed for another call's sake); a request it closed on before writing
    /// anything is sent once more, on a new connection: the backend never saw it.
    async fn send(&self, request: Request<Body>) -> Result<Response<Incoming>, BoxError> {
        self.send_from(self.sender().await?, request.map(EndsWithLast::new))
            .await
    }

    /// `send`, first on `sender`.
    async fn send_from(
        &self,
        sender: Sender,
        request: Sent,
    ) -> Result<Response<Incoming>, BoxError> {
        match Self::send_on(sender, request).await? {
            Ok(response) => Ok(response),
            Err(unsent) => Ok(Self::send_on(self.sender().await?, unsent)
                .await?
                .map_err(|_| "the backend's new connection closed before the request was sent")?),
        }
    }

    /// Sends on `sender`: the answer, or the request back when the connection closed before
    /// any of it was written.
    async fn send_on(
        mut sender: Sender,
        request: Sent,
    ) -> Result<Result<Response<Incoming>, Sent>, hyper::Error> {
        match sender.try_send_request(request).await {
            Ok(response) => Ok(Ok(response)),
            Err(mut failed) => match failed.take_message() {
                Some(request) => Ok(Err(request)),
                None => Err(failed.into_error()),
            },
        }
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
            .map_err(|e| ConnectFailed::new(e.as_ref(), self.connect_timeout))?;
        let tasks = Tasks::default();
        let (sender, connection) = self
            .http2(tasks.clone())
            .handshake(io)
            .await
            .map_err(|e| ConnectFailed::new(&e, self.connect_timeout))?;
        let connection = async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "gRPC backend connection ended");
            }
        };
        tokio::spawn(crate::connection_tasks::run(connection, tasks));
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
        crate::in_place::in_place(|| async move { connections.send(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::TcpListener;

    /// An HTTP/2 server that answers 200 to anything, counts its connections, and hands back
    /// each connection's task, so that a test can end one.
    async fn server() -> (
        Uri,
        Arc<AtomicUsize>,
        tokio::sync::mpsc::UnboundedReceiver<tokio::task::JoinHandle<()>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (tasks, handles) = tokio::sync::mpsc::unbounded_channel();
        let counted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (io, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, Ordering::SeqCst);
                let service = hyper::service::service_fn(|_| async {
                    Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Empty::<
                        bytes::Bytes,
                    >::new()))
                });
                let serve =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
                let _ = tasks.send(tokio::spawn(async move {
                    let _ = serve.await;
                }));
            }
        });
        (uri, accepted, handles)
    }

    /// Connections to `uri` over plain TCP, with the upstream defaults' timings.
    fn plain(uri: &Uri) -> Connections {
        let connector = crate::tls::https_connector(false, None, true, Duration::from_secs(2))
            .expect("plain connector");
        Connections::new(
            uri.clone(),
            connector,
            Duration::from_secs(2),
            (Duration::from_secs(20), Duration::from_secs(10)),
        )
    }

    fn request(uri: &Uri) -> Request<Body> {
        Request::post(uri.clone()).body(Body::empty()).unwrap()
    }

    /// The HTTP/2 frames a client wrote, read off the bytes it sent after its preface:
    /// (type, flags, stream, length) each.
    fn frames(mut sent: &[u8]) -> Vec<(u8, u8, u32, usize)> {
        sent = &sent[24..]; // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        let mut frames = Vec::new();
        while sent.len() >= 9 {
            let length =
                usize::from(sent[0]) << 16 | usize::from(sent[1]) << 8 | usize::from(sent[2]);
            let stream = u32::from_be_bytes([sent[5], sent[6], sent[7], sent[8]]) & 0x7fff_ffff;
            frames.push((sent[3], sent[4], stream, length));
            sent = &sent[(9 + length).min(sent.len())..];
        }
        frames
    }

    /// A unary call's message goes to the backend in one DATA frame that ends its stream,
    /// though tonic's body only says it has ended when asked for more: hyper wrote that frame
    /// and an empty one after it to end the stream.
    #[tokio::test]
    async fn a_message_goes_in_one_data_frame_that_ends_the_stream() {
        let (backend, _, _) = server().await;
        // A relay in front of the backend that keeps what the gateway writes.
        let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}", relay.local_addr().unwrap())
            .parse()
            .unwrap();
        let written = Arc::new(Mutex::new(Vec::new()));
        let kept = written.clone();
        let authority = backend.authority().unwrap().to_string();
        tokio::spawn(async move {
            let (mut client, _) = relay.accept().await.unwrap();
            let mut server = tokio::net::TcpStream::connect(authority).await.unwrap();
            let (mut from_client, mut to_client) = client.split();
            let (mut from_server, mut to_server) = server.split();
            let upstream = async {
                let mut buffer = [0u8; 4096];
                loop {
                    let n = tokio::io::AsyncReadExt::read(&mut from_client, &mut buffer).await?;
                    if n == 0 {
                        return std::io::Result::Ok(());
                    }
                    kept.lock().unwrap().extend_from_slice(&buffer[..n]);
                    tokio::io::AsyncWriteExt::write_all(&mut to_server, &buffer[..n]).await?;
                }
            };
            let downstream = tokio::io::copy(&mut from_server, &mut to_client);
            let _ = tokio::join!(upstream, downstream);
        });
        let connections = plain(&uri);
        let message = crate::protocol::inference::ModelInferRequest {
            model_name: "add_sub".into(),
            ..Default::default()
        };
        // gRPC's 5-byte prefix, then the message.
        let framed = 5 + prost::Message::encoded_len(&message);
        let body = crate::upstream::ends::unary_body(message);
        let answer = connections
            .send(Request::post(uri).body(body).unwrap())
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        let data: Vec<_> = frames(&written.lock().unwrap())
            .into_iter()
            .filter(|&(kind, _, stream, _)| kind == 0 && stream == 1)
            .collect();
        assert_eq!(
            data,
            [(0, 1, 1, framed)],
            "one DATA frame, END_STREAM, the message"
        );
    }

    #[tokio::test]
    async fn a_request_its_connection_closed_on_unsent_goes_on_a_new_one() {
        let (uri, accepted, mut handles) = server().await;
        let connections = plain(&uri);
        let answer = connections.send(request(&uri)).await.unwrap();
        assert_eq!(answer.status(), 200);

        // The connection closes after the sender was taken, as when it fails between the
        // check for a closed connection and the send.
        let stale = connections.sender().await.unwrap();
        handles.recv().await.unwrap().abort();
        while !stale.is_closed() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let answer = connections
            .send_from(stale, request(&uri).map(EndsWithLast::new))
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "a second connection");
    }
}
