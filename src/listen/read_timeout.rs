//! `server.body_read_timeout`: a request body that pauses longer than that between two reads
//! fails with `BodyReadTimeout`, and tells its connection to close.
//!
//! The timer only exists while the body waits: a body whose bytes are there when it is read
//! costs no timer at all.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// The error a body yields when the client sent nothing for `server.body_read_timeout`.
#[derive(Debug, thiserror::Error)]
#[error(
    "the request body stalled: no bytes for {}ms (server.body_read_timeout)",
    timeout.as_millis()
)]
pub struct BodyReadTimeout {
    /// The configured timeout.
    pub timeout: Duration,
}

impl BodyReadTimeout {
    /// The `BodyReadTimeout` anywhere in an error's chain (a read of the body, or a backend
    /// send that streamed it): the client stalled, the backend did nothing wrong.
    pub fn in_chain<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        let mut source = Some(error);
        while let Some(e) = source {
            if let Some(timeout) = e.downcast_ref::<Self>() {
                return Some(timeout);
            }
            source = e.source();
        }
        None
    }
}

/// What a connection's requests tell its task: a request head arrived (the first-request
/// timer can stop), or a body stalled (close the connection).
#[derive(Debug)]
pub(super) struct ConnectionState {
    /// The listener, for the metric.
    listener: &'static str,
    saw_request: AtomicBool,
    /// An HTTP/1 request's body is not yet read to its end.
    body_unread: AtomicBool,
    stalled: Notify,
}

impl ConnectionState {
    pub fn new(listener: &'static str) -> Self {
        Self {
            listener,
            saw_request: AtomicBool::new(false),
            body_unread: AtomicBool::new(false),
            stalled: Notify::new(),
        }
    }

    pub fn mark_request(&self) {
        self.saw_request.store(true, Ordering::Relaxed);
    }

    /// A request begins: `unread` when it is HTTP/1 and has a body.
    pub fn body_started(&self, unread: bool) {
        self.body_unread.store(unread, Ordering::Relaxed);
    }

    pub fn body_unread(&self) -> bool {
        self.body_unread.load(Ordering::Relaxed)
    }

    pub fn saw_request(&self) -> bool {
        self.saw_request.load(Ordering::Relaxed)
    }

    /// Resolves once a body of this connection has stalled.
    pub async fn notified(&self) {
        self.stalled.notified().await
    }
}

/// A request body with a deadline on each wait for the client's next bytes.
pub(super) struct ReadTimeout<B> {
    inner: B,
    /// `None`: no timeout (gRPC streams).
    timeout: Option<Duration>,
    /// Created on the first wait, reset on each later one.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Whether `sleep` runs for the current wait.
    waiting: bool,
    failed: bool,
    connection: std::sync::Arc<ConnectionState>,
}

impl<B> ReadTimeout<B> {
    pub fn new(
        inner: B,
        timeout: Option<Duration>,
        connection: std::sync::Arc<ConnectionState>,
    ) -> Self {
        Self {
            inner,
            timeout,
            sleep: None,
            waiting: false,
            failed: false,
            connection,
        }
    }
}

impl<B> Body for ReadTimeout<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.waiting = false;
            if frame.is_none() || this.inner.is_end_stream() {
                this.connection.body_started(false);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let Some(timeout) = this.timeout else {
            return Poll::Pending;
        };
        if !this.waiting {
            this.waiting = true;
            let deadline = Instant::now() + timeout;
            match &mut this.sleep {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => this.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let sleep = this.sleep.as_mut().expect("armed above");
        ready!(sleep.as_mut().poll(cx));
        this.failed = true;
        super::connection::count_timeout(this.connection.listener, "body");
        this.connection.stalled.notify_one();
        Poll::Ready(Some(Err(Box::new(BodyReadTimeout { timeout }))))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::convert::Infallible;
    use std::sync::Arc;

    /// A body that yields one chunk, then waits forever.
    fn stalls_after_one_chunk() -> impl Body<Data = Bytes, Error = Infallible> + Unpin {
        use futures_util::StreamExt;
        let chunk = Ok(Frame::data(Bytes::from_static(b"ab")));
        http_body_util::StreamBody::new(
            futures_util::stream::iter([chunk]).chain(futures_util::stream::pending()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_after_the_timeout_and_tells_its_connection() {
        let connection = Arc::new(ConnectionState::new("http"));
        let timeout = Duration::from_secs(60);
        let mut body =
            ReadTimeout::new(stalls_after_one_chunk(), Some(timeout), connection.clone());
        let started = Instant::now();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "ab");
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), timeout);
        assert!(BodyReadTimeout::in_chain(&*error).is_some());
        let error = error.downcast::<BodyReadTimeout>().unwrap();
        assert_eq!(error.timeout, timeout);
        assert!(
            error.to_string().contains("server.body_read_timeout"),
            "{error}"
        );
        tokio::time::timeout(Duration::from_millis(1), connection.notified())
            .await
            .expect("the connection is told to close");
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_timeout_a_body_may_wait_as_long_as_it_likes() {
        let connection = Arc::new(ConnectionState::new("http"));
        let mut body = ReadTimeout::new(stalls_after_one_chunk(), None, connection);
        body.frame().await.unwrap().unwrap();
        let waited = tokio::time::timeout(Duration::from_secs(3600), body.frame()).await;
        assert!(waited.is_err(), "a gRPC stream's pause is not a stall");
    }
}
