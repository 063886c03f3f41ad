//! An inference's answer passed on as the backend encoded it.
//!
//! The gateway reads nothing in a unary `ModelInferResponse`: it answers the client with the
//! backend's message unchanged. Decoding that message into its fields and encoding it again
//! cost about 12,000 instructions a call (its outputs' names, shapes and parameters, each
//! allocated and freed) for the same bytes. Both ends of a unary ModelInfer use the codecs
//! here instead: the backend's answer is kept as its bytes (`Encoded`, a slice of the
//! receive buffer, not a copy), and those bytes are what the client is sent. The request is
//! still decoded, because the gateway reads it (its model, sequence, inputs).

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use std::marker::PhantomData;
use std::sync::Arc;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic_prost::ProstDecoder;

/// The method's path, which the gateway's own route for it and its call to a backend share.
pub const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";

/// A protobuf message as its encoded bytes: passed on, never read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded(pub Bytes);

/// The codec of a call to a backend: the request (`T`, shared with the caller, who keeps it
/// for a second send) encoded from its fields, the answer kept encoded.
pub struct BackendCodec<T>(PhantomData<fn(T)>);

/// The codec of the gateway's own route: the client's request (`U`) decoded into its fields,
/// an encoded answer written as it is.
pub struct ClientCodec<U>(PhantomData<fn() -> U>);

impl<T> Default for BackendCodec<T> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<U> Default for ClientCodec<U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T: Message + Send + Sync + 'static> Codec for BackendCodec<T> {
    type Encode = Arc<T>;
    type Decode = Encoded;
    type Encoder = EncodeShared<T>;
    type Decoder = KeepEncoded;

    fn encoder(&mut self) -> Self::Encoder {
        EncodeShared(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        KeepEncoded
    }
}

impl<U: Message + Default + Send + 'static> Codec for ClientCodec<U> {
    type Encode = Encoded;
    type Decode = U;
    type Encoder = WriteEncoded;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        WriteEncoded
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

/// Encodes a shared message from its fields.
pub struct EncodeShared<T>(PhantomData<fn(T)>);

impl<T: Message> Encoder for EncodeShared<T> {
    type Item = Arc<T>;
    type Error = Status;

    fn encode(&mut self, item: Arc<T>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // The buffer grows as written to: encoding a message cannot run out of room.
        item.encode(dst).expect("an encode buffer grows");
        Ok(())
    }
}

/// Takes a received message's bytes as they are.
pub struct KeepEncoded;

impl Decoder for KeepEncoded {
    type Item = Encoded;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Encoded>, Status> {
        // A slice of the receive buffer: no copy.
        Ok(Some(Encoded(src.copy_to_bytes(src.remaining()))))
    }
}

/// Writes a message's bytes as they are.
pub struct WriteEncoded;

impl Encoder for WriteEncoded {
    type Item = Encoded;
    type Error = Status;

    fn encode(&mut self, item: Encoded, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item.0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::inference::ModelInferResponse;
    use crate::protocol::inference::model_infer_response::InferOutputTensor;
    use http_body_util::BodyExt;
    use tonic::codec::{EncodeBody, Streaming};
    use tonic_prost::ProstEncoder;

    fn answer() -> ModelInferResponse {
        ModelInferResponse {
            model_name: "simple".into(),
            id: "42".into(),
            outputs: vec![InferOutputTensor {
                name: "OUTPUT0".into(),
                datatype: "INT32".into(),
                shape: vec![1, 16],
                ..Default::default()
            }],
            raw_output_contents: vec![Bytes::from(vec![7u8; 64])],
            ..Default::default()
        }
    }

    /// One message as tonic frames it on the wire.
    async fn framed<E>(encoder: E, item: E::Item) -> Bytes
    where
        E: Encoder<Error = Status> + Send + 'static,
        E::Item: Send + 'static,
    {
        let source = tokio_stream::once(Ok(item));
        let body = EncodeBody::new_client(encoder, source, None, None);
        body.collect().await.unwrap().to_bytes()
    }

    /// The one message of a frame, as tonic hands it to `decoder`.
    async fn read<D>(decoder: D, frame: Bytes) -> D::Item
    where
        D: Decoder<Error = Status> + Send + 'static,
        D::Item: Send + 'static,
    {
        let body = http_body_util::Full::new(frame);
        let mut stream = Streaming::new_request(decoder, body, None, None);
        stream.message().await.unwrap().unwrap()
    }

    /// The client is sent, byte for byte, the frame the backend sent: the bytes one codec
    /// keeps are the bytes the other writes, and they read as the backend's answer.
    #[tokio::test]
    async fn an_answer_passes_through_unchanged() {
        let from_backend = framed(ProstEncoder::default(), answer()).await;
        let kept = read(
            BackendCodec::<ModelInferResponse>::default().decoder(),
            from_backend.clone(),
        )
        .await;
        let to_client = framed(ClientCodec::<ModelInferResponse>::default().encoder(), kept).await;
        assert_eq!(to_client, from_backend);
        let read_by_client = read(ProstDecoder::<ModelInferResponse>::default(), to_client).await;
        assert_eq!(read_by_client, answer());
    }
}
