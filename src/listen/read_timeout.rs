//! How fast a request body must come (`BodyPace`): a body that pauses longer than
//! `server.body_read_timeout` between two reads fails with `BodyReadTimeout`; one that,
//! after `server.min_body_rate_grace` of waiting, averages under `server.min_body_rate`
//! fails with `BodyTooSlow`. Either way its connection is told to close.
//!
//! The timer only exists while the body waits: a body whose bytes are there when it is read
//! costs no timer at all, and one timer stands for whichever limit comes first.

use crate::body::{BodyReadTimeout, BodyTooSlow, client_too_slow};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

/// What a connection's requests tell its task: a request head arrived (the first-request
/// timer can stop), or a body stalled (close the connection).
#[derive(Debug)]
pub(super) struct ConnectionState {
    /// The listener, for the metric.
    listener: &'static str,
    saw_request: AtomicBool,
    /// The connection speaks HTTP/2 (seen on its first request).
    http2: AtomicBool,
    /// An HTTP/1 request's body is not yet read to its end.
    body_unread: AtomicBool,
    stalled: Notify,
    /// Cancelled when the gateway begins to shut down (`Workers::begin_drain`).
    drain: CancellationToken,
}

impl ConnectionState {
    pub fn new(listener: &'static str, drain: CancellationToken) -> Self {
        Self {
            listener,
            saw_request: AtomicBool::new(false),
            http2: AtomicBool::new(false),
            body_unread: AtomicBool::new(false),
            stalled: Notify::new(),
            drain,
        }
    }

    pub fn mark_request(&self, http2: bool) {
        self.saw_request.store(true, Ordering::Relaxed);
        self.http2.store(http2, Ordering::Relaxed);
    }

    pub fn is_http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    /// Shutdown has begun: an HTTP/1 answer tells its client not to reuse the connection.
    pub fn draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// Resolves once shutdown has begun.
    pub async fn drain_begun(&self) {
        self.drain.cancelled().await
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

/// How fast a request body must come: the longest pause between two reads
/// (`server.body_read_timeout`), and the slowest average rate after a grace period
/// (`server.min_body_rate`, `server.min_body_rate_grace`). The pause alone lets a client
/// trickle a byte just inside it forever (the slow-POST attack); the rate bounds the whole
/// body, yet a large upload on a slow but steady link is never cut.
#[derive(Clone, Copy, Debug)]
pub(super) struct BodyPace {
    pub gap: Duration,
    /// `None`: `server.min_body_rate = 0`, no rate.
    pub min_rate: Option<MinRate>,
}

/// The slowest a body may average, in bytes per second, once it has been waited for longer
/// than `grace` (Kestrel's `MinRequestBodyDataRate`).
#[derive(Clone, Copy, Debug)]
pub(super) struct MinRate {
    pub bytes_per_sec: u64,
    pub grace: Duration,
}

impl MinRate {
    /// How long a body that has sent `received` bytes may have been waited for in all: the
    /// grace, or the time those bytes buy at the minimum rate, whichever is longer.
    fn allowed_wait(self, received: u64) -> Duration {
        let earned = Duration::from_secs_f64(received as f64 / self.bytes_per_sec as f64);
        self.grace.max(earned)
    }
}

/// Where a gRPC request stream is in its length-prefixed messages (a flag byte and a
/// big-endian length, then the message). A stream may rest between messages as long as the
/// application likes (a bidirectional stream waits on its answers); a message once begun must
/// come at the body's pace, so a client cannot trickle one in forever.
#[derive(Debug, Default)]
pub(super) struct Messages {
    prefix: [u8; 5],
    /// Bytes of the current message's prefix read; 5 while its body is read.
    prefix_read: usize,
    body_left: u64,
}

impl Messages {
    /// Whether a message has begun and not ended.
    fn inside(&self) -> bool {
        self.prefix_read > 0
    }

    /// Reads past `data`; returns how many of its bytes belong to a message that began in it
    /// and is still open at its end.
    fn feed(&mut self, mut data: &[u8]) -> Option<usize> {
        let mut open_from = None;
        let total = data.len();
        while !data.is_empty() {
            if self.prefix_read < 5 {
                if self.prefix_read == 0 {
                    open_from = Some(total - data.len());
                }
                let take = (5 - self.prefix_read).min(data.len());
                self.prefix[self.prefix_read..self.prefix_read + take]
                    .copy_from_slice(&data[..take]);
                self.prefix_read += take;
                data = &data[take..];
                if self.prefix_read == 5 {
                    let length = [
                        self.prefix[1],
                        self.prefix[2],
                        self.prefix[3],
                        self.prefix[4],
                    ];
                    self.body_left = u64::from(u32::from_be_bytes(length));
                }
            } else {
                let take =
                    usize::try_from(self.body_left).map_or(data.len(), |left| left.min(data.len()));
                self.body_left -= take as u64;
                data = &data[take..];
            }
            if self.prefix_read == 5 && self.body_left == 0 {
                (self.prefix_read, open_from) = (0, None);
            }
        }
        open_from.map(|from| total - from)
    }
}

/// Which limit the armed timer stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limit {
    Gap,
    Rate,
}

/// A request body held to a `BodyPace`. Only the time spent waiting for the client counts:
/// while the gateway itself is slow to read (a backend applying back-pressure), the client is
/// not to blame.
pub(super) struct ReadTimeout<B> {
    inner: B,
    pace: BodyPace,
    /// A gRPC stream's place in its messages (`None`: a plain body, paced whole).
    messages: Option<Messages>,
    /// Created on the first wait, reset on each later one.
    sleep: Option<Pin<Box<Sleep>>>,
    /// When the current wait began; `None` while the body is not waiting.
    waiting_since: Option<Instant>,
    /// The limit the current wait's timer stands for.
    armed: Limit,
    /// Time spent waiting for the client's bytes, over the earlier waits.
    waited: Duration,
    received: u64,
    failed: bool,
    connection: std::sync::Arc<ConnectionState>,
}

impl<B> ReadTimeout<B> {
    /// `grpc`: the body is a gRPC message stream, paced one message at a time.
    pub fn new(
        inner: B,
        pace: BodyPace,
        grpc: bool,
        connection: std::sync::Arc<ConnectionState>,
    ) -> Self {
        Self {
            inner,
            pace,
            messages: grpc.then(Messages::default),
            sleep: None,
            waiting_since: None,
            armed: Limit::Gap,
            waited: Duration::ZERO,
            received: 0,
            failed: false,
            connection,
        }
    }

    /// Books a frame that arrived: the wait it ended, and its bytes.
    fn arrived(&mut self, frame: &Option<Result<Frame<Bytes>, B::Error>>)
    where
        B: Body<Data = Bytes>,
    {
        if let Some(since) = self.waiting_since.take() {
            self.waited += since.elapsed();
        }
        let Some(Ok(frame)) = frame else { return };
        let Some(data) = frame.data_ref() else { return };
        let Some(messages) = &mut self.messages else {
            self.received += data.len() as u64;
            return;
        };
        // A message is paced from its first byte; a stream between messages is not paced.
        match messages.feed(data) {
            _ if !messages.inside() => (self.received, self.waited) = (0, Duration::ZERO),
            Some(begun) => (self.received, self.waited) = (begun as u64, Duration::ZERO),
            None => self.received += data.len() as u64,
        }
    }

    /// Starts timing a wait for the client: whichever limit it would pass first.
    fn start_wait(&mut self, pace: BodyPace) {
        let now = Instant::now();
        self.waiting_since = Some(now);
        let (after, limit) = match pace.min_rate {
            Some(rate) => {
                let left = rate.allowed_wait(self.received).saturating_sub(self.waited);
                if left < pace.gap {
                    (left, Limit::Rate)
                } else {
                    (pace.gap, Limit::Gap)
                }
            }
            None => (pace.gap, Limit::Gap),
        };
        self.armed = limit;
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut().reset(now + after),
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(now + after))),
        }
    }

    /// The body fails for the limit it passed, and its connection is told to close. A gRPC
    /// stream fails with the status the error table gives (tonic answers it as is).
    fn fail(&mut self, pace: BodyPace) -> axum::BoxError {
        self.failed = true;
        self.connection.stalled.notify_one();
        let error = self.passed(pace);
        match (&self.messages, client_too_slow(&*error)) {
            (Some(_), Some(error)) => {
                Box::new(tonic::Status::new(error.grpc_code(), error.to_string()))
            }
            _ => error,
        }
    }

    fn passed(&self, pace: BodyPace) -> axum::BoxError {
        match (self.armed, pace.min_rate) {
            (Limit::Rate, Some(rate)) => {
                super::connection::count_timeout(self.connection.listener, "body_rate");
                Box::new(BodyTooSlow {
                    bytes_per_sec: rate.bytes_per_sec,
                    received: self.received,
                    waited: self.waited
                        + self.waiting_since.map_or(Duration::ZERO, |s| s.elapsed()),
                })
            }
            _ => {
                super::connection::count_timeout(self.connection.listener, "body");
                Box::new(BodyReadTimeout { timeout: pace.gap })
            }
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
            this.arrived(&frame);
            if frame.is_none() || this.inner.is_end_stream() {
                this.connection.body_started(false);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let pace = this.pace;
        if this.messages.as_ref().is_some_and(|m| !m.inside()) {
            return Poll::Pending;
        }
        if this.waiting_since.is_none() {
            this.start_wait(pace);
        }
        let sleep = this.sleep.as_mut().expect("armed above");
        ready!(sleep.as_mut().poll(cx));
        Poll::Ready(Some(Err(this.fail(pace))))
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

    fn gap_only(gap: Duration) -> BodyPace {
        BodyPace {
            gap,
            min_rate: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_after_the_timeout_and_tells_its_connection() {
        let connection = Arc::new(ConnectionState::new("http", CancellationToken::new()));
        let timeout = Duration::from_secs(60);
        let mut body = ReadTimeout::new(
            stalls_after_one_chunk(),
            gap_only(timeout),
            false,
            connection.clone(),
        );
        let started = Instant::now();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "ab");
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), timeout);
        assert!(client_too_slow(&*error).is_some());
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

    /// A gRPC stream: `chunks`, then a wait forever.
    fn grpc_stream(
        chunks: &[&'static [u8]],
    ) -> impl Body<Data = Bytes, Error = Infallible> + Unpin {
        use futures_util::StreamExt;
        let chunks: Vec<_> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c))))
            .collect();
        http_body_util::StreamBody::new(
            futures_util::stream::iter(chunks).chain(futures_util::stream::pending()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_grpc_stream_may_rest_between_messages_as_long_as_it_likes() {
        let connection = Arc::new(ConnectionState::new("grpc", CancellationToken::new()));
        let whole = grpc_stream(&[b"\0\0\0\0\x02ab", b"\0\0\0\0\x00"]);
        let mut body = ReadTimeout::new(whole, kestrel_like(), true, connection);
        body.frame().await.unwrap().unwrap();
        body.frame().await.unwrap().unwrap();
        let waited = tokio::time::timeout(Duration::from_secs(3600), body.frame()).await;
        assert!(
            waited.is_err(),
            "a gRPC stream's pause between messages is not a stall"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_grpc_message_stalled_half_way_fails_with_the_tables_status() {
        let connection = Arc::new(ConnectionState::new("grpc", CancellationToken::new()));
        // A whole message, then the prefix of a 100-byte one and 2 of its bytes.
        let half = grpc_stream(&[b"\0\0\0\0\x01a", b"\0\0\0", b"\0\x64ab"]);
        let mut body = ReadTimeout::new(half, gap_only(Duration::from_secs(2)), true, connection);
        for _ in 0..3 {
            body.frame().await.unwrap().unwrap();
        }
        let started = Instant::now();
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        let status = error
            .downcast_ref::<tonic::Status>()
            .expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("server.body_read_timeout"),
            "{status:?}"
        );
    }

    #[test]
    fn messages_are_followed_across_chunks() {
        let mut messages = Messages::default();
        assert_eq!(messages.feed(b"\0\0\0\0\x03abc\0\0"), Some(2));
        assert!(messages.inside());
        assert_eq!(messages.feed(b"\0\0\x01"), None);
        assert!(messages.inside());
        assert_eq!(messages.feed(b"z"), None);
        assert!(!messages.inside());
        assert_eq!(messages.feed(b"\0\0\0\0\x00\0\0\0\0\x05ab"), Some(7));
    }

    /// A body of `chunks` chunks of `size` bytes, one every `every`.
    fn paced(
        chunks: usize,
        size: usize,
        every: Duration,
    ) -> impl Body<Data = Bytes, Error = Infallible> + Unpin {
        use futures_util::StreamExt;
        let stream = futures_util::stream::iter(0..chunks).then(move |_| async move {
            tokio::time::sleep(every).await;
            Ok(Frame::data(Bytes::from(vec![b'x'; size])))
        });
        http_body_util::StreamBody::new(Box::pin(stream))
    }

    fn kestrel_like() -> BodyPace {
        BodyPace {
            gap: Duration::from_secs(60),
            min_rate: Some(MinRate {
                bytes_per_sec: 240,
                grace: Duration::from_secs(5),
            }),
        }
    }

    /// Reads the body to its end or its first error: the bytes read, and the error.
    async fn drain<B: Body<Data = Bytes, Error = axum::BoxError> + Unpin>(
        body: &mut B,
    ) -> (usize, Option<axum::BoxError>) {
        let mut read = 0;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => read += frame.into_data().map_or(0, |d| d.len()),
                Err(error) => return (read, Some(error)),
            }
        }
        (read, None)
    }

    // A byte a second never passes the 60 s pause, but it is cut once the grace is spent.
    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_fails_when_its_grace_is_spent_under_the_minimum_rate() {
        let connection = Arc::new(ConnectionState::new("http", CancellationToken::new()));
        let trickle = paced(1000, 1, Duration::from_secs(1));
        let mut body = ReadTimeout::new(trickle, kestrel_like(), false, connection.clone());
        let started = Instant::now();
        let (read, error) = drain(&mut body).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(read, 5);
        let error = error.expect("cut");
        let slow = error.downcast_ref::<BodyTooSlow>().expect("for its rate");
        assert_eq!((slow.received, slow.waited), (5, Duration::from_secs(5)));
        assert!(
            error.to_string().contains("server.min_body_rate"),
            "{error}"
        );
        let answer = client_too_slow(&*error).expect("the client's failure");
        assert_eq!(answer.http_status(), http::StatusCode::REQUEST_TIMEOUT);
        tokio::time::timeout(Duration::from_millis(1), connection.notified())
            .await
            .expect("the connection is told to close");
    }

    // 300 bytes every second for a minute: slow, but above the rate all the way.
    #[tokio::test(start_paused = true)]
    async fn a_slow_but_steady_body_above_the_rate_is_read_whole() {
        let connection = Arc::new(ConnectionState::new("http", CancellationToken::new()));
        let steady = paced(60, 300, Duration::from_secs(1));
        let mut body = ReadTimeout::new(steady, kestrel_like(), false, connection);
        let (read, error) = drain(&mut body).await;
        assert!(error.is_none(), "{error:?}");
        assert_eq!(read, 60 * 300);
    }

    // Bytes that are there when read cost no wait: a gateway slow to read them (a backend
    // holding it back) does not make the client slow.
    #[tokio::test(start_paused = true)]
    async fn time_the_gateway_takes_between_reads_is_not_the_clients() {
        let connection = Arc::new(ConnectionState::new("http", CancellationToken::new()));
        let ready = paced(20, 1, Duration::ZERO);
        let mut body = ReadTimeout::new(ready, kestrel_like(), false, connection);
        let mut read = 0;
        while let Some(frame) = body.frame().await {
            read += frame.unwrap().into_data().unwrap().len();
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        assert_eq!(read, 20);
    }
}
