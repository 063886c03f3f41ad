//! The books: which model copy is on which backend, loading or ready, how big, how recently
//! used, and how many requests hold it. Every decision is a short synchronous function over
//! these books, taken under one lock that is never held across an await.

use super::estimate::{Estimate, SizeSource, Sizing};
use super::located::Located;
use super::policy::{EvictionOrder, Rank, Usage};
use super::registry::Synced;
use super::sequences::Affinity;
use super::versions::Versions;
use crate::config::EvictionPolicy;
use crate::error::GatewayError;
use crate::model::ModelRef;
use foldhash::{HashMap, HashMapExt};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How a load ended: `None` while it runs, then success or the backend's error message.
pub type LoadOutcome = Option<Result<(), Arc<str>>>;

/// The rules a decision follows (from `[placement]`).
#[derive(Clone, Debug)]
pub struct Policy {
    /// Models used more recently than this are not evicted.
    pub min_churn_age: Duration,
    /// First retry pause after a failed load on a backend.
    pub backoff: Duration,
    /// Longest retry pause.
    pub backoff_max: Duration,
}

/// What the caller knows about each backend right now (health and its repository index).
#[derive(Clone, Copy, Debug, Default)]
pub struct BackendView {
    /// Passes health checks.
    pub ready: bool,
    /// Its repository has the model.
    pub knows: bool,
    /// Requests in flight on the backend, for tie-breaking.
    pub in_flight: usize,
    /// Requests waiting for the model in the backend's own queue, by its Triton's last fresh
    /// reading (0 when unknown): what other replicas and direct clients have sent there.
    pub queued: usize,
}

/// One copy of a model on one backend.
#[derive(Debug)]
pub struct CopyEntry {
    /// Tells this copy from any other, before or after it in the same place: a sequence is
    /// bound to the copy that saw it start, not to whatever copy is there later.
    pub id: u64,
    /// The model's name (shared with the eviction order).
    pub name: Arc<str>,
    /// Bytes it is counted for.
    pub size: u64,
    /// Where that number came from.
    pub source: SizeSource,
    /// Loading or serving.
    pub state: CopyState,
    /// When a request last finished with it (or when it was placed).
    pub last_used: Instant,
    /// Requests holding a lease on it.
    pub in_flight: usize,
    /// Of those, the ones that asked for a version by number, per version: a version a
    /// reload takes out of every route leaves once none holds it. A few entries at most, and
    /// the vector keeps its room, so a warm request allocates nothing here.
    pub in_flight_versions: Vec<(u64, usize)>,
    /// Never evicted.
    pub pinned: bool,
    /// Requests served since it was placed (for scaling by demand).
    pub served: u64,
    /// What it was loaded to serve.
    pub versions: Versions,
    /// The version numbers it serves: planned at the load, then as the backend's index says.
    pub serving: BTreeSet<u64>,
    /// The config override its last load sent (`None`: the repository's config); a copy
    /// whose override is not its model's spec is loaded again (`Placement::load`).
    pub config: Option<Arc<str>>,
    /// Live sequences bound to it (`sequences`): while any is, it is never evicted or
    /// scaled down.
    pub sequences: usize,
    /// Its place in the eviction order, while it is ranked (see `Idle`).
    pub rank: Option<Rank>,
    /// Another replica has a request or a live sequence on it (`[cluster]`'s in-use
    /// marks): it is not evicted or scaled down while that lasts.
    pub remote_busy: bool,
    /// When one of this replica's own requests last finished with it: what this replica
    /// publishes as its use (`last_used` also takes other replicas' use).
    pub used_here: Option<Instant>,
    /// For an ensemble: the models it runs, which are on this backend as copies of their
    /// own while it is (`Table::hold_parts`) and leave with it when it is evicted.
    pub parts: Arc<[String]>,
    /// Ensemble copies on this backend that run this copy: while any does, it is not
    /// evicted on its own (Triton would take the ensemble down with it).
    pub held: u32,
}

/// A new copy's id.
fn next_copy_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl CopyEntry {
    /// A copy just put on the books: nothing in flight or bound to it, unranked, not yet
    /// used by this replica, no config override, no ensemble parts.
    fn new(
        name: &str,
        (size, source): (u64, SizeSource),
        state: CopyState,
        (versions, serving): (Versions, BTreeSet<u64>),
        pinned: bool,
        now: Instant,
    ) -> Self {
        Self {
            id: next_copy_id(),
            name: name.into(),
            size,
            source,
            state,
            last_used: now,
            in_flight: 0,
            in_flight_versions: Vec::new(),
            pinned,
            served: 0,
            versions,
            serving,
            config: None,
            sequences: 0,
            rank: None,
            remote_busy: false,
            used_here: None,
            parts: Arc::default(),
            held: 0,
        }
    }

    /// Whether a request, a live sequence, or another replica's request holds it.
    fn busy(&self) -> bool {
        self.in_flight > 0 || self.sequences > 0 || self.remote_busy || self.held > 0
    }

    /// Whether a request for `version` (`None`: the default policy) can use this copy now.
    fn serves(&self, version: Option<u64>) -> bool {
        let serving = matches!(self.state, CopyState::Ready | CopyState::Reloading(_));
        serving
            && match version {
                None => self.versions.latest,
                Some(v) => self.serving.contains(&v),
            }
    }
}

/// Loading and reloading copies carry the channel their waiters listen on.
#[derive(Debug)]
pub enum CopyState {
    /// A load is running; its outcome arrives on the channel.
    Loading(watch::Receiver<LoadOutcome>),
    /// Serving what it served while it is loaded again for other versions (Triton keeps the
    /// old versions serving until the new ones are ready).
    Reloading(Reload),
    /// Serving.
    Ready,
}

/// A ready copy being loaded again: for one more version, or for a newer "latest".
#[derive(Debug)]
pub struct Reload {
    /// Where the outcome arrives.
    pub waiting: watch::Receiver<LoadOutcome>,
    /// What it will serve once loaded.
    pub to: Versions,
    /// The version numbers that will be.
    pub to_serving: BTreeSet<u64>,
    /// Its size and where that came from before, restored if the reload fails.
    pub from: Estimate,
}

/// One backend's books.
#[derive(Debug)]
pub struct Books {
    /// Capacity minus the memory buffer.
    pub usable: u64,
    /// Sum of the sizes of its copies, loading or ready.
    pub committed: u64,
    /// No new copies are placed here.
    pub draining: bool,
    /// Last time placement changed what is loaded here; an index read before this is stale.
    pub changed: Instant,
    /// Copies by model name. Change them only through `put`, `take` and `modify`, which keep
    /// `idle` and the table's index of copies in step.
    pub copies: HashMap<String, CopyEntry>,
    /// The copies eviction may take (ready, unused, not pinned), in the policy's order once
    /// they are past `min_churn_age`: a miss reads victims off the front instead of sorting
    /// every copy.
    idle: Idle,
    /// Copies placement took off the books to unload, until the backend has unloaded them
    /// (`Table::departed`): Triton answers an unload at once and keeps the model (and its
    /// memory) for a second or more while it goes, so each is served no more, its bytes
    /// still count against `usable`, it is not adopted back by reconciliation, and no new
    /// copy of it is placed here meanwhile.
    pub departing: HashMap<String, Departing>,
    /// Sum of the departing copies' bytes.
    departing_bytes: u64,
}

/// One backend's idle copies (ready, no request or live sequence on them, not pinned), in
/// two stages. A copy that becomes idle is `cooling`, by last use; at the next cold miss that
/// looks at the backend, those idle for `min_churn_age` are ranked by the policy and move to
/// `ranked`, the eviction order. So victims come off the front of `ranked` under every
/// policy, the churn guard is which copies have been ranked, and both cost O(log n).
#[derive(Debug, Default)]
struct Idle {
    cooling: BTreeSet<(Instant, Arc<str>)>,
    cooling_bytes: u64,
    ranked: BTreeSet<(Rank, Arc<str>)>,
    ranked_bytes: u64,
}

impl Idle {
    /// Whether eviction may take the copy (once past `min_churn_age`).
    fn evictable(copy: &CopyEntry) -> bool {
        matches!(copy.state, CopyState::Ready) && !copy.busy() && !copy.pinned
    }

    /// Files the copy as cooling, if it is idle.
    fn file(&mut self, copy: &mut CopyEntry) {
        copy.rank = None;
        if Self::evictable(copy) {
            self.cooling.insert((copy.last_used, copy.name.clone()));
            self.cooling_bytes += copy.size;
        }
    }

    /// Files an idle copy in the eviction order.
    fn file_ranked(&mut self, copy: &mut CopyEntry, rank: Rank) {
        copy.rank = Some(rank);
        self.ranked.insert((rank, copy.name.clone()));
        self.ranked_bytes += copy.size;
    }

    /// Takes the copy out of wherever `file` or `file_ranked` put it.
    fn unfile(&mut self, copy: &mut CopyEntry) {
        if let Some(rank) = copy.rank.take() {
            self.ranked.remove(&(rank, copy.name.clone()));
            self.ranked_bytes -= copy.size;
        } else if Self::evictable(copy) {
            self.cooling.remove(&(copy.last_used, copy.name.clone()));
            self.cooling_bytes -= copy.size;
        }
    }
}

/// A copy on its way out of a backend (see `Books::departing`).
#[derive(Debug)]
pub struct Departing {
    /// Bytes it is still counted for.
    pub bytes: u64,
    /// Told when it has gone, for requests that wait to load it here again.
    done: watch::Sender<LoadOutcome>,
}

impl Books {
    fn new(usable: u64, now: Instant) -> Self {
        Self {
            usable,
            committed: 0,
            draining: false,
            changed: now,
            copies: HashMap::new(),
            idle: Idle::default(),
            departing: HashMap::new(),
            departing_bytes: 0,
        }
    }

    /// Takes a copy off the books to be unloaded: it departs (see `departing`).
    fn depart(&mut self, name: &str, at: (&mut Located, usize), now: Instant) -> Option<CopyEntry> {
        let copy = self.take(name, at)?;
        self.committed -= copy.size;
        self.departing_bytes += copy.size;
        self.changed = now;
        self.departing
            .entry(name.to_string())
            .and_modify(|d| d.bytes += copy.size)
            .or_insert_with(|| Departing {
                bytes: copy.size,
                done: watch::channel(None).0,
            });
        Some(copy)
    }

    /// Puts a copy on the books of backend `at` (replacing any of the same model), and in
    /// the index of copies.
    fn put(&mut self, mut copy: CopyEntry, (located, at): (&mut Located, usize)) {
        self.idle.file(&mut copy);
        located.add(&copy.name, at);
        if let Some(mut old) = self.copies.insert(copy.name.to_string(), copy) {
            self.idle.unfile(&mut old);
        }
    }

    /// Takes a copy off the books of backend `at`, and out of the index of copies.
    fn take(&mut self, name: &str, (located, at): (&mut Located, usize)) -> Option<CopyEntry> {
        let mut copy = self.copies.remove(name)?;
        located.remove(name, at);
        self.idle.unfile(&mut copy);
        for part in copy.parts.iter() {
            self.modify(part, |part| part.held = part.held.saturating_sub(1));
        }
        Some(copy)
    }

    /// Changes a copy, keeping its place in the eviction order right (a changed copy is
    /// ranked again).
    fn modify<R>(&mut self, name: &str, change: impl FnOnce(&mut CopyEntry) -> R) -> Option<R> {
        let copy = self.copies.get_mut(name)?;
        self.idle.unfile(copy);
        let result = change(copy);
        self.idle.file(copy);
        Some(result)
    }

    /// Ranks the idle copies last used at or before `before` (past `min_churn_age`), so
    /// eviction may take them in the order's turn.
    fn rank_idle(&mut self, order: &EvictionOrder, before: Instant) {
        while let Some((last_used, name)) = self.idle.cooling.first()
            && *last_used <= before
        {
            let name = name.clone();
            let copy = self
                .copies
                .get_mut(&*name)
                .expect("idle copies are on the books");
            self.idle.unfile(copy);
            let rank = order.rank(Usage {
                model: &name,
                bytes: copy.size,
                uses: copy.served,
                last_used: copy.last_used,
            });
            self.idle.file_ranked(copy, rank);
        }
    }

    /// Since the least recently used idle copy was used.
    fn oldest_idle(&self) -> Option<Instant> {
        let cooling = self.idle.cooling.first().map(|(used, _)| *used);
        let ranked = (self.idle.ranked.iter())
            .map(|(_, name)| self.copies[&**name].last_used)
            .min();
        cooling.into_iter().chain(ranked).min()
    }

    /// What is left for new copies: departing copies still hold their bytes.
    pub fn free(&self) -> u64 {
        self.usable
            .saturating_sub(self.committed + self.departing_bytes)
    }

    fn loading_bytes(&self) -> u64 {
        self.copies
            .values()
            .map(|c| match &c.state {
                CopyState::Loading(_) => c.size,
                CopyState::Reloading(reload) => c.size.saturating_sub(reload.from.bytes),
                CopyState::Ready => 0,
            })
            .sum()
    }
}

/// A model evicted to make room, for the unload call and the metrics.
#[derive(Debug)]
pub struct Evicted {
    /// Model name.
    pub model: String,
    /// How long since it was last used.
    pub idle: Duration,
}

/// A load the caller must now carry out: unload `evict` on `backend`, then load `model`,
/// then report through `finish_load`.
#[derive(Debug)]
pub struct LoadPlan {
    /// Backend index.
    pub backend: usize,
    /// Model to load.
    pub model: String,
    /// The versions to load it for: a plain load for the default policy alone, else a config
    /// override naming `serving`.
    pub versions: Versions,
    /// The version numbers that means ("latest" taken as the newest on disk).
    pub serving: BTreeSet<u64>,
    /// Why the load runs (the loads metric's `reason`).
    pub reason: LoadReason,
    /// Models to unload first (already off the books).
    pub evict: Vec<Evicted>,
    /// Where the outcome is announced.
    pub done: watch::Sender<LoadOutcome>,
    /// With `[cluster]`: the registry revisions of the keys it touches, as the books had
    /// them when it was planned (`Table::stamp`).
    pub expect: Vec<(Synced, i64)>,
}

/// What `Table::narrow` did to one copy.
#[derive(Debug)]
pub enum Narrowed {
    /// Took it off the books on this backend: it served nothing else; unload it.
    Unload(usize),
    /// Load it again for fewer versions.
    Load(LoadPlan),
}

/// What a request for a model should do next.
#[derive(Debug)]
pub enum Decision {
    /// Use the ready copy on this backend (its in-flight count is already raised).
    Serve(usize),
    /// A load is running; wait for it, then decide again.
    Wait(watch::Receiver<LoadOutcome>),
    /// Start this load, then decide again.
    Load(LoadPlan),
    /// Answer with this error.
    Refuse(GatewayError),
}

/// Why a load runs: the `reason` label of the loads metric, and what a fresh copy (`New`)
/// does differently from a copy loaded again (its learned size, its load time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadReason {
    /// A copy where there was none.
    New,
    /// A copy loaded again with one more version.
    Version,
    /// A copy loaded again for a newer version of "latest".
    Reload,
    /// A copy loaded again without versions a reload took out of every route.
    Retire,
}

impl LoadReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Version => "version",
            Self::Reload => "reload",
            Self::Retire => "retire",
        }
    }
}

/// Every backend's books, in pool order.
#[derive(Debug)]
pub struct Table {
    backends: Vec<Books>,
    /// Which backends hold each model: a warm hit reads this, not every backend's books.
    located: Located,
    failures: HashMap<(String, usize), backoff::LoadBackoff>,
    policy: Policy,
    /// Live sequences and the copies they run on.
    sequences: Affinity,
    /// Which idle copy goes first (`placement.policy`).
    order: EvictionOrder,
    /// With `[cluster]`: the registry revision each key was last taken into the books at
    /// (`mirror`), which a change compares before it counts.
    synced: HashMap<Synced, i64>,
    /// Loads other replicas run, by (model, backend): told when the registry says how they
    /// ended, for the requests here that wait on them.
    remote_loads: HashMap<(String, usize), watch::Sender<LoadOutcome>>,
}

impl Table {
    /// Empty books for backends with these usable capacities.
    pub fn new(usable: &[u64], policy: Policy, now: Instant) -> Self {
        let backends = usable
            .iter()
            .map(|&usable| Books::new(usable, now))
            .collect();
        Self {
            backends,
            located: Located::default(),
            failures: HashMap::new(),
            policy,
            sequences: Affinity::default(),
            order: EvictionOrder::new(EvictionPolicy::Lru, now),
            synced: HashMap::new(),
            remote_loads: HashMap::new(),
        }
    }

    /// Copies used more recently than this are not evicted.
    pub fn min_churn_age(&self) -> Duration {
        self.policy.min_churn_age
    }

    /// The same books, evicting in `order` (LRU by default).
    pub fn with_order(self, order: EvictionOrder) -> Self {
        Self { order, ..self }
    }

    /// The eviction policy the books follow (for the admin view).
    pub fn eviction_policy(&self) -> EvictionPolicy {
        self.order.policy()
    }

    /// Records how long a load of `model` took: its reload cost, for `gdsf`.
    pub fn learn_load_time(&mut self, model: &str, took: Duration) {
        self.order.learn_load_time(model, took);
    }

    /// Empty books for a backend added to the pool (its index is the next one).
    pub fn add_backend(&mut self, usable: u64, now: Instant) {
        self.backends.push(Books::new(usable, now));
    }

    /// The books of every backend.
    pub fn backends(&self) -> &[Books] {
        &self.backends
    }

    /// Stops or resumes placing new copies on a backend.
    pub fn set_draining(&mut self, backend: usize, draining: bool) {
        self.backends[backend].draining = draining;
    }
}

/// What `Placement::load` and the calls that never load need of the books.
impl Table {
    /// Records the config override a load of the copy is sending; returns the one its
    /// previous load sent.
    pub fn swap_config(
        &mut self,
        backend: usize,
        model: &str,
        config: Option<Arc<str>>,
    ) -> Option<Arc<str>> {
        self.backends[backend]
            .modify(model, |copy| std::mem::replace(&mut copy.config, config))
            .flatten()
    }

    /// Forgets the model's failed loads: they were of a config that is no longer asked for.
    pub fn forget_failures(&mut self, model: &str) {
        self.failures.retain(|(name, _), _| name != model);
    }

    /// The backends whose ready copy of `model` was loaded with another override than
    /// `config`, and a load of the model still running (whose copy may turn out stale).
    pub fn stale_copies(
        &self,
        model: &str,
        config: &Option<Arc<str>>,
    ) -> (Vec<usize>, Option<watch::Receiver<LoadOutcome>>) {
        let mut stale = Vec::new();
        let mut running = None;
        for (b, books) in self.backends.iter().enumerate() {
            let Some(copy) = books.copies.get(model) else {
                continue;
            };
            match &copy.state {
                CopyState::Ready if copy.config != *config => stale.push(b),
                CopyState::Ready => {}
                CopyState::Loading(rx) => running = Some(rx.clone()),
                CopyState::Reloading(reload) => running = Some(reload.waiting.clone()),
            }
        }
        (stale, running)
    }

    /// The backends (ready, per `view`) whose copy of `model` serves the version it asks
    /// for now: where its statistics are.
    pub fn holders(&self, model: &ModelRef, view: &[BackendView]) -> Vec<usize> {
        let Ok(version) = model.version_number() else {
            return Vec::new();
        };
        self.located
            .of(&model.name)
            .filter(|&b| view[b].ready && self.backends[b].copies[&model.name].serves(version))
            .collect()
    }
}

/// The version a request asks for, as a number; refused when it is not one (Triton's 400),
/// or when the repository is known and has no such version directory (Triton's 404 for a
/// version it does not have: no load, and no retry, can make one).
pub(super) fn requested_version(
    model: &ModelRef,
    sizing: &Sizing,
) -> Result<Option<u64>, GatewayError> {
    match model.version_number()? {
        Some(v) if !sizing.has_version(v) => Err(GatewayError::UnknownVersion {
            model: model.name.clone(),
            version: v,
        }),
        version => Ok(version),
    }
}

mod backoff;
mod eviction;
mod loads;
mod mirror;
mod plan;
mod reconcile;
mod report;
mod requests;
mod scaling;
mod sequencing;
mod unload;
pub use mirror::UseMark;
pub use reconcile::Indexed;

#[cfg(test)]
mod eviction_tests;

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const MIB: u64 = 1 << 20;

    pub(super) fn policy() -> Policy {
        Policy {
            min_churn_age: Duration::from_secs(60),
            backoff: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
        }
    }

    pub(super) fn view(n: usize) -> Vec<BackendView> {
        vec![
            BackendView {
                ready: true,
                knows: true,
                in_flight: 0,
                queued: 0
            };
            n
        ]
    }

    pub(super) fn est(mib: u64) -> Sizing {
        Estimate {
            bytes: mib * MIB,
            source: SizeSource::Disk,
        }
        .into()
    }

    pub(super) fn model(name: &str) -> ModelRef {
        ModelRef::new(name, None)
    }

    /// Loads a model to completion and returns the backend it went to.
    pub(super) fn load(table: &mut Table, name: &str, mib: u64, now: Instant) -> usize {
        match table.decide(
            &model(name),
            &est(mib),
            &view(table.backends.len()),
            false,
            true,
            now,
        ) {
            Decision::Load(plan) => {
                depart_victims(table, &plan, now);
                table.finish_load(plan.backend, name, &Ok(()), now);
                plan.backend
            }
            other => panic!("expected a load of {name}, got {other:?}"),
        }
    }

    /// The victims' unloads are done, as the gateway's `run_load` sees them done.
    pub(super) fn depart_victims(table: &mut Table, plan: &LoadPlan, now: Instant) {
        for victim in &plan.evict {
            table.departed(plan.backend, &victim.model, now);
        }
    }

    pub(super) fn assert_within_capacity(table: &Table) {
        let on_books: BTreeSet<(String, usize)> = (table.backends.iter().enumerate())
            .flat_map(|(b, books)| books.copies.keys().map(move |name| (name.clone(), b)))
            .collect();
        assert_eq!(
            table.located.pairs(),
            on_books,
            "the index of copies follows the books"
        );
        for books in &table.backends {
            assert_idle_follows_the_copies(books);
            let sum: u64 = books.copies.values().map(|c| c.size).sum();
            assert_eq!(sum, books.committed);
            let departing: u64 = books.departing.values().map(|d| d.bytes).sum();
            assert_eq!(departing, books.departing_bytes);
            // Departing copies may overlap the copies that replace them on the books: those
            // load only once the victims have gone.
            assert!(
                books.committed <= books.usable,
                "{} > {}",
                books.committed,
                books.usable
            );
        }
    }

    /// Every idle copy is filed once, cooling or ranked, with the bytes summed; nothing
    /// else is.
    fn assert_idle_follows_the_copies(books: &Books) {
        let idle = || books.copies.values().filter(|c| Idle::evictable(c));
        let cooling: BTreeSet<_> = idle()
            .filter(|c| c.rank.is_none())
            .map(|c| (c.last_used, c.name.clone()))
            .collect();
        let ranked: BTreeSet<_> = idle()
            .filter_map(|c| Some((c.rank?, c.name.clone())))
            .collect();
        assert_eq!(
            cooling, books.idle.cooling,
            "cooling copies follow the books"
        );
        assert_eq!(
            ranked, books.idle.ranked,
            "the eviction order follows the books"
        );
        let bytes =
            |names: Vec<&Arc<str>>| -> u64 { names.iter().map(|n| books.copies[&***n].size).sum() };
        assert_eq!(
            bytes(books.idle.cooling.iter().map(|(_, n)| n).collect()),
            books.idle.cooling_bytes
        );
        assert_eq!(
            bytes(books.idle.ranked.iter().map(|(_, n)| n).collect()),
            books.idle.ranked_bytes
        );
        assert!(
            books
                .copies
                .values()
                .all(|c| Idle::evictable(c) || c.rank.is_none()),
            "only idle copies are ranked"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cold_miss_loads_once_then_hits() {
        let now = Instant::now();
        let mut table = Table::new(&[100 * MIB, 100 * MIB], policy(), now);
        let plan = match table.decide(&model("a"), &est(10), &view(2), false, true, now) {
            Decision::Load(plan) => plan,
            other => panic!("{other:?}"),
        };
        // While loading, others wait on the same load.
        assert!(matches!(
            table.decide(&model("a"), &est(10), &view(2), false, true, now),
            Decision::Wait(_)
        ));
        table.finish_load(plan.backend, "a", &Ok(()), now);
        assert!(
            matches!(table.decide(&model("a"), &est(10), &view(2), false, true, now), Decision::Serve(b) if b == plan.backend)
        );
        assert_within_capacity(&table);
    }

    #[tokio::test(start_paused = true)]
    async fn an_evicted_copy_departs_until_the_backend_has_let_it_go() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB], policy(), start);
        load(&mut table, "old", 60, start);
        let later = start + Duration::from_secs(600);
        let plan = plan_of(table.decide(&model("new"), &est(60), &view(1), false, true, later));
        assert_eq!(plan.evict[0].model, "old");
        // Not served, its bytes still held: nothing else fits meanwhile.
        assert_eq!(table.backends[0].free(), 0);
        assert!(matches!(
            table.decide(&model("small"), &est(10), &view(1), false, true, later),
            Decision::Refuse(GatewayError::NoRoom { .. })
        ));
        // A fresh index that still shows it READY does not bring it back.
        let found = |name: &str| Indexed {
            name: name.into(),
            estimate: Estimate {
                bytes: 60 * MIB,
                source: SizeSource::Disk,
            },
            serving: BTreeSet::from([1]),
        };
        let fresh = later + Duration::from_millis(45);
        let result = table.reconcile(0, true, &[found("old")], Some(fresh), &|_| false, fresh);
        assert!(result.adopted.is_empty(), "{result:?}");
        // Asked for again while it goes: the request waits, then it may load again there.
        let mut waiting = match table.decide(&model("old"), &est(60), &view(1), false, true, fresh)
        {
            Decision::Wait(waiting) => waiting,
            other => panic!("{other:?}"),
        };
        table.departed(0, "old", fresh);
        assert!(waiting.borrow_and_update().is_some());
        assert_eq!(table.backends[0].free(), 40 * MIB);
        table.finish_load(0, "new", &Ok(()), fresh);
        // An index read before it went is stale; one after it is believed.
        let stale = table.reconcile(0, true, &[found("old")], Some(later), &|_| false, fresh);
        assert!(stale.adopted.is_empty());
        assert_within_capacity(&table);
    }

    fn versioned(name: &str, version: &str) -> ModelRef {
        ModelRef::new(name, Some(version.into()))
    }

    pub(super) fn plan_of(decision: Decision) -> LoadPlan {
        match decision {
            Decision::Load(plan) => plan,
            other => panic!("expected a load, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn versions_load_where_the_model_is_not_then_as_a_union_where_it_is() {
        let now = Instant::now();
        let mut table = Table::new(&[100 * MIB, 100 * MIB], policy(), now);
        // Versions 1 (10 MiB) and 2 (20 MiB) on disk; "latest" is 2.
        let sizing = Sizing::on_disk(0, &[(1, 10 * MIB), (2, 20 * MIB)]);
        let decide = |table: &mut Table, model: &ModelRef| {
            table.decide(model, &sizing, &view(2), false, true, now)
        };
        // Version 1 goes to a backend without the model, loaded for 1 alone.
        let one = plan_of(decide(&mut table, &versioned("m", "1")));
        assert_eq!(
            (one.reason, one.serving.clone()),
            (LoadReason::New, BTreeSet::from([1]))
        );
        assert!(!one.versions.latest);
        table.finish_load(one.backend, "m", &Ok(()), now);
        assert!(
            matches!(decide(&mut table, &versioned("m", "1")), Decision::Serve(b) if b == one.backend)
        );
        // Version 2 too: the other backend has room and no copy.
        let two = plan_of(decide(&mut table, &versioned("m", "2")));
        assert_ne!(two.backend, one.backend);
        table.finish_load(two.backend, "m", &Ok(()), now);
        assert_eq!(table.usage(one.backend).0, 10 * MIB);
        assert_eq!(table.usage(two.backend).0, 20 * MIB);
        // No copy serves "latest" and every backend has the model: one is loaded again with
        // the union, and keeps serving its version meanwhile.
        let union = plan_of(decide(&mut table, &model("m")));
        assert_eq!(union.reason, LoadReason::Version);
        assert!(union.versions.latest);
        let kept = if union.backend == one.backend {
            "1"
        } else {
            "2"
        };
        assert_eq!(union.serving, BTreeSet::from([kept.parse().unwrap(), 2]));
        assert!(
            matches!(decide(&mut table, &versioned("m", kept)), Decision::Serve(b) if b == union.backend)
        );
        table.release(union.backend, "m", now);
        assert!(matches!(decide(&mut table, &model("m")), Decision::Wait(_)));
        assert_within_capacity(&table);
        table.finish_load(union.backend, "m", &Ok(()), now);
        assert!(
            matches!(decide(&mut table, &model("m")), Decision::Serve(b) if b == union.backend)
        );
        assert_eq!(
            table.usage(union.backend).0,
            if kept == "1" { 30 } else { 20 } * MIB
        );
        assert_within_capacity(&table);
        // Versions that are no number, or not on disk, are refused without a load.
        assert!(matches!(
            decide(&mut table, &versioned("m", "7")),
            Decision::Refuse(GatewayError::UnknownVersion { version: 7, .. })
        ));
        assert!(matches!(
            decide(&mut table, &versioned("m", "x")),
            Decision::Refuse(GatewayError::BadRequest(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn leaving_versions_and_models_wait_for_the_requests_holding_them() {
        let now = Instant::now();
        let mut table = Table::new(&[100 * MIB], policy(), now);
        let sizing = Sizing::on_disk(0, &[(1, 10 * MIB), (2, 20 * MIB)]);
        let decide = |table: &mut Table, model: &ModelRef| {
            table.decide(model, &sizing, &view(1), false, true, now)
        };
        plan_of(decide(&mut table, &versioned("m", "1")));
        table.finish_load(0, "m", &Ok(()), now);
        let union = plan_of(decide(&mut table, &versioned("m", "2")));
        table.finish_load(0, "m", &Ok(()), now);
        assert_eq!(union.serving, BTreeSet::from([1, 2]));
        // A request holds version 1: neither the version nor the model may go yet; one on
        // version 2 does not hold version 1 back.
        assert!(matches!(
            decide(&mut table, &versioned("m", "1")),
            Decision::Serve(0)
        ));
        assert!(matches!(
            decide(&mut table, &versioned("m", "2")),
            Decision::Serve(0)
        ));
        let leaving = BTreeSet::from([1]);
        assert!(table.narrow("m", &leaving, &sizing, now).is_none());
        assert!(table.take_if_idle("m", now).is_none());
        table.release_version(0, "m", Some(1), now);
        let narrowed = table.narrow("m", &leaving, &sizing, now).unwrap();
        let [Narrowed::Load(plan)] = &narrowed[..] else {
            panic!("{narrowed:?}")
        };
        assert_eq!(
            (plan.reason, plan.serving.clone()),
            (LoadReason::Retire, BTreeSet::from([2]))
        );
        assert!(!plan.versions.latest);
        // From now on version 1 is not served here: its requests wait for the load.
        assert!(matches!(
            decide(&mut table, &versioned("m", "1")),
            Decision::Wait(_)
        ));
        assert!(matches!(
            decide(&mut table, &versioned("m", "2")),
            Decision::Serve(0)
        ));
        table.finish_load(0, "m", &Ok(()), now);
        assert_eq!(table.usage(0).0, 20 * MIB);
        assert_within_capacity(&table);
        // The whole model goes once the two requests on version 2 are done.
        assert!(table.take_if_idle("m", now).is_none());
        table.release_version(0, "m", Some(2), now);
        assert!(table.take_if_idle("m", now).is_none());
        table.release_version(0, "m", Some(2), now);
        assert_eq!(table.take_if_idle("m", now), Some(vec![0]));
        assert_eq!(table.usage(0), (0, 0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_reload_keeps_the_copy_serving_what_it_served() {
        let now = Instant::now();
        let mut table = Table::new(&[100 * MIB], policy(), now);
        let sizing = Sizing::on_disk(0, &[(1, 10 * MIB), (2, 20 * MIB)]);
        let first = plan_of(table.decide(&model("m"), &sizing, &view(1), false, true, now));
        table.finish_load(0, "m", &Ok(()), now);
        assert_eq!(first.serving, BTreeSet::from([2]));
        let union =
            plan_of(table.decide(&versioned("m", "1"), &sizing, &view(1), false, true, now));
        assert_eq!(table.usage(0).0, 30 * MIB);
        table.finish_load(0, "m", &Err("boom".into()), now);
        assert_eq!(union.serving, BTreeSet::from([1, 2]));
        assert_eq!(table.usage(0).0, 20 * MIB);
        assert!(matches!(
            table.decide(&model("m"), &sizing, &view(1), false, true, now),
            Decision::Serve(0)
        ));
        table.release(0, "m", now);
        // Backing off on that backend: the version is refused for now.
        assert!(matches!(
            table.decide(&versioned("m", "1"), &sizing, &view(1), false, true, now),
            Decision::Refuse(GatewayError::LoadFailed { .. })
        ));
        // A newer version on disk reloads the "latest" copy as it is (a plain load).
        let newer = Sizing::on_disk(0, &[(1, 10 * MIB), (2, 20 * MIB), (3, 30 * MIB)]);
        let later = now + Duration::from_secs(5);
        let reload = table
            .reload_on(
                &[0],
                "m",
                (&Versions::latest(), &newer),
                &view(1),
                true,
                later,
            )
            .unwrap();
        assert_eq!(reload.reason, LoadReason::Reload);
        assert!(reload.versions.is_default());
        assert_eq!(reload.serving, BTreeSet::from([3]));
        table.finish_load(0, "m", &Ok(()), later);
        assert_eq!(table.usage(0).0, 30 * MIB);
        assert_within_capacity(&table);
    }

    #[test]
    fn the_eviction_order_stays_in_step_through_random_traffic() {
        let mut table = Table::new(&[300 * MIB, 200 * MIB], policy(), Instant::now());
        let start = Instant::now();
        let mut held: Vec<(usize, String)> = Vec::new();
        let mut seed = 7u64;
        for step in 0..5_000u64 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let now = start + Duration::from_secs(120 * step);
            let name = format!("m{}", (seed >> 33) % 12);
            let release = (seed >> 20).is_multiple_of(3);
            if release && !held.is_empty() {
                let (b, name) = held.swap_remove((seed >> 40) as usize % held.len());
                table.release(b, &name, now);
            } else {
                match table.decide(
                    &model(&name),
                    &est(40 + (seed >> 50) % 60),
                    &view(2),
                    false,
                    true,
                    now,
                ) {
                    Decision::Serve(b) => held.push((b, name)),
                    Decision::Load(plan) => {
                        depart_victims(&mut table, &plan, now);
                        let ok = !(seed >> 45).is_multiple_of(7);
                        let outcome = if ok { Ok(()) } else { Err("boom".into()) };
                        table.finish_load(plan.backend, &name, &outcome, now);
                    }
                    Decision::Wait(_) | Decision::Refuse(_) => {}
                }
            }
            assert_within_capacity(&table);
        }
    }

    /// An ensemble is placed with the models it runs, which stay while it does and leave
    /// with it: eviction never takes a part the ensemble still runs, and takes the group
    /// together when it takes the ensemble.
    #[tokio::test(start_paused = true)]
    async fn an_ensemble_and_its_parts_stay_and_leave_together() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB], policy(), start);
        // Planned for the group (its own 1 MiB and its two 30 MiB parts), then booked as
        // three copies once Triton has loaded them.
        let group = load(&mut table, "ensemble", 61, start);
        let parts = [("pre".to_string(), est(30)), ("net".to_string(), est(30))];
        let own = est(1).estimate(&Versions::latest());
        let added = table.hold_parts(group, ("ensemble", own), &parts, start);
        assert_eq!(added, ["pre", "net"]);
        assert_eq!(table.backends[0].committed, 61 * MIB);
        assert_within_capacity(&table);
        // A part is served where the ensemble put it.
        let net = model("net");
        assert!(matches!(
            table.hit(&net, &view(1)),
            Some(Decision::Serve(0))
        ));
        table.release(0, "net", start);
        // While the ensemble is busy, its parts are not evicted on their own.
        let later = start + Duration::from_secs(3600);
        assert!(matches!(
            table.hit(&model("ensemble"), &view(1)),
            Some(Decision::Serve(0))
        ));
        let refused = table.decide(&model("x"), &est(60), &view(1), false, true, later);
        assert!(
            matches!(refused, Decision::Refuse(GatewayError::NoRoom { .. })),
            "{refused:?}"
        );
        // Once it is idle, the group leaves together.
        table.release(0, "ensemble", later);
        let much_later = later + Duration::from_secs(3600);
        match table.decide(&model("x"), &est(60), &view(1), false, true, much_later) {
            Decision::Load(plan) => {
                let mut evicted: Vec<&str> = plan.evict.iter().map(|e| e.model.as_str()).collect();
                evicted.sort();
                assert_eq!(evicted, ["ensemble", "net", "pre"]);
                depart_victims(&mut table, &plan, much_later);
            }
            other => panic!("{other:?}"),
        }
        assert_within_capacity(&table);
    }
}
