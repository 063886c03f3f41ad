//! `ModelStreamInfer`: one bidirectional stream from the client, fanned out to one stream per
//! model placed on a backend.
//!
//! Each request on the client's stream is placed like any model request, checked against its
//! signature and copied to its route's mirrors (as one `ModelInfer` each). The first request
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
//! Each request takes a flow slot on its model's copies as a unary call does (its band from
//! the stream's `x-infergate-priority` metadata, its tenant from the stream's credential),
//! held until the backend's first answer to it. A request that must wait holds up the
//! requests after it on the stream (they stay in order); one that is shed is answered on the
//! stream with `error_message` (`... was shed (full); retry in 1s`), and the stream goes on.
//!
//! A request the gateway cannot place is answered on the stream with `error_message`, as
//! Triton answers a failed request on a stream, and the stream goes on. A backend stream that
//! breaks (the backend went away) ends the client's stream with that status (UNAVAILABLE),
//! since requests in flight on it are lost and the client must know.

use super::call::{Call, is_too_large, stamp_id};
use super::upstream_request;
use super::wire::ModelMessage;
use crate::auth::Admission;
use crate::error::GatewayError;
use crate::flow::Permit;
use crate::model::{Ask, ModelRef, Served};
use crate::pipeline::{self, RequestCtx, admit, finish};
use crate::placement::Lease;
use crate::protocol::inference::{ModelInferRequest, ModelInferResponse, ModelStreamInferResponse};
use crate::routing::Tally;
use crate::telemetry::scope::LogScope;
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
struct BackendStream {
    backend: Arc<Backend>,
    /// The backend's place in the pool (`Placement::route_sequence`).
    index: usize,
    requests: mpsc::Sender<ModelInferRequest>,
    waiting: Waiting,
}

/// Every backend stream of the client's stream, per model.
type Streams = HashMap<ModelRef, Vec<BackendStream>>;

/// What ends when a pump ends: its model's stream to one backend.
type Pumps = JoinSet<((ModelRef, usize), Result<u64, GatewayError>)>;

/// What a request sent down a backend stream holds until its answer: the tenant's
/// concurrency slot, the route guard's count of it, and its flow slot on the model's copies.
#[derive(Default)]
struct Held {
    _admission: Admission,
    tally: Option<Tally>,
    permit: Option<Permit>,
}

/// The requests sent down one backend stream and not yet answered, by request id, oldest
/// first. Shared by the relay, which adds one before it sends a request, and the pump, which
/// releases one with the backend's answer to it.
#[derive(Clone, Default)]
struct Waiting(Arc<Mutex<HashMap<String, VecDeque<Held>>>>);

impl Waiting {
    /// Holds a request's slot and count until its answer.
    fn hold(&self, id: &str, held: Held) {
        let mut waiting = self.0.lock().expect("waiting lock");
        waiting.entry(id.to_owned()).or_default().push_back(held);
    }

    /// Takes back the newest held for `id` (its request was not sent after all).
    fn take_back(&self, id: &str) -> Option<Held> {
        let mut waiting = self.0.lock().expect("waiting lock");
        let held = waiting.get_mut(id)?.pop_back();
        if waiting.get(id).is_some_and(VecDeque::is_empty) {
            waiting.remove(id);
        }
        held
    }

    /// The backend has answered the oldest request of `id`: its slot is released and its
    /// guard counts the answer (`failed`: Triton answered it with an error).
    fn answered(&self, id: &str, failed: bool) {
        let released = self
            .0
            .lock()
            .expect("waiting lock")
            .get_mut(id)
            .and_then(VecDeque::pop_front);
        if let Some(tally) = released.and_then(|held| held.tally) {
            tally.finish(failed);
        }
    }

    /// The backend stream broke: every request still waiting on it failed.
    fn broke(&self) {
        let waiting = std::mem::take(&mut *self.0.lock().expect("waiting lock"));
        for tally in waiting
            .into_values()
            .flatten()
            .filter_map(|held| held.tally)
        {
            tally.finish(true);
        }
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
    call: Call,
    metadata: MetadataMap,
    inbound: Streaming<ModelInferRequest>,
) -> Response<ResponseStream> {
    let (out, answers) = mpsc::channel(OUT_QUEUE);
    let id = call.ctx().id.clone();
    let scope = call.scope().clone();
    tokio::spawn(scope.wrap(relay(call, metadata, inbound, out)));
    let mut response: Response<ResponseStream> =
        Response::new(Box::pin(ReceiverStream::new(answers)));
    stamp_id(response.metadata_mut(), &id);
    response
}

/// The stream's state that every request on it shares.
struct Relay<'a> {
    /// The stream's own context (its edge and caller), which each request's starts from.
    stream: &'a RequestCtx,
    scope: &'a LogScope,
    /// What served the stream, for its log line: its first model.
    served: Option<Served>,
    metadata: &'a MetadataMap,
    streams: Streams,
    pumps: Pumps,
    out: mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
}

async fn relay(
    mut call: Call,
    metadata: MetadataMap,
    mut inbound: Streaming<ModelInferRequest>,
    out: mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
) {
    let mut counts = Counts::default();
    let limit = call
        .gateway()
        .fixed_config()
        .server
        .max_grpc_message_size
        .bytes();
    let mut relay = Relay {
        stream: call.ctx(),
        scope: call.scope(),
        served: None,
        metadata: &metadata,
        streams: HashMap::new(),
        pumps: JoinSet::new(),
        out: out.clone(),
    };
    let work = async {
        loop {
            tokio::select! {
                next = inbound.message() => match next {
                    Ok(Some(message)) => {
                        counts.requests += 1;
                        counts.refused += u64::from(relay.request(message).await);
                    }
                    // The client is done sending: let the backends finish answering.
                    Ok(None) => break,
                    Err(status) if is_too_large(&status) => {
                        return Err(GatewayError::MessageTooLarge { limit });
                    }
                    Err(status) => return Err(GatewayError::Backend(status)),
                },
                Some(done) = relay.pumps.join_next() => {
                    let ((model, index), answered) = done.expect("pump tasks do not panic");
                    relay.drop_stream(&model, index);
                    counts.responses += answered?;
                }
                // The client went away.
                () = relay.out.closed() => return Ok(()),
            }
        }
        relay.streams.clear();
        while let Some(done) = relay.pumps.join_next().await {
            counts.responses += done.expect("pump tasks do not panic").1?;
        }
        Ok(())
    };
    let outcome = call.run_stream(work).await;
    relay.pumps.abort_all();
    let served = relay.served.take();
    call.served(served);
    let extra = [
        ("requests", counts.requests),
        ("responses", counts.responses),
        ("refused", counts.refused),
    ];
    match outcome {
        Ok(()) => call.finish_stream(&extra),
        Err(error) => {
            let status = call.fail(error, &extra);
            let _ = out.send(Err(status)).await;
        }
    }
}

impl Relay<'_> {
    fn drop_stream(&mut self, model: &ModelRef, index: usize) {
        if let Some(list) = self.streams.get_mut(model) {
            list.retain(|r| r.index != index);
            if list.is_empty() {
                self.streams.remove(model);
            }
        }
    }

    /// One request on the stream, through the pipeline's phases with a context of its own
    /// (a fresh config snapshot each: a long stream follows reloads): admit, route, place
    /// (or the backend stream already open to its copy), validate, then down the backend
    /// stream. Returns true when the request was refused (answered on the stream with
    /// `error_message`).
    ///
    /// A request of a live sequence goes down the stream to the copy its sequence runs on (a
    /// stream opened for it if need be); a sequence's start goes down the model's stream and
    /// binds the sequence there; a request of a sequence whose copy has gone is refused
    /// (`SequenceLost`).
    async fn request(&mut self, mut message: ModelInferRequest) -> bool {
        let mut ctx = self.stream.next(self.stream.gateway.live());
        match self.admitted(&mut ctx, &mut message) {
            Ok(()) => {}
            Err(error) => return self.refuse(&mut ctx, message, error).await,
        }
        if let Some(waiting) = pipeline::flow::enter(&mut ctx, || message.size())
            && let Err(error) = pipeline::flow::wait(&mut ctx, waiting).await
        {
            return self.refuse(&mut ctx, message, error).await;
        }
        let (model, sequence) = (
            ctx.routed.as_ref().expect("routed").target.clone(),
            ctx.sequence.clone(),
        );
        let placement = ctx.gateway.placement().clone();
        let bound = match sequence.as_ref().filter(|s| !s.start) {
            Some(sequence) => match placement.route_sequence(&model, sequence) {
                Ok(bound) => bound,
                Err(error) => return self.refuse(&mut ctx, message, error).await,
            },
            None => None,
        };
        let open = self.streams.get(&model).and_then(|list| match bound {
            Some(index) => list.iter().find(|r| r.index == index),
            None => list.first(),
        });
        let mut message = match open {
            Some(open) => {
                let (backend, index, requests, waiting) = (
                    open.backend.clone(),
                    open.index,
                    open.requests.clone(),
                    open.waiting.clone(),
                );
                if let Err(error) = pipeline::inspect(&mut ctx, &mut message, &backend).await {
                    return self.refuse(&mut ctx, message, error).await;
                }
                if let Some(sequence) = &sequence {
                    placement.sequence_sent(index, &model.name, sequence);
                }
                // Held before sending, so that the answer cannot come before it is held.
                waiting.hold(&message.id, held(&mut ctx));
                match requests.send(message).await {
                    Ok(()) => return false,
                    // The backend stream ended meanwhile: place again.
                    Err(mpsc::error::SendError(message)) => {
                        let taken = waiting.take_back(&message.id).unwrap_or_default();
                        ctx.admission = taken._admission;
                        ctx.permit = taken.permit;
                        if let (Some(routed), Some(tally)) = (&mut ctx.routed, taken.tally) {
                            routed.tally = Some(tally);
                        }
                        self.drop_stream(&model, index);
                        message
                    }
                }
            }
            None => message,
        };
        if let Err(error) = pipeline::place(&mut ctx).await {
            return self.refuse(&mut ctx, message, error).await;
        }
        if self.streams.is_empty() && self.pumps.is_empty() {
            // The first model of the stream names it in the metrics and the log line.
            self.served = Some(ctx.served());
        }
        let lease = ctx.lease.take().expect("placed");
        if let Err(error) = pipeline::inspect(&mut ctx, &mut message, lease.backend()).await {
            return self.refuse(&mut ctx, message, error).await;
        }
        self.open(ctx, model, lease, message).await;
        false
    }

    /// The admit and route phases for one request, and what placement needs of it.
    fn admitted(
        &self,
        ctx: &mut RequestCtx,
        message: &mut ModelInferRequest,
    ) -> Result<(), GatewayError> {
        ctx.about(message.model()?, Ask::Inference);
        // Each request is admitted for the model it names and counted against the tenant's
        // rate; its concurrency slot is held until the backend answers it.
        admit::model(ctx)?;
        let metadata = self.metadata;
        let asked = metadata.as_ref().get(&crate::flow::PRIORITY_HEADER);
        pipeline::flow::priority(ctx, asked.map(|v| v.as_bytes()))?;
        // Sticky keys from the stream's metadata, so a sticky route keeps one target for
        // the whole stream; the request goes on under the target's name.
        pipeline::route(ctx, |name| {
            metadata.as_ref().get(name).map(|v| v.as_bytes())
        })?;
        message.retarget(&ctx.routed.as_ref().expect("routed").target);
        ctx.sequence = message.sequence();
        Ok(())
    }

    /// Opens a backend stream to the copy `lease` holds, sends `message` down it, and
    /// relays its answers in a task of its own (`pump`).
    async fn open(
        &mut self,
        mut ctx: RequestCtx,
        model: ModelRef,
        lease: Lease,
        message: ModelInferRequest,
    ) {
        let (requests, queue) = mpsc::channel(ROUTE_QUEUE);
        let waiting = Waiting::default();
        waiting.hold(&message.id, held(&mut ctx));
        requests
            .send(message)
            .await
            .expect("the receiver is alive until the pump starts");
        let timeout = ctx
            .deadline
            .map(|deadline| deadline.saturating_duration_since(tokio::time::Instant::now()));
        let request = upstream_request(&ctx, self.metadata, ReceiverStream::new(queue), timeout);
        let index = lease.backend_index();
        self.streams
            .entry(model.clone())
            .or_default()
            .push(BackendStream {
                backend: lease.backend().clone(),
                index,
                requests,
                waiting: waiting.clone(),
            });
        let out = self.out.clone();
        self.pumps.spawn(self.scope.wrap(async move {
            let answered = pump(lease, request, waiting, out).await;
            ((model, index), answered)
        }));
    }

    /// Answers a request the gateway refuses on the stream, as Triton answers a failed
    /// request on a stream: `error_message`, and the stream goes on; the route's guard counts
    /// it. Returns true (refused).
    async fn refuse(
        &self,
        ctx: &mut RequestCtx,
        message: ModelInferRequest,
        error: GatewayError,
    ) -> bool {
        finish::settle(ctx, error.fails_target());
        let model = ctx.model().map_or("", |m| m.name.as_str());
        tracing::info!(model, error = error.kind(), %error, "stream request refused");
        let answer = ModelStreamInferResponse {
            error_message: error.to_string(),
            infer_response: Some(ModelInferResponse {
                model_name: message.model_name,
                model_version: message.model_version,
                id: message.id,
                ..Default::default()
            }),
        };
        let _ = self.out.send(Ok(answer)).await;
        true
    }
}

/// What a request's context hands to the backend stream it goes down.
fn held(ctx: &mut RequestCtx) -> Held {
    Held {
        _admission: std::mem::take(&mut ctx.admission),
        tally: ctx.routed.as_mut().and_then(|r| r.tally.take()),
        permit: ctx.permit.take(),
    }
}

/// Relays one backend stream's answers to the client until it ends, releasing each answered
/// request's slot and counting it for its guard; holds the lease so the copy stays loaded
/// while the stream is open. Returns how many answers were relayed; a stream that breaks
/// fails every request still waiting on it.
async fn pump(
    lease: Lease,
    request: Request<ReceiverStream<ModelInferRequest>>,
    waiting: Waiting,
    out: mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
) -> Result<u64, GatewayError> {
    let relayed = relay_answers(&lease, request, &waiting, out).await;
    if relayed.is_err() {
        waiting.broke();
    }
    relayed
}

async fn relay_answers(
    lease: &Lease,
    request: Request<ReceiverStream<ModelInferRequest>>,
    waiting: &Waiting,
    out: mpsc::Sender<Result<ModelStreamInferResponse, Status>>,
) -> Result<u64, GatewayError> {
    let backend = lease.backend();
    let timeout = super::call::client_timeout(request.metadata().as_ref());
    let mut answers = upstream_grpc::open_stream(backend, timeout, |client| async move {
        client.methods().model_stream_infer(request).await
    })
    .await?
    .into_inner();
    let mut relayed = 0;
    loop {
        match answers.message().await {
            Ok(Some(answer)) => {
                relayed += 1;
                if let Some(response) = &answer.infer_response {
                    waiting.answered(&response.id, !answer.error_message.is_empty());
                }
                if out.send(Ok(answer)).await.is_err() {
                    return Ok(relayed);
                }
            }
            Ok(None) => return Ok(relayed),
            Err(status) => return Err(upstream_grpc::classify(backend, status)),
        }
    }
}
