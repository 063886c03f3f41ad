//! HTTP/1.1 connections to a plain `http://` backend, each driven by the request using it.
//!
//! hyper's pooled client runs every connection as a task of its own: a request handed its
//! message to that task and waited to be woken with the answer, and each chunk of the answer's
//! body crossed back the same way. Here the request's own task polls the connection (hyper's
//! `client::conn`) along with the answer, and then along with the answer's body; once the body
//! has ended, the connection goes back to its worker's idle list for the next request of that
//! worker. Nothing crosses a task or a thread.
//!
//! Only on the workers (`crate::listen`): a connection's socket is registered with its
//! worker's runtime and stays on that worker. Background work, TLS and h2c backends use the
//! pooled client (`client.rs`).

use crate::deadline_timer::DeadlineTimer;
use crate::error::GatewayError;
use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

type Connection = http1::Connection<TokioIo<TcpStream>, Body>;

/// One connection: the handle that sends on it and the state machine that drives it.
struct Conn {
    sender: http1::SendRequest<Body>,
    driver: Pin<Box<Connection>>,
    /// The driver has finished (the connection closed); it must not be polled again.
    closed: bool,
    /// When it went idle.
    since: Instant,
    /// Wakes the request on this connection by its deadline.
    timer: DeadlineTimer,
}

impl Conn {
    /// Drives the connection as far as it goes without waiting; false once it has closed.
    fn progress(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.closed && self.driver.as_mut().poll(cx).is_ready() {
            self.closed = true;
        }
        !self.closed
    }
}

/// The idle connections to one backend, a list per worker.
pub(super) struct Driven {
    /// `host:port` to connect to.
    address: String,
    idle: Box<[Mutex<Vec<Conn>>]>,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    /// How long a request may wait for the head of its answer, connecting included.
    request_timeout: Duration,
}

impl std::fmt::Debug for Driven {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driven")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Driven {
    /// Idle lists for `workers` workers, for a backend at `address` (`host:port`).
    pub(super) fn new(
        address: String,
        workers: usize,
        config: &crate::config::Upstream,
    ) -> Arc<Self> {
        Arc::new(Self {
            address,
            idle: (0..workers).map(|_| Mutex::new(Vec::new())).collect(),
            max_idle: config.pool_max_idle,
            idle_timeout: config.pool_idle_timeout.0,
            connect_timeout: config.connect_timeout.0,
            request_timeout: config.request_timeout.0,
        })
    }

    /// Whether this thread is a worker with a list here.
    pub(super) fn worker(&self) -> Option<usize> {
        crate::worker::worker_index().filter(|&i| i < self.idle.len())
    }

    /// Sends `request` on an idle connection of `worker`'s, or a new one, and answers once the
    /// head of the answer has arrived; its body drives the connection on. A request that an
    /// idle connection closed under before sending any of it is sent once more, on a new
    /// connection, as hyper's pooled client does. No answer by `upstream.request_timeout`
    /// after the call: `GatewayError::UpstreamTimeout`.
    pub(super) async fn send(
        self: &Arc<Self>,
        worker: usize,
        backend: &str,
        mut request: Request<Body>,
    ) -> Result<Response<Body>, GatewayError> {
        // On a connection of its own, a request names only its path (origin form), as hyper's
        // pooled client sends it.
        let origin = request.uri().path_and_query().cloned();
        *request.uri_mut() = origin.map_or_else(|| Uri::from_static("/"), Uri::from);
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        loop {
            let (mut conn, reused) =
                match poll_fn(|cx| Poll::Ready(self.checkout(worker, cx))).await {
                    Some(conn) => (conn, true),
                    None => (self.connect(backend, deadline).await?, false),
                };
            let sent = conn.sender.try_send_request(request);
            let mut sent = pin!(sent);
            let answer = poll_fn(|cx| {
                conn.progress(cx);
                match sent.as_mut().poll(cx) {
                    // One timer for all the connection's requests (`DeadlineTimer`), where a
                    // tokio timeout per request cost ~650 instructions.
                    Poll::Pending if conn.timer.poll_until(deadline, cx).is_ready() => {
                        Poll::Ready(None)
                    }
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(answer) => Poll::Ready(Some(answer)),
                }
            })
            .await;
            let Some(answer) = answer else {
                return Err(super::failure::no_answer_within(
                    backend,
                    self.request_timeout,
                ));
            };
            match answer {
                Ok(response) => {
                    let home = Home {
                        pool: self.clone(),
                        worker,
                        conn: Some(conn),
                    };
                    return Ok(response.map(|body| Body::new(Answer { body, home })));
                }
                Err(mut error) => match error.take_message() {
                    Some(again) if reused => request = again,
                    _ => {
                        let error = error.into_error();
                        return Err(super::client::classify(
                            backend,
                            &error,
                            self.connect_timeout,
                        ));
                    }
                },
            }
        }
    }

    /// The most recently used idle connection of this worker that is still open and ready.
    fn checkout(&self, worker: usize, cx: &mut Context<'_>) -> Option<Conn> {
        loop {
            let mut conn = self.idle[worker].lock().expect("idle list").pop()?;
            // One poll lets the connection notice a close by the backend, and lets its
            // dispatcher ask for the next request.
            if conn.since.elapsed() < self.idle_timeout
                && conn.progress(cx)
                && conn.sender.is_ready()
            {
                return Some(conn);
            }
        }
    }

    /// Puts a connection whose answer has ended back on its worker's list.
    fn release(&self, worker: usize, mut conn: Conn) {
        if conn.closed || conn.sender.is_closed() {
            return;
        }
        conn.since = Instant::now();
        let mut idle = self.idle[worker].lock().expect("idle list");
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }

    /// A new connection, whose timer first wakes at `deadline`.
    async fn connect(
        &self,
        backend: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Conn, GatewayError> {
        let unreachable = |reason: String, refused: bool| GatewayError::UpstreamUnreachable {
            backend: backend.to_string(),
            reason,
            refused,
        };
        let stream =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.address))
                .await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    let refused = super::failure::refused(&error);
                    return Err(unreachable(format!("tcp connect error: {error}"), refused));
                }
                Err(_) => {
                    let reason = super::failure::no_connection_within(self.connect_timeout);
                    return Err(unreachable(reason, false));
                }
            };
        // A request goes out as one write; with Nagle on, a second would wait for an ACK.
        let _ = stream.set_nodelay(true);
        let (sender, driver) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|error| unreachable(error.to_string(), false))?;
        Ok(Conn {
            sender,
            driver: Box::pin(driver),
            closed: false,
            since: Instant::now(),
            timer: DeadlineTimer::new(deadline),
        })
    }
}

/// Where a connection goes back once its answer has ended.
struct Home {
    pool: Arc<Driven>,
    worker: usize,
    /// `None` once given back, or lost with an unfinished answer.
    conn: Option<Conn>,
}

/// The body of an answer, which drives its connection while it is read.
struct Answer {
    body: Incoming,
    home: Home,
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(conn) = &mut this.home.conn {
            conn.progress(cx);
        }
        let frame = std::task::ready!(Pin::new(&mut this.body).poll_frame(cx));
        if frame.is_none() || this.body.is_end_stream() {
            this.home.give_back();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Home {
    fn give_back(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.release(self.worker, conn);
        }
    }
}

impl Drop for Answer {
    /// An answer read to its end gives its connection back (hyper stops reading a body of
    /// known length after its last byte, without asking for its end); one dropped before
    /// then takes its connection with it, as hyper's own pool does.
    fn drop(&mut self) {
        if http_body::Body::is_end_stream(&self.body) {
            self.home.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A backend that answers `ok` on keep-alive connections and counts them (`/slow` after
    /// 2 s); with `linger`, it closes each connection that long after accepting it, as a
    /// backend's idle timeout would.
    async fn backend(linger: Option<Duration>) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(|request: Request<Incoming>| async move {
                            if request.uri().path() == "/slow" {
                                tokio::time::sleep(Duration::from_secs(2)).await;
                            }
                            Ok::<_, std::convert::Infallible>(Response::new(
                                http_body_util::Full::new(Bytes::from_static(b"ok")),
                            ))
                        });
                    let serve = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    match linger {
                        Some(linger) => drop(tokio::time::timeout(linger, serve).await),
                        None => drop(serve.await),
                    }
                });
            }
        });
        (address, accepted)
    }

    async fn get(pool: &Arc<Driven>) -> Bytes {
        let response = pool
            .send(0, "b", request("/v2/health/ready"))
            .await
            .unwrap();
        response.into_body().collect().await.unwrap().to_bytes()
    }

    fn request(path: &str) -> Request<Body> {
        Request::builder()
            .uri(format!("http://backend{path}"))
            .header(http::header::HOST, "backend")
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn an_answer_later_than_request_timeout_times_out_whenever_the_connection_was_made() {
        let (address, accepted) = backend(None).await;
        let config = crate::config::Upstream {
            request_timeout: crate::config::HumanDuration(Duration::from_millis(300)),
            ..Default::default()
        };
        let pool = Driven::new(address, 1, &config);
        let timed = |path: &'static str| {
            let pool = pool.clone();
            async move {
                let started = Instant::now();
                let answer = pool.send(0, "b", request(path)).await;
                (answer.map(|_| ()), started.elapsed())
            }
        };
        // A new connection's timer.
        let (answer, took) = timed("/slow").await;
        assert!(
            matches!(&answer, Err(GatewayError::UpstreamTimeout { backend, after })
                if backend == "b" && *after == Duration::from_millis(300)),
            "{answer:?}"
        );
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(1),
            "{took:?}"
        );
        // A kept connection whose timer fired while it was idle: a quick answer is not timed
        // out by it, and a slow one is timed out from its own start, not from the timer's.
        assert_eq!(get(&pool).await, "ok");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(get(&pool).await, "ok");
        let (answer, took) = timed("/slow").await;
        assert!(
            matches!(answer, Err(GatewayError::UpstreamTimeout { .. })),
            "{answer:?}"
        );
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(1),
            "{took:?}"
        );
        // A timed-out request's connection is not used again: the next request opens a
        // third.
        assert_eq!(get(&pool).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_connection_serves_one_request_after_another() {
        let (address, accepted) = backend(None).await;
        let pool = Driven::new(address, 1, &crate::config::Upstream::default());
        for _ in 0..3 {
            assert_eq!(get(&pool).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_backend_closed_while_idle_is_not_used() {
        let (address, accepted) = backend(Some(Duration::from_millis(100))).await;
        let pool = Driven::new(address, 1, &crate::config::Upstream::default());
        assert_eq!(get(&pool).await, "ok");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(get(&pool).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_unreachable_backend_is_named() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        drop(listener);
        let pool = Driven::new(address, 1, &crate::config::Upstream::default());
        let request = Request::new(Body::empty());
        let error = pool.send(0, "b", request).await.unwrap_err();
        assert!(
            matches!(&error, GatewayError::UpstreamUnreachable { backend, refused: true, .. } if backend == "b"),
            "{error:?}"
        );
    }
}
