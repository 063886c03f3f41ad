//! The books as a mirror of the pool's registry (`[cluster]`, see `placement::registry`):
//! each copy on the books is what the registry says the pool has there, whoever loaded it,
//! plus what only this replica knows (its requests in flight, its sequences, its own loads
//! while the registry has not agreed them yet).

use super::{CopyEntry, CopyState, Departing, LoadOutcome, Table};
use crate::placement::estimate::SizeSource;
use crate::placement::registry::{SharedCopy, SharedState, Synced};
use crate::placement::versions::Versions;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;

/// A copy on the books, as the mirror tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Local {
    /// None, or only departing.
    Absent,
    /// This replica is loading (or reloading) it.
    Own,
    /// Another replica is loading it.
    Remote,
    /// Serving.
    Ready,
}

/// One replica's use of a copy, as its in-use marks publish it.
#[derive(Clone, Debug, PartialEq)]
pub struct UseMark {
    /// The backend's place in the pool.
    pub backend: usize,
    /// The model.
    pub model: String,
    /// A request or a live sequence holds it.
    pub busy: bool,
    /// When a request last finished with it.
    pub last_used: Instant,
}

impl Table {
    /// The revision the books last took `key` at (0: never).
    pub fn synced(&self, key: &Synced) -> i64 {
        self.synced.get(key).copied().unwrap_or(0)
    }

    /// Whether a record at `revision` is news to the books.
    pub fn is_newer(&self, key: &Synced, revision: i64) -> bool {
        revision > self.synced(key)
    }

    /// Notes that the books have `key` as of `revision` (0: the registry has no such key).
    pub fn set_synced(&mut self, key: Synced, revision: i64) {
        self.synced.insert(key, revision);
    }

    /// Notes in a plan, as it is made, the revisions of the keys it touches
    /// (`LoadPlan::expect`): its model's, its victims' and its backend's.
    pub(super) fn stamp(&self, plan: &mut super::LoadPlan) {
        let models =
            std::iter::once(plan.model.as_str()).chain(plan.evict.iter().map(|v| v.model.as_str()));
        plan.expect = models
            .map(|m| Synced::Model(m.to_string()))
            .chain([Synced::Backend(plan.backend)])
            .map(|key| {
                let revision = self.synced(&key);
                (key, revision)
            })
            .collect();
    }

    /// Takes the registry's copies of `model` into the books, backend by backend (`copies`
    /// in pool order, `None` where it has none), as of `revision`. `own` is this replica's
    /// lease: a load the registry says is this replica's is left to it. With `force` (the
    /// records a lost or unreachable agreement returned), a load of this replica's that the
    /// registry does not have is undone too.
    pub fn mirror(
        &mut self,
        model: &str,
        copies: &[Option<&SharedCopy>],
        (own, force): (i64, bool),
        pinned: bool,
        now: Instant,
    ) {
        for (b, shared) in copies.iter().enumerate().take(self.backends.len()) {
            self.mirror_copy(b, model, *shared, (own, force), pinned, now);
        }
    }

    fn local(&self, b: usize, model: &str) -> Local {
        match self.backends[b].copies.get(model).map(|c| &c.state) {
            None => Local::Absent,
            Some(CopyState::Loading(_))
                if self.remote_loads.contains_key(&(model.to_string(), b)) =>
            {
                Local::Remote
            }
            Some(CopyState::Loading(_) | CopyState::Reloading(_)) => Local::Own,
            Some(CopyState::Ready) => Local::Ready,
        }
    }

    fn mirror_copy(
        &mut self,
        b: usize,
        model: &str,
        shared: Option<&SharedCopy>,
        (own, force): (i64, bool),
        pinned: bool,
        now: Instant,
    ) {
        let local = self.local(b, model);
        let mine = shared.is_some_and(|s| s.lease == own && own != 0);
        let departing = self.backends[b].departing.contains_key(model);
        match (shared.map(|s| s.state), local) {
            // This replica's load: it finishes it; another's still running.
            (Some(SharedState::Loading), Local::Own) if mine => {}
            (Some(SharedState::Loading), Local::Remote) => {}
            // Loaded here; the registry hears so next (`settle`).
            (Some(SharedState::Loading), Local::Ready) if mine => {}
            (Some(SharedState::Ready), Local::Own) if mine || !force => {}
            (None, Local::Own) if !force => {}
            (Some(SharedState::Ready), Local::Remote | Local::Ready) => {
                self.take_ready(b, model, shared.expect("some"), now)
            }
            (Some(SharedState::Departing), Local::Absent) if departing => {}
            (None, Local::Absent) => {
                if departing {
                    self.departed(b, model, now);
                }
            }
            (state, _) => {
                self.drop_copy(
                    b,
                    model,
                    "the replica loading it gave up or another took over",
                );
                if departing && state != Some(SharedState::Departing) {
                    self.departed(b, model, now);
                }
                match (state, shared) {
                    (Some(SharedState::Ready), Some(s)) => {
                        self.put_shared(b, model, s, None, pinned, now)
                    }
                    (Some(SharedState::Loading), Some(s)) => {
                        let (done, waiting) = watch::channel(None);
                        self.remote_loads.insert((model.to_string(), b), done);
                        self.put_shared(b, model, s, Some(waiting), pinned, now);
                    }
                    (Some(SharedState::Departing), Some(s)) => {
                        self.hold_departing(b, model, s.bytes, now)
                    }
                    _ => {}
                }
            }
        }
    }

    /// A copy the registry says is ready: a remote load done, or new versions or size.
    fn take_ready(&mut self, b: usize, model: &str, shared: &SharedCopy, now: Instant) {
        let books = &mut self.backends[b];
        let sizes = books.modify(model, |copy| {
            let before = copy.size;
            if matches!(copy.state, CopyState::Loading(_)) {
                copy.state = CopyState::Ready;
                copy.last_used = now;
            }
            copy.size = shared.bytes;
            copy.versions = versions(shared);
            copy.serving = shared.serving.clone();
            (before, copy.size)
        });
        if let Some((before, after)) = sizes {
            books.committed = books.committed - before + after;
        }
        // An index read sent before now may not show it yet: reconciliation must not take
        // it for gone.
        books.changed = now;
        self.failures.remove(&(model.to_string(), b));
        if let Some(done) = self.remote_loads.remove(&(model.to_string(), b)) {
            let _ = done.send(Some(Ok(())));
        }
    }

    /// Takes a copy off the books (no unload: the registry says it is not there, or is
    /// something else); requests waiting on another replica's load of it decide again.
    fn drop_copy(&mut self, b: usize, model: &str, why: &str) {
        let books = &mut self.backends[b];
        if let Some(copy) = books.take(model, (&mut self.located, b)) {
            books.committed -= copy.size;
        }
        if let Some(done) = self.remote_loads.remove(&(model.to_string(), b)) {
            let _ = done.send(Some(Err(Arc::from(why))));
        }
    }

    fn put_shared(
        &mut self,
        b: usize,
        model: &str,
        shared: &SharedCopy,
        loading: Option<watch::Receiver<LoadOutcome>>,
        pinned: bool,
        now: Instant,
    ) {
        let books = &mut self.backends[b];
        books.put(
            CopyEntry::new(
                model,
                (shared.bytes, SizeSource::Learned),
                loading.map_or(CopyState::Ready, CopyState::Loading),
                (versions(shared), shared.serving.clone()),
                pinned,
                now,
            ),
            (&mut self.located, b),
        );
        books.committed += shared.bytes;
        books.changed = now;
    }

    /// Counts bytes another replica is unloading from a backend, until it has gone.
    fn hold_departing(&mut self, b: usize, model: &str, bytes: u64, now: Instant) {
        let books = &mut self.backends[b];
        if books.departing.contains_key(model) {
            return;
        }
        books.departing_bytes += bytes;
        books.changed = now;
        books.departing.insert(
            model.to_string(),
            Departing {
                bytes,
                done: watch::channel(None).0,
            },
        );
    }

    /// Takes other replicas' in-use marks: their last use counts for the eviction order and
    /// the churn guard, and a copy one of them holds is not evicted.
    pub fn remote_use(&mut self, marks: &[UseMark]) {
        let busy: HashSet<(usize, &str)> = marks
            .iter()
            .filter(|m| m.busy)
            .map(|m| (m.backend, m.model.as_str()))
            .collect();
        for b in 0..self.backends.len() {
            let freed: Vec<String> = (self.backends[b].copies.iter())
                .filter(|(name, c)| c.remote_busy && !busy.contains(&(b, name.as_str())))
                .map(|(name, _)| name.clone())
                .collect();
            for name in freed {
                self.backends[b].modify(&name, |copy| copy.remote_busy = false);
            }
        }
        let backends = self.backends.len();
        for mark in marks.iter().filter(|m| m.backend < backends) {
            self.backends[mark.backend].modify(&mark.model, |copy| {
                copy.remote_busy = mark.busy;
                copy.last_used = copy.last_used.max(mark.last_used);
            });
        }
    }

    /// This replica's own use of copies since `since` (and every copy its requests or
    /// sequences hold now): what its in-use marks publish.
    pub fn used_here(&self, since: Instant) -> Vec<UseMark> {
        let mut marks = Vec::new();
        for (b, books) in self.backends.iter().enumerate() {
            for (name, copy) in &books.copies {
                let busy = copy.in_flight > 0 || copy.sequences > 0;
                let recent = copy.used_here.filter(|used| *used >= since);
                if busy || recent.is_some() {
                    marks.push(UseMark {
                        backend: b,
                        model: name.clone(),
                        busy,
                        last_used: recent.unwrap_or(since),
                    });
                }
            }
        }
        marks
    }
}

fn versions(shared: &SharedCopy) -> Versions {
    Versions {
        latest: shared.latest,
        pinned: shared.pinned.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Decision;
    use super::super::tests::{MIB, est, model, policy, view};
    use super::*;

    fn shared(state: SharedState, mib: u64, lease: i64) -> SharedCopy {
        SharedCopy {
            state,
            bytes: mib * MIB,
            latest: true,
            pinned: Default::default(),
            serving: [1].into(),
            replica: "other".into(),
            lease,
            at_unix: 0.0,
        }
    }

    #[test]
    fn another_replicas_load_is_waited_on_then_served_from() {
        let now = Instant::now();
        let mut table = Table::new(&[10 * MIB, 10 * MIB], policy(), now);
        let loading = shared(SharedState::Loading, 2, 7);
        table.mirror("m", &[None, Some(&loading)], (1, false), false, now);
        assert_eq!(
            table.backends[1].committed,
            2 * MIB,
            "its bytes count here too"
        );
        let Some(Decision::Wait(mut waiting)) = table.hit(&model("m"), &view(2)) else {
            panic!("a request waits on the other replica's load");
        };
        let ready = shared(SharedState::Ready, 2, 7);
        table.mirror("m", &[None, Some(&ready)], (1, false), false, now);
        assert!(matches!(*waiting.borrow_and_update(), Some(Ok(()))));
        assert!(matches!(
            table.hit(&model("m"), &view(2)),
            Some(Decision::Serve(1))
        ));
        // The other replica unloads it: it is served no more, its bytes held till it goes.
        let departing = shared(SharedState::Departing, 2, 7);
        table.mirror("m", &[None, Some(&departing)], (1, false), false, now);
        assert!(table.hit(&model("m"), &view(2)).is_none());
        assert_eq!(table.backends[1].free(), 8 * MIB);
        table.mirror("m", &[None, None], (1, false), false, now);
        assert_eq!(table.backends[1].free(), 10 * MIB);
    }

    // The health checks excuse a slow backend while a load runs there, whoever runs it.
    #[test]
    fn another_replicas_load_counts_as_loading_on_that_backend_until_it_is_ready() {
        let now = Instant::now();
        let mut table = Table::new(&[10 * MIB, 10 * MIB], policy(), now);
        assert!(!table.loading_on(0) && !table.loading_on(1));
        let loading = shared(SharedState::Loading, 2, 7);
        table.mirror("m", &[None, Some(&loading)], (1, false), false, now);
        assert!(table.loading_on(1), "another replica's load");
        assert!(!table.loading_on(0));
        let ready = shared(SharedState::Ready, 2, 7);
        table.mirror("m", &[None, Some(&ready)], (1, false), false, now);
        assert!(!table.loading_on(1), "loaded");
    }

    #[test]
    fn a_lost_agreement_undoes_the_plan_and_puts_its_victims_back() {
        let now = Instant::now();
        let mut table = Table::new(&[3 * MIB], policy(), now);
        let ready = shared(SharedState::Ready, 2, 7);
        table.mirror("old", &[Some(&ready)], (1, false), false, now);
        let later = now + std::time::Duration::from_secs(60);
        let Decision::Load(plan) =
            table.decide(&model("new"), &est(2), &view(1), false, true, later)
        else {
            panic!("a load that evicts 'old'");
        };
        assert_eq!(plan.evict.len(), 1);
        // Unforced, the books keep this replica's load while it is being agreed.
        table.mirror("new", &[None], (1, false), false, later);
        assert!(table.backends[0].copies.contains_key("new"));
        // Lost: the registry still has 'old' ready and no 'new'.
        table.mirror("new", &[None], (1, true), false, later);
        table.mirror("old", &[Some(&ready)], (1, true), false, later);
        assert!(!table.backends[0].copies.contains_key("new"));
        assert!(matches!(
            table.hit(&model("old"), &view(1)),
            Some(Decision::Serve(0))
        ));
        assert_eq!(table.backends[0].free(), MIB);
    }

    #[test]
    fn a_copy_another_replica_holds_is_not_evicted() {
        let now = Instant::now();
        let mut table = Table::new(&[3 * MIB], policy(), now);
        let ready = shared(SharedState::Ready, 2, 7);
        table.mirror("old", &[Some(&ready)], (1, false), false, now);
        let mark = UseMark {
            backend: 0,
            model: "old".into(),
            busy: true,
            last_used: now,
        };
        table.remote_use(std::slice::from_ref(&mark));
        let later = now + std::time::Duration::from_secs(60);
        let decision = table.decide(&model("new"), &est(2), &view(1), false, true, later);
        assert!(matches!(decision, Decision::Refuse(_)), "{decision:?}");
        table.remote_use(&[]);
        let decision = table.decide(&model("new"), &est(2), &view(1), false, true, later);
        assert!(matches!(decision, Decision::Load(_)), "{decision:?}");
    }
}
