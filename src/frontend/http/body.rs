//! Request and response bodies on the HTTP front-end: the body limit as a body streams in
//! (`limit`), an inference's body had whole before it takes a flow slot (`arrive`, no copy),
//! reading a body whole or its first bytes (`collect`, `read_head`, `stream_on`), each
//! copying at most once, and the lease a response body holds while it streams out
//! (`LeasedBody`).

use super::validate::HEADER_LENGTH;
use crate::auth::Admission;
use crate::error::GatewayError;
use crate::pipeline::tokens::TokenClock;
use crate::placement::Lease;
use axum::body::Body;
use axum::extract::Request;
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, header};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A request's declared `Content-Length`.
pub(super) fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(length)
}

/// A `Content-Length` value's number.
fn length(value: &HeaderValue) -> Option<u64> {
    value.to_str().ok()?.parse().ok()
}

/// What a request's headers say about its body, found in one walk over them as it arrives:
/// its arrival, its size limit and its validation each read some of them, and by lookups
/// (each hashing a name) read five, two of them twice (`loadtest/instructions.sh`).
#[derive(Clone, Default)]
pub(super) struct BodyHeaders {
    /// The declared `Content-Length` (`declared_length`).
    pub declared: Option<u64>,
    /// The first `Content-Encoding`.
    pub encoding: Option<HeaderValue>,
    /// The first `Inference-Header-Content-Length` (the binary tensor extension).
    pub header_length: Option<HeaderValue>,
}

impl BodyHeaders {
    pub(super) fn of(headers: &http::HeaderMap) -> Self {
        let (mut length_value, mut encoding, mut header_length) = (None, None, None);
        for (name, value) in headers {
            let first = match *name {
                header::CONTENT_LENGTH => &mut length_value,
                header::CONTENT_ENCODING => &mut encoding,
                _ if *name == HEADER_LENGTH => &mut header_length,
                _ => continue,
            };
            first.get_or_insert(value);
        }
        Self {
            declared: length_value.and_then(length),
            encoding: encoding.cloned(),
            header_length: header_length.cloned(),
        }
    }

    /// Whether the body is compressed (`validate::http::compressed`).
    pub(super) fn compressed(&self) -> bool {
        (self.encoding.as_ref()).is_some_and(|e| crate::validate::http::compressed(e.as_bytes()))
    }
}

/// Refuses a declared length over the limit at once, and cuts off a chunked body that grows
/// past it.
pub(super) fn limit(
    (declared, version): (Option<u64>, http::Version),
    body: Body,
    limit: u64,
) -> Result<Body, GatewayError> {
    if declared.is_some_and(|length| length > limit) {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    // HTTP/1 delivers exactly the declared length (hyper refuses a body that differs), so
    // only a chunked body (or HTTP/2's) needs counting as it streams.
    if declared.is_some() && version <= http::Version::HTTP_11 {
        return Ok(body);
    }
    Ok(crate::body::limited(body, limit))
}

/// A request body as this front-end holds it: whole in memory (an inference's, once it has
/// arrived in one chunk or been read), or a body to read. Whole bytes are read again
/// without a copy, and a second send takes a clone of them, where a body must be recorded
/// as it goes out (`crate::body::replayable`).
pub(super) enum Payload {
    /// The whole body.
    Whole(Bytes),
    /// A body not read yet, or one that came in several chunks, streamed on as they came.
    Streaming(Body),
}

impl Payload {
    /// The body to send.
    pub(super) fn into_body(self) -> Body {
        match self {
            Self::Whole(bytes) => Body::from(bytes),
            Self::Streaming(body) => body,
        }
    }

    /// The whole body (`collect`), as it is when it is already whole.
    pub(super) async fn collect(
        self,
        limit: u64,
        declared: Option<u64>,
    ) -> Result<Bytes, GatewayError> {
        match self {
            Self::Whole(bytes) => Ok(bytes),
            Self::Streaming(body) => collect(body, limit, declared).await,
        }
    }
}

/// An inference's body, had whole before the request takes a flow slot, so that a client
/// trickling its body holds no slot while it does (the connection's read timeouts bound
/// the wait: `server.body_read_timeout`, `server.min_body_rate`). Kept as the chunks it
/// arrived in, never copied: one chunk as it is (a small body usually comes with its head),
/// several as a stream of them, which the later reads (`read_head`, `collect`) take as they
/// would the client's own. With its size, which the flow phase's byte bound counts.
pub(super) async fn arrive(mut body: Body, limit: u64) -> Result<(Payload, usize), GatewayError> {
    let Some(first) = next_data(&mut body, limit).await? else {
        return Ok((Payload::Whole(Bytes::new()), 0));
    };
    // A body that says it has ended (its `Content-Length` read) needs no poll for its end.
    let second = if body.is_end_stream() {
        None
    } else {
        next_data(&mut body, limit).await?
    };
    let Some(second) = second else {
        let size = first.len();
        return Ok((Payload::Whole(first), size));
    };
    let mut chunks = vec![first, second];
    while let Some(data) = next_data(&mut body, limit).await? {
        chunks.push(data);
    }
    let size = chunks.iter().map(Bytes::len).sum();
    let stream =
        futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::convert::Infallible>));
    Ok((Payload::Streaming(Body::from_stream(stream)), size))
}

/// The body's next data chunk (trailers skipped), `None` at its end; a failed read is the
/// client's error (`read_error`).
async fn next_data(body: &mut Body, limit: u64) -> Result<Option<Bytes>, GatewayError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| read_error(&error, limit))?;
        if let Ok(data) = frame.into_data() {
            return Ok(Some(data));
        }
    }
    Ok(None)
}

/// Reads frames until at least `wanted` bytes have arrived: those bytes (one frame kept as
/// it is, several joined), and the body with the rest.
pub(super) async fn read_head(
    mut body: Body,
    wanted: usize,
    limit: u64,
) -> Result<(Bytes, Body), GatewayError> {
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut arrived = 0;
    while arrived < wanted {
        let Some(data) = next_data(&mut body, limit).await? else {
            break;
        };
        arrived += data.len();
        chunks.push(data);
    }
    let head = match chunks.len() {
        1 => chunks.pop().expect("one chunk"),
        _ => {
            let mut head = BytesMut::with_capacity(arrived);
            chunks
                .iter()
                .for_each(|chunk| head.extend_from_slice(chunk));
            head.freeze()
        }
    };
    Ok((head, body))
}

/// The whole body, when the head read first is not enough.
pub(super) async fn join(
    head: Bytes,
    rest: Body,
    limit: u64,
    declared: Option<u64>,
) -> Result<Bytes, GatewayError> {
    let rest = collect(rest, limit, None).await?;
    if rest.is_empty() {
        return Ok(head);
    }
    let mut whole =
        BytesMut::with_capacity(declared.map_or(head.len() + rest.len(), |n| n as usize));
    whole.extend_from_slice(&head);
    whole.extend_from_slice(&rest);
    Ok(whole.freeze())
}

/// The body to forward: the head already read, then the rest as it arrives.
pub(super) fn stream_on(head: Bytes, rest: Body) -> Body {
    use futures_util::StreamExt as _;
    let head = futures_util::stream::once(async move { Ok::<_, axum::Error>(head) });
    let rest = rest.into_data_stream();
    Body::from_stream(head.chain(rest))
}

/// The whole body, read within the body limit (a body that is already limited answers with
/// `BodyTooLarge` once it passes it). A body that arrives in one chunk is kept as it is; one
/// in several is copied once into a buffer sized by `Content-Length`, so a request never
/// holds much more than its own size.
pub(super) async fn collect(
    mut body: Body,
    limit: u64,
    declared: Option<u64>,
) -> Result<Bytes, GatewayError> {
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    while let Some(data) = next_data(&mut body, limit).await? {
        match (&mut joined, first.take()) {
            (Some(buffer), _) => buffer.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(head)) => {
                let capacity = declared.unwrap_or(0).min(limit) as usize;
                let mut buffer = BytesMut::with_capacity(capacity.max(head.len() + data.len()));
                buffer.extend_from_slice(&head);
                buffer.extend_from_slice(&data);
                joined = Some(buffer);
            }
        }
    }
    Ok(match joined {
        Some(buffer) => buffer.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// A small control body (repository requests), read whole within the body limit.
pub(super) async fn read_small(request: Request, max: u64) -> Result<Bytes, GatewayError> {
    Ok(read_whole(request, max).await?.1)
}

/// A request's head, and its body read whole within the body limit: for a request the
/// gateway answers by writing another (an OpenAI call becomes a generate request with the
/// client's headers, moved, not copied).
pub(super) async fn read_whole(
    request: Request,
    max: u64,
) -> Result<(http::request::Parts, Bytes), GatewayError> {
    let (parts, whole) = request.into_parts();
    let declared = declared_length(&parts.headers);
    let whole = limit((declared, parts.version), whole, max)?;
    Ok((parts, collect(whole, max, declared).await?))
}

fn read_error(error: &axum::Error, limit: u64) -> GatewayError {
    if crate::body::too_large(error).is_some() {
        return GatewayError::BodyTooLarge { limit };
    }
    crate::body::client_too_slow(error).unwrap_or_else(|| {
        GatewayError::BadRequest(format!("could not read request body: {error}"))
    })
}

/// A response body that holds its lease until the last byte is sent (or the client goes),
/// so a model is never evicted while its answer is still streaming; and the caller's
/// admission, so the tenant's concurrency slot is busy for just as long.
pub(super) struct LeasedBody {
    inner: Body,
    _lease: Lease,
    _admission: Admission,
}

impl LeasedBody {
    /// `response` with its body holding the request's lease and admission, taken off `ctx`,
    /// when it has a lease (the answer came from a copy).
    pub(super) fn hold(
        response: axum::response::Response,
        ctx: &mut crate::pipeline::RequestCtx,
    ) -> axum::response::Response {
        let Some(lease) = ctx.lease.take() else {
            return response;
        };
        let admission = std::mem::take(&mut ctx.admission);
        response.map(|inner| {
            Body::new(Self {
                inner,
                _lease: lease,
                _admission: admission,
            })
        })
    }
}

impl HttpBody for LeasedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A token stream's body (Triton's `generate_stream` server-sent events), timed by its
/// clock as each event's end (`\n\n`) passes: the client's own stream, or the one the
/// OpenAI endpoints read.
pub(super) struct TimedBody {
    inner: Body,
    clock: TokenClock,
    /// Whether the last byte seen was a `\n`, for an event end split between frames.
    newline: bool,
}

impl TimedBody {
    /// `response` with its body timed by `clock`.
    pub(super) fn wrap(
        response: axum::response::Response,
        clock: TokenClock,
    ) -> axum::response::Response {
        response.map(|inner| {
            Body::new(Self {
                inner,
                clock,
                newline: false,
            })
        })
    }
}

/// The server-sent events whose end (`\n\n`) is in `data`; `newline` says whether the bytes
/// before it ended in a `\n`, and is kept for the next.
fn event_ends(newline: &mut bool, data: &[u8]) -> u64 {
    let split = *newline && data.first() == Some(&b'\n');
    let whole = memchr::memmem::find_iter(data, b"\n\n").count();
    if let Some(&last) = data.last() {
        *newline = last == b'\n';
    }
    (whole + usize::from(split)) as u64
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            let events = event_ends(&mut self.newline, data);
            self.clock.events(events);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk finds what lookups found: the declared length, the first encoding and the
    /// first JSON header length, among other headers and repeated values; a length that is
    /// no number is none, as `declared_length` reads it.
    #[test]
    fn one_walk_finds_what_the_body_headers_say() {
        let mut headers = http::HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("gw"));
        headers.insert("x-request-id", HeaderValue::from_static("r"));
        let sent = BodyHeaders::of(&headers);
        assert_eq!(
            (sent.declared, &sent.encoding, &sent.header_length),
            (None, &None, &None)
        );
        assert!(!sent.compressed());

        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(120));
        headers.append(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        headers.append(
            header::CONTENT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        headers.append(&HEADER_LENGTH, HeaderValue::from(7));
        headers.append(&HEADER_LENGTH, HeaderValue::from(9));
        let sent = BodyHeaders::of(&headers);
        assert_eq!(sent.declared, declared_length(&headers));
        assert_eq!(sent.declared, Some(120));
        assert_eq!(
            sent.encoding.as_ref(),
            headers.get(header::CONTENT_ENCODING)
        );
        assert!(sent.compressed());
        assert_eq!(sent.header_length.as_ref(), headers.get(&HEADER_LENGTH));
        assert_eq!(sent.header_length.unwrap(), "7");

        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("12x"));
        headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        let sent = BodyHeaders::of(&headers);
        assert_eq!((sent.declared, declared_length(&headers)), (None, None));
        assert!(!sent.compressed());
    }

    #[test]
    fn counts_event_ends_across_frames() {
        let mut newline = false;
        let frames: [&[u8]; 4] = [b"data: {}\n\ndata: {", b"}\n", b"\ndata: {}\n\n", b""];
        let counted: Vec<u64> = frames
            .iter()
            .map(|frame| event_ends(&mut newline, frame))
            .collect();
        assert_eq!(counted, [1, 0, 2, 0]);
    }

    fn chunked(chunks: &[&'static str]) -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        Body::from_stream(futures_util::stream::iter(chunks))
    }

    #[tokio::test]
    async fn reads_a_head_and_streams_the_rest_unchanged() {
        let (head, rest) = read_head(chunked(&["ab", "cd", "ef", "gh"]), 3, 100)
            .await
            .unwrap();
        assert_eq!(head, "abcd", "whole frames until the wanted bytes are in");
        let forwarded = stream_on(head, rest).collect().await.unwrap().to_bytes();
        assert_eq!(forwarded, "abcdefgh");
        let (head, rest) = read_head(chunked(&["abcdef", "gh"]), 3, 100).await.unwrap();
        assert_eq!(head, "abcdef");
        assert_eq!(join(head, rest, 100, Some(8)).await.unwrap(), "abcdefgh");
        let (head, _) = read_head(chunked(&["ab"]), 3, 100).await.unwrap();
        assert_eq!(head, "ab", "a body shorter than wanted is all there is");
    }

    #[tokio::test]
    async fn a_body_arrives_whole_in_the_chunks_it_came_in() {
        let one = Bytes::from_static(b"one chunk");
        let (body, size) = arrive(Body::from(one.clone()), 100).await.unwrap();
        assert_eq!(size, 9);
        assert!(matches!(&body, Payload::Whole(_)), "one chunk is had whole");
        let kept = body.collect(100, None).await.unwrap();
        assert_eq!(kept.as_ptr(), one.as_ptr(), "a single chunk is not copied");
        let (body, size) = arrive(chunked(&["ab", "cd", "e"]), 100).await.unwrap();
        assert_eq!(size, 5);
        let Payload::Streaming(body) = body else {
            panic!("several chunks stream on as they came");
        };
        let (head, rest) = read_head(body, 2, 100).await.unwrap();
        assert_eq!(head, "ab", "read again chunk by chunk");
        assert_eq!(join(head, rest, 100, None).await.unwrap(), "abcde");
        assert_eq!(arrive(chunked(&[]), 100).await.unwrap().1, 0);
        let limited = crate::body::limited(chunked(&["abc", "def"]), 4);
        assert!(matches!(
            arrive(limited, 4).await,
            Err(GatewayError::BodyTooLarge { limit: 4 })
        ));
    }

    #[tokio::test]
    async fn collects_a_body_once_within_the_limit() {
        let body = collect(chunked(&["ab", "cd", "e"]), 100, Some(5))
            .await
            .unwrap();
        assert_eq!(body, "abcde");
        let whole = Bytes::from_static(b"one chunk");
        let kept = collect(Body::from(whole.clone()), 100, None).await.unwrap();
        assert_eq!(
            kept.as_ptr(),
            whole.as_ptr(),
            "a single chunk is not copied"
        );
        assert!(collect(chunked(&[]), 100, None).await.unwrap().is_empty());
        let limited = crate::body::limited(chunked(&["abc", "def"]), 4);
        assert!(matches!(
            collect(limited, 4, None).await,
            Err(GatewayError::BodyTooLarge { limit: 4 })
        ));
    }
}
