//! Placement: which Triton has which model loaded, decided by infergate alone.
//!
//! A request for a model no backend has is a cold miss: a backend is chosen (room first, else
//! the least recently used victims), evicted models are unloaded, the model is loaded, and
//! every request that arrived meanwhile waits on that one load. The books (`table`) are the
//! single truth, kept in line with each backend's repository index by `reconcile`.

mod agree;
mod control;
pub(crate) mod estimate;
mod housekeeping;
mod loading;
mod located;
mod model_config;
pub(crate) mod policy;
mod pool;
pub mod registry;
mod room;
pub mod sequences;
mod sketch;
mod spec;
pub(crate) mod table;
mod unloading;
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
use smallvec::SmallVec;
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

    /// Each backend as placing `model` sees it, in pool order: a request's, so it stays off
    /// the heap for pools of up to `VIEW_INLINE` backends.
    fn view(&self, model: &str) -> SmallVec<[BackendView; VIEW_INLINE]> {
        self.pool
            .backends()
            .iter()
            .map(|backend| {
                let knows = backend.knows(model);
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

    /// Flow control's slots for `model`: `slots(in_flight, pending)` for each copy on the
    /// books (loading ones too), summed; one copy's, with nothing on it, while there is
    /// none. `in_flight`: this gateway's requests on the copy; `pending`: the requests its
    /// Triton reports waiting for the model, by a reading younger than
    /// `placement.queue_max_age` (`None`: no such reading, or readings off). Takes the
    /// books' lock: read only when the model's slots are all taken.
    pub fn flow_slots(&self, model: &str, slots: impl Fn(usize, Option<u64>) -> usize) -> usize {
        let backends = self.pool.backends();
        let pending = |b: usize| {
            let backend = backends.get(b).filter(|_| !self.queue_max_age.is_zero())?;
            backend.pending(model, self.queue_max_age)
        };
        let books = self.books();
        let mut copies = books.in_flight_per_copy(model).peekable();
        if copies.peek().is_none() {
            return slots(0, None);
        }
        copies
            .map(|(b, in_flight)| slots(in_flight, pending(b)))
            .sum()
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

    /// The one walk behind `acquire` and `acquire_in`: decide, and until a decision serves,
    /// wait for room or for a load and decide again. Each round's outcome is handled by one
    /// of the helpers below.
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
            let waiting = match decision {
                Decision::Serve(backend) => return Ok(self.lease(model, backend, cold_since)),
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
            self.wait_for_load(model, waiting, attempts).await?;
        }
    }

    /// The lease on the copy a decision serves from; a request that went through a cold
    /// miss records how long it waited.
    fn lease(
        self: &Arc<Self>,
        model: &ModelRef,
        backend: usize,
        cold_since: Option<Instant>,
    ) -> Lease {
        if let Some(since) = cold_since {
            metrics::histogram!(telemetry::PLACEMENT_COLD_WAIT)
                .record(since.elapsed().as_secs_f64());
        }
        let in_flight = self.pool.backends()[backend].start_request();
        Lease {
            placement: self.clone(),
            backend,
            model: model.name.clone(),
            // `Serve` only follows a version that parsed.
            version: model.version_number().ok().flatten(),
            in_flight,
        }
    }

    /// Waits for a load this request joined (its `attempts`-th), up to `load_timeout`.
    /// `Ok` means decide again: the load ended, or failed with attempts left, or its task
    /// ended without a word.
    async fn wait_for_load(
        &self,
        model: &ModelRef,
        mut waiting: tokio::sync::watch::Receiver<table::LoadOutcome>,
        attempts: usize,
    ) -> Result<(), GatewayError> {
        let outcome =
            tokio::time::timeout(self.load_timeout, waiting.wait_for(Option::is_some)).await;
        match outcome {
            Err(_) => Err(GatewayError::LoadTimeout {
                model: model.name.clone(),
                after: self.load_timeout,
            }),
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
                Ok(())
            }
            // The load task ended without a word (it panicked): decide again.
            Ok(Err(_)) => Ok(()),
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
}

/// Backends a request's view of the pool holds without a heap allocation.
const VIEW_INLINE: usize = 16;

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
