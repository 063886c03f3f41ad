//! The gRPC front-end's side of the pipeline (`pipeline::Wire`): one unary call about a model,
//! its message and metadata as the phases need them. Every per-model RPC is a `Unary` over
//! its message type (`ModelMessage`) and the backend method that answers it.

use super::{upstream_request, version};
use crate::error::GatewayError;
use crate::model::ModelRef;
use crate::pipeline::mirror;
use crate::pipeline::{Inspect, Local, RequestCtx, Sent, Wire, forward, sequence};
use crate::placement::SequenceRef;
use crate::protocol::encoded::Encoded;
use crate::protocol::inference::*;
use crate::routing::{Routed, Shadow};
use crate::upstream::Backend;
use crate::upstream::grpc::{self as upstream_grpc, InferenceClient};
use crate::validate::{self, Signature, Verdict};
use std::future::Future;
use std::sync::Arc;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

/// A request message that names a model, and what the phases need of it beyond the name.
pub(crate) trait ModelMessage: Clone + Send + Sync + 'static {
    /// The model (and version) the client named; a version Triton cannot read is refused.
    fn model(&self) -> Result<ModelRef, GatewayError>;
    /// Names `target` instead.
    fn retarget(&mut self, target: &ModelRef);
    /// The sequence the request belongs to (only an inference has one).
    fn sequence(&self) -> Option<SequenceRef> {
        None
    }
    /// The validate phase's reader (only an inference is checked: `validate::grpc`).
    fn read(&self, _signature: &Signature) -> Verdict {
        Verdict::Passed
    }
    /// Sends copies to the route's mirrors (only an inference is mirrored).
    fn mirror(&self, _ctx: &RequestCtx, _shadow: Shadow) {}
    /// Its size on the wire, which it holds in memory while it waits for a slot.
    fn size(&self) -> usize;
}

macro_rules! names_model {
    ($message:ty: $name:ident, $version:ident) => {
        fn model(&self) -> Result<ModelRef, GatewayError> {
            Ok(ModelRef::requested(
                self.$name.clone(),
                version(&self.$version),
            )?)
        }
        fn retarget(&mut self, target: &ModelRef) {
            self.$name.clone_from(&target.name);
            self.$version = target.version.clone().unwrap_or_default();
        }
        fn size(&self) -> usize {
            prost::Message::encoded_len(self)
        }
    };
}

impl ModelMessage for ModelReadyRequest {
    names_model!(ModelReadyRequest: name, version);
}

impl ModelMessage for ModelMetadataRequest {
    names_model!(ModelMetadataRequest: name, version);
}

impl ModelMessage for ModelConfigRequest {
    names_model!(ModelConfigRequest: name, version);
}

impl ModelMessage for ModelStatisticsRequest {
    names_model!(ModelStatisticsRequest: name, version);
}

impl ModelMessage for ModelInferRequest {
    names_model!(ModelInferRequest: model_name, model_version);

    fn sequence(&self) -> Option<SequenceRef> {
        sequence::from_parameters(&self.parameters)
    }

    fn read(&self, signature: &Signature) -> Verdict {
        validate::grpc::read(self, signature)
    }

    fn mirror(&self, ctx: &RequestCtx, shadow: Shadow) {
        let message = self.clone();
        let timeout = ctx.gateway.fixed_config().upstream.request_timeout.0;
        mirror::spawn(&ctx.gateway, shadow, move |backend, target| {
            let mut message = message.clone();
            message.retarget(&target);
            async move {
                upstream_grpc::unary(&backend, timeout, |client| {
                    client.infer(tonic::Request::new(Arc::new(message)))
                })
                .await
                .map(drop)
                .map_err(|e| e.to_string())
            }
        })
    }
}

/// A request to send as the generated client takes it: its message owned, so cloned, as the
/// call keeps it for a second send (these messages are a model's name and version).
pub(super) fn owned<M: Clone>(request: Request<Arc<M>>) -> Request<M> {
    request.map(Arc::unwrap_or_clone)
}

/// A per-model RPC's answer, for the answers the gateway gives itself.
pub(crate) trait ModelAnswer: Sized {
    /// The answer about a servable model loaded nowhere (`pipeline::Local`).
    fn local(answer: Local) -> Result<Self, GatewayError>;

    /// The answer when no copy can be placed: the failure, unless the RPC words it itself.
    fn unplaced(error: GatewayError) -> Result<Self, GatewayError> {
        Err(error)
    }
}

impl ModelAnswer for ModelReadyResponse {
    fn local(answer: Local) -> Result<Self, GatewayError> {
        Ok(Self {
            ready: answer == Local::Ready,
        })
    }

    /// Triton answers an unknown or unloadable model with `ready: false`, not an error.
    fn unplaced(error: GatewayError) -> Result<Self, GatewayError> {
        tracing::debug!(%error, "model is not ready");
        Ok(Self { ready: false })
    }
}

impl ModelAnswer for ModelMetadataResponse {
    fn local(answer: Local) -> Result<Self, GatewayError> {
        described(answer, "inference.ModelMetadataResponse", |json| json)
    }
}

impl ModelAnswer for ModelConfigResponse {
    fn local(answer: Local) -> Result<Self, GatewayError> {
        described(
            answer,
            "inference.ModelConfigResponse",
            |json| serde_json::json!({ "config": json }),
        )
    }
}

impl ModelAnswer for Encoded {
    fn local(_: Local) -> Result<Self, GatewayError> {
        Err(GatewayError::Backend(Status::internal(
            "an inference is always placed",
        )))
    }
}

/// A description (Triton's JSON, as HTTP answers it) as the gRPC message, `shape`d first.
fn described<T: prost::Message + Default>(
    answer: Local,
    name: &str,
    shape: impl FnOnce(serde_json::Value) -> serde_json::Value,
) -> Result<T, GatewayError> {
    let Local::Described(json) = answer else {
        return Err(GatewayError::Backend(Status::internal(
            "no description to answer with",
        )));
    };
    serde_json::from_slice(&json)
        .map_err(|e| e.to_string())
        .and_then(|value| json_message(name, &shape(value)))
        .map_err(|reason| {
            GatewayError::Backend(Status::internal(format!(
                "the model's description cannot be written as protobuf: {reason}"
            )))
        })
}

/// One unary call about a model: its metadata and message, and `send`, the backend method.
pub(super) struct Unary<M, Res, F> {
    metadata: MetadataMap,
    /// Shared with each request sent (`send`), not cloned for it: kept for a second send.
    message: Arc<M>,
    send: F,
    answer: std::marker::PhantomData<fn() -> Res>,
}

impl<M, Res, F, Fut> Unary<M, Res, F>
where
    M: ModelMessage,
    F: Fn(InferenceClient, Request<Arc<M>>) -> Fut,
    Fut: Future<Output = Result<Response<Res>, Status>>,
{
    pub(super) fn new(metadata: MetadataMap, message: M, send: F) -> Self {
        Self {
            metadata,
            message: Arc::new(message),
            send,
            answer: std::marker::PhantomData,
        }
    }
}

/// A call's message (and each message of a stream) as the pipeline's `inspect` reads it.
impl<M: ModelMessage> Inspect for M {
    async fn read(
        &mut self,
        _ctx: &RequestCtx,
        _model: &ModelRef,
        signature: &Signature,
    ) -> Result<Verdict, GatewayError> {
        Ok(ModelMessage::read(self, signature))
    }

    async fn mirror(&mut self, ctx: &RequestCtx, shadow: Shadow) -> Result<(), GatewayError> {
        ModelMessage::mirror(self, ctx, shadow);
        Ok(())
    }
}

impl<M: ModelMessage, Res, F> Inspect for Unary<M, Res, F> {
    async fn read(
        &mut self,
        _ctx: &RequestCtx,
        _model: &ModelRef,
        signature: &Signature,
    ) -> Result<Verdict, GatewayError> {
        Ok(ModelMessage::read(&*self.message, signature))
    }

    async fn mirror(&mut self, ctx: &RequestCtx, shadow: Shadow) -> Result<(), GatewayError> {
        ModelMessage::mirror(&*self.message, ctx, shadow);
        Ok(())
    }
}

impl<M, Res, F, Fut> Wire for Unary<M, Res, F>
where
    M: ModelMessage,
    Res: ModelAnswer,
    F: Fn(InferenceClient, Request<Arc<M>>) -> Fut,
    Fut: Future<Output = Result<Response<Res>, Status>>,
{
    type Answer = Response<Res>;

    fn header(&self, name: &http::HeaderName) -> Option<&[u8]> {
        self.metadata.as_ref().get(name).map(|v| v.as_bytes())
    }

    fn retarget(&mut self, routed: &Routed) {
        Arc::make_mut(&mut self.message).retarget(&routed.target);
    }

    fn body_len(&self) -> usize {
        self.message.size()
    }

    /// A message arrives whole: only its sequence is read.
    async fn arrive(&mut self, _ctx: &RequestCtx) -> Result<Option<SequenceRef>, GatewayError> {
        Ok(self.message.sequence())
    }

    /// Sends the client's metadata (less what belongs to one hop), the request id, and the
    /// time left before the client's deadline (capped by `upstream.request_timeout`), which
    /// bounds the call here and, with a grace, the backend's `grpc-timeout`. The message is
    /// shared with the request, not cloned, and kept for a second send.
    async fn send(
        &mut self,
        ctx: &RequestCtx,
        backend: &Arc<Backend>,
    ) -> Result<Response<Res>, GatewayError> {
        let timeout = ctx.budget(ctx.gateway.fixed_config().upstream.request_timeout.0);
        let request = upstream_request(
            ctx,
            &self.metadata,
            Arc::clone(&self.message),
            Some(timeout),
        );
        upstream_grpc::unary(backend, timeout, |client| (self.send)(client, request))
            .await
            .map_err(|error| ctx.deadline_passed(error))
    }

    async fn gone(&mut self, answer: Result<Response<Res>, GatewayError>) -> Sent<Response<Res>> {
        match answer {
            Err(GatewayError::Backend(status))
                if matches!(
                    status.code(),
                    tonic::Code::NotFound | tonic::Code::Unavailable
                ) && forward::copy_is_gone(status.message()) =>
            {
                Sent::Again
            }
            Err(GatewayError::Backend(status))
                if status.code() == tonic::Code::Internal
                    && forward::stub_stalled(status.message()) =>
            {
                Sent::Stalled(status.message().to_owned())
            }
            answer => Sent::Answer(answer),
        }
    }

    fn failed(_answer: &Response<Res>) -> bool {
        false
    }

    fn local(&mut self, answer: Local) -> Result<Response<Res>, GatewayError> {
        Res::local(answer).map(Response::new)
    }

    fn unplaced(&mut self, error: GatewayError) -> Result<Response<Res>, GatewayError> {
        Res::unplaced(error).map(Response::new)
    }
}

/// Triton's JSON for a message (its HTTP answer) as the gRPC message: the field names are
/// the proto's, so placement's descriptions of a model (its metadata and config, which it
/// keeps as Triton's JSON) answer both front-ends without a second reading of their own.
fn json_message<T: prost::Message + Default>(
    name: &str,
    value: &serde_json::Value,
) -> Result<T, String> {
    use prost::Message as _;
    use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage};
    static POOL: std::sync::OnceLock<DescriptorPool> = std::sync::OnceLock::new();
    let pool = POOL.get_or_init(|| {
        DescriptorPool::decode(crate::protocol::inference::FILE_DESCRIPTOR_SET)
            .expect("build.rs writes a valid descriptor set")
    });
    let schema = pool
        .get_message_by_name(name)
        .ok_or_else(|| format!("no message {name} in the descriptor set"))?;
    let options = DeserializeOptions::new().deny_unknown_fields(false);
    let message = DynamicMessage::deserialize_with_options(schema, value, &options)
        .map_err(|e| e.to_string())?;
    T::decode(message.encode_to_vec().as_slice()).map_err(|e| e.to_string())
}
