//! `ModelStreamInfer`: one bidirectional stream from the client, fanned out to one stream per
//! model placed on a backend.
//!
//! Each request on the client's stream is placed like any model request. The first request
//! for a model (name and version) leases a copy and opens a stream to that backend; later
//! requests for the same model go down the same backend stream, so a sequence stays on one
//! backend and a decoupled model may answer any number of times. A request of a live
//! sequence that runs on another copy (started on another stream) goes there, down a second
//! backend stream (`placement::sequences`). The lease is held for as
//! long as that backend stream is open. The backends' answers are merged onto the client's
//! stream as they come (each carries its request `id`).
//!
//! Each request is admitted for its model, and its tenant's concurrency slot is held until
//! the backend's first answer to it (matched by request `id`; requests with the same id are
//! answered in order), or until its backend stream ends. A decoupled model's later answers
//! to the same request are not covered: the gateway cannot tell which answer is the last
//! unless the client asked Triton for an empty final response.
//!
//! A route name is resolved per request and the request goes on under its target's name, so
//! each answer's `model_name` and `model_version` (Triton's) name the target that served it.
//! That is the only place to say so: the stream's metadata went out when it opened, before
//! any request was routed, so it carries no `infergate-target`.
//!
//! A request the gateway cannot place is answered on the stream with `error_message`, as
//! Triton answers a failed request on a stream, and the stream goes on. A backend stream that
//! breaks (the backend went away) ends the client's stream with that status (UNAVAILABLE),
//! since requests in flight on it are lost and the client must know.

use super::call::{Call, Failure, is_too_large};
use super::{upstream_request, version};
use crate::Gateway;
use crate::auth::{Access, Admission};
use crate::frontend::Served;
use crate::pipeline::ModelRef;
use crate::pipeline::auth::{Caller, admit};
use crate::placement::Lease;
use crate::protocol::inference::{ModelInferRequest, ModelInferResponse, ModelStreamInferResponse};
use crate::upstream::Backend;
use crate::upstream::grpc as upstream_grpc;
use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

/// The client's response stream.
pub type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<ModelStreamInferResponse, Status>> + Send + 'static>>;

/// Requests waiting to go down one backend stream.
const ROUTE_QUEUE: usize = 16;
/// Answers waiting to go to the client.
const OUT_QUEUE: usize = 64;

/// One model's stream to one of its backends. A model has one, and another only when a
/// live sequence runs on a copy elsewhere (it started on another stream, or before a
/// backend stream ended).
struct Route {
    backend: Arc<Backend>,
    /// The backend's place in the pool (`Placement::route_sequence`).
    index: usize,
    requests: mpsc::Sender<ModelInferRequest>,
    waiting: Waiting,
}

/// Every backend stream of the client's stream, per model.
type Routes = HashMap<ModelRef, Vec<Route>>;

/// What ends when a pump ends: its model's route to one backend.
type Pumps = JoinSet<((ModelRef, usize), Result<u64, Failure>)>;

/// The concurrency slots of requests sent down one backend stream and not yet answered, by
/// request id, oldest first. Shared by the relay, which adds one before it sends a request,
/// and the pump, which releases one with the backend's answer to it.
#[derive(Clone, Default)]
struct Waiting(Arc<Mutex<HashMap<String, VecDeque<Admission>>>>);

impl Waiting {
    /// Holds a request's slot until its answer.
    fn hold(&self, id: &str, admission: Admission) {
        let mut waiting = self.0.lock().expect("waiting lock");
        waiting
            .entry(id.to_owned())
            .or_default()
            .push_back(admission);
    }

    /// Takes back the newest slot held for `id` (its request was not sent after all).
    fn take_back(&self, id: &str) -> Option<Admission> {
        let mut waiting = self.0.lock().expect("waiting lock");
        let admission = waiting.get_mut(id)?.pop_back();
        if waiting.get(id).is_some_and(VecDeque::is_empty) {
            waiting.remove(id);
        }
        admission
    }

    /// Releases the oldest slot held for `id`: the backend has answered that request.
    fn answered(&self, id: &str) {
        let released = self
            .0
            .lock()
            .expect("waiting lock")
            .get_mut(id)
            .and_then(VecDeque::pop_front);
        drop(released);
    }
}

/// What the stream did, for its log line.
#[derive(Default)]
struct Counts {
    requests: u64,
    responses: u64,
    refused: u64,
}

/// Starts relaying: returns the client's response stream at once; a task does the work and
/// writes the call's log line when the stream ends.
pub fn start(
    gateway: Gateway,
    call: Call,
    caller: Caller,
    request: Request<Streaming<ModelInferRequest>>,
) -> Response<ResponseStream> {
    let (out, answers) = mpsc::channel(OUT_QUEUE);
    let id = call.id();
    let span = call.span().clone();
    let (metadata, _, inbound) = request.into_parts();
    tokio::spawn(relay(gateway, call, caller, metadata, inbound, out).instrument(span));
    let mut response: Response<ResponseStream> =
        Response::new(Box::pin(ReceiverStream::new(answers)));
    response.metadata_mut().insert("x-request-id", id);
    response
}

async fn relay(
    gateway: Gateway,
    call: Call,
    caller: Caller,
    metadata: MetadataMap,
    mut inbound: Streaming<ModelInferRequest>,
    out: mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
) {
    let mut counts = Counts::default();
    let mut routes: Routes = HashMap::new();
    let mut pumps: Pumps = JoinSet::new();
    let limit = gateway.config().server.max_grpc_message_size.bytes();
    let work = async {
        loop {
            tokio::select! {
                next = inbound.message() => match next {
                    Ok(Some(message)) => {
                        counts.requests += 1;
                        let refused = route(&gateway, &call, &caller, &metadata, &mut routes, &mut pumps, &out, message).await;
                        counts.refused += u64::from(refused);
                    }
                    // The client is done sending: let the backends finish answering.
                    Ok(None) => break,
                    Err(status) if is_too_large(&status) => return Err(Failure::TooLarge(limit)),
                    Err(status) => return Err(Failure::Backend(status)),
                },
                Some(done) = pumps.join_next() => {
                    let ((model, index), answered) = done.expect("pump tasks do not panic");
                    drop_route(&mut routes, &model, index);
                    counts.responses += answered?;
                }
                // The client went away.
                () = out.closed() => return Ok(()),
            }
        }
        routes.clear();
        while let Some(done) = pumps.join_next().await {
            counts.responses += done.expect("pump tasks do not panic").1?;
        }
        Ok(())
    };
    let outcome = call.run(work).await;
    pumps.abort_all();
    let extra = [
        ("requests", counts.requests),
        ("responses", counts.responses),
        ("refused", counts.refused),
    ];
    match outcome {
        Ok(()) => call.finish_stream(&extra),
        Err(failure) => {
            let status = call.fail(failure, &extra);
            let _ = out.send(Err(status)).await;
        }
    }
}

fn drop_route(routes: &mut Routes, model: &ModelRef, index: usize) {
    if let Some(list) = routes.get_mut(model) {
        list.retain(|r| r.index != index);
        if list.is_empty() {
            routes.remove(model);
        }
    }
}

/// Sends one request down its model's backend stream, opening one if needed. Returns true
/// when the request was refused (answered on the stream with `error_message`).
///
/// A request of a live sequence goes down the stream to the copy its sequence runs on (a
/// stream opened for it if need be); a sequence's start goes down the model's stream and
/// binds the sequence there; a request of a sequence whose copy has gone is refused
/// (`SequenceLost`).
#[allow(clippy::too_many_arguments)]
async fn route(
    gateway: &Gateway,
    call: &Call,
    caller: &Caller,
    metadata: &MetadataMap,
    routes: &mut Routes,
    pumps: &mut Pumps,
    out: &mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
    mut message: ModelInferRequest,
) -> bool {
    // A route name is resolved per request (sticky keys from the stream's metadata, so a
    // sticky route keeps one target for the whole stream); the request goes on under the
    // target's name, down the target's backend stream.
    let requested = ModelRef::new(message.model_name.clone(), version(&message.model_version));
    if let Err(error) = requested.version_number() {
        return refuse(out, &requested, message, error).await;
    }
    let live = gateway.live();
    // Each request on the stream is admitted for the model it names and counted against the
    // tenant's rate; its concurrency slot is held until the backend answers it.
    let mut admission = match admit(&live.auth, caller, Access::Model(&requested.name)) {
        Ok(admission) => admission,
        Err(error) => return refuse(out, &requested, message, error).await,
    };
    let routed = match live.routes.resolve(
        requested.clone(),
        |name| metadata.get(name).map(|v| v.as_bytes()),
        caller,
    ) {
        Ok(routed) => routed,
        Err(error) => return refuse(out, &requested, message, error).await,
    };
    let model = routed.target;
    message.model_name.clone_from(&model.name);
    message.model_version = model.version.clone().unwrap_or_default();
    let sequence = crate::pipeline::sequence::from_parameters(&message.parameters);
    let placement = gateway.placement();
    let bound = match sequence.as_ref().filter(|s| !s.start) {
        Some(sequence) => match placement.route_sequence(&model, sequence) {
            Ok(bound) => bound,
            Err(error) => return refuse(out, &model, message, error).await,
        },
        None => None,
    };
    let open = routes.get(&model).and_then(|list| match bound {
        Some(index) => list.iter().find(|r| r.index == index),
        None => list.first(),
    });
    let message = match open {
        Some(route) => {
            if let Err(error) =
                super::validate::infer_request(gateway, &route.backend, &model, &message).await
            {
                return refuse(out, &model, message, error).await;
            }
            if let Some(sequence) = &sequence {
                placement.sequence_sent(route.index, &model.name, sequence);
            }
            // Held before sending, so that the answer cannot come before the slot is held.
            route.waiting.hold(&message.id, admission);
            match route.requests.send(message).await {
                Ok(()) => return false,
                // The backend stream ended meanwhile: place again.
                Err(mpsc::error::SendError(message)) => {
                    admission = route.waiting.take_back(&message.id).unwrap_or_default();
                    let index = route.index;
                    drop_route(routes, &model, index);
                    message
                }
            }
        }
        None => message,
    };
    let lease = match placement.acquire_in(&model, sequence.as_ref()).await {
        Ok(lease) => lease,
        Err(error) => return refuse(out, &model, message, error).await,
    };
    if let Err(error) =
        super::validate::infer_request(gateway, lease.backend(), &model, &message).await
    {
        return refuse(out, &model, message, error).await;
    }
    if routes.is_empty() && pumps.is_empty() {
        // The first model of the stream names it in the metrics and the log line.
        call.served(Served {
            model: model.name.clone(),
            version: model.version.clone(),
            backend: lease.backend().name.clone(),
            route: routed.route,
        });
    }
    let (requests, queue) = mpsc::channel(ROUTE_QUEUE);
    let waiting = Waiting::default();
    waiting.hold(&message.id, admission);
    requests
        .send(message)
        .await
        .expect("the receiver is alive until the pump starts");
    let timeout = call
        .deadline()
        .map(|deadline| deadline.saturating_duration_since(tokio::time::Instant::now()));
    let request = upstream_request(call, metadata.clone(), ReceiverStream::new(queue), timeout);
    let index = lease.backend_index();
    routes.entry(model.clone()).or_default().push(Route {
        backend: lease.backend().clone(),
        index,
        requests,
        waiting: waiting.clone(),
    });
    let out = out.clone();
    pumps.spawn(
        async move {
            let answered = pump(lease, request, waiting, out).await;
            ((model, index), answered)
        }
        .instrument(call.span().clone()),
    );
    false
}

/// Answers a request the gateway refuses on the stream, as Triton answers a failed request
/// on a stream: `error_message`, and the stream goes on. Returns true (refused).
async fn refuse(
    out: &mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
    model: &ModelRef,
    message: ModelInferRequest,
    error: crate::error::GatewayError,
) -> bool {
    tracing::info!(model = model.name, error = error.kind(), %error, "stream request refused");
    let answer = ModelStreamInferResponse {
        error_message: error.to_string(),
        infer_response: Some(ModelInferResponse {
            model_name: message.model_name,
            model_version: message.model_version,
            id: message.id,
            ..Default::default()
        }),
    };
    let _ = out.send(Ok(answer)).await;
    true
}

/// Relays one backend stream's answers to the client until it ends, releasing each answered
/// request's slot; holds the lease so the copy stays loaded while the stream is open (and the
/// slots of unanswered requests until it ends). Returns how many answers were relayed.
async fn pump(
    lease: Lease,
    request: Request<ReceiverStream<ModelInferRequest>>,
    waiting: Waiting,
    out: mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
) -> Result<u64, Failure> {
    let backend = lease.backend();
    let timeout = request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| super::call::parse_timeout(v.as_bytes()));
    let mut client = upstream_grpc::client(backend)?;
    let mut answers = match client.model_stream_infer(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return Err(upstream_grpc::classify(backend, status, timeout).into()),
    };
    backend.record_success();
    let mut relayed = 0;
    loop {
        match answers.message().await {
            Ok(Some(answer)) => {
                relayed += 1;
                if let Some(response) = &answer.infer_response {
                    waiting.answered(&response.id);
                }
                if out.send(Ok(answer)).await.is_err() {
                    return Ok(relayed);
                }
            }
            Ok(None) => return Ok(relayed),
            Err(status) => return Err(upstream_grpc::classify(backend, status, timeout).into()),
        }
    }
}
