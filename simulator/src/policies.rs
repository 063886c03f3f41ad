//! The policies the simulator compares: infergate's own `Table` (the code the gateway runs,
//! called exactly as `Placement::acquire` calls it), and two baselines kept here — plain
//! per-instance LRU, as ModelMesh does it, and Belady's furthest-next-use oracle.

use super::engine::{Micros, Placer, Refusal, Setup, Step};
use super::trace::Trace;
use infergate::internals::{
    BackendView, Decision, Estimate, EvictionOrder, EvictionPolicy, GatewayError, ModelRef, Policy,
    SizeSource, Table,
};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// The real placement table over fake backends that are always ready, know every model, and
/// load whatever they are asked to.
pub struct Real {
    table: Table,
    models: Vec<ModelRef>,
    sizes: Vec<u64>,
    /// Whether a load of each model has succeeded: its size is known (`Setup::estimate_before_load`).
    learned: Vec<bool>,
    /// Each model's index, by name (the books name models).
    index: HashMap<String, u32>,
    /// Requests each model's copies had served at the last rebalancing round.
    last_served: HashMap<String, u64>,
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
            learned: vec![false; trace.names.len()],
            index: (trace.names.iter().enumerate())
                .map(|(i, name)| (name.clone(), i as u32))
                .collect(),
            last_served: HashMap::new(),
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

    /// What the gateway would estimate the model at now.
    fn estimate(&self, model: u32) -> Estimate {
        estimate(&self.setup, &self.learned, &self.sizes, model)
    }

    /// A load of the model succeeded on `backend`: from now on its size is known, and the
    /// copy on the books takes it, as `Placement::measured_load` resizes it before
    /// `finish_load`.
    fn learn(&mut self, backend: usize, model: u32) {
        let m = model as usize;
        if self.learned[m] {
            return;
        }
        self.learned[m] = true;
        if self.setup.estimate_before_load.is_some() {
            let estimate = self.estimate(model);
            let name = &self.models[m].name;
            self.table.resize(backend, name, estimate);
        }
    }
}

/// The estimate of a model, as the gateway makes it: its true size once a load has
/// measured it, `Setup::estimate_before_load` until then (when set).
fn estimate(setup: &Setup, learned: &[bool], sizes: &[u64], model: u32) -> Estimate {
    let m = model as usize;
    match setup.estimate_before_load {
        Some(bytes) if !learned[m] => Estimate {
            bytes,
            source: SizeSource::Default,
        },
        Some(_) => Estimate {
            bytes: sizes[m],
            source: SizeSource::Learned,
        },
        None => Estimate {
            bytes: sizes[m],
            source: SizeSource::Config,
        },
    }
}

impl Placer for Real {
    fn decide(&mut self, model: u32, now: Micros) -> Step {
        let estimate = self.estimate(model);
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
        if ok {
            self.learn(backend, model);
        }
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
        let estimate = self.estimate(model);
        let now = self.at(0);
        let name = &self.models[model as usize];
        let decision = (self.table).decide(name, &estimate.into(), &self.view, true, true, now);
        let Decision::Load(plan) = decision else {
            return None;
        };
        for victim in &plan.evict {
            self.table.departed(plan.backend, &victim.model, now);
        }
        self.learn(plan.backend, model);
        let name = &self.models[model as usize].name;
        self.table.finish_load(plan.backend, name, &Ok(()), now);
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

    /// As `Placement::rebalance`: a model whose copies each served more than `up_rps` since
    /// the last round gets another copy, in free space, up to `max_copies`; extra copies
    /// idle for `down_idle` go (at once: unloads are instant here).
    fn rebalance(&mut self, now: Micros) -> Vec<(usize, u32)> {
        let Some(scaling) = self.setup.scaling else {
            return Vec::new();
        };
        let now = self.at(now);
        let seconds = scaling.every.as_secs_f64();
        let demand = self.table.demand();
        let mut hot = Vec::new();
        for (name, &(copies, served)) in &demand {
            let previous = self
                .last_served
                .insert(name.clone(), served)
                .unwrap_or(served);
            let rate = served.saturating_sub(previous) as f64 / seconds / copies as f64;
            if rate > scaling.up_rps && copies < scaling.max_copies {
                hot.push(self.index[name]);
            }
        }
        self.last_served.retain(|name, _| demand.contains_key(name));
        // The books' map has no order; the replay must not depend on it.
        hot.sort_unstable();
        let mut loads = Vec::new();
        for model in hot {
            let sizing = self.estimate(model).into();
            let name = &self.models[model as usize].name;
            if let Some(plan) = self
                .table
                .plan_extra_copy(name, &sizing, &self.view, false, now)
            {
                loads.push((plan.backend, model));
            }
        }
        let idle = self
            .table
            .take_idle_extra_copies(scaling.down_idle, &|_| 1, now);
        for (backend, name) in idle {
            self.table.departed(backend, &name, now);
        }
        loads
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
    /// Belady held to the real table's churn guard: a copy used within `min_churn_age` is
    /// never a victim. A yardstick for policies that keep the guard, not their bound: with
    /// sizes, `BeladySizeGuarded` does better.
    BeladyGuarded,
    /// Size-aware Belady held to the churn guard: the copy that ties up the most
    /// byte-requests until its next use (requests until then × its size) goes first, and the
    /// new copy goes to the backend whose victims tie up the most. With sizes, Belady's rule
    /// is not optimal, and under the guard memory is scarcer; this asks whether weighing
    /// size gets a guarded oracle further.
    BeladySizeGuarded,
    /// `BeladySizeGuarded` that may also refuse a request it could serve: when the model is
    /// never asked for again, or its copy would tie up more than a victim it displaces. No
    /// real policy may (a request that can be served is); what refusing would buy under the
    /// guard, a bound beyond the rules.
    BeladyRefusing,
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
    /// Bytes each model's copy counts on the books: its estimate when it was placed, its
    /// true size once loaded.
    copy_size: Vec<u64>,
    /// Whether a load of each model has succeeded (`Setup::estimate_before_load`).
    learned: Vec<bool>,
    setup: Setup,
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
    /// Copies used within this long are not victims (`Rule::BeladyGuarded`; 0 otherwise).
    guard: Micros,
    /// The time of the decision under way (for `guard`).
    now: Micros,
    /// Oracles: the index of the request under way.
    index: u64,
}

impl Rule {
    /// Reads the trace ahead.
    fn oracle(self) -> bool {
        !matches!(self, Rule::Lru | Rule::LruOldestInstance)
    }

    /// Keeps the churn guard.
    fn guarded(self) -> bool {
        matches!(
            self,
            Rule::BeladyGuarded | Rule::BeladySizeGuarded | Rule::BeladyRefusing
        )
    }

    /// Weighs next use by size.
    fn sized(self) -> bool {
        matches!(self, Rule::BeladySizeGuarded | Rule::BeladyRefusing)
    }
}

impl Baseline {
    /// Empty books; Belady reads the whole trace ahead.
    pub fn new(rule: Rule, trace: &Trace, setup: &Setup) -> Self {
        let n = trace.names.len();
        let backends = setup.usable.len();
        let oracle = rule.oracle();
        let next = if oracle {
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
            copy_size: vec![0; n],
            learned: vec![false; n],
            setup: setup.clone(),
            placed: vec![NOT_PLACED; n],
            loading: vec![false; n],
            copy_in_flight: vec![0; n],
            last_used: vec![0; n],
            filed: vec![None; n],
            next,
            next_use: vec![NEVER; n],
            pinned: vec![false; n],
            guard: if rule.guarded() {
                setup.min_churn_age.as_micros() as Micros
            } else {
                0
            },
            now: 0,
            index: 0,
        }
    }

    fn priority(&self, model: u32) -> u64 {
        match self.rule {
            Rule::Lru | Rule::LruOldestInstance => self.last_used[model as usize],
            // Furthest next use first; never-again (NEVER) sorts first of all.
            _ => NEVER - self.next_use[model as usize],
        }
    }

    fn file(&mut self, backend: usize, model: u32) {
        if self.pinned[model as usize] {
            return;
        }
        let priority = self.priority(model);
        self.evictable[backend].insert((priority, model));
        self.evictable_bytes[backend] += self.copy_size[model as usize];
        self.filed[model as usize] = Some(priority);
    }

    fn unfile(&mut self, backend: usize, model: u32) {
        if let Some(priority) = self.filed[model as usize].take() {
            self.evictable[backend].remove(&(priority, model));
            self.evictable_bytes[backend] -= self.copy_size[model as usize];
        }
    }

    /// The model's estimate now (see `estimate`).
    fn estimate(&self, model: u32) -> u64 {
        estimate(&self.setup, &self.learned, &self.sizes, model).bytes
    }

    /// Takes an evictable copy off its backend.
    fn evict(&mut self, backend: usize, victim: u32) {
        self.unfile(backend, victim);
        self.placed[victim as usize] = NOT_PLACED;
        self.committed[backend] -= self.copy_size[victim as usize];
    }

    /// A load of the model succeeded: its copy counts its true size from now on.
    fn learn(&mut self, backend: usize, model: u32) {
        let m = model as usize;
        self.learned[m] = true;
        self.committed[backend] = self.committed[backend] - self.copy_size[m] + self.sizes[m];
        self.copy_size[m] = self.sizes[m];
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
        if self.rule.sized() {
            return self.choose_sized(size);
        }
        let feasible = (0..self.usable.len()).filter(|&b| {
            if self.guard == 0 {
                self.free(b) + self.evictable_bytes[b] >= size
            } else {
                self.victims(b, size).1 >= size
            }
        });
        let backend = match self.rule {
            Rule::Lru => {
                feasible.max_by_key(|&b| (self.free(b), std::cmp::Reverse(self.in_flight[b])))?
            }
            Rule::LruOldestInstance => feasible.min_by_key(|&b| {
                let (victims, _) = self.victims(b, size);
                let youngest = victims.last().map_or(0, |&m| self.last_used[m as usize]);
                (youngest, std::cmp::Reverse(self.free(b)), self.in_flight[b])
            })?,
            _ => feasible.max_by_key(|&b| {
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

    /// Byte-requests the copy of `model` ties up until its next use (infinite if never).
    fn hold(&self, model: u32) -> f64 {
        let next = self.next_use[model as usize];
        if next == NEVER {
            f64::INFINITY
        } else {
            (next.saturating_sub(self.index) + 1) as f64 * self.copy_size[model as usize] as f64
        }
    }

    /// `choose` for the size-aware oracles: on each backend the victims are the copies that
    /// tie up most, and the backend is the one whose least such victim ties up most.
    fn choose_sized(&self, size: u64) -> Option<(usize, Vec<u32>)> {
        let (backend, (victims, _, _)) = (0..self.usable.len())
            .map(|b| (b, self.sized_victims(b, size)))
            .filter(|(_, (_, free, _))| *free >= size)
            .max_by(|(a, (_, fa, ha)), (b, (_, fb, hb))| {
                ha.total_cmp(hb)
                    .then(fa.cmp(fb))
                    .then(self.in_flight[*b].cmp(&self.in_flight[*a]))
            })?;
        Some((backend, victims))
    }

    /// The idle copies past the guard on `backend` that tie up most, until `size` is free;
    /// the free space then, and the least hold among them.
    fn sized_victims(&self, backend: usize, size: u64) -> (Vec<u32>, u64, f64) {
        let mut candidates: Vec<(f64, u32)> = self.evictable[backend]
            .iter()
            .map(|&(_, m)| m)
            .filter(|&m| self.past_guard(m))
            .map(|m| (self.hold(m), m))
            .collect();
        let mut free = self.free(backend);
        let mut chosen = Vec::new();
        let mut least = f64::INFINITY;
        // A victim or two is the rule: picking the greatest each time beats sorting them all.
        while free < size && !candidates.is_empty() {
            let (at, _) = (candidates.iter().enumerate())
                .max_by(|(_, a), (_, b)| {
                    a.0.total_cmp(&b.0)
                        .then(self.copy_size[a.1 as usize].cmp(&self.copy_size[b.1 as usize]))
                })
                .expect("candidates left");
            let (hold, model) = candidates.swap_remove(at);
            free += self.copy_size[model as usize];
            chosen.push(model);
            least = hold;
        }
        (chosen, free, least)
    }

    /// `Rule::BeladyRefusing`: whether to refuse a request for `model` (asked for again) that
    /// it could serve by evicting `victims`.
    fn refuses(&self, model: u32, size: u64, victims: &[u32]) -> bool {
        let next = self.next_use[model as usize];
        let hold = (next.saturating_sub(self.index) + 1) as f64 * size as f64;
        victims.iter().any(|&v| self.hold(v) < hold)
    }

    /// Whether the churn guard (if kept) lets the copy of `model` go now.
    fn past_guard(&self, model: u32) -> bool {
        self.guard == 0 || self.last_used[model as usize] + self.guard <= self.now
    }

    fn victims(&self, backend: usize, size: u64) -> (Vec<u32>, u64) {
        let mut free = self.free(backend);
        let mut chosen = Vec::new();
        for &(_, model) in &self.evictable[backend] {
            if free >= size {
                break;
            }
            if !self.past_guard(model) {
                continue;
            }
            free += self.copy_size[model as usize];
            chosen.push(model);
        }
        (chosen, free)
    }
}

impl Placer for Baseline {
    fn observe(&mut self, index: usize, model: u32) {
        self.index = index as u64;
        if self.rule.oracle() {
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
        let size = self.estimate(model);
        self.now = now;
        if self.rule == Rule::BeladyRefusing && self.next_use[m] == NEVER {
            return Step::Refuse(Refusal::Other);
        }
        let Some((backend, victims)) = self.choose(size) else {
            return Step::Refuse(Refusal::NoRoom);
        };
        if self.rule == Rule::BeladyRefusing && self.refuses(model, size, &victims) {
            return Step::Refuse(Refusal::Other);
        }
        let mut evicted_idle = Duration::ZERO;
        for &victim in &victims {
            self.evict(backend, victim);
            evicted_idle += Duration::from_micros(now - self.last_used[victim as usize]);
        }
        self.placed[m] = backend as u32;
        self.loading[m] = true;
        self.last_used[m] = now;
        self.copy_size[m] = size;
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
            self.committed[backend] -= self.copy_size[m];
            return;
        }
        self.learn(backend, model);
        self.last_used[m] = now;
        if self.copy_in_flight[m] == 0 {
            self.file(backend, model);
        }
    }

    fn pin(&mut self, model: u32) -> Option<usize> {
        let m = model as usize;
        let size = self.estimate(model);
        let (backend, victims) = self.choose(size)?;
        for &victim in &victims {
            self.evict(backend, victim);
        }
        self.pinned[m] = true;
        self.placed[m] = backend as u32;
        self.copy_size[m] = size;
        self.committed[backend] += size;
        self.learn(backend, model);
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
