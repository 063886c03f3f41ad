//! The policies the simulator compares: infergate's own `Table` (the code the gateway runs,
//! called exactly as `Placement::acquire` calls it), and two baselines kept here — plain
//! per-instance LRU, as ModelMesh does it, and Belady's furthest-next-use oracle.

use super::engine::{Micros, Placer, Refusal, Setup, Step};
use super::trace::Trace;
use infergate::internals::{
    BackendView, Decision, Estimate, EvictionOrder, EvictionPolicy, GatewayError, ModelRef, Policy,
    SizeSource, Table,
};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

/// The real placement table over fake backends that are always ready, know every model, and
/// load whatever they are asked to.
pub struct Real {
    table: Table,
    models: Vec<ModelRef>,
    sizes: Vec<u64>,
    view: Vec<BackendView>,
    base: Instant,
    setup: Setup,
}

impl Real {
    /// Empty books over the setup's backends, evicting by `policy`.
    pub fn new(trace: &Trace, setup: &Setup, policy: EvictionPolicy) -> Self {
        let base = Instant::now();
        let order = EvictionOrder::new(policy, base);
        let rules = Policy {
            min_churn_age: setup.min_churn_age,
            backoff: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
        };
        Self {
            table: Table::new(&setup.usable, rules, base).with_order(order),
            models: trace
                .names
                .iter()
                .map(|name| ModelRef::new(name.clone(), None))
                .collect(),
            sizes: trace.sizes.clone(),
            view: vec![
                BackendView {
                    ready: true,
                    knows: true,
                    in_flight: 0,
                    queued: 0,
                };
                setup.usable.len()
            ],
            base,
            setup: setup.clone(),
        }
    }

    /// The models on each backend's books, sorted: what a test compares with the Tritons'
    /// indexes after the same trace.
    pub fn placed(&self) -> Vec<Vec<String>> {
        self.table
            .backends()
            .iter()
            .map(|books| {
                let mut names: Vec<String> = books.copies.keys().cloned().collect();
                names.sort();
                names
            })
            .collect()
    }

    fn at(&self, now: Micros) -> Instant {
        self.base + Duration::from_micros(now)
    }
}

impl Placer for Real {
    fn decide(&mut self, model: u32, now: Micros) -> Step {
        let estimate = Estimate {
            bytes: self.sizes[model as usize],
            source: SizeSource::Config,
        };
        let now = self.at(now);
        let decision = self.table.decide(
            &self.models[model as usize],
            &estimate.into(),
            &self.view,
            false,
            true,
            now,
        );
        match decision {
            Decision::Serve(backend) => {
                self.view[backend].in_flight += 1;
                Step::Serve(backend)
            }
            Decision::Wait(_) => Step::Wait,
            Decision::Load(plan) => {
                // Unloads are instant here: each victim has gone before the load starts.
                for victim in &plan.evict {
                    self.table.departed(plan.backend, &victim.model, now);
                }
                Step::Load {
                    backend: plan.backend,
                    evicted: plan.evict.len(),
                    evicted_idle: plan.evict.iter().map(|e| e.idle).sum(),
                }
            }
            Decision::Refuse(GatewayError::Churn { .. }) => Step::Refuse(Refusal::Churn),
            Decision::Refuse(GatewayError::NoRoom { .. }) => Step::Refuse(Refusal::NoRoom),
            Decision::Refuse(GatewayError::LoadFailed { .. }) => Step::Refuse(Refusal::LoadFailed),
            Decision::Refuse(_) => Step::Refuse(Refusal::Other),
        }
    }

    fn finish_load(&mut self, backend: usize, model: u32, ok: bool, now: Micros) {
        let now = self.at(now);
        let name = &self.models[model as usize].name;
        let outcome = if ok {
            // As `run_load` does: the load's own time (the slot wait is not the model's cost).
            let took = self.setup.load_time(self.sizes[model as usize]);
            self.table
                .learn_load_time(name, Duration::from_micros(took));
            Ok(())
        } else {
            Err("load failed".into())
        };
        self.table.finish_load(backend, name, &outcome, now);
    }

    /// As `Placement::warm_up` places a `min_copies` model: a pinned copy, evicting if need
    /// be, ready at once.
    fn pin(&mut self, model: u32) -> Option<usize> {
        let estimate = Estimate {
            bytes: self.sizes[model as usize],
            source: SizeSource::Config,
        };
        let now = self.at(0);
        let model = &self.models[model as usize];
        let decision = (self.table).decide(model, &estimate.into(), &self.view, true, true, now);
        let Decision::Load(plan) = decision else {
            return None;
        };
        for victim in &plan.evict {
            self.table.departed(plan.backend, &victim.model, now);
        }
        self.table
            .finish_load(plan.backend, &model.name, &Ok(()), now);
        Some(plan.backend)
    }

    fn release(&mut self, backend: usize, model: u32, now: Micros) {
        let now = self.at(now);
        self.table
            .release(backend, &self.models[model as usize].name, now);
        self.view[backend].in_flight -= 1;
    }

    fn committed(&self, backend: usize) -> u64 {
        self.table.backends()[backend].committed
    }
}

/// Which copy a baseline gives up first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Least recently used; the new copy goes to the backend with the most free space among
    /// those that can make room (ModelMesh's per-instance LRU).
    Lru,
    /// Least recently used; the new copy goes to the backend whose victims were used least
    /// recently (ModelMesh publishes each instance's LRU time for this), ties to the one
    /// with most free space. infergate's rule without its churn guard.
    LruOldestInstance,
    /// Requested furthest in the future (never, first); the new copy goes to the backend
    /// whose victims are next needed latest. Belady's rule is optimal for one cache of
    /// equal-sized items; with sizes and several backends it is the classic oracle bound,
    /// not a proven optimum.
    Belady,
}

const NOT_PLACED: u32 = u32::MAX;
const NEVER: u64 = u64::MAX;

/// Per-instance LRU or Belady, with O(log n) books: each backend keeps its evictable copies
/// (ready, no request in flight) in a set ordered by eviction priority.
pub struct Baseline {
    rule: Rule,
    usable: Vec<u64>,
    committed: Vec<u64>,
    /// Bytes of evictable copies per backend.
    evictable_bytes: Vec<u64>,
    /// (priority, model): the first is evicted first.
    evictable: Vec<BTreeSet<(u64, u32)>>,
    in_flight: Vec<usize>,
    sizes: Vec<u64>,
    /// Backend holding each model, or `NOT_PLACED` (one copy per model, as the real table).
    placed: Vec<u32>,
    loading: Vec<bool>,
    copy_in_flight: Vec<u32>,
    last_used: Vec<Micros>,
    /// The priority a model's copy is filed under in `evictable`, while it is there.
    filed: Vec<Option<u64>>,
    /// Belady: for each request index, the index of the same model's next request.
    next: Vec<u64>,
    /// Belady: each model's next request index (as of the last arrival).
    next_use: Vec<u64>,
    /// Never filed as evictable.
    pinned: Vec<bool>,
}

impl Baseline {
    /// Empty books; Belady reads the whole trace ahead.
    pub fn new(rule: Rule, trace: &Trace, setup: &Setup) -> Self {
        let n = trace.names.len();
        let backends = setup.usable.len();
        let next = if rule == Rule::Belady {
            let mut seen = vec![NEVER; n];
            let mut next = vec![NEVER; trace.requests.len()];
            for (i, r) in trace.requests.iter().enumerate().rev() {
                next[i] = seen[r.model as usize];
                seen[r.model as usize] = i as u64;
            }
            next
        } else {
            Vec::new()
        };
        Self {
            rule,
            usable: setup.usable.clone(),
            committed: vec![0; backends],
            evictable_bytes: vec![0; backends],
            evictable: vec![BTreeSet::new(); backends],
            in_flight: vec![0; backends],
            sizes: trace.sizes.clone(),
            placed: vec![NOT_PLACED; n],
            loading: vec![false; n],
            copy_in_flight: vec![0; n],
            last_used: vec![0; n],
            filed: vec![None; n],
            next,
            next_use: vec![NEVER; n],
            pinned: vec![false; n],
        }
    }

    fn priority(&self, model: u32) -> u64 {
        match self.rule {
            Rule::Lru | Rule::LruOldestInstance => self.last_used[model as usize],
            // Furthest next use first; never-again (NEVER) sorts first of all.
            Rule::Belady => NEVER - self.next_use[model as usize],
        }
    }

    fn file(&mut self, backend: usize, model: u32) {
        if self.pinned[model as usize] {
            return;
        }
        let priority = self.priority(model);
        self.evictable[backend].insert((priority, model));
        self.evictable_bytes[backend] += self.sizes[model as usize];
        self.filed[model as usize] = Some(priority);
    }

    fn unfile(&mut self, backend: usize, model: u32) {
        if let Some(priority) = self.filed[model as usize].take() {
            self.evictable[backend].remove(&(priority, model));
            self.evictable_bytes[backend] -= self.sizes[model as usize];
        }
    }

    fn free(&self, backend: usize) -> u64 {
        self.usable[backend].saturating_sub(self.committed[backend])
    }

    /// The backend for a new copy of `size` bytes and the victims to evict there.
    fn choose(&self, size: u64) -> Option<(usize, Vec<u32>)> {
        // Room without eviction: most free space, then fewest in flight; the last of equals,
        // as the real table's `max_by_key` picks.
        let roomy = (0..self.usable.len())
            .filter(|&b| self.free(b) >= size)
            .max_by_key(|&b| (self.free(b), std::cmp::Reverse(self.in_flight[b])));
        if let Some(b) = roomy {
            return Some((b, Vec::new()));
        }
        let feasible =
            (0..self.usable.len()).filter(|&b| self.free(b) + self.evictable_bytes[b] >= size);
        let backend = match self.rule {
            Rule::Lru => {
                feasible.max_by_key(|&b| (self.free(b), std::cmp::Reverse(self.in_flight[b])))?
            }
            Rule::LruOldestInstance => feasible.min_by_key(|&b| {
                let (victims, _) = self.victims(b, size);
                let youngest = victims.last().map_or(0, |&m| self.last_used[m as usize]);
                (youngest, std::cmp::Reverse(self.free(b)), self.in_flight[b])
            })?,
            Rule::Belady => feasible.max_by_key(|&b| {
                // The soonest next use among the victims this backend would give up.
                let (victims, _) = self.victims(b, size);
                let soonest = victims
                    .iter()
                    .map(|&m| self.next_use[m as usize])
                    .min()
                    .unwrap_or(NEVER);
                (soonest, self.free(b))
            })?,
        };
        let (victims, _) = self.victims(backend, size);
        Some((backend, victims))
    }

    fn victims(&self, backend: usize, size: u64) -> (Vec<u32>, u64) {
        let mut free = self.free(backend);
        let mut chosen = Vec::new();
        for &(_, model) in &self.evictable[backend] {
            if free >= size {
                break;
            }
            free += self.sizes[model as usize];
            chosen.push(model);
        }
        (chosen, free)
    }
}

impl Placer for Baseline {
    fn observe(&mut self, index: usize, model: u32) {
        if self.rule == Rule::Belady {
            self.next_use[model as usize] = self.next[index];
            let backend = self.placed[model as usize];
            if backend != NOT_PLACED && self.filed[model as usize].is_some() {
                self.unfile(backend as usize, model);
                self.file(backend as usize, model);
            }
        }
    }

    fn decide(&mut self, model: u32, now: Micros) -> Step {
        let m = model as usize;
        let backend = self.placed[m];
        if backend != NOT_PLACED {
            let backend = backend as usize;
            if self.loading[m] {
                return Step::Wait;
            }
            self.unfile(backend, model);
            self.copy_in_flight[m] += 1;
            self.in_flight[backend] += 1;
            return Step::Serve(backend);
        }
        let size = self.sizes[m];
        let Some((backend, victims)) = self.choose(size) else {
            return Step::Refuse(Refusal::NoRoom);
        };
        let mut evicted_idle = Duration::ZERO;
        for &victim in &victims {
            self.unfile(backend, victim);
            self.placed[victim as usize] = NOT_PLACED;
            self.committed[backend] -= self.sizes[victim as usize];
            evicted_idle += Duration::from_micros(now - self.last_used[victim as usize]);
        }
        self.placed[m] = backend as u32;
        self.loading[m] = true;
        self.last_used[m] = now;
        self.committed[backend] += size;
        Step::Load {
            backend,
            evicted: victims.len(),
            evicted_idle,
        }
    }

    fn finish_load(&mut self, backend: usize, model: u32, ok: bool, now: Micros) {
        let m = model as usize;
        self.loading[m] = false;
        if !ok {
            // Gone, and tried again by the next request that wants it: no backoff.
            self.placed[m] = NOT_PLACED;
            self.committed[backend] -= self.sizes[m];
            return;
        }
        self.last_used[m] = now;
        if self.copy_in_flight[m] == 0 {
            self.file(backend, model);
        }
    }

    fn pin(&mut self, model: u32) -> Option<usize> {
        let m = model as usize;
        let (backend, victims) = self.choose(self.sizes[m])?;
        for &victim in &victims {
            self.unfile(backend, victim);
            self.placed[victim as usize] = NOT_PLACED;
            self.committed[backend] -= self.sizes[victim as usize];
        }
        self.pinned[m] = true;
        self.placed[m] = backend as u32;
        self.committed[backend] += self.sizes[m];
        Some(backend)
    }

    fn release(&mut self, backend: usize, model: u32, now: Micros) {
        let m = model as usize;
        self.copy_in_flight[m] -= 1;
        self.in_flight[backend] -= 1;
        self.last_used[m] = now;
        if self.copy_in_flight[m] == 0 {
            self.file(backend, model);
        }
    }

    fn committed(&self, backend: usize) -> u64 {
        self.committed[backend]
    }
}
