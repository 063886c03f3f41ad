//! The discrete-event loop: requests arrive from the trace, loads finish after a
//! size-proportional time (at most `max_loading` at once per backend, the rest queued in
//! order, as `Placement::run_load` does with its semaphore), and requests hold their copy for
//! a fixed service time. Time is microseconds since the trace's start; policies see it as
//! they like (the real table as `tokio::time::Instant`s).

use super::trace::Trace;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

/// Microseconds since the start of the trace.
pub type Micros = u64;

/// The pool and the timings every policy is run with.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Usable bytes per backend (capacity minus the memory buffer).
    pub usable: Vec<u64>,
    /// The real policy's churn guard.
    pub min_churn_age: Duration,
    /// Fixed part of a load's duration.
    pub load_base: Duration,
    /// Load time per GiB of model.
    pub load_per_gib: Duration,
    /// How long a request holds its copy.
    pub service: Duration,
    /// Loads running at once per backend.
    pub max_loading: usize,
    /// The most requested models of the trace, this many, are pinned (`min_copies = 1`):
    /// placed before the first request and never evicted.
    pub pinned: usize,
    /// Share of the models (every `1/share`-th by a hash of its index) whose loads always
    /// fail, as a model with a broken config does.
    pub failing: f64,
    /// Loads one request waits on before it is refused (`placement.max_load_attempts`).
    pub max_attempts: usize,
    /// Learned sizes: every model is estimated at this many bytes until a load of it has
    /// succeeded, then at its true size, as the gateway places a model by
    /// `default_model_size` until it has measured it. `None`: the true size from the start.
    pub estimate_before_load: Option<u64>,
    /// Extra copies for busy models (`placement.scale_up_rps` and the keys beside it); `None`:
    /// one copy per model.
    pub scaling: Option<Scaling>,
}

/// When a model gets another copy, and loses it, as `Placement::rebalance` decides.
#[derive(Clone, Copy, Debug)]
pub struct Scaling {
    /// Requests per second per copy above which a model gets another copy.
    pub up_rps: f64,
    /// Copies per model at most.
    pub max_copies: usize,
    /// Extra copies idle this long go.
    pub down_idle: Duration,
    /// How often copies are counted (`placement.rebalance_interval`).
    pub every: Duration,
}

impl Setup {
    /// How long a load of `bytes` takes.
    pub fn load_time(&self, bytes: u64) -> Micros {
        let per_gib = self.load_per_gib.as_secs_f64() * bytes as f64 / (1u64 << 30) as f64;
        (self.load_base.as_micros() as u64) + (per_gib * 1e6) as u64
    }
}

/// Why a request was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Making room would evict something used within `min_churn_age`.
    Churn,
    /// No backend can free enough (the model is too big, or everything is busy or loading).
    NoRoom,
    /// The model's loads failed (or it is backing off after they did).
    LoadFailed,
    /// Anything else the table answered (should not happen with fake backends).
    Other,
}

/// What a policy tells a request to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Use the ready copy on this backend; the policy has counted the request on it.
    Serve(usize),
    /// A load of this model is under way; wait for it.
    Wait,
    /// Load the model on this backend (the policy has already taken the victims off its
    /// books and counted the new copy); wait for it.
    Load {
        /// Backend index.
        backend: usize,
        /// Copies evicted to make room.
        evicted: usize,
        /// Their idle times, summed.
        evicted_idle: Duration,
    },
    /// Answer with an error.
    Refuse(Refusal),
}

/// A placement policy under test. Every call carries the current virtual time.
pub trait Placer {
    /// Request `index` of the trace, for `model`, has arrived (called before `decide`).
    /// Only an oracle needs this.
    fn observe(&mut self, _index: usize, _model: u32) {}
    /// What a request for `model` should do now.
    fn decide(&mut self, model: u32, now: Micros) -> Step;
    /// The load of `model` on `backend` has finished, successfully or not.
    fn finish_load(&mut self, backend: usize, model: u32, ok: bool, now: Micros);
    /// Places a pinned copy of `model` before the trace starts (ready at once); its backend,
    /// or `None` when nothing has room.
    fn pin(&mut self, model: u32) -> Option<usize>;
    /// A request served by `backend` is done with its copy of `model`.
    fn release(&mut self, backend: usize, model: u32, now: Micros);
    /// Bytes committed (loaded or loading) on a backend.
    fn committed(&self, backend: usize) -> u64;
    /// A rebalancing round (`Setup::scaling`): the extra copies it started loading, as
    /// (backend, model), each already on the books; idle extra copies it took off are gone.
    fn rebalance(&mut self, _now: Micros) -> Vec<(usize, u32)> {
        Vec::new()
    }
}

/// What one policy did over one trace.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Requests in the trace.
    pub requests: u64,
    /// Served at once by a ready copy.
    pub hits: u64,
    /// Found no ready copy, waited for a load (their own or one already running), and were
    /// served.
    pub cold_misses: u64,
    /// Loads started.
    pub loads: u64,
    /// Bytes of those loads.
    pub bytes_loaded: u64,
    /// Time those loads took (each by `Setup::load_time`, slot waits not counted), in
    /// microseconds: what the misses cost the GPUs, which a policy cannot hide by reloading
    /// only small models.
    pub load_micros: u64,
    /// Copies evicted.
    pub evictions: u64,
    /// Idle time of evicted copies, summed (for the mean).
    pub evicted_idle: Duration,
    /// Refused by the churn guard.
    pub refused_churn: u64,
    /// Refused for want of room.
    pub refused_no_room: u64,
    /// Refused because the model's loads failed: after `max_attempts` failed loads, or at
    /// once while the table backs off.
    pub refused_failed: u64,
    /// Refused for another reason.
    pub refused_other: u64,
    /// Loads that failed.
    pub failed_loads: u64,
    /// Pinned copies placed before the trace.
    pub pinned: u64,
    /// Each cold miss's wait until served, in milliseconds.
    pub cold_waits_ms: Vec<u32>,
    /// Highest committed bytes per backend.
    pub peak_committed: Vec<u64>,
    /// Loads started per backend.
    pub loads_per_backend: Vec<u64>,
    /// Loads waiting for a free load slot, at most, on any backend.
    pub peak_load_queue: usize,
    /// Requests for models of `LARGE` bytes or more: size-aware policies trade their hits
    /// for the small models'.
    pub large_requests: u64,
    /// Of those, hits.
    pub large_hits: u64,
    /// Loads of extra copies for busy models (also counted in `loads`).
    pub extra_copies: u64,
    /// Loads that, once their model's true size was learned, left the backend's books over
    /// its usable capacity: on a real GPU these are the loads that run out of memory.
    pub over_capacity_loads: u64,
}

/// A model this big or bigger counts as large in `Outcome`.
pub const LARGE: u64 = 1 << 30;

impl Outcome {
    /// Hits over requests.
    pub fn hit_ratio(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }

    /// Hits over requests, for large models alone.
    pub fn large_hit_ratio(&self) -> f64 {
        if self.large_requests == 0 {
            0.0
        } else {
            self.large_hits as f64 / self.large_requests as f64
        }
    }

    /// Seconds the loads took, summed.
    pub fn load_seconds(&self) -> f64 {
        self.load_micros as f64 / 1e6
    }

    /// All refusals.
    pub fn refusals(&self) -> u64 {
        self.refused_churn + self.refused_no_room + self.refused_failed + self.refused_other
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    // Releases sort before load completions at the same instant: a request that ends as a
    // load ends has already let go of its copy.
    Release { backend: u32, model: u32 },
    LoadDone { backend: u32, model: u32, ok: bool },
    Rebalance,
}

struct Sim<'a> {
    setup: &'a Setup,
    sizes: &'a [u64],
    events: BinaryHeap<Reverse<(Micros, Event)>>,
    queued: Vec<VecDeque<u32>>,
    running: Vec<usize>,
    /// Per model, the requests waiting for its load: when each arrived, loads it waited on.
    waiters: Vec<Vec<(Micros, usize)>>,
    failing: Vec<bool>,
    /// When the last request arrives: rebalancing rounds stop there.
    end: Micros,
    out: Outcome,
}

/// Replays the trace against one policy.
pub fn run(placer: &mut dyn Placer, trace: &Trace, setup: &Setup) -> Outcome {
    let backends = setup.usable.len();
    let mut sim = Sim {
        setup,
        sizes: &trace.sizes,
        events: BinaryHeap::new(),
        queued: vec![VecDeque::new(); backends],
        running: vec![0; backends],
        waiters: vec![Vec::new(); trace.names.len()],
        failing: failing_models(trace.names.len(), setup.failing),
        end: trace.requests.last().map_or(0, |r| r.at_ms * 1000),
        out: Outcome {
            peak_committed: vec![0; backends],
            loads_per_backend: vec![0; backends],
            ..Outcome::default()
        },
    };
    for model in most_requested(trace, setup.pinned) {
        if let Some(backend) = placer.pin(model) {
            sim.out.pinned += 1;
            let committed = placer.committed(backend);
            sim.out.peak_committed[backend] = sim.out.peak_committed[backend].max(committed);
        }
    }
    if let Some(scaling) = setup.scaling {
        let first = scaling.every.as_micros() as Micros;
        sim.events.push(Reverse((first, Event::Rebalance)));
    }
    for (index, request) in trace.requests.iter().enumerate() {
        let now = request.at_ms * 1000;
        sim.advance(placer, now);
        placer.observe(index, request.model);
        sim.out.requests += 1;
        sim.out.large_requests += u64::from(sim.sizes[request.model as usize] >= LARGE);
        sim.dispatch(placer, request.model, (now, 0), now, true);
    }
    sim.advance(placer, Micros::MAX);
    sim.out
}

impl Sim<'_> {
    /// Handles every event up to and including `until`.
    fn advance(&mut self, placer: &mut dyn Placer, until: Micros) {
        while let Some(&Reverse((at, event))) = self.events.peek() {
            if at > until {
                break;
            }
            self.events.pop();
            match event {
                Event::Release { backend, model } => placer.release(backend as usize, model, at),
                Event::Rebalance => self.rebalance(placer, at),
                Event::LoadDone { backend, model, ok } => {
                    let backend = backend as usize;
                    placer.finish_load(backend, model, ok, at);
                    // A learned size may have grown the copy on the books, past capacity.
                    let committed = placer.committed(backend);
                    let peak = &mut self.out.peak_committed[backend];
                    *peak = (*peak).max(committed);
                    self.out.over_capacity_loads +=
                        u64::from(ok && committed > self.setup.usable[backend]);
                    self.out.failed_loads += u64::from(!ok);
                    self.running[backend] -= 1;
                    if let Some(next) = self.queued[backend].pop_front() {
                        self.start_load(backend, next, at);
                    }
                    // Everyone who waited on this load decides again, as `acquire` does,
                    // until one has waited on `max_attempts` failed loads.
                    for (arrived, failed) in std::mem::take(&mut self.waiters[model as usize]) {
                        let failed = failed + usize::from(!ok);
                        if failed >= self.setup.max_attempts {
                            self.out.refused_failed += 1;
                        } else {
                            self.dispatch(placer, model, (arrived, failed), at, false);
                        }
                    }
                }
            }
        }
    }

    /// One decision for a request that arrived at `arrived` and has waited on `failed`
    /// failed loads; `fresh` is its first.
    fn dispatch(
        &mut self,
        placer: &mut dyn Placer,
        model: u32,
        (arrived, failed): (Micros, usize),
        now: Micros,
        fresh: bool,
    ) {
        match placer.decide(model, now) {
            Step::Serve(backend) => {
                if fresh {
                    self.out.hits += 1;
                    self.out.large_hits += u64::from(self.sizes[model as usize] >= LARGE);
                } else {
                    self.out.cold_misses += 1;
                    let waited_ms = (now - arrived) / 1000;
                    self.out
                        .cold_waits_ms
                        .push(waited_ms.min(u32::MAX as u64) as u32);
                }
                let done = now + self.setup.service.as_micros() as u64;
                self.events.push(Reverse((
                    done,
                    Event::Release {
                        backend: backend as u32,
                        model,
                    },
                )));
            }
            Step::Wait => {
                self.waiters[model as usize].push((arrived, failed));
            }
            Step::Load {
                backend,
                evicted,
                evicted_idle,
            } => {
                self.count_load(placer, backend, model);
                self.out.evictions += evicted as u64;
                self.out.evicted_idle += evicted_idle;
                self.waiters[model as usize].push((arrived, failed));
                self.load_or_queue(backend, model, now);
            }
            Step::Refuse(why) => match why {
                Refusal::Churn => self.out.refused_churn += 1,
                Refusal::NoRoom => self.out.refused_no_room += 1,
                Refusal::LoadFailed => self.out.refused_failed += 1,
                Refusal::Other => self.out.refused_other += 1,
            },
        }
    }

    /// A rebalancing round: extra copies start loading (or queue for a slot), and the next
    /// round is due while requests still come.
    fn rebalance(&mut self, placer: &mut dyn Placer, now: Micros) {
        for (backend, model) in placer.rebalance(now) {
            self.out.extra_copies += 1;
            self.count_load(placer, backend, model);
            self.load_or_queue(backend, model, now);
        }
        let every = self
            .setup
            .scaling
            .map_or(0, |s| s.every.as_micros() as Micros);
        if every > 0 && now + every <= self.end {
            self.events.push(Reverse((now + every, Event::Rebalance)));
        }
    }

    /// Counts a load the placer has put on the books.
    fn count_load(&mut self, placer: &dyn Placer, backend: usize, model: u32) {
        self.out.loads += 1;
        self.out.loads_per_backend[backend] += 1;
        self.out.bytes_loaded += self.sizes[model as usize];
        self.out.load_micros += self.setup.load_time(self.sizes[model as usize]);
        let committed = placer.committed(backend);
        let peak = &mut self.out.peak_committed[backend];
        *peak = (*peak).max(committed);
    }

    /// Starts a load in a free slot of the backend, or queues it for one.
    fn load_or_queue(&mut self, backend: usize, model: u32, now: Micros) {
        if self.running[backend] < self.setup.max_loading {
            self.start_load(backend, model, now);
        } else {
            self.queued[backend].push_back(model);
            self.out.peak_load_queue = self.out.peak_load_queue.max(self.queued[backend].len());
        }
    }

    fn start_load(&mut self, backend: usize, model: u32, now: Micros) {
        self.running[backend] += 1;
        let done = now + self.setup.load_time(self.sizes[model as usize]);
        self.events.push(Reverse((
            done,
            Event::LoadDone {
                backend: backend as u32,
                model,
                ok: !self.failing[model as usize],
            },
        )));
    }
}

/// The `count` models with the most requests in the trace (ties to the lower index).
fn most_requested(trace: &Trace, count: usize) -> Vec<u32> {
    let mut requests = vec![0u64; trace.names.len()];
    for request in &trace.requests {
        requests[request.model as usize] += 1;
    }
    let mut models: Vec<u32> = (0..trace.names.len() as u32).collect();
    models.sort_by_key(|&m| std::cmp::Reverse(requests[m as usize]));
    models.truncate(count);
    models
}

/// Which models always fail to load: a share of them, spread by a hash of the index so
/// that neither popularity nor size decides.
fn failing_models(models: usize, share: f64) -> Vec<bool> {
    (0..models as u64)
        .map(|m| {
            let hash = m.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
            (hash as f64 / (1u64 << 53) as f64) < share
        })
        .collect()
}
