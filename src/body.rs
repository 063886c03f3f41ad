//! Request bodies with a size limit that is enforced while they stream, and bodies that can
//! be sent twice.
//!
//! A `Content-Length` over the limit is refused before anything is read; a chunked body is
//! cut off the moment it passes the limit, and the error carries the limit so the client is
//! told exactly what it was.

use crate::error::GatewayError;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// The error a limited body yields once it has passed its limit.
#[derive(Debug, thiserror::Error)]
#[error("request body is larger than the limit of {limit} bytes")]
pub struct BodyTooLarge {
    /// The configured limit in bytes.
    pub limit: u64,
}

/// The limit a body passed, when `BodyTooLarge` is anywhere in an error's chain (a read of a
/// limited body, or a backend send that streamed one): the one place that digs it out.
pub fn too_large(error: &(dyn std::error::Error + 'static)) -> Option<u64> {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(too_large) = e.downcast_ref::<BodyTooLarge>() {
            return Some(too_large.limit);
        }
        source = e.source();
    }
    None
}

/// Wraps a body so that reading past `limit` bytes fails with `BodyTooLarge`.
pub fn limited(body: Body, limit: u64) -> Body {
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    Body::new(Limited::new(body, limit_usize).map_err(move |error| {
        if error.is::<LengthLimitError>() {
            Box::new(BodyTooLarge { limit }) as axum::BoxError
        } else {
            error
        }
    }))
}

/// Streamed bodies up to this size are kept as they go, to be sent again (`replayable`).
pub const REPLAY_LIMIT: usize = 1 << 20;

/// Wraps a request body so that it can be sent once more after the backend refused it
/// without reading it as a request (`pipeline::replay`). The chunks are kept as they pass,
/// shared, never copied, up to `REPLAY_LIMIT`, so a large streamed tensor is never held for
/// a second try. (A body the caller has whole needs none of this: `Replay::whole`.)
pub fn replayable(body: Body) -> (Body, Replay) {
    let kept = Arc::new(Mutex::new(Kept {
        sent: http_body::Body::is_end_stream(&body),
        ..Kept::default()
    }));
    let recording = Recording {
        inner: body,
        kept: kept.clone(),
    };
    (Body::new(recording), Replay(Again::Recorded(kept)))
}

/// The other end of `replayable`: the body again, once it has been sent whole.
#[derive(Debug)]
pub struct Replay(Again);

#[derive(Debug)]
enum Again {
    /// A body whose bytes the caller had whole (`Replay::whole`).
    Whole(Bytes),
    /// A body recorded as it was sent (`replayable`).
    Recorded(Arc<Mutex<Kept>>),
}

impl Replay {
    /// A body the caller has whole in memory: sent again as a clone of its bytes, with
    /// nothing to record as it goes out.
    pub fn whole(bytes: Bytes) -> Self {
        Self(Again::Whole(bytes))
    }

    /// Whether the body can be had again: one had whole always; a recorded one when it was
    /// sent to its end and kept.
    pub fn ready(&self) -> bool {
        match &self.0 {
            Again::Whole(_) => true,
            Again::Recorded(kept) => {
                let kept = kept.lock().expect("replay lock");
                kept.sent && !kept.dropped
            }
        }
    }

    /// Another replay of a body had whole (its bytes shared, not copied), so that it may go
    /// once more after this replay; `None` for a recorded body, which goes again only once.
    pub fn whole_again(&self) -> Option<Self> {
        match &self.0 {
            Again::Whole(bytes) => Some(Self::whole(bytes.clone())),
            Again::Recorded(_) => None,
        }
    }

    /// The same bytes as a new body, when `ready`.
    pub fn take(self) -> Option<Body> {
        let kept = match self.0 {
            Again::Whole(bytes) => return Some(Body::from(bytes)),
            Again::Recorded(kept) => kept,
        };
        let mut kept = kept.lock().expect("replay lock");
        if !kept.sent || kept.dropped {
            return None;
        }
        let chunks = std::mem::take(&mut kept.chunks);
        kept.dropped = true;
        Some(match <[Bytes; 1]>::try_from(chunks) {
            Ok([one]) => Body::from(one),
            Err(chunks) => Body::from_stream(futures_util::stream::iter(
                chunks.into_iter().map(Ok::<_, std::convert::Infallible>),
            )),
        })
    }
}

#[derive(Debug, Default)]
struct Kept {
    chunks: Vec<Bytes>,
    bytes: usize,
    /// The whole body went out.
    sent: bool,
    /// Too large to keep, or taken.
    dropped: bool,
}

struct Recording {
    inner: Body,
    kept: Arc<Mutex<Kept>>,
}

impl http_body::Body for Recording {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let end = http_body::Body::is_end_stream(&self.inner);
        let mut kept = self.kept.lock().expect("replay lock");
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if !kept.dropped && kept.bytes + data.len() <= REPLAY_LIMIT {
                        kept.bytes += data.len();
                        kept.chunks.push(data.clone());
                    } else {
                        kept.dropped = true;
                        kept.chunks = Vec::new();
                    }
                }
                kept.sent |= end;
            }
            Poll::Ready(None) => kept.sent = true,
            Poll::Ready(Some(Err(_))) | Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> SizeHint {
        http_body::Body::size_hint(&self.inner)
    }
}

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

/// The error a body yields when it came slower than `server.min_body_rate` on average, once
/// past its grace: a client trickling a body to hold the connection (slow POST).
#[derive(Debug, thiserror::Error)]
#[error(
    "the request body came too slowly: {received} bytes in {}ms of waiting, under the minimum of {bytes_per_sec} bytes/s (server.min_body_rate)",
    waited.as_millis()
)]
pub struct BodyTooSlow {
    /// The configured minimum rate.
    pub bytes_per_sec: u64,
    /// Bytes that had arrived.
    pub received: u64,
    /// Time spent waiting for them.
    pub waited: Duration,
}

/// The client's failure when a body came too slowly (either limit) anywhere in an error's
/// chain, as the request is answered: the one place that turns these errors into a
/// `GatewayError`, for a body read by the gateway and one streamed to a backend alike.
pub fn client_too_slow(error: &(dyn std::error::Error + 'static)) -> Option<GatewayError> {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(stalled) = e.downcast_ref::<BodyReadTimeout>() {
            return Some(GatewayError::BadRequest(format!(
                "could not read request body: {stalled}"
            )));
        }
        if let Some(slow) = e.downcast_ref::<BodyTooSlow>() {
            return Some(GatewayError::BodyTooSlow {
                reason: slow.to_string(),
            });
        }
        source = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_had_whole_goes_again_as_the_same_bytes() {
        let whole = Bytes::from(vec![7u8; 3 * REPLAY_LIMIT]);
        let replay = Replay::whole(whole.clone());
        assert!(replay.ready(), "whole from the start, at any size");
        let more = replay
            .whole_again()
            .expect("a body had whole goes any number of times");
        let again = replay.take().unwrap().collect().await.unwrap().to_bytes();
        assert_eq!(again.as_ptr(), whole.as_ptr(), "the same bytes, shared");
        let third = more.take().unwrap().collect().await.unwrap().to_bytes();
        assert_eq!(third.as_ptr(), whole.as_ptr());
    }

    #[tokio::test]
    async fn a_streamed_body_goes_again_once_sent_to_its_end_within_the_limit() {
        let stream = |chunks: Vec<&'static [u8]>| {
            Body::from_stream(futures_util::stream::iter(
                chunks
                    .into_iter()
                    .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c))),
            ))
        };
        let (body, replay) = replayable(stream(vec![b"ab", b"cd"]));
        assert!(!replay.ready(), "not sent yet");
        assert!(
            replay.whole_again().is_none(),
            "a recorded body goes again once"
        );
        body.collect().await.unwrap();
        assert!(replay.ready());
        let again = replay.take().unwrap().collect().await.unwrap().to_bytes();
        assert_eq!(again, "abcd");

        // A streamed body over the limit is not kept.
        let big: &'static [u8] = Box::leak(vec![1u8; REPLAY_LIMIT].into_boxed_slice());
        let (body, replay) = replayable(stream(vec![b"x", big]));
        body.collect().await.unwrap();
        assert!(!replay.ready());
        assert!(replay.take().is_none());

        let (_, replay) = replayable(Body::empty());
        assert!(replay.ready(), "an empty body is whole from the start");
    }

    #[tokio::test]
    async fn cuts_off_past_the_limit() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"0123")),
            Ok(Bytes::from_static(b"4567")),
        ];
        let body = Body::from_stream(futures_util::stream::iter(chunks));
        let error = limited(body, 6).collect().await.unwrap_err();
        assert_eq!(too_large(&error), Some(6));
        assert_eq!(too_large(&std::io::Error::other("unrelated")), None);

        let fits = limited(Body::from("0123"), 6).collect().await.unwrap();
        assert_eq!(fits.to_bytes(), "0123");
    }
}
