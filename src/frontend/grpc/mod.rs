//! The KServe v2 gRPC front-end: Triton's `inference.GRPCInferenceService` with tonic, plus
//! `grpc.health.v1` for load balancers and server reflection.
//!
//! It decodes protobuf into the same pipeline calls the HTTP front-end makes and encodes the
//! answers back; no rule lives here. A model RPC leases a loaded copy
//! (`Placement::acquire`, loading the model on first request) and forwards over that
//! backend's gRPC channel; the repository RPCs go through placement and the pool's merged
//! index; liveness, readiness and server metadata follow the same rules as HTTP's.
//!
//! The service is served by axum (tonic's routes as an axum router) so it shares the other
//! listeners' graceful shutdown, and so `call::grpc_layer` sees `grpc-timeout` before any
//! timeout of tonic's would.

mod call;
mod stream;
mod validate;

use crate::Gateway;
use crate::auth::{Access, Admission, Credentials};
use crate::error::GatewayError;
use crate::frontend::Served;
use crate::pipeline::auth::{Caller, admit};
use crate::pipeline::repository::{self, Index};
use crate::pipeline::statistics::{self, Statistics};
use crate::pipeline::{Ask, ModelRef, Routed, mirror, replay, sequence, server_metadata};
use crate::placement::{Lease, SequenceRef};
use crate::protocol::inference::grpc_inference_service_server::{
    GrpcInferenceService, GrpcInferenceServiceServer,
};
use crate::protocol::inference::repository_index_response::ModelIndex;
use crate::protocol::inference::*;
use crate::upstream::grpc::{self as upstream_grpc, InferenceClient};
use bytes::Bytes;
use call::{Call, Failure};
use http::StatusCode;
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::codec::CompressionEncoding;
use tonic::metadata::MetadataMap;
use tonic::service::Routes;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// The service name load balancers ask `grpc.health.v1` about (the empty name works too).
const SERVICE_NAME: &str = "inference.GRPCInferenceService";

/// Turns on, for one generated tonic server, the compression Triton's gRPC server takes:
/// gzip and deflate requests (`grpc-encoding`), and answers in either for a compressed
/// request whose client reads it (`call::grpc_layer` decides which requests those are).
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
    let limit = gateway.config().server.max_grpc_message_size.bytes();
    let inference = with_compression!(GrpcInferenceServiceServer::new(InferenceService {
        gateway: gateway.clone(),
    }))
    .max_decoding_message_size(usize::try_from(limit).unwrap_or(usize::MAX))
    .max_encoding_message_size(usize::MAX);
    let (reporter, health) = tonic_health::server::health_reporter();
    spawn_health_updates(gateway.clone(), reporter, tasks, shutdown);
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the generated descriptor set is valid");
    Routes::new(inference)
        .add_service(with_compression!(health))
        .add_service(with_compression!(reflection))
        .prepare()
        .into_axum_router()
        .layer(axum::middleware::from_fn_with_state(
            gateway,
            call::grpc_layer,
        ))
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
    let interval = (gateway.config().upstream.health_interval.0 / 4).max(Duration::from_millis(50));
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

/// A Triton HTTP error answer (`{"error": "..."}` with its status), as a gRPC status.
fn status_from_http(status: StatusCode, body: &Bytes) -> Status {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let code = match status {
        StatusCode::BAD_REQUEST => tonic::Code::InvalidArgument,
        StatusCode::NOT_FOUND => tonic::Code::NotFound,
        StatusCode::SERVICE_UNAVAILABLE => tonic::Code::Unavailable,
        StatusCode::GATEWAY_TIMEOUT => tonic::Code::DeadlineExceeded,
        _ => tonic::Code::Internal,
    };
    Status::new(code, message)
}

/// The credentials a call carries in its metadata.
fn credentials<'a>(metadata: &'a MetadataMap, peer: Option<&'a str>) -> Credentials<'a> {
    Credentials {
        authorization: metadata.get("authorization").map(|v| v.as_bytes()),
        api_key: metadata.get("x-api-key").map(|v| v.as_bytes()),
        peer,
    }
}

/// The `auth` stage's first half for a call: the credential in its metadata becomes a
/// `Caller` (or the call is UNAUTHENTICATED), and with auth on the credential is taken off
/// the metadata so it never reaches a backend. The tenant goes on the call's log line.
pub(super) async fn authenticate(
    gateway: &Gateway,
    call: &Call,
    metadata: &mut MetadataMap,
) -> Result<Caller, GatewayError> {
    let auth = gateway.live().auth.clone();
    let caller =
        crate::pipeline::auth::authenticate(&auth, credentials(metadata, call.peer())).await?;
    if auth.is_on() {
        metadata.remove("authorization");
        metadata.remove("x-api-key");
    }
    if let Some(tenant) = caller.tenant() {
        call.tenant(tenant.clone());
    }
    Ok(caller)
}

impl InferenceService {
    /// Authenticates a call that needs the admin role (the repository, every model's
    /// statistics).
    async fn admit_admin(
        &self,
        call: &Call,
        metadata: &mut MetadataMap,
        what: &'static str,
    ) -> Result<Admission, GatewayError> {
        let caller = authenticate(&self.gateway, call, metadata).await?;
        admit(&self.gateway.live().auth, &caller, Access::Admin(what))
    }

    /// Authenticates a model call and admits it for the model the client named (a route
    /// name, not its targets), as HTTP's `to_model` does.
    async fn admit_model(
        &self,
        call: &Call,
        metadata: &mut MetadataMap,
        requested: &ModelRef,
    ) -> Result<(Caller, Admission), GatewayError> {
        let caller = authenticate(&self.gateway, call, metadata).await?;
        let admission = admit(
            &self.gateway.live().auth,
            &caller,
            Access::Model(&requested.name),
        )?;
        Ok((caller, admission))
    }

    /// Finds or loads a copy of the model (what HTTP's `to_model` does), and records it as
    /// what serves the call.
    ///
    /// A model name that is a route is resolved first (sticky keys read from the call's
    /// metadata, as HTTP reads them from headers, or from the caller's token); the copy
    /// leased is the target's, which is returned so the message can be sent under the
    /// target's name. `ask` says whether the route's guard and mirrors apply, and whether
    /// the model may be loaded (only for an inference).
    async fn place(
        &self,
        call: &Call,
        requested: ModelRef,
        (metadata, caller): (&MetadataMap, &Caller),
        ask: Ask,
        sequence: Option<&SequenceRef>,
    ) -> Result<(Lease, Routed), GatewayError> {
        let mut routed = self.route(requested, metadata, caller, ask)?;
        let lease = routed
            .place(self.gateway.placement(), ask, sequence)
            .await?;
        call.served(Served {
            model: routed.target.name.clone(),
            version: routed.target.version.clone(),
            backend: lease.backend().name.clone(),
            route: routed.route.clone(),
        });
        if let Some(label) = routed.label.take() {
            call.routed_to(label);
        }
        Ok((lease, routed))
    }

    /// Resolves the route (sticky keys from the call's metadata), as HTTP does from headers.
    fn route(
        &self,
        requested: ModelRef,
        metadata: &MetadataMap,
        caller: &Caller,
        ask: Ask,
    ) -> Result<Routed, GatewayError> {
        let mut routed = self.gateway.live().routes.resolve(
            requested,
            |name| metadata.get(name).map(|v| v.as_bytes()),
            caller,
        )?;
        routed.for_inference(ask == Ask::Inference);
        Ok(routed)
    }

    /// Forwards one unary call to the leased backend: the client's metadata (less what
    /// belongs to one hop), the request id, and the time left before the client's deadline
    /// (capped by `upstream.request_timeout`) as the backend's `grpc-timeout`.
    ///
    /// The lease is held until the backend has answered: the answer is then in the
    /// gateway's memory, so the copy may be evicted while it is being written to the client.
    async fn forward<Req, Res, Fut>(
        &self,
        call: &Call,
        lease: &Lease,
        metadata: MetadataMap,
        message: Req,
        send: &impl Fn(InferenceClient, Request<Req>) -> Fut,
    ) -> Result<Response<Res>, Failure>
    where
        Fut: Future<Output = Result<Response<Res>, Status>>,
    {
        let timeout = call.budget(self.gateway.config().upstream.request_timeout.0);
        let request = upstream_request(call, metadata, message, Some(timeout));
        upstream_grpc::unary(lease.backend(), timeout, |client| send(client, request))
            .await
            .map_err(|error| call.deadline_passed(error.into()))
    }

    /// Forwards to the leased copy; when the backend answers that it has no such model (the
    /// copy went between placement and the answer), places the call again and sends it once
    /// more (`pipeline::replay`). The message is kept for that as a clone: tensors in
    /// `raw_input_contents` are shared, not copied.
    async fn forward_placed<Req: Clone, Res, Fut>(
        &self,
        call: &Call,
        (routed, ask, sequence): (&mut Routed, Ask, Option<&SequenceRef>),
        lease: &mut Lease,
        metadata: MetadataMap,
        message: Req,
        send: impl Fn(InferenceClient, Request<Req>) -> Fut,
    ) -> Result<Response<Res>, Failure>
    where
        Fut: Future<Output = Result<Response<Res>, Status>>,
    {
        let again = (metadata.clone(), message.clone());
        match self.forward(call, lease, metadata, message, &send).await {
            Err(Failure::Backend(status))
                if matches!(
                    status.code(),
                    tonic::Code::NotFound | tonic::Code::Unavailable
                ) && replay::copy_is_gone(status.message()) =>
            {
                *lease = routed
                    .place_again(self.gateway.placement(), lease, ask, sequence)
                    .await?;
                call.served(Served {
                    model: routed.target.name.clone(),
                    version: routed.target.version.clone(),
                    backend: lease.backend().name.clone(),
                    route: routed.route.clone(),
                });
                self.forward(call, lease, again.0, again.1, &send).await
            }
            answer => answer,
        }
    }

    /// Admit, place, then forward: every per-model RPC. The admission (the tenant's
    /// concurrency slot) is held until the backend has answered.
    async fn to_model<Req: NamesModel + Clone, Res, Fut>(
        &self,
        call: &Call,
        mut metadata: MetadataMap,
        mut message: Req,
        ask: Ask,
        send: impl Fn(InferenceClient, Request<Req>) -> Fut,
    ) -> Result<Response<Res>, Failure>
    where
        Fut: Future<Output = Result<Response<Res>, Status>>,
    {
        let requested = message.model()?;
        let (caller, _admission) = self.admit_model(call, &mut metadata, &requested).await?;
        let (mut lease, mut routed) = self
            .place(call, requested, (&metadata, &caller), ask, None)
            .await?;
        message.retarget(&routed.target);
        self.forward_placed(
            call,
            (&mut routed, ask, None),
            &mut lease,
            metadata,
            message,
            send,
        )
        .await
    }
}

/// A request message that names a model: what it asks for, and how to send it to the
/// target a route chose instead.
trait NamesModel {
    /// The model (and version) the client named; a version Triton cannot read is refused.
    fn model(&self) -> Result<ModelRef, GatewayError>;
    /// Names `target` instead.
    fn retarget(&mut self, target: &ModelRef);
}

macro_rules! names_model {
    ($($message:ty: $name:ident, $version:ident;)*) => {$(
        impl NamesModel for $message {
            fn model(&self) -> Result<ModelRef, GatewayError> {
                ModelRef::requested(self.$name.clone(), version(&self.$version))
            }
            fn retarget(&mut self, target: &ModelRef) {
                self.$name.clone_from(&target.name);
                self.$version = target.version.clone().unwrap_or_default();
            }
        }
    )*};
}

names_model! {
    ModelReadyRequest: name, version;
    ModelMetadataRequest: name, version;
    ModelConfigRequest: name, version;
    ModelStatisticsRequest: name, version;
    ModelInferRequest: model_name, model_version;
}

/// A request to a backend: the client's metadata without hop headers, our request id, and a
/// `grpc-timeout` when there is a time budget.
fn upstream_request<T>(
    call: &Call,
    mut metadata: MetadataMap,
    message: T,
    timeout: Option<Duration>,
) -> Request<T> {
    call::strip_reserved(&mut metadata);
    let mut request = Request::from_parts(metadata, Default::default(), message);
    request.metadata_mut().insert("x-request-id", call.id());
    call.stamp_trace(request.metadata_mut());
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    request
}

/// Shared memory names regions on one host; the gateway and its backends are not one host.
fn no_shared_memory(call: Call) -> Status {
    call.fail(GatewayError::SharedMemoryUnsupported.into(), &[])
}

/// Trace and log settings belong to each Triton server.
fn per_backend_setting(call: Call, what: &str) -> Status {
    call.fail(
        Failure::Backend(Status::unimplemented(format!(
            "{what} settings are per Triton server and are not served through infergate; \
             set them on each backend"
        ))),
        &[],
    )
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(
        &self,
        request: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        let call = Call::start_probe("ServerLive", &request);
        call.finish(Ok(Response::new(ServerLiveResponse { live: true })))
    }

    async fn server_ready(
        &self,
        request: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        let call = Call::start_probe("ServerReady", &request);
        // Triton answers "not ready" as `ready: false`, not as an error status.
        let ready = self.gateway.readiness().is_ok();
        call.finish(Ok(Response::new(ServerReadyResponse { ready })))
    }

    async fn server_metadata(
        &self,
        request: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        let call = Call::start("ServerMetadata", &request);
        let mut metadata = request.into_parts().0;
        // As HTTP's `GET /v2`: any verified caller, no admission (no model, no limit).
        let outcome = match authenticate(&self.gateway, &call, &mut metadata).await {
            Ok(_) => {
                let ours = server_metadata::server_metadata(&self.gateway).await;
                Ok(Response::new(ServerMetadataResponse {
                    name: ours.name,
                    version: ours.version,
                    extensions: ours.extensions,
                }))
            }
            Err(error) => Err(error.into()),
        };
        call.finish(outcome)
    }

    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        let call = Call::start("ModelReady", &request);
        let (mut metadata, _, mut message) = request.into_parts();
        let outcome = call
            .run(async {
                let requested = message.model()?;
                // Who may ask is decided first: a refusal is an error, not `ready: false`.
                let (caller, _admission) =
                    self.admit_model(&call, &mut metadata, &requested).await?;
                match self
                    .place(&call, requested, (&metadata, &caller), Ask::Ready, None)
                    .await
                {
                    // Triton answers an unknown or unloadable model with `ready: false`.
                    Err(error) => {
                        tracing::debug!(%error, "model is not ready");
                        Ok(Response::new(ModelReadyResponse { ready: false }))
                    }
                    Ok((mut lease, mut routed)) => {
                        message.retarget(&routed.target);
                        self.forward_placed(
                            &call,
                            (&mut routed, Ask::Ready, None),
                            &mut lease,
                            metadata,
                            message,
                            |mut c, r| async move { c.model_ready(r).await },
                        )
                        .await
                    }
                }
            })
            .await;
        call.finish(outcome)
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let call = Call::start("ModelMetadata", &request);
        let (metadata, _, message) = request.into_parts();
        let outcome = call
            .run(self.to_model(
                &call,
                metadata,
                message,
                Ask::Metadata,
                |mut c, r| async move { c.model_metadata(r).await },
            ))
            .await;
        call.finish(outcome)
    }

    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let call = Call::start("ModelInfer", &request);
        let (mut metadata, _, mut message) = request.into_parts();
        let outcome = call
            .run(async {
                let requested = message.model()?;
                let (caller, _admission) =
                    self.admit_model(&call, &mut metadata, &requested).await?;
                let sequence = sequence::from_parameters(&message.parameters);
                let (mut lease, mut routed) = self
                    .place(
                        &call,
                        requested,
                        (&metadata, &caller),
                        Ask::Inference,
                        sequence.as_ref(),
                    )
                    .await?;
                message.retarget(&routed.target);
                let answer = async {
                    validate::infer_request(
                        &self.gateway,
                        lease.backend(),
                        &routed.target,
                        &message,
                    )
                    .await?;
                    if let Some(copy) = routed.mirror_copy() {
                        mirror::grpc(&self.gateway, copy, &message);
                    }
                    self.forward_placed(
                        &call,
                        (&mut routed, Ask::Inference, sequence.as_ref()),
                        &mut lease,
                        metadata,
                        message,
                        |mut c, r| async move { c.model_infer(r).await },
                    )
                    .await
                }
                .await;
                if let Some(outcome) = routed.outcome {
                    outcome.finish(answer.as_ref().is_err_and(Failure::is_server_error));
                }
                answer
            })
            .await;
        call.finish(outcome)
    }

    type ModelStreamInferStream = stream::ResponseStream;

    async fn model_stream_infer(
        &self,
        request: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let call = Call::start("ModelStreamInfer", &request);
        let (mut metadata, extensions, inbound) = request.into_parts();
        // The stream's credential is checked once, when it opens; each request on it is
        // then admitted for its model and counted against the tenant's rate.
        match authenticate(&self.gateway, &call, &mut metadata).await {
            Ok(caller) => Ok(stream::start(
                self.gateway.clone(),
                call,
                caller,
                Request::from_parts(metadata, extensions, inbound),
            )),
            Err(error) => Err(call.fail(error.into(), &[])),
        }
    }

    async fn model_config(
        &self,
        request: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let call = Call::start("ModelConfig", &request);
        let (metadata, _, message) = request.into_parts();
        let outcome = call
            .run(self.to_model(
                &call,
                metadata,
                message,
                Ask::Config,
                |mut c, r| async move { c.model_config(r).await },
            ))
            .await;
        call.finish(outcome)
    }

    async fn model_statistics(
        &self,
        request: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        let call = Call::start("ModelStatistics", &request);
        let (mut metadata, _, message) = request.into_parts();
        let outcome = call
            .run(async {
                let answer = if message.name.is_empty() {
                    let _admission = self
                        .admit_admin(&call, &mut metadata, "the statistics of all models")
                        .await?;
                    statistics::of_all(&self.gateway).await?
                } else {
                    let requested = message.model()?;
                    let (caller, _admission) =
                        self.admit_model(&call, &mut metadata, &requested).await?;
                    let routed = self.route(requested, &metadata, &caller, Ask::Statistics)?;
                    call.served(Served {
                        model: routed.target.name.clone(),
                        version: routed.target.version.clone(),
                        route: routed.route.clone(),
                        ..Served::default()
                    });
                    statistics::of_model(&self.gateway, &routed.target).await?
                };
                match answer {
                    Statistics::Merged(value) => Ok(Response::new(
                        statistics_message(&value).map_err(|reason| {
                            Failure::Backend(Status::internal(format!(
                                "statistics cannot be written as protobuf: {reason}"
                            )))
                        })?,
                    )),
                    Statistics::Refused { status, body } => {
                        Err(Failure::Backend(status_from_http(status, &body)))
                    }
                }
            })
            .await;
        call.finish(outcome)
    }

    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let call = Call::start("RepositoryIndex", &request);
        let ready = request.get_ref().ready;
        let mut metadata = request.into_parts().0;
        let outcome = call
            .run(async {
                let _admission = self
                    .admit_admin(&call, &mut metadata, "the repository API")
                    .await?;
                let body = serde_json::json!({ "ready": ready }).to_string();
                match repository::index(&self.gateway, Bytes::from(body)).await? {
                    Index::Merged(rows) => Ok(Response::new(RepositoryIndexResponse {
                        models: rows
                            .into_iter()
                            .map(|row| ModelIndex {
                                name: row.name,
                                version: row.version.unwrap_or_default(),
                                state: row.state.unwrap_or_default(),
                                reason: row.reason.unwrap_or_default(),
                            })
                            .collect(),
                    })),
                    Index::Refused { status, body } => {
                        Err(Failure::Backend(status_from_http(status, &body)))
                    }
                }
            })
            .await;
        call.finish(outcome)
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        let call = Call::start("RepositoryModelLoad", &request);
        let (mut metadata, _, message) = request.into_parts();
        let model = message.model_name;
        let outcome = call
            .run(async {
                let _admission = self
                    .admit_admin(&call, &mut metadata, "the repository API")
                    .await?;
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
                self.gateway.placement().load(&model, config).await?;
                call.served(Served {
                    model: model.clone(),
                    ..Served::default()
                });
                Ok(Response::new(RepositoryModelLoadResponse {}))
            })
            .await;
        call.finish(outcome)
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        let call = Call::start("RepositoryModelUnload", &request);
        let (mut metadata, _, message) = request.into_parts();
        let model = message.model_name;
        let outcome = call
            .run(async {
                let _admission = self
                    .admit_admin(&call, &mut metadata, "the repository API")
                    .await?;
                self.gateway.placement().unload_explicitly(&model).await;
                Ok(Response::new(RepositoryModelUnloadResponse {}))
            })
            .await;
        call.finish(outcome)
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        Err(no_shared_memory(Call::start(
            "SystemSharedMemoryStatus",
            &request,
        )))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        Err(no_shared_memory(Call::start(
            "SystemSharedMemoryRegister",
            &request,
        )))
    }

    async fn system_shared_memory_unregister(
        &self,
        request: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        Err(no_shared_memory(Call::start(
            "SystemSharedMemoryUnregister",
            &request,
        )))
    }

    async fn cuda_shared_memory_status(
        &self,
        request: Request<CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<CudaSharedMemoryStatusResponse>, Status> {
        Err(no_shared_memory(Call::start(
            "CudaSharedMemoryStatus",
            &request,
        )))
    }

    async fn cuda_shared_memory_register(
        &self,
        request: Request<CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<CudaSharedMemoryRegisterResponse>, Status> {
        Err(no_shared_memory(Call::start(
            "CudaSharedMemoryRegister",
            &request,
        )))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        request: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<CudaSharedMemoryUnregisterResponse>, Status> {
        Err(no_shared_memory(Call::start(
            "CudaSharedMemoryUnregister",
            &request,
        )))
    }

    async fn trace_setting(
        &self,
        request: Request<TraceSettingRequest>,
    ) -> Result<Response<TraceSettingResponse>, Status> {
        Err(per_backend_setting(
            Call::start("TraceSetting", &request),
            "trace",
        ))
    }

    async fn log_settings(
        &self,
        request: Request<LogSettingsRequest>,
    ) -> Result<Response<LogSettingsResponse>, Status> {
        Err(per_backend_setting(
            Call::start("LogSettings", &request),
            "log",
        ))
    }
}

/// Statistics in Triton's JSON (its HTTP answer, summed over copies) as the gRPC message: the
/// field names are the proto's, so the one merge serves both front-ends.
fn statistics_message(value: &serde_json::Value) -> Result<ModelStatisticsResponse, String> {
    use prost::Message;
    use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage};
    static SCHEMA: std::sync::OnceLock<prost_reflect::MessageDescriptor> =
        std::sync::OnceLock::new();
    let schema = SCHEMA.get_or_init(|| {
        DescriptorPool::decode(FILE_DESCRIPTOR_SET)
            .expect("build.rs writes a valid descriptor set")
            .get_message_by_name("inference.ModelStatisticsResponse")
            .expect("grpc_service.proto defines ModelStatisticsResponse")
    });
    let options = DeserializeOptions::new().deny_unknown_fields(false);
    let message = DynamicMessage::deserialize_with_options(schema.clone(), value, &options)
        .map_err(|e| e.to_string())?;
    ModelStatisticsResponse::decode(message.encode_to_vec().as_slice()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_json_becomes_the_grpc_message() {
        let json = serde_json::json!({"model_stats": [{
            "name": "m", "version": "1", "last_inference": 1796156218584u64,
            "inference_count": 3, "execution_count": 3,
            "inference_stats": {"success": {"count": 3, "ns": 21016483}},
            "response_stats": {},
            "batch_stats": [{"batch_size": 1, "compute_infer": {"count": 3, "ns": 9}}],
            "memory_usage": [], "some_future_field": true
        }]});
        let message = statistics_message(&json).unwrap();
        let row = &message.model_stats[0];
        assert_eq!((row.name.as_str(), row.version.as_str()), ("m", "1"));
        assert_eq!(row.last_inference, 1796156218584);
        assert_eq!(row.inference_count, 3);
        let success = row
            .inference_stats
            .as_ref()
            .unwrap()
            .success
            .as_ref()
            .unwrap();
        assert_eq!((success.count, success.ns), (3, 21016483));
        assert_eq!(row.batch_stats[0].compute_infer.as_ref().unwrap().ns, 9);
    }

    #[test]
    fn triton_http_errors_become_statuses() {
        let status = status_from_http(
            StatusCode::BAD_REQUEST,
            &Bytes::from_static(br#"{"error":"bad index request"}"#),
        );
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "bad index request");
        let status = status_from_http(StatusCode::BAD_GATEWAY, &Bytes::from_static(b"oops"));
        assert_eq!(status.code(), tonic::Code::Internal);
        assert_eq!(status.message(), "oops");
    }
}
