//! Placement: which Triton has which model loaded, decided by infergate alone.
//!
//! A request for a model no backend has is a cold miss: a backend is chosen (room first, else
//! the least recently used victims), evicted models are unloaded, the model is loaded, and
//! every request that arrived meanwhile waits on that one load. The books (`table`) are the
//! single truth, kept in line with each backend's repository index by `reconcile`.

mod agree;
mod control;
pub(crate) mod estimate;
mod located;
mod model_config;
pub(crate) mod policy;
pub mod registry;
mod room;
pub mod sequences;
mod spec;
pub(crate) mod table;
mod versions;

// The books and the eviction order are internal: the simulator and the benches reach them
// through `crate::internals`.
pub use crate::upstream::Priority;
use estimate::{Estimator, SizeSource, Sizing};
pub use model_config::check_override;
use policy::{EvictionOrder, ModelWeight};
use registry::Registry;
pub use sequences::{SequenceId, SequenceRef};
use table::{BackendView, Decision, Indexed, LoadPlan, LoadReason, Narrowed, Policy, Table};
pub use versions::Versions;

use crate::config;
use crate::error::GatewayError;
use crate::model::ModelRef;
use crate::telemetry;
use crate::upstream::{Backend, InFlight, Pool, TritonClient, TritonError, metrics_scrape};
use bytes::Bytes;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;

/// A change to what is loaded, for components that cache per-model facts (signatures).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelEvent {
    /// The model was loaded (or reloaded) on a backend.
    Loaded(String),
    /// The model was unloaded from a backend.
    Unloaded(String),
}

/// The placement service: books, policy, and the calls that change what is loaded.
pub struct Placement {
    table: Mutex<Table>,
    pool: Arc<Pool>,
    estimator: Estimator,
    pinned: HashSet<String>,
    min_copies: HashMap<String, usize>,
    max_copies: HashMap<String, usize>,
    scaling: Scaling,
    memory_metric: String,
    /// `placement.queue_max_age`: how old a backend's queue reading may be to count.
    queue_max_age: Duration,
    /// `placement.scale_up_queue`: requests waiting per copy above which a model gets
    /// another copy (0: off).
    scale_up_queue: f64,
    /// `placement.default_capacity` and `mem_buffer`, for backends a reload adds.
    sizes: (u64, u64),
    load_timeout: Duration,
    max_attempts: usize,
    events: broadcast::Sender<ModelEvent>,
    /// `placement.model_repository`: config.pbtxt for loads of chosen versions.
    repository: Option<std::path::PathBuf>,
    /// `placement.reconcile_interval`.
    reconcile_interval: Duration,
    /// Config overrides and explicit unloads, from the repository API.
    specs: spec::Specs,
    /// `placement.room_wait`, and the requests waiting for room.
    room_wait: Duration,
    room: room::RoomQueue,
    /// With `[cluster]`: the pool's registry, which agrees every change before it is made.
    registry: std::sync::OnceLock<Arc<dyn Registry>>,
}

/// When models get more copies, and lose them.
#[derive(Clone, Copy, Debug)]
struct Scaling {
    up_rps: f64,
    max_copies: usize,
    down_idle: Duration,
    interval: Duration,
}

/// A claim on one ready copy of a model for the length of a request: while any lease is
/// held the copy cannot be evicted; dropping it records the use for LRU.
pub struct Lease {
    placement: Arc<Placement>,
    backend: usize,
    model: String,
    /// The version asked for by number, if any (counted per version on the copy).
    version: Option<u64>,
    in_flight: InFlight,
}

impl Lease {
    /// The backend to send to.
    pub fn backend(&self) -> &Arc<Backend> {
        self.in_flight.backend()
    }

    /// The backend's place in the pool, as `Placement::route_sequence` names backends.
    pub fn backend_index(&self) -> usize {
        self.backend
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.placement.books().release_version(
            self.backend,
            &self.model,
            self.version,
            Instant::now(),
        );
        // The copy may be idle now: room for whoever waits for it there.
        self.placement.offer_room(self.backend);
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("backend", &self.backend().name)
            .field("model", &self.model)
            .finish()
    }
}

impl Placement {
    /// Builds placement over the pool.
    pub fn new(config: &config::Config, pool: Arc<Pool>) -> Self {
        let policy = &config.placement;
        let usable: Vec<u64> = pool.backends().iter().map(|b| usable(b, policy)).collect();
        let sizes = (policy.default_capacity.bytes(), policy.mem_buffer.bytes());
        let table = Table::new(
            &usable,
            Policy {
                min_churn_age: policy.min_churn_age.0,
                backoff: policy.load_failure_backoff.0,
                backoff_max: policy.load_failure_backoff_max.0,
            },
            Instant::now(),
        )
        .with_order(eviction_order(policy.policy, &config.models));
        for (backend, bytes) in pool.backends().iter().zip(&usable) {
            metrics::gauge!(telemetry::PLACEMENT_CAPACITY, "backend" => backend.name.clone())
                .set(*bytes as f64);
        }
        Self {
            table: Mutex::new(table),
            memory_metric: policy.memory_metric.clone(),
            queue_max_age: policy.queue_max_age.0,
            scale_up_queue: policy.scale_up_queue,
            sizes,
            pool,
            estimator: Estimator::new(policy, &config.models),
            pinned: config
                .models
                .iter()
                .filter(|m| m.pinned())
                .map(|m| m.name.clone())
                .collect(),
            min_copies: config
                .models
                .iter()
                .map(|m| (m.name.clone(), m.min_copies))
                .collect(),
            max_copies: config
                .models
                .iter()
                .filter_map(|m| Some((m.name.clone(), m.max_copies?)))
                .collect(),
            scaling: Scaling {
                up_rps: policy.scale_up_rps,
                max_copies: policy.max_copies,
                down_idle: policy.scale_down_idle.0,
                interval: policy.rebalance_interval.0,
            },
            load_timeout: policy.load_timeout.0,
            max_attempts: policy.max_load_attempts,
            events: broadcast::channel(256).0,
            repository: policy.model_repository.clone(),
            reconcile_interval: policy.reconcile_interval.0,
            specs: spec::Specs::default(),
            room_wait: policy.room_wait.0,
            room: room::RoomQueue::default(),
            registry: std::sync::OnceLock::new(),
        }
    }

    /// How models are sized: `[cluster]` shares learned sizes through it.
    pub fn estimator(&self) -> &Estimator {
        &self.estimator
    }

    /// Receives every load and unload.
    pub fn subscribe(&self) -> broadcast::Receiver<ModelEvent> {
        self.events.subscribe()
    }

    /// Whether a model is loading on backend `i`, by this replica or another: the health
    /// checks excuse its slow answers then (`upstream::HealthChecks::loading`).
    pub fn loading_on(&self, backend: usize) -> bool {
        self.books().loading_on(backend)
    }

    fn books(&self) -> MutexGuard<'_, Table> {
        self.table.lock().expect("placement lock")
    }

    fn view(&self, model: &str) -> Vec<BackendView> {
        self.pool
            .backends()
            .iter()
            .map(|backend| {
                let knows = backend.index().knows(model);
                BackendView {
                    ready: backend.is_ready(),
                    knows,
                    in_flight: backend.in_flight(),
                    // No copy can be where the model is not known: no reading to look up.
                    queued: if knows {
                        self.queued_on(backend, model)
                    } else {
                        0
                    },
                }
            })
            .collect()
    }

    /// Finds (or makes) a ready copy of the model and leases it.
    pub async fn acquire(self: &Arc<Self>, model: &ModelRef) -> Result<Lease, GatewayError> {
        self.acquire_with(model, None, true, None).await
    }

    /// `acquire` for a request that may belong to a sequence: a later request of a live
    /// sequence gets the copy that saw it start (or `GatewayError::SequenceLost`), a start
    /// binds its sequence to the copy it gets (`sequences`). A wait for room ends by the
    /// client's `deadline` at the latest (`NoRoom`, which the pipeline words as the
    /// deadline's error once it has passed).
    pub async fn acquire_in(
        self: &Arc<Self>,
        model: &ModelRef,
        sequence: Option<&SequenceRef>,
        deadline: Option<Instant>,
    ) -> Result<Lease, GatewayError> {
        self.acquire_with(model, sequence, true, deadline).await
    }

    /// Whether requests for the model may belong to sequences: true for a model with
    /// sequence batching, and for one whose config has not been read yet. Front-ends read a
    /// request's sequence id only then, so other models' requests cost nothing more.
    pub fn may_hold_sequences(&self, model: &str) -> bool {
        self.books().is_sequence_model(model) != Some(false)
    }

    /// Where a later request of `sequence` must go, for a request sent down a stream
    /// already open (see `Table::route_sequence`): `Some(backend)` while the sequence is
    /// live on a copy that is there, `None` when it is not bound.
    pub fn route_sequence(
        &self,
        model: &ModelRef,
        sequence: &SequenceRef,
    ) -> Result<Option<usize>, GatewayError> {
        let view = self.view(&model.name);
        self.books()
            .route_sequence(model, sequence, &view, Instant::now())
    }

    /// Records a request of `sequence` sent to the copy of `model` on backend `b` outside
    /// `acquire_in` (down a stream already open to it): see `Table::sequence_sent`.
    pub fn sequence_sent(&self, b: usize, model: &str, sequence: &SequenceRef) {
        self.books()
            .sequence_sent(b, model, sequence, Instant::now());
    }

    async fn acquire_with(
        self: &Arc<Self>,
        model: &ModelRef,
        sequence: Option<&SequenceRef>,
        allow_evict: bool,
        deadline: Option<Instant>,
    ) -> Result<Lease, GatewayError> {
        let mut attempts = 0;
        let mut cold_since: Option<Instant> = None;
        // A decision made for this request while it waited for room (`room`).
        let mut handed: Option<Decision> = None;
        let mut room_until: Option<Instant> = None;
        loop {
            // Checked on every round: an explicit unload may come while a request waits.
            if self.specs.is_unloaded(&model.name) {
                return Err(control::not_loaded(model, crate::model::Ask::Inference));
            }
            let decision = match handed.take() {
                Some(decision) => decision,
                None => self.decide(model, sequence, allow_evict),
            };
            let mut waiting = match decision {
                Decision::Serve(backend) => {
                    if let Some(since) = cold_since {
                        metrics::histogram!(telemetry::PLACEMENT_COLD_WAIT)
                            .record(since.elapsed().as_secs_f64());
                    }
                    let in_flight = self.pool.backends()[backend].start_request();
                    return Ok(Lease {
                        placement: self.clone(),
                        backend,
                        model: model.name.clone(),
                        // `Serve` only follows a version that parsed.
                        version: model.version_number().ok().flatten(),
                        in_flight,
                    });
                }
                Decision::Refuse(error @ GatewayError::NoRoom { .. }) => {
                    // Waits up to `room_wait` in all, however many times it is refused, and
                    // never past the client's deadline.
                    let until = *room_until.get_or_insert_with(|| {
                        let waited = Instant::now() + self.room_wait;
                        deadline.map_or(waited, |deadline| deadline.min(waited))
                    });
                    handed = self
                        .wait_for_room(model, sequence, allow_evict, (until, deadline))
                        .await;
                    if handed.is_none() {
                        return Err(error);
                    }
                    continue;
                }
                Decision::Refuse(error) => {
                    if matches!(error, GatewayError::Churn { .. }) {
                        metrics::counter!(telemetry::PLACEMENT_CHURN_REFUSALS).increment(1);
                    }
                    return Err(error);
                }
                Decision::Wait(waiting) => waiting,
                Decision::Load(plan) => {
                    metrics::counter!(telemetry::PLACEMENT_COLD_MISSES).increment(1);
                    let waiting = plan.done.subscribe();
                    tokio::spawn(self.clone().run_load(plan, Priority::Request));
                    waiting
                }
            };
            cold_since.get_or_insert_with(Instant::now);
            attempts += 1;
            let outcome =
                tokio::time::timeout(self.load_timeout, waiting.wait_for(Option::is_some)).await;
            match outcome {
                Err(_) => {
                    return Err(GatewayError::LoadTimeout {
                        model: model.name.clone(),
                        after: self.load_timeout,
                    });
                }
                Ok(Ok(result)) => {
                    if let Some(Err(reason)) = result.clone()
                        && attempts >= self.max_attempts
                    {
                        return Err(GatewayError::LoadFailed {
                            model: model.name.clone(),
                            reason: reason.to_string(),
                            retry_after: Duration::from_secs(1),
                        });
                    }
                }
                // The load task ended without a word (it panicked): decide again.
                Ok(Err(_)) => {}
            }
        }
    }

    /// What a request for `model` should do now. The warm path takes one lock and no
    /// estimate; a miss estimates the model's size outside the lock, then decides.
    fn decide(
        &self,
        model: &ModelRef,
        sequence: Option<&SequenceRef>,
        allow_evict: bool,
    ) -> Decision {
        let view = self.view(&model.name);
        if let Some(hit) = self.books().hit_for(model, sequence, &view, Instant::now()) {
            return hit;
        }
        if self.registry().is_some_and(|r| !r.reachable()) {
            return Decision::Refuse(GatewayError::RegistryUnreachable {
                model: model.name.clone(),
            });
        }
        let sizing = self.sizing_for(&model.name, &view);
        let pinned = self.pinned.contains(&model.name);
        self.books().decide_for(
            model,
            sequence,
            &sizing,
            &view,
            (pinned, allow_evict),
            Instant::now(),
        )
    }

    /// How `model` is sized; a model no backend knows yet is sized by default.
    fn sizing_for(&self, model: &str, view: &[BackendView]) -> Sizing {
        if view.iter().any(|v| v.knows) {
            self.estimator.sizing(model)
        } else {
            self.estimator.unread()
        }
    }

    /// Carries out a load plan: unload the victims, load the model (one of
    /// `max_loading_concurrency` slots on the backend), record the outcome, tell the waiters.
    async fn run_load(self: Arc<Self>, plan: LoadPlan, priority: Priority) {
        if !self.agree_plan(&plan).await {
            // Dropping the plan tells its waiters to decide again, on the registry's books;
            // the copy it booked goes first, or they would wait on it for ever.
            self.books().abandon(&plan, Instant::now());
            return;
        }
        let backend = self.pool.backends()[plan.backend].clone();
        // The decision already changed the books (a loading copy, victims taken off).
        self.publish_usage(plan.backend);
        let _slot = backend.load_slots.acquire(priority).await;
        let _changing = backend.start_change();
        // The victims go first, all at once, and the load starts once Triton has let them
        // go: the backend never holds more than its capacity.
        let unloads = plan.evict.iter().map(|victim| {
            metrics::counter!(telemetry::PLACEMENT_EVICTIONS, "backend" => backend.name.clone())
                .increment(1);
            metrics::histogram!(telemetry::PLACEMENT_EVICTED_IDLE)
                .record(victim.idle.as_secs_f64());
            self.unload_on(plan.backend, &victim.model, "evict")
        });
        futures_util::future::join_all(unloads).await;
        let started = Instant::now();
        let outcome = self.measured_load(&plan, &backend).await;
        let serving = if outcome.is_ok() {
            let (serving, ()) = tokio::join!(
                self.serving_after_load(&backend, &plan.model),
                self.learn_sequencing(&backend, &plan.model)
            );
            serving
        } else {
            None
        };
        let result = if outcome.is_ok() {
            "success"
        } else {
            "failure"
        };
        metrics::counter!(telemetry::PLACEMENT_LOADS, "backend" => backend.name.clone(),
            "reason" => plan.reason.as_str(), "result" => result)
        .increment(1);
        metrics::histogram!(telemetry::PLACEMENT_LOAD_DURATION)
            .record(started.elapsed().as_secs_f64());
        match &outcome {
            Ok(()) => {
                tracing::info!(model = plan.model, backend = %backend.name, versions = %plan.versions,
                    reason = plan.reason.as_str(), evicted = plan.evict.len(),
                    load_ms = started.elapsed().as_millis() as u64, "model loaded");
                let _ = self.events.send(ModelEvent::Loaded(plan.model.clone()));
            }
            Err(reason) => {
                tracing::warn!(model = plan.model, backend = %backend.name, versions = %plan.versions,
                    %reason, "model failed to load")
            }
        }
        let took = started.elapsed();
        let group = if outcome.is_ok() {
            self.group(&plan)
        } else {
            None
        };
        let parts_added = {
            let mut books = self.books();
            if outcome.is_ok() && plan.reason == LoadReason::New {
                books.learn_load_time(&plan.model, took);
            }
            books.finish_load(plan.backend, &plan.model, &outcome, Instant::now());
            if let Some(serving) = serving {
                books.set_serving(plan.backend, &plan.model, serving);
            }
            group.map_or_else(Vec::new, |(own, parts)| {
                books.hold_parts(plan.backend, (&plan.model, own), &parts, Instant::now())
            })
        };
        for part in &parts_added {
            tracing::info!(model = part, ensemble = plan.model, backend = %backend.name,
                "loaded as a part of an ensemble");
            self.settle_copy(plan.backend, part, None);
        }
        self.publish_usage(plan.backend);
        self.settle_load(&plan);
        let failed = outcome.is_err();
        let _ = plan.done.send(Some(outcome));
        if failed {
            // A new copy that failed has left the books: its bytes are free.
            self.offer_room(plan.backend);
        }
    }

    /// For an ensemble: its own estimate, and the sizing of each model it runs (read outside
    /// the books' lock, as sizing may read the disk); `None` for any other model.
    fn group(&self, plan: &LoadPlan) -> Option<(estimate::Estimate, Vec<(String, Sizing)>)> {
        let parts = self.estimator.parts(&plan.model);
        if parts.is_empty() {
            return None;
        }
        let sizing = self.estimator.sizing(&plan.model).without_parts();
        let parts = parts
            .iter()
            .filter(|part| **part != plan.model)
            .map(|part| (part.clone(), self.estimator.sizing(part)))
            .collect();
        Some((sizing.estimate(&plan.versions), parts))
    }

    /// Reads whether the model has sequence batching, and its idle timeout, from its config
    /// on a backend that serves it: before any request is told of a load, so a sequence
    /// model's first requests are already read for their sequence ids.
    async fn learn_sequencing(&self, backend: &Backend, model: &str) {
        let answer = TritonClient::new(backend, Duration::from_secs(2))
            .model_config(model, None)
            .await;
        match answer {
            Ok(body) => {
                if let Some(idle) = sequences::sequencing_of(&body) {
                    self.books().learn_sequencing(model, idle);
                }
            }
            Err(TritonError::Refused { status, .. }) => {
                tracing::debug!(model, backend = %backend.name, %status, "model config not read")
            }
            Err(error) => {
                tracing::debug!(model, backend = %backend.name, %error, "model config not read")
            }
        }
    }

    /// The versions the backend's index shows READY for the model, read again after a load
    /// so that no request is told of the load before the index knows it.
    async fn serving_after_load(&self, backend: &Backend, model: &str) -> Option<BTreeSet<u64>> {
        match crate::upstream::refresh_index(backend, Duration::from_secs(2)).await {
            Ok(()) => Some(backend.index().ready_versions(model)),
            Err(reason) => {
                tracing::warn!(backend = %backend.name, %reason, "index refresh after a load failed");
                None
            }
        }
    }

    /// Loads, and learns the model's size per version: what Triton's statistics report in
    /// `memory_usage`, where the backend measures the model; else, where the backend reports
    /// memory and no other load ran beside this one, the rise of the memory metric (new
    /// copies only: a reload's rise is a part of the model, and its old versions go
    /// meanwhile). A load that failed for lack of memory raises the estimate before anyone
    /// decides again, so the retry goes where the larger size fits.
    async fn measured_load(&self, plan: &LoadPlan, backend: &Arc<Backend>) -> Result<(), Arc<str>> {
        let model = plan.model.as_str();
        let running = &backend.loads_running;
        let alone_at_start = running.fetch_add(1, Ordering::AcqRel) == 0;
        let timeout = Duration::from_secs(2);
        // An ensemble's load is its parts' too: the rise is not the ensemble's own size.
        let measured = plan.reason == LoadReason::New && self.estimator.parts(model).is_empty();
        let before = if alone_at_start && measured {
            metrics_scrape::read_sum(backend, &self.memory_metric, timeout).await
        } else {
            None
        };
        let outcome = self.load_on(backend, plan).await;
        let alone_at_end = running.load(Ordering::Acquire) == 1;
        let learned = match &outcome {
            Ok(()) => match self.reported_size(backend, plan).await {
                Some(per_version) => Some((per_version, SizeSource::Reported)),
                None if alone_at_end => (self.metric_rise(backend, plan, before).await)
                    .map(|per_version| (per_version, SizeSource::Learned)),
                None => None,
            },
            Err(reason) if estimate::is_out_of_memory(reason) => {
                self.raise_after_out_of_memory(plan, backend);
                None
            }
            Err(_) => None,
        };
        if let Some((per_version, source)) = learned {
            self.estimator.learn_from(model, per_version, source);
            let estimate = self.estimator.sizing(model).estimate(&plan.versions);
            self.books().resize(plan.backend, model, estimate);
            tracing::info!(model, backend = %backend.name, per_version, ?source, "learned model size");
        }
        running.fetch_sub(1, Ordering::AcqRel);
        outcome
    }

    /// The bytes per version Triton's statistics report for the versions the load brought
    /// (their mean), or `None` when it reports none for them (the python backend on CPU).
    async fn reported_size(&self, backend: &Backend, plan: &LoadPlan) -> Option<u64> {
        let answer = TritonClient::new(backend, Duration::from_secs(2))
            .model_statistics(Some((&plan.model, None)))
            .await
            .ok()?;
        let reported = estimate::reported_sizes(&answer, &plan.model, &self.memory_metric);
        let sizes: Vec<u64> = plan
            .serving
            .iter()
            .filter_map(|v| reported.get(v).copied())
            .collect();
        (!sizes.is_empty()).then(|| sizes.iter().sum::<u64>() / sizes.len() as u64)
    }

    /// How far the memory metric rose from `before` (read before the load) to now, per
    /// version the load brought.
    async fn metric_rise(
        &self,
        backend: &Backend,
        plan: &LoadPlan,
        before: Option<f64>,
    ) -> Option<u64> {
        let before = before?;
        let timeout = Duration::from_secs(2);
        let after = metrics_scrape::read_sum(backend, &self.memory_metric, timeout).await?;
        let versions = plan.serving.len().max(1) as u64;
        (after > before).then_some((after - before) as u64 / versions)
    }

    /// A load failed for lack of memory: the model's estimate rises (doubles, up to the
    /// largest backend's usable bytes; see `Estimator::raise_after_out_of_memory`).
    fn raise_after_out_of_memory(&self, plan: &LoadPlan, backend: &Backend) {
        let largest = self
            .books()
            .backends()
            .iter()
            .map(|b| b.usable)
            .max()
            .unwrap_or(0);
        let raised = self
            .estimator
            .raise_after_out_of_memory(&plan.model, &plan.versions, largest);
        match raised {
            Some(estimate) => tracing::warn!(model = plan.model, backend = %backend.name,
                bytes = estimate.bytes, "load ran out of memory: estimate raised"),
            None => tracing::warn!(model = plan.model, backend = %backend.name,
                "load ran out of memory; the estimate stays (set by config, or the largest backend's size)"),
        }
    }

    /// `POST .../load` for the plan's versions, within `load_timeout`. A new copy whose load
    /// times out is undone; a reloaded one is left serving what it served.
    async fn load_on(&self, backend: &Arc<Backend>, plan: &LoadPlan) -> Result<(), Arc<str>> {
        let model = plan.model.as_str();
        let body = self.load_body(plan)?;
        let answer = TritonClient::new(backend, self.load_timeout)
            .load(model, body)
            .await;
        if let Err(error) = &answer
            && error.timed_out()
            && plan.reason == LoadReason::New
        {
            // Never on the books as loaded: nothing departs.
            self.send_unload(backend, model, "abandon").await;
        }
        answer.map_err(|error| error.reason().into())
    }

    /// The body of a load: the model's config override when it has one (with the versions
    /// named, for chosen versions); else a plain load for the default policy (Triton reads
    /// config.pbtxt, and a newer version directory replaces the old version), or the whole
    /// config.pbtxt with the versions named. A copy that served an override is loaded with
    /// its config.pbtxt written out: Triton keeps an override in force through a plain load.
    /// The copy's books record which override this load sends.
    fn load_body(&self, plan: &LoadPlan) -> Result<Bytes, Arc<str>> {
        let config = self.specs.config(&plan.model);
        let had = self
            .books()
            .swap_config(plan.backend, &plan.model, config.clone());
        let versions: Vec<u64> = plan.serving.iter().copied().collect();
        let versions = (!plan.versions.is_default()).then_some(versions.as_slice());
        let source = match &config {
            Some(text) => model_config::Source::Override(text),
            None if versions.is_none() && had.is_none() => {
                return Ok(Bytes::from_static(b"{}"));
            }
            None => model_config::Source::Repository(self.repository.as_deref().ok_or_else(|| {
                Arc::<str>::from("loading chosen versions, or going back to the repository's config after an override, needs placement.model_repository (the model's config.pbtxt)")
            })?),
        };
        model_config::load_body(source, &plan.model, versions)
            .map(Bytes::from)
            .map_err(Arc::from)
    }

    /// Unloads a copy the books have taken off (it departs, see `Books::departing`) from
    /// backend `b`: `POST .../unload`, then Triton's index is followed until the model has
    /// gone (Triton answers at once and unloads for a second or more), and only then are its
    /// bytes free on the books. An unload that fails frees them at once: reconciliation
    /// adopts the copy again if the backend still has it.
    async fn unload_on(&self, b: usize, model: &str, reason: &'static str) {
        let backend = self.pool.backends()[b].clone();
        let _changing = backend.start_change();
        if self.send_unload(&backend, model, reason).await {
            self.await_departure(&backend, model).await;
        }
        self.books().departed(b, model, Instant::now());
        self.settle_copy(b, model, Some(registry::SharedState::Departing));
        let _ = self.events.send(ModelEvent::Unloaded(model.to_string()));
    }

    /// `POST .../unload`; true when the backend took it. Failures are logged and counted.
    async fn send_unload(&self, backend: &Backend, model: &str, reason: &'static str) -> bool {
        let answer = TritonClient::new(backend, self.load_timeout)
            .unload(model)
            .await;
        let result = match &answer {
            Ok(()) => "success",
            Err(_) => "failure",
        };
        metrics::counter!(telemetry::PLACEMENT_UNLOADS, "backend" => backend.name.clone(), "reason" => reason, "result" => result)
            .increment(1);
        match answer {
            Ok(()) => {
                tracing::info!(model, backend = %backend.name, reason, "model unloaded");
                return true;
            }
            Err(error) => tracing::warn!(model, backend = %backend.name,
                error = error.reason(), "unload failed"),
        }
        false
    }

    /// Reads the backend's index, more and more slowly, until it holds the model no more
    /// (no version READY, LOADING or UNLOADING), the backend is out of service, or
    /// `load_timeout` passes.
    async fn await_departure(&self, backend: &Backend, model: &str) {
        let deadline = Instant::now() + self.load_timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            let read = crate::upstream::refresh_index(backend, Duration::from_secs(2)).await;
            if read.is_ok() && !backend.index().holds(model) {
                return;
            }
            if !backend.is_ready() || backend.is_retired() {
                return;
            }
            if Instant::now() + pause > deadline {
                tracing::warn!(model, backend = %backend.name,
                    "the backend still holds an unloaded model after placement.load_timeout; its room is counted free again");
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(320));
        }
    }

    /// Unloads a model from every backend (in-flight requests finish first: Triton waits for
    /// them). Returns how many copies were unloaded. Requests load it again (the admin API).
    pub async fn unload(&self, model: &str) -> usize {
        let backends = self.books().remove_everywhere(model, Instant::now());
        self.unload_from(&backends, model, "request").await;
        backends.len()
    }

    /// Unloads a model the books no longer hold from each of `backends`, and says so.
    async fn unload_from(&self, backends: &[usize], model: &str, reason: &'static str) {
        for &b in backends {
            if !self.agree_departure(b, model).await {
                continue;
            }
            self.unload_on(b, model, reason).await;
            self.publish_usage(b);
        }
    }

    /// Whether the books hold a copy of `model` (loaded for one of `versions`, when given).
    pub fn holds(&self, model: &str, versions: Option<&BTreeSet<u64>>) -> bool {
        self.books().backends().iter().any(|books| {
            books
                .copies
                .get(model)
                .is_some_and(|copy| versions.is_none_or(|v| !copy.versions.pinned.is_disjoint(v)))
        })
    }

    /// A request's backend said it has no such model (or none ready) before doing any work:
    /// the books were wrong about that copy. It is taken off (reconciliation adopts it
    /// again should the backend report it READY after all), so that placing the request
    /// again finds another copy or loads one.
    pub fn copy_gone(&self, lease: &Lease) {
        let dropped = self
            .books()
            .copy_gone(lease.backend, &lease.model, Instant::now());
        let backend = &lease.backend().name;
        metrics::counter!(telemetry::PLACEMENT_STALE_COPIES, "backend" => backend.clone())
            .increment(1);
        tracing::warn!(
            model = lease.model,
            backend,
            dropped,
            "the backend does not have a copy the books had; placing the request again"
        );
        if dropped {
            let _ = self.events.send(ModelEvent::Unloaded(lease.model.clone()));
            self.publish_usage(lease.backend);
            self.settle_copy(
                lease.backend,
                &lease.model,
                Some(registry::SharedState::Ready),
            );
        }
    }

    /// Unloads every copy of a model no route uses any more, if no request holds one (the
    /// gateway's own leases: a request may hold one before it reaches Triton) and no load
    /// of it runs. Returns how many copies were unloaded, or `None` while it is busy.
    pub async fn unload_if_idle(&self, model: &str) -> Option<usize> {
        let backends = self.books().take_if_idle(model, Instant::now())?;
        self.unload_from(&backends, model, "unrouted").await;
        Some(backends.len())
    }

    /// Loads each copy serving one of the numbered `versions` (which no route uses any more)
    /// again without them, or unloads it when it served nothing else, once no request holds
    /// one of them. Returns false, doing nothing, while one is held or a load of the model
    /// runs.
    pub async fn drop_versions_if_idle(
        self: &Arc<Self>,
        model: &str,
        versions: &BTreeSet<u64>,
    ) -> bool {
        let sizing = self.estimator.sizing(model);
        let Some(narrowed) = self
            .books()
            .narrow(model, versions, &sizing, Instant::now())
        else {
            return false;
        };
        for step in narrowed {
            match step {
                Narrowed::Unload(b) => self.unload_from(&[b], model, "unrouted").await,
                Narrowed::Load(plan) => self.clone().run_load(plan, Priority::Background).await,
            }
        }
        true
    }

    /// Loads pinned models (`min_copies` copies each, evicting if need be) and preload models
    /// (one copy, free space only) at start. Failures are logged; requests will retry them.
    pub async fn warm_up(self: &Arc<Self>, preload: Vec<String>) {
        let mut pinned: Vec<(&String, &usize)> =
            self.min_copies.iter().filter(|(_, n)| **n > 0).collect();
        pinned.sort();
        for (model, &copies) in pinned {
            match self.acquire(&ModelRef::new(model.clone(), None)).await {
                Ok(_) => tracing::info!(model, "loaded at start"),
                Err(error) => tracing::warn!(model, %error, "not loaded at start"),
            }
            for _ in 1..copies {
                self.add_copy(model, true).await;
            }
        }
        for model in preload {
            match self
                .acquire_with(&ModelRef::new(model.clone(), None), None, false, None)
                .await
            {
                Ok(_) => tracing::info!(model, "preloaded"),
                Err(error) => tracing::info!(model, %error, "not preloaded"),
            }
        }
    }

    /// Loads one more copy of a model on a backend that lacks it, and waits for it.
    async fn add_copy(self: &Arc<Self>, model: &str, allow_evict: bool) -> bool {
        let sizing = self.estimator.sizing(model);
        let view = self.view(model);
        let plan = self
            .books()
            .plan_extra_copy(model, &sizing, &view, allow_evict, Instant::now());
        let Some(plan) = plan else { return false };
        let mut done = plan.done.subscribe();
        self.clone().run_load(plan, Priority::Background).await;
        matches!(
            done.wait_for(Option::is_some).await.as_deref(),
            Ok(Some(Ok(())))
        )
    }

    /// Runs `rebalance` every `rebalance_interval` until `shutdown`.
    pub async fn rebalance_loop(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let mut last = HashMap::new();
        let mut ticker = tokio::time::interval(self.scaling.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => self.rebalance(&mut last).await,
            }
        }
    }

    /// Gives a model another copy when each copy served more than `scale_up_rps` since the
    /// last round, or when more than `scale_up_queue` requests wait per copy in the
    /// backends' own queues (what other replicas send counts too); free space only, up to
    /// `max_copies`. Unloads copies beyond a model's first (or its `min_copies`) that have
    /// been idle for `scale_down_idle`.
    async fn rebalance(self: &Arc<Self>, last: &mut HashMap<String, u64>) {
        if !self.runs_housekeeping() {
            return;
        }
        // Sequences idle past their timeout no longer hold their copies.
        self.books().expire_sequences(Instant::now());
        let seconds = self.scaling.interval.as_secs_f64();
        let demand = self.books().demand();
        let mut hot = Vec::new();
        for (model, (copies, served)) in &demand {
            let previous = last.insert(model.clone(), *served).unwrap_or(*served);
            let rate = served.saturating_sub(previous) as f64 / seconds / *copies as f64;
            let max = self
                .max_copies
                .get(model)
                .copied()
                .unwrap_or(self.scaling.max_copies);
            let busy = self.scaling.up_rps > 0.0 && rate > self.scaling.up_rps;
            let queued = self.queued(model) / *copies as f64;
            let backed_up = self.scale_up_queue > 0.0 && queued > self.scale_up_queue;
            if (busy || backed_up) && *copies < max {
                hot.push((model.clone(), rate, queued));
            }
        }
        last.retain(|model, _| demand.contains_key(model));
        for (model, rate, queued) in hot {
            tracing::info!(
                model,
                rps_per_copy = rate,
                queued_per_copy = queued,
                "model is busy: adding a copy"
            );
            if !self.add_copy(&model, false).await {
                tracing::debug!(model, "no backend has free space for another copy");
            }
        }
        let keep = |model: &str| self.min_copies.get(model).copied().unwrap_or(0);
        let idle =
            self.books()
                .take_idle_extra_copies(self.scaling.down_idle, &keep, Instant::now());
        for (b, model) in idle {
            self.unload_from(&[b], &model, "idle").await;
        }
    }

    /// Requests waiting for `model` in one backend's own queue, by its fresh reading (0 with
    /// readings off).
    fn queued_on(&self, backend: &Backend, model: &str) -> usize {
        if self.queue_max_age.is_zero() {
            return 0;
        }
        backend
            .pending(model, self.queue_max_age)
            .map_or(0, |n| n as usize)
    }

    /// Requests waiting for `model` in the backends' own queues, by their fresh readings.
    fn queued(&self, model: &str) -> f64 {
        let backends = self.pool.backends();
        let waiting = backends
            .iter()
            .filter_map(|b| b.pending(model, self.queue_max_age));
        waiting.sum::<u64>() as f64
    }

    /// Runs reconciliation on start and every `reconcile_interval` until `shutdown`: each
    /// ready backend's index is read afresh, then `reconcile`. (Health checks reconcile a
    /// backend at once when it fails or comes up.)
    pub async fn reconcile_loop(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let mut ticker = tokio::time::interval(self.reconcile_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => self.reconcile_all().await,
            }
        }
    }

    async fn reconcile_all(self: &Arc<Self>) {
        for (i, backend) in self.pool.backends().iter().enumerate() {
            if backend.is_retired() || !backend.is_ready() {
                continue;
            }
            match crate::upstream::refresh_index(backend, Duration::from_secs(2)).await {
                Ok(()) => self.reconcile(i),
                Err(reason) => {
                    tracing::warn!(backend = %backend.name, %reason, "index read for reconciliation failed")
                }
            }
        }
    }

    /// Brings the books for one backend in line with its last health check and index, and
    /// reloads copies serving "latest" whose model has a newer version on disk.
    pub fn reconcile(self: &Arc<Self>, backend_index: usize) {
        if !self.runs_housekeeping() {
            return;
        }
        let backend = &self.pool.backends()[backend_index];
        let index = backend.index();
        let names: BTreeSet<&str> = index
            .entries()
            .iter()
            .filter(|e| e.is_ready())
            .map(|e| e.name.as_str())
            .collect();
        let ready_models: Vec<Indexed> = names
            .into_iter()
            .map(|name| Indexed {
                name: name.to_string(),
                estimate: self.estimator.estimate(name),
                serving: index.ready_versions(name),
            })
            .collect();
        let pinned = |name: &str| self.pinned.contains(name);
        let changed = self.books().reconcile(
            backend_index,
            backend.is_ready(),
            &ready_models,
            index.read_at(),
            &pinned,
            Instant::now(),
        );
        for model in &changed.adopted {
            tracing::info!(model, backend = %backend.name, "adopted a model the backend already had");
            self.settle_copy(backend_index, model, None);
        }
        for model in &changed.dropped {
            self.settle_copy(backend_index, model, Some(registry::SharedState::Ready));
        }
        let unknown: Vec<String> = {
            let books = self.books();
            changed
                .adopted
                .iter()
                .filter(|m| books.is_sequence_model(m).is_none())
                .cloned()
                .collect()
        };
        if !unknown.is_empty() {
            let placement = self.clone();
            let backend = backend.clone();
            tokio::spawn(async move {
                for model in unknown {
                    placement.learn_sequencing(&backend, &model).await;
                }
            });
        }
        for model in &changed.dropped {
            tracing::info!(model, backend = %backend.name, "model is gone from the backend");
            let _ = self.events.send(ModelEvent::Unloaded(model.clone()));
        }
        if backend.is_ready() {
            self.reload_newer_versions(backend_index);
        }
        self.publish_usage(backend_index);
    }

    /// Loads again (a plain load, or the union for a copy that also serves numbered
    /// versions) each copy serving "latest" whose model gained a newer version directory:
    /// Triton loads the new version, then unloads the old one once its requests are done.
    /// The repository is read on the blocking pool: it is often a network file system, and
    /// a slow directory listing must not stall the requests on the runtime's threads.
    fn reload_newer_versions(self: &Arc<Self>, backend_index: usize) {
        let latest = self.books().latest_copies(backend_index);
        if latest.is_empty() {
            return;
        }
        let placement = self.clone();
        tokio::spawn(async move {
            let scanner = placement.clone();
            let newer = tokio::task::spawn_blocking(move || {
                latest
                    .into_iter()
                    .filter_map(|(model, serving)| {
                        let newest = scanner.estimator.rescan(&model)?;
                        serving
                            .is_some_and(|v| v < newest)
                            .then_some((model, serving, newest))
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
            for (model, serving, newest) in newer {
                placement.reload_newer(backend_index, &model, serving, newest);
            }
        });
    }

    /// Plans loading the copy of `model` on a backend again, to serve `versions` (evicting
    /// for room if need be): what a newer version on disk and a config change both do.
    fn plan_reload(
        &self,
        backend: usize,
        model: &str,
        versions: &Versions,
    ) -> Result<LoadPlan, GatewayError> {
        let sizing = self.estimator.sizing(model);
        let view = self.view(model);
        self.books().reload_on(
            &[backend],
            model,
            (versions, &sizing),
            &view,
            true,
            Instant::now(),
        )
    }

    /// Plans and starts the reload of `model` on a backend, for a newer version on disk.
    fn reload_newer(
        self: &Arc<Self>,
        backend_index: usize,
        model: &str,
        serving: Option<u64>,
        newest: u64,
    ) {
        match self.plan_reload(backend_index, model, &Versions::latest()) {
            Ok(plan) => {
                tracing::info!(model, backend = %self.pool.backends()[backend_index].name,
                    from = serving, to = newest, "newer version on disk: reloading");
                tokio::spawn(self.clone().run_load(plan, Priority::Background));
            }
            Err(error) => {
                tracing::info!(model, %error, "newer version on disk, not reloaded yet")
            }
        }
    }

    /// Opens books for a backend a reload added to the pool (at index `backend`).
    pub fn add_backend(&self, backend: &Backend) {
        let bytes = usable_of(backend, self.sizes);
        self.books().add_backend(bytes, Instant::now());
        metrics::gauge!(telemetry::PLACEMENT_CAPACITY, "backend" => backend.name.clone())
            .set(bytes as f64);
    }

    /// Takes a backend a reload removed out of placement: its pinned models move elsewhere
    /// first (as for a drain), then it is retired (never ready again; requests on it finish)
    /// and its books are closed.
    pub async fn retire(self: &Arc<Self>, name: &str) {
        let Some(index) = self.index_of(name) else {
            return;
        };
        self.set_draining(name, true).await;
        self.pool.backends()[index].retire();
        self.reconcile(index);
        tracing::info!(backend = name, "backend removed from the pool");
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.pool
            .backends()
            .iter()
            .position(|b| b.name == name && !b.is_retired())
    }

    /// Stops (or resumes) placing models on a backend; returns false for an unknown name.
    /// Draining also moves its pinned models: each gets a copy elsewhere first, then leaves.
    pub async fn set_draining(self: &Arc<Self>, backend: &str, draining: bool) -> bool {
        let Some(index) = self.index_of(backend) else {
            return false;
        };
        let pinned_here = {
            let mut books = self.books();
            books.set_draining(index, draining);
            books.pinned_on(index)
        };
        if draining {
            for model in pinned_here {
                if self.add_copy(&model, true).await {
                    if self.books().remove_copy(index, &model, Instant::now()) {
                        self.unload_on(index, &model, "drain").await;
                    }
                } else {
                    tracing::warn!(
                        model,
                        backend,
                        "no other backend can take this pinned model; it stays"
                    );
                }
            }
            self.publish_usage(index);
        }
        true
    }

    /// Sets a backend's placement gauges from the books: after every change to what is
    /// loaded there, and (through `publish_gauges`) at each scrape, since the LRU age grows
    /// while nothing changes.
    fn publish_usage(&self, backend: usize) {
        let (used, loading, copies, lru) = {
            let books = self.books();
            let (used, loading, copies) = books.usage(backend);
            (
                used,
                loading,
                copies,
                books.lru_age(backend, Instant::now()),
            )
        };
        let name = self.pool.backends()[backend].name.clone();
        metrics::gauge!(telemetry::PLACEMENT_USED, "backend" => name.clone()).set(used as f64);
        metrics::gauge!(telemetry::PLACEMENT_LOADING, "backend" => name.clone())
            .set(loading as f64);
        metrics::gauge!(telemetry::PLACEMENT_MODELS, "backend" => name.clone()).set(copies as f64);
        metrics::gauge!(telemetry::PLACEMENT_LRU_AGE, "backend" => name).set(lru.as_secs_f64());
    }

    /// Brings every backend's placement gauges up to date, for a scrape.
    pub fn publish_gauges(&self) {
        for (index, backend) in self.pool.backends().iter().enumerate() {
            if !backend.is_retired() {
                self.publish_usage(index);
            }
        }
    }

    /// The admin view: every backend's books and every failing load.
    pub fn snapshot(&self) -> serde_json::Value {
        let now = Instant::now();
        let books = self.books();
        let backends: Vec<_> = books
            .backends()
            .iter()
            .zip(self.pool.backends().iter())
            .filter(|(_, backend)| !backend.is_retired())
            .map(|(b, backend)| {
                let mut models: Vec<_> = b
                    .copies
                    .iter()
                    .map(|(name, c)| {
                        serde_json::json!({
                            "name": name,
                            "size": c.size,
                            "size_source": c.source,
                            "state": match c.state {
                                table::CopyState::Ready => "ready",
                                table::CopyState::Loading(_) => "loading",
                                table::CopyState::Reloading(_) => "reloading",
                            },
                            "versions": c.serving,
                            "latest": c.versions.latest,
                            "idle_seconds": now.saturating_duration_since(c.last_used).as_secs_f64(),
                            "in_flight": c.in_flight,
                            "sequences": c.sequences,
                            "pinned": c.pinned,
                            "served": c.served,
                        })
                    })
                    .collect();
                models.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
                let mut unloading: Vec<_> = b.departing.keys().collect();
                unloading.sort();
                serde_json::json!({
                    "name": backend.name,
                    "ready": backend.is_ready(),
                    "draining": b.draining,
                    "capacity": b.usable,
                    "used": b.committed,
                    "free": b.free(),
                    "models": models,
                    "unloading": unloading,
                })
            })
            .collect();
        let failures: Vec<_> = books
            .failures(now)
            .into_iter()
            .map(|(model, b, count, retry_in, reason)| {
                serde_json::json!({
                    "model": model,
                    "backend": self.pool.backends()[b].name,
                    "failures": count,
                    "retry_in_seconds": retry_in.as_secs_f64(),
                    "error": reason.as_ref(),
                })
            })
            .collect();
        let sequences: serde_json::Map<String, serde_json::Value> = books
            .live_sequences(now)
            .into_iter()
            .map(|(model, live)| (model, live.into()))
            .collect();
        serde_json::json!({
            "policy": books.eviction_policy(),
            "backends": backends,
            "failed_loads": failures,
            "live_sequences": sequences,
        })
    }
}

/// What a backend offers models: its capacity (or the default) less the buffer kept free.
/// `placement.policy` with each model's `keep` and `cost_weight`.
fn eviction_order(policy: config::EvictionPolicy, models: &[config::Model]) -> EvictionOrder {
    let mut order = EvictionOrder::new(policy, Instant::now());
    for model in models {
        let weight = ModelWeight {
            keep: model.keep,
            cost_weight: model.cost_weight.unwrap_or(1.0),
        };
        order.weigh(&model.name, weight);
    }
    order
}

fn usable(backend: &Backend, policy: &config::Placement) -> u64 {
    usable_of(
        backend,
        (policy.default_capacity.bytes(), policy.mem_buffer.bytes()),
    )
}

fn usable_of(backend: &Backend, (default_capacity, mem_buffer): (u64, u64)) -> u64 {
    backend
        .capacity
        .unwrap_or(default_capacity)
        .saturating_sub(mem_buffer)
}
