//! Planning a load: what a request does when no copy serves it (load a new copy, or load a
//! ready copy again for more versions), and booking the planned copy as loading before the
//! load runs. Its own file so the decision a cold request takes reads in one place; where the
//! load goes and what it evicts is `eviction`.

use super::eviction::take_victims;
use super::{
    BackendView, Books, CopyEntry, CopyState, Decision, LoadPlan, LoadReason, Reload, Table,
    requested_version,
};
use crate::error::GatewayError;
use crate::model::ModelRef;
use crate::placement::estimate::{Estimate, Sizing};
use crate::placement::policy::Rank;
use crate::placement::sequences::SequenceRef;
use crate::placement::versions::Versions;
use tokio::sync::watch;
use tokio::time::Instant;

impl Table {
    /// Decides what a request for `model` does next. `allow_evict` is false for preloads,
    /// which only ever use free space.
    ///
    /// A miss loads the versions asked for on a backend without the model; only where no
    /// such backend exists is a copy that lacks the version loaded again with the union of
    /// what it serves and the version (`reload_on`), so its other versions keep serving.
    pub fn decide(
        &mut self,
        model: &ModelRef,
        sizing: &Sizing,
        view: &[BackendView],
        pinned: bool,
        allow_evict: bool,
        now: Instant,
    ) -> Decision {
        self.decide_for(model, None, sizing, view, (pinned, allow_evict), now)
    }

    /// `decide` for a request of a sequence (`hit_for`).
    pub fn decide_for(
        &mut self,
        model: &ModelRef,
        sequence: Option<&SequenceRef>,
        sizing: &Sizing,
        view: &[BackendView],
        (pinned, allow_evict): (bool, bool),
        now: Instant,
    ) -> Decision {
        let version = match requested_version(model, sizing) {
            Ok(version) => version,
            Err(error) => return Decision::Refuse(error),
        };
        if let Some(decision) = self.hit_for(model, sequence, view, now) {
            return decision;
        }
        if !view.iter().any(|v| v.ready) {
            return Decision::Refuse(GatewayError::NoBackendReady);
        }
        if !view.iter().any(|v| v.ready && v.knows) {
            return Decision::Refuse(GatewayError::UnknownModel {
                model: model.name.clone(),
            });
        }
        let wanted = Versions::requested(version);
        let placeable =
            |table: &Self, b: usize| view[b].ready && view[b].knows && !table.backends[b].draining;
        let candidates: Vec<usize> = (0..self.backends.len())
            .filter(|&b| placeable(self, b) && self.lacks(b, &model.name))
            .collect();
        if candidates.is_empty() {
            let holders: Vec<usize> = (0..self.backends.len())
                .filter(|&b| placeable(self, b) && self.is_ready_copy(b, &model.name))
                .collect();
            if holders.is_empty()
                && let Some(departing) = (0..self.backends.len())
                    .filter(|&b| placeable(self, b))
                    .find_map(|b| self.backends[b].departing.get(&model.name))
            {
                // Its only place is where it is being unloaded: load it there once it has gone.
                return Decision::Wait(departing.done.subscribe());
            }
            return match self.reload_on(
                &holders,
                &model.name,
                (&wanted, sizing),
                view,
                allow_evict,
                now,
            ) {
                Ok(plan) => Decision::Load(plan),
                Err(error) => Decision::Refuse(error),
            };
        }
        let allowed = self.not_backing_off(&model.name, &candidates, now);
        if allowed.is_empty() {
            return Decision::Refuse(self.refusal_after_failures(&model.name, &candidates, now));
        }
        let estimate = sizing.estimate(&wanted);
        self.rank_idle(&allowed, now);
        match self.choose(
            &allowed,
            &model.name,
            &|_| estimate.bytes,
            view,
            allow_evict,
            now,
        ) {
            Ok((backend, evict, top)) => Decision::Load({
                self.order.missed();
                self.commit(
                    backend,
                    &model.name,
                    (wanted, sizing),
                    (evict, top),
                    pinned,
                    now,
                )
            }),
            Err(error) => Decision::Refuse(error),
        }
    }

    /// Plans loading a ready copy again, on one of `holders`, so it serves `wanted` as well
    /// as what it serves: for a request's version, or (`wanted` = latest) for a newer version
    /// on disk. Room for the growth is found as for any load (eviction on that backend,
    /// churn guard); a backend whose last load of the model failed waits out its backoff.
    pub fn reload_on(
        &mut self,
        holders: &[usize],
        model: &str,
        (wanted, sizing): (&Versions, &Sizing),
        view: &[BackendView],
        allow_evict: bool,
        now: Instant,
    ) -> Result<LoadPlan, GatewayError> {
        let allowed = self.not_backing_off(model, holders, now);
        if allowed.is_empty() {
            return Err(self.refusal_after_failures(model, holders, now));
        }
        self.rank_idle(&allowed, now);
        let target = |b: usize| self.backends[b].copies[model].versions.union(wanted);
        let growth = |b: usize| {
            let copy = &self.backends[b].copies[model];
            sizing.estimate(&target(b)).bytes.saturating_sub(copy.size)
        };
        let (backend, evict, top) =
            self.choose(&allowed, model, &growth, view, allow_evict, now)?;
        self.order.evicted(top);
        let reason = if self.backends[backend].copies[model].versions.covers(wanted) {
            LoadReason::Reload
        } else {
            LoadReason::Version
        };
        let target = target(backend);
        let books = &mut self.backends[backend];
        let evict = take_victims(books, (&mut self.located, backend), evict, now);
        let mut plan = start_reload(books, backend, model, target, sizing, reason, now);
        plan.evict = evict;
        self.stamp(&mut plan);
        Ok(plan)
    }

    /// Whether a new copy of `model` may go on `backend`: it has none, and none departing.
    pub(super) fn lacks(&self, backend: usize, model: &str) -> bool {
        let books = &self.backends[backend];
        !books.copies.contains_key(model) && !books.departing.contains_key(model)
    }

    fn is_ready_copy(&self, backend: usize, model: &str) -> bool {
        self.backends[backend]
            .copies
            .get(model)
            .is_some_and(|c| matches!(c.state, CopyState::Ready))
    }

    /// Takes victims off the books and puts the new copy on as loading.
    pub(super) fn commit(
        &mut self,
        backend: usize,
        model: &str,
        (versions, sizing): (Versions, &Sizing),
        (victims, top): (Vec<String>, Option<Rank>),
        pinned: bool,
        now: Instant,
    ) -> LoadPlan {
        self.order.evicted(top);
        let books = &mut self.backends[backend];
        let evict = take_victims(books, (&mut self.located, backend), victims, now);
        let estimate = sizing.estimate(&versions);
        let serving = versions.resolve(sizing.newest());
        let (done, waiting) = watch::channel(None);
        books.put(
            CopyEntry {
                used_here: Some(now),
                ..CopyEntry::new(
                    model,
                    (estimate.bytes, estimate.source),
                    CopyState::Loading(waiting),
                    (versions.clone(), serving.clone()),
                    pinned,
                    now,
                )
            },
            (&mut self.located, backend),
        );
        books.committed += estimate.bytes;
        books.changed = now;
        let mut plan = LoadPlan {
            backend,
            model: model.to_string(),
            versions,
            serving,
            reason: LoadReason::New,
            evict,
            done,
            expect: Vec::new(),
        };
        self.stamp(&mut plan);
        plan
    }
}

/// Puts the ready copy of `model` on `backend` into `Reloading` towards `to` and books its
/// new estimate: the one step every reload of a copy takes (a version more, a newer
/// "latest", versions retired). The plan evicts nothing; the caller adds victims it took.
pub(super) fn start_reload(
    books: &mut Books,
    backend: usize,
    model: &str,
    to: Versions,
    sizing: &Sizing,
    reason: LoadReason,
    now: Instant,
) -> LoadPlan {
    let estimate = sizing.estimate(&to);
    let serving = to.resolve(sizing.newest());
    let (done, waiting) = watch::channel(None);
    let from = books
        .modify(model, |copy| {
            let from = Estimate {
                bytes: copy.size,
                source: copy.source,
            };
            copy.state = CopyState::Reloading(Reload {
                waiting,
                to: to.clone(),
                to_serving: serving.clone(),
                from,
            });
            copy.size = estimate.bytes;
            copy.source = estimate.source;
            from
        })
        .expect("the backend has a copy to reload");
    books.committed = books.committed - from.bytes + estimate.bytes;
    books.changed = now;
    LoadPlan {
        backend,
        model: model.to_string(),
        versions: to,
        serving,
        reason,
        evict: Vec::new(),
        done,
        expect: Vec::new(),
    }
}
