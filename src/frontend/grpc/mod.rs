//! The KServe v2 gRPC front-end: Triton's `inference.GRPCInferenceService` with tonic, plus
//! `grpc.health.v1` for load balancers and server reflection.
//!
//! It decodes protobuf into a `RequestCtx` and runs the same pipeline as the HTTP front-end
//! (`wire` is this front-end's `pipeline::Wire`), then encodes the answer back; no rule lives
//! here. A unary inference's answer is the exception: it is passed on as the backend encoded
//! it (`protocol::encoded`, on a route of its own). Streams run the pipeline's phases per
//! message (`stream`).
//!
//! The service is served by axum (tonic's routes as an axum router) so it shares the other
//! listeners' graceful shutdown, and so `call::grpc_layer` sees `grpc-timeout` before any
//! timeout of tonic's would.

mod call;
mod services;
mod stream;
mod wire;

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::in_place::in_place;
use crate::model::Ask;
use crate::pipeline::admit;
use crate::pipeline::{self, RequestCtx};
use crate::protocol::encoded::{self, ClientCodec};
use crate::protocol::inference::grpc_inference_service_server::{
    GrpcInferenceService, GrpcInferenceServiceServer,
};
use crate::protocol::inference::*;
use crate::services::repository::{self, IndexRequest};
use crate::services::{server_metadata, statistics};
use crate::upstream::grpc::InferenceClient;
use call::Call;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::codec::CompressionEncoding;
use tonic::metadata::MetadataMap;
use tonic::service::Routes;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use wire::{ModelMessage, Unary};

/// The service name load balancers ask `grpc.health.v1` about (the empty name works too).
const SERVICE_NAME: &str = "inference.GRPCInferenceService";

/// Turns on, for one tonic server (a generated one, or the `Grpc` of ModelInfer's own route),
/// the compression Triton's gRPC server takes: gzip and deflate requests (`grpc-encoding`),
/// and answers in either for a compressed request whose client reads it (`call::grpc_layer`
/// decides which requests those are).
/// Every service of the listener gets the same, so a client channel that compresses every
/// call works for each of them.
macro_rules! with_compression {
    ($server:expr) => {
        $server
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Deflate)
            .send_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Deflate)
    };
}

/// Builds the gRPC router over the gateway state: the inference service, health (kept in
/// step with readiness by a task on `tasks`) and reflection.
pub fn router(gateway: Gateway, tasks: &TaskTracker, shutdown: &CancellationToken) -> axum::Router {
    let limit = gateway.fixed_config().server.max_grpc_message_size.bytes();
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let inference = with_compression!(GrpcInferenceServiceServer::new(InferenceService {
        gateway: gateway.clone(),
    }))
    .max_decoding_message_size(limit)
    .max_encoding_message_size(usize::MAX);
    let (reporter, health) = tonic_health::server::health_reporter();
    spawn_health_updates(gateway.clone(), reporter, tasks, shutdown);
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the generated descriptor set is valid");
    let infer = InferRoute {
        service: InferenceService {
            gateway: gateway.clone(),
        },
        limit,
    };
    Routes::new(inference)
        .add_service(with_compression!(health))
        .add_service(with_compression!(reflection))
        .prepare()
        .into_axum_router()
        .route_service(encoded::MODEL_INFER, infer)
        .layer(axum::middleware::from_fn_with_state(
            gateway,
            call::grpc_layer,
        ))
}

/// ModelInfer's route (`InferenceService::infer`), whose future is built in its box
/// (`in_place`): an axum handler's future is built first and then copied into one.
#[derive(Clone)]
struct InferRoute {
    service: InferenceService,
    /// `server.max_grpc_message_size`, in bytes.
    limit: usize,
}

impl tower::Service<axum::extract::Request> for InferRoute {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::extract::Request) -> Self::Future {
        let route = self.clone();
        in_place(|| async move { Ok(route.service.infer(request, route.limit).await) })
    }
}

/// Keeps `grpc.health.v1` in step with the gateway's readiness (the same rule as
/// `/v2/health/ready`), and NOT_SERVING from the moment shutdown begins.
fn spawn_health_updates(
    gateway: Gateway,
    reporter: HealthReporter,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) {
    let shutdown = shutdown.clone();
    let interval =
        (gateway.fixed_config().upstream.health_interval.0 / 4).max(Duration::from_millis(50));
    tasks.spawn(async move {
        loop {
            let status = if gateway.readiness().is_ok() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for name in ["", SERVICE_NAME] {
                reporter.set_service_status(name, status).await;
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(interval) => {}
            }
        }
        for name in ["", SERVICE_NAME] {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    });
}

/// `inference.GRPCInferenceService` over the gateway.
#[derive(Clone)]
pub struct InferenceService {
    gateway: Gateway,
}

/// Protobuf's empty string is "not given".
fn version(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// A call's credentials are in its metadata.
impl admit::CredentialHeaders for MetadataMap {
    fn credential(&self, name: &http::HeaderName) -> Option<&[u8]> {
        self.get(name.as_str()).map(|v| v.as_bytes())
    }

    fn strip(&mut self, name: &http::HeaderName) {
        self.remove(name.as_str());
    }
}

impl InferenceService {
    /// Every per-model RPC: its message decoded into the context, then the pipeline
    /// (`pipeline::serve`), with `send` the backend method that answers it. The lease and the
    /// admission are held until the backend has answered: the answer is then in the
    /// gateway's memory, so the copy may be evicted while it is being written to the client.
    async fn model_call<M, Res, F, Fut>(
        &self,
        (rpc, ask): (&'static str, Ask),
        mut request: Request<M>,
        send: F,
    ) -> Result<Response<Res>, Status>
    where
        M: ModelMessage,
        Res: wire::ModelAnswer,
        F: Fn(InferenceClient, Request<Arc<M>>) -> Fut,
        Fut: Future<Output = Result<Response<Res>, Status>>,
    {
        let mut call = Call::start(&self.gateway, rpc, &mut request);
        let (mut metadata, _, message) = request.into_parts();
        let outcome = call
            .run(async |ctx| {
                let requested = message.model()?;
                admit::authenticate(ctx, &mut metadata).await?;
                ctx.about(requested, ask);
                let mut wire = Unary::new(metadata, message, send);
                pipeline::serve(ctx, &mut wire).await
            })
            .await;
        call.finish(outcome)
    }

    /// A unary inference, on its own route: the message decoded and the answer written by
    /// `protocol::encoded`'s codec, so that the backend's answer is passed on unread, and
    /// otherwise as the generated service serves a call (compression, the message limit).
    async fn infer(
        self,
        request: axum::extract::Request,
        limit: usize,
    ) -> http::Response<tonic::body::Body> {
        let mut grpc = with_compression!(tonic::server::Grpc::new(ClientCodec::default()))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(usize::MAX);
        let call = tower::service_fn(|request| {
            self.model_call(("ModelInfer", Ask::Inference), request, |c, r| c.infer(r))
        });
        grpc.unary(call, request).await
    }

    /// An RPC the gateway does not serve, answered with `error` (shared memory names regions
    /// on one host, and the gateway and its backends are not one host).
    fn refuse<T>(&self, mut request: Request<T>, rpc: &'static str, error: GatewayError) -> Status {
        Call::start(&self.gateway, rpc, &mut request).fail(error, &[])
    }

    /// Every admin RPC (the repository, every model's statistics): authenticated and
    /// admitted for the admin role, then `work`.
    async fn admin_call<M, Res>(
        &self,
        (rpc, what): (&'static str, &'static str),
        mut request: Request<M>,
        work: impl AsyncFnOnce(M) -> Result<Res, GatewayError>,
    ) -> Result<Response<Res>, Status> {
        let mut call = Call::start(&self.gateway, rpc, &mut request);
        let (mut metadata, _, message) = request.into_parts();
        let outcome = call
            .run(async |ctx| {
                admit::authenticate(ctx, &mut metadata).await?;
                admit::admin(ctx, what)?;
                work(message).await.map(Response::new)
            })
            .await;
        call.finish(outcome)
    }
}

/// How much longer than the gateway's own timer a backend is told it has (`grpc-timeout`).
/// The gateway ends a call whose time is up by resetting its stream, and an HTTP/2 client
/// ignores whatever a backend still sends on a stream it has reset. A backend whose deadline
/// passes first answers on its own, and Triton does so with its trailers several times over,
/// which hyper's HTTP/2 client takes as a protocol error of the whole connection: every other
/// call on this worker's connection to that backend would fail with it.
const BACKEND_DEADLINE_GRACE: Duration = Duration::from_millis(500);

/// A request to a backend: the client's metadata without hop headers (the call's trace is
/// on it since its edge), the request's id, and a `grpc-timeout` when there is a time budget
/// (with the grace above).
fn upstream_request<T>(
    ctx: &RequestCtx,
    metadata: &MetadataMap,
    message: T,
    timeout: Option<Duration>,
) -> Request<T> {
    let metadata = call::without_hop(metadata);
    let mut request = Request::from_parts(metadata, Default::default(), message);
    call::stamp_id(request.metadata_mut(), &ctx.id);
    if let Some(timeout) = timeout {
        request.set_timeout(timeout + BACKEND_DEADLINE_GRACE);
    }
    request
}

/// Trace and log settings belong to each Triton server.
fn per_backend_setting(what: &str) -> GatewayError {
    GatewayError::Backend(Status::unimplemented(format!(
        "{what} settings are per Triton server and are not served through infergate; \
         set them on each backend"
    )))
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(
        &self,
        mut request: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        let call = Call::start_probe(&self.gateway, "ServerLive", &mut request);
        call.finish(Ok(Response::new(ServerLiveResponse { live: true })))
    }

    async fn server_ready(
        &self,
        mut request: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        let call = Call::start_probe(&self.gateway, "ServerReady", &mut request);
        // Triton answers "not ready" as `ready: false`, not as an error status.
        let ready = self.gateway.readiness().is_ok();
        call.finish(Ok(Response::new(ServerReadyResponse { ready })))
    }

    async fn server_metadata(
        &self,
        mut request: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        let mut call = Call::start(&self.gateway, "ServerMetadata", &mut request);
        let mut metadata = request.into_parts().0;
        // As HTTP's `GET /v2`: any verified caller, no admission (no model, no limit).
        let outcome = call
            .run(async |ctx| {
                admit::authenticate(ctx, &mut metadata).await?;
                let ours = server_metadata::server_metadata(&ctx.gateway).await;
                Ok(Response::new(ServerMetadataResponse::from(ours)))
            })
            .await;
        call.finish(outcome)
    }

    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        // Who may ask is decided first: a refusal is an error, not `ready: false`; Triton
        // answers an unknown or unloadable model with `ready: false` (`ModelAnswer`).
        self.model_call(("ModelReady", Ask::Ready), request, |c, r| async move {
            c.methods().model_ready(wire::owned(r)).await
        })
        .await
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        self.model_call(
            ("ModelMetadata", Ask::Metadata),
            request,
            |c, r| async move { c.methods().model_metadata(wire::owned(r)).await },
        )
        .await
    }

    /// Never called: `router` serves ModelInfer on a route of its own (`infer`), ahead of
    /// this service, so that the backend's answer passes through as it was encoded.
    async fn model_infer(
        &self,
        _: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        Err(Status::internal("ModelInfer is served by its own route"))
    }

    type ModelStreamInferStream = stream::ResponseStream;

    async fn model_stream_infer(
        &self,
        mut request: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let mut call = Call::start(&self.gateway, "ModelStreamInfer", &mut request);
        let (mut metadata, _, inbound) = request.into_parts();
        // The stream's credential is checked once, when it opens; each request on it is
        // then admitted for its model and counted against the tenant's rate.
        match call
            .run(async |ctx| admit::authenticate(ctx, &mut metadata).await)
            .await
        {
            Ok(()) => Ok(stream::start(call, metadata, inbound)),
            Err(error) => Err(call.fail(error, &[])),
        }
    }

    async fn model_config(
        &self,
        request: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        self.model_call(("ModelConfig", Ask::Config), request, |c, r| async move {
            c.methods().model_config(wire::owned(r)).await
        })
        .await
    }

    async fn model_statistics(
        &self,
        mut request: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        let mut call = Call::start(&self.gateway, "ModelStatistics", &mut request);
        let (mut metadata, _, message) = request.into_parts();
        let outcome = call
            .run(async |ctx| {
                let answer = if message.name.is_empty() {
                    admit::authenticate(ctx, &mut metadata).await?;
                    admit::admin(ctx, "the statistics of all models")?;
                    statistics::of_all(&ctx.gateway).await?
                } else {
                    let requested = message.model()?;
                    admit::authenticate(ctx, &mut metadata).await?;
                    ctx.about(requested, Ask::Statistics);
                    let header =
                        |name: &http::HeaderName| metadata.as_ref().get(name).map(|v| v.as_bytes());
                    let answer = statistics::of_routed(ctx, header).await;
                    if let Some(routed) = &ctx.routed {
                        ctx.serving = Some(routed.served());
                    }
                    answer?
                };
                Ok(Response::new(ModelStatisticsResponse::from(answer)))
            })
            .await;
        call.finish(outcome)
    }

    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let gateway = &self.gateway;
        self.admin_call(
            ("RepositoryIndex", "the repository API"),
            request,
            async |message| {
                let request = IndexRequest::Ready(message.ready);
                let rows = repository::index(gateway, &request).await?;
                Ok(services::repository_index(rows))
            },
        )
        .await
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        let gateway = &self.gateway;
        self.admin_call(
            ("RepositoryModelLoad", "the repository API"),
            request,
            async |message| {
                let model = message.model_name;
                let config = repository::load_config(
                    &model,
                    message.parameters.iter().map(|(name, value)| {
                        let text = match &value.parameter_choice {
                            Some(model_repository_parameter::ParameterChoice::StringParam(
                                text,
                            )) => Some(text.as_str()),
                            _ => None,
                        };
                        (name.as_str(), text)
                    }),
                )?;
                gateway.placement().load(&model, config).await?;
                Ok(RepositoryModelLoadResponse {})
            },
        )
        .await
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        let gateway = &self.gateway;
        self.admin_call(
            ("RepositoryModelUnload", "the repository API"),
            request,
            async |message| {
                gateway
                    .placement()
                    .unload_explicitly(&message.model_name)
                    .await;
                Ok(RepositoryModelUnloadResponse {})
            },
        )
        .await
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        Err(self.refuse(
            request,
            "SystemSharedMemoryStatus",
            GatewayError::SharedMemoryUnsupported,
        ))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        Err(self.refuse(
            request,
            "SystemSharedMemoryRegister",
            GatewayError::SharedMemoryUnsupported,
        ))
    }

    async fn system_shared_memory_unregister(
        &self,
        request: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        Err(self.refuse(
            request,
            "SystemSharedMemoryUnregister",
            GatewayError::SharedMemoryUnsupported,
        ))
    }

    async fn cuda_shared_memory_status(
        &self,
        request: Request<CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<CudaSharedMemoryStatusResponse>, Status> {
        Err(self.refuse(
            request,
            "CudaSharedMemoryStatus",
            GatewayError::SharedMemoryUnsupported,
        ))
    }

    async fn cuda_shared_memory_register(
        &self,
        request: Request<CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<CudaSharedMemoryRegisterResponse>, Status> {
        Err(self.refuse(
            request,
            "CudaSharedMemoryRegister",
            GatewayError::SharedMemoryUnsupported,
        ))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        request: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<CudaSharedMemoryUnregisterResponse>, Status> {
        Err(self.refuse(
            request,
            "CudaSharedMemoryUnregister",
            GatewayError::SharedMemoryUnsupported,
        ))
    }

    async fn trace_setting(
        &self,
        request: Request<TraceSettingRequest>,
    ) -> Result<Response<TraceSettingResponse>, Status> {
        Err(self.refuse(request, "TraceSetting", per_backend_setting("trace")))
    }

    async fn log_settings(
        &self,
        request: Request<LogSettingsRequest>,
    ) -> Result<Response<LogSettingsResponse>, Status> {
        Err(self.refuse(request, "LogSettings", per_backend_setting("log")))
    }
}
