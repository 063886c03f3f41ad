//! A request body that says it has ended as soon as its last frame is read.
//!
//! tonic's request body (one encoded message for a unary call) only learns that it has ended
//! when asked for a frame after its last, and so says it has not ended when hyper reads the
//! message. hyper then sent the message in a DATA frame that left the stream open, and an
//! empty DATA frame that ended it: a frame more on every call, for the gateway to write and
//! Triton to read (1.1% of the gateway's instructions a call:
//! `loadtest/results/2026-12-07-ends-grpc-instructions.md`). Looking one frame ahead, without
//! waiting, lets hyper end the stream with the message. A body whose next frame is not ready
//! yet (a client's stream of messages) is passed on as it comes.

use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// `B`, read one frame ahead (`ends`).
pub struct EndsWithLast<B: Body> {
    body: B,
    /// The frame read after the one given last, given next.
    ahead: Option<Result<Frame<B::Data>, B::Error>>,
    /// `body` has no more frames.
    ended: bool,
}

impl<B: Body> EndsWithLast<B> {
    /// `body`, to be read one frame ahead.
    pub fn new(body: B) -> Self {
        Self {
            body,
            ahead: None,
            ended: false,
        }
    }
}

// Only `body` is ever pinned (and it is `Unpin`); the frame read ahead is moved freely.
impl<B: Body + Unpin> Unpin for EndsWithLast<B> {}

impl<B: Body + Unpin> Body for EndsWithLast<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = match this.ahead.take() {
            Some(frame) => frame,
            None if this.ended => return Poll::Ready(None),
            None => match std::task::ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(frame) => frame,
                None => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
            },
        };
        if frame.is_ok() {
            // Whether that was the last frame, if the body can tell now.
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(next)) => this.ahead = Some(next),
                Poll::Pending => {}
            }
        }
        Poll::Ready(Some(frame))
    }

    fn is_end_stream(&self) -> bool {
        self.ahead.is_none() && (self.ended || self.body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match &self.ahead {
            None if self.ended => SizeHint::with_exact(0),
            None => self.body.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
}

/// A unary ModelInfer's body as the backend client builds it (`grpc::InferenceClient::infer`:
/// tonic's encoding of one shared message), for the tests here and `multiplex`'s.
#[cfg(test)]
pub(super) fn unary_body(
    message: crate::protocol::inference::ModelInferRequest,
) -> tonic::body::Body {
    use tonic::codec::Codec;
    let mut codec = crate::protocol::encoded::BackendCodec::default();
    let source = tokio_stream::once(Ok(std::sync::Arc::new(message)));
    tonic::body::Body::new(tonic::codec::EncodeBody::new_client(
        codec.encoder(),
        source,
        None,
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, StreamBody};

    type Framed = Result<Frame<Bytes>, std::io::Error>;

    /// A body of `frames` that, as tonic's, never says it has ended before it is asked for more.
    fn stream(frames: Vec<Framed>) -> impl Body<Data = Bytes, Error = std::io::Error> + Unpin {
        StreamBody::new(futures_util::stream::iter(frames))
    }

    fn data(text: &'static str) -> Framed {
        Ok(Frame::data(Bytes::from_static(text.as_bytes())))
    }

    /// Each frame comes in its order, and the body says it has ended as the last one is read,
    /// where tonic's says so only when asked for one more.
    #[tokio::test]
    async fn the_last_frame_says_the_body_has_ended() {
        let message = crate::protocol::inference::ModelInferRequest {
            model_name: "add_sub".into(),
            ..Default::default()
        };
        let mut tonics = unary_body(message.clone());
        tonics.frame().await.unwrap().unwrap();
        assert!(
            !tonics.is_end_stream(),
            "tonic's body, read as hyper reads it"
        );

        let mut one = EndsWithLast::new(unary_body(message));
        assert!(!one.is_end_stream());
        assert!(one.frame().await.unwrap().unwrap().is_data());
        assert!(one.is_end_stream());
        assert!(one.frame().await.is_none());

        let mut two = EndsWithLast::new(stream(vec![data("a"), data("b")]));
        assert_eq!(
            two.frame().await.unwrap().unwrap().into_data().unwrap(),
            "a"
        );
        assert!(!two.is_end_stream());
        assert_eq!(
            two.frame().await.unwrap().unwrap().into_data().unwrap(),
            "b"
        );
        assert!(two.is_end_stream());
        assert!(two.frame().await.is_none());
    }

    /// Trailers and an error read ahead are given in their turn, not lost.
    #[tokio::test]
    async fn what_is_read_ahead_is_given_next() {
        let trailers = Ok(Frame::trailers(http::HeaderMap::new()));
        let mut body = EndsWithLast::new(stream(vec![data("m"), trailers]));
        assert!(body.frame().await.unwrap().unwrap().is_data());
        assert!(!body.is_end_stream());
        assert!(body.frame().await.unwrap().unwrap().is_trailers());
        assert!(body.is_end_stream());

        let failed = Err(std::io::Error::other("reset"));
        let mut body = EndsWithLast::new(stream(vec![data("m"), failed]));
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.frame().await.unwrap().is_err());
    }

    /// A body whose next frame is not ready (a client still streaming) is not waited for.
    #[tokio::test]
    async fn a_frame_not_ready_is_not_waited_for() {
        let (sender, receiver) = tokio::sync::mpsc::channel::<Framed>(2);
        let mut body = EndsWithLast::new(StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        ));
        sender.send(data("first")).await.unwrap();
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame())
            .await
            .expect("given without waiting for the next");
        assert_eq!(first.unwrap().unwrap().into_data().unwrap(), "first");
        assert!(!body.is_end_stream());
        sender.send(data("second")).await.unwrap();
        drop(sender);
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "second"
        );
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }
}
