//! Placement's side of `[cluster]` (see `registry`): every change this replica decides is
//! agreed with the pool's registry before it is carried out, every outcome is settled there
//! after, and what the registry holds is mirrored into the books.

use super::Placement;
use super::registry::{
    Agreed, Change, CopyChange, InUse, Record, Registry, SharedBackoff, SharedCopy, SharedSpec,
    SharedState, Synced,
};
use super::table::{CopyEntry, CopyState, LoadPlan, LoadReason, UseMark};
use crate::telemetry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// Now, in seconds since the Unix epoch: how the registry tells time across replicas.
pub(crate) fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Awaits an agreement, timed into `infergate_placement_agree_duration_seconds{result}`.
async fn timed(agreement: super::registry::Pending<Agreed>) -> Agreed {
    let started = Instant::now();
    let answer = agreement.await;
    let result = match answer {
        Agreed::Yes(_) => "agreed",
        Agreed::Lost(_) => "lost",
        Agreed::Unreachable(_) => "unreachable",
    };
    metrics::histogram!(telemetry::PLACEMENT_AGREE_DURATION, "result" => result)
        .record(started.elapsed().as_secs_f64());
    answer
}

impl Placement {
    /// Shares placement with the other replicas through `registry` (once, at start).
    pub fn share_through(&self, registry: Arc<dyn Registry>) {
        let _ = self.registry.set(registry);
    }

    pub(super) fn registry(&self) -> Option<&Arc<dyn Registry>> {
        self.registry.get()
    }

    /// Whether this replica runs reconciliation, scaling and retiring: alone it does; in a
    /// pool, the elected leader does, so nothing runs twice.
    pub(super) fn runs_housekeeping(&self) -> bool {
        self.registry().is_none_or(|r| r.leads())
    }

    /// A copy on the books as the registry records it, in `state`.
    fn shared(&self, copy: &CopyEntry, state: SharedState) -> SharedCopy {
        let (replica, lease) = self.registry().map(|r| r.me()).unwrap_or_default();
        SharedCopy {
            state,
            bytes: copy.size,
            latest: copy.versions.latest,
            pinned: copy.versions.pinned.clone(),
            serving: copy.serving.clone(),
            replica,
            lease,
            at_unix: now_unix(),
        }
    }

    fn change(&self, b: usize, copies: Vec<CopyChange>, expect: &[(Synced, i64)]) -> Change {
        let usable = self.books().backends()[b].usable;
        let expect_backend = expect
            .iter()
            .find_map(|(key, rev)| matches!(key, Synced::Backend(_)).then_some(*rev))
            .unwrap_or(0);
        Change {
            backend: self.pool.backends()[b].name.clone(),
            usable,
            copies,
            expect_models: (expect.iter())
                .filter_map(|(key, rev)| match key {
                    Synced::Model(m) => Some((m.clone(), *rev)),
                    Synced::Backend(_) => None,
                })
                .collect(),
            expect_backend,
        }
    }

    /// Agrees a load plan (and its evictions) with the registry; `false` when another
    /// replica got there first or the registry cannot be reached, after taking the
    /// registry's records into the books. Alone, every plan is agreed.
    pub(super) async fn agree_plan(&self, plan: &LoadPlan) -> bool {
        let Some(registry) = self.registry() else {
            return true;
        };
        let copies = {
            let books = self.books();
            let held = &books.backends()[plan.backend];
            // The mirror took it off meanwhile: the registry's records won; its victims
            // go back to what the registry says of them.
            let Some(copy) = held.copies.get(&plan.model) else {
                drop(books);
                let models: Vec<String> = std::iter::once(plan.model.clone())
                    .chain(plan.evict.iter().map(|v| v.model.clone()))
                    .collect();
                self.mirror_books(&registry.known(&models), true);
                return false;
            };
            // A reload keeps serving what it served while it runs.
            let state = match copy.state {
                CopyState::Loading(_) => SharedState::Loading,
                _ => SharedState::Ready,
            };
            let mut copies = vec![CopyChange {
                model: plan.model.clone(),
                from: None,
                lease: None,
                to: Some(self.shared(copy, state)),
                backoff: None,
            }];
            for victim in &plan.evict {
                let bytes = held.departing.get(&victim.model).map_or(0, |d| d.bytes);
                copies.push(CopyChange {
                    model: victim.model.clone(),
                    from: Some(SharedState::Ready),
                    lease: None,
                    to: Some(self.departing(bytes)),
                    backoff: None,
                });
            }
            copies
        };
        let change = self.change(plan.backend, copies, &plan.expect);
        self.agreed(timed(registry.agree(change)).await)
    }

    fn departing(&self, bytes: u64) -> SharedCopy {
        let (replica, lease) = self.registry().map(|r| r.me()).unwrap_or_default();
        SharedCopy {
            state: SharedState::Departing,
            bytes,
            latest: false,
            pinned: Default::default(),
            serving: Default::default(),
            replica,
            lease,
            at_unix: now_unix(),
        }
    }

    /// Agrees taking a ready copy out of service (an explicit unload, scale-down,
    /// retirement) before it is unloaded; the books already have it departing.
    pub(super) async fn agree_departure(&self, b: usize, model: &str) -> bool {
        let Some(registry) = self.registry() else {
            return true;
        };
        let (bytes, expect) = {
            let books = self.books();
            let bytes = books.backends()[b]
                .departing
                .get(model)
                .map_or(0, |d| d.bytes);
            let expect: Vec<(Synced, i64)> = [Synced::Model(model.to_string()), Synced::Backend(b)]
                .into_iter()
                .map(|key| {
                    let rev = books.synced(&key);
                    (key, rev)
                })
                .collect();
            (bytes, expect)
        };
        let copies = vec![CopyChange {
            model: model.to_string(),
            from: Some(SharedState::Ready),
            lease: None,
            to: Some(self.departing(bytes)),
            backoff: None,
        }];
        let change = self.change(b, copies, &expect);
        self.agreed(timed(registry.agree(change)).await)
    }

    fn agreed(&self, answer: Agreed) -> bool {
        let replica = self.registry().map(|r| r.me().0).unwrap_or_default();
        match answer {
            Agreed::Yes(records) => {
                self.mirror_books(&records, false);
                true
            }
            Agreed::Lost(records) => {
                metrics::counter!(telemetry::CLUSTER_CONFLICTS, "key" => "placement", "replica" => replica)
                    .increment(1);
                self.mirror_books(&records, true);
                false
            }
            Agreed::Unreachable(records) => {
                self.mirror_books(&records, true);
                false
            }
        }
    }

    /// Tells the registry what became of a copy on backend `b`: whatever the books now
    /// have there (a ready copy, or none), provided the registry still has it `from`. A
    /// load is settled by its loader only.
    pub(super) fn settle_copy(&self, b: usize, model: &str, from: Option<SharedState>) {
        let Some(registry) = self.registry() else {
            return;
        };
        let (to, backoff) = {
            let books = self.books();
            let to = (books.backends()[b].copies.get(model))
                .filter(|c| matches!(c.state, CopyState::Ready))
                .map(|c| self.shared(c, SharedState::Ready));
            // A load that failed here: every replica backs off from it.
            let backoff = to.is_none().then(|| books.backoff(model, b)).flatten();
            (to, backoff)
        };
        let backoff = backoff.map(|(failures, retry_in, reason)| SharedBackoff {
            failures,
            retry_at_unix: now_unix() + retry_in.as_secs_f64(),
            reason: reason.to_string(),
        });
        let lease = (from == Some(SharedState::Loading)).then(|| registry.me().1);
        let copies = vec![CopyChange {
            model: model.to_string(),
            from,
            lease,
            to,
            backoff,
        }];
        registry.settle(self.change(b, copies, &[]));
    }

    /// Settles a finished load (see `settle_copy`).
    pub(super) fn settle_load(&self, plan: &LoadPlan) {
        let from = match plan.reason {
            LoadReason::New => SharedState::Loading,
            _ => SharedState::Ready,
        };
        self.settle_copy(plan.backend, &plan.model, Some(from));
    }

    /// Takes the records the registry's watch brings into the books, where they are news
    /// (`Table::mirror`); requests waiting for room look again.
    pub fn mirror(self: &Arc<Self>, records: &[Record]) {
        self.mirror_books(records, false);
        for b in 0..self.pool.backends().len() {
            self.offer_room(b);
        }
    }

    /// `mirror`; with `force`, also the records a lost agreement returned, which undo this
    /// replica's change.
    fn mirror_books(&self, records: &[Record], force: bool) {
        let lease = self.registry().map_or(0, |r| r.me().1);
        let backends = self.pool.backends();
        let place: HashMap<&str, usize> = (backends.iter().enumerate())
            .map(|(i, b)| (b.name.as_str(), i))
            .collect();
        {
            let mut books = self.books();
            let now = Instant::now();
            for record in records {
                match record {
                    Record::Model(model, shared, revision) => {
                        let key = Synced::Model(model.clone());
                        if !force && !books.is_newer(&key, *revision) {
                            continue;
                        }
                        let copies: Vec<Option<&SharedCopy>> = (backends.iter())
                            .map(|b| shared.as_ref().and_then(|r| r.copies.get(&b.name)))
                            .collect();
                        let pinned = self.pinned.contains(model);
                        books.mirror(model, &copies, (lease, force), pinned, now);
                        let backoffs = shared.as_ref().map(|r| &r.backoffs);
                        for (b, backend) in backends.iter().enumerate() {
                            let Some(backoff) = backoffs.and_then(|all| all.get(&backend.name))
                            else {
                                continue;
                            };
                            let wait = (backoff.retry_at_unix - now_unix()).max(0.0);
                            let retry_at = now + Duration::from_secs_f64(wait);
                            let failures = backoff.failures;
                            books.remote_backoff(model, b, failures, retry_at, &backoff.reason);
                        }
                        books.set_synced(key, if shared.is_some() { *revision } else { 0 });
                    }
                    Record::Backend(name, revision) => {
                        if let Some(&b) = place.get(name.as_str()) {
                            books.set_synced(Synced::Backend(b), *revision);
                        }
                    }
                }
            }
        }
    }

    /// Publishes the model's spec as it now is (after the repository API changed it).
    pub(super) fn share_spec(&self, model: &str) {
        let Some(registry) = self.registry() else {
            return;
        };
        let spec = self.specs.get(model);
        let shared = (spec != super::spec::Spec::default()).then(|| SharedSpec {
            config: spec.config.as_deref().map(str::to_string),
            unloaded: spec.unloaded,
        });
        registry.share_spec(model, shared);
    }

    /// Takes a spec another replica published (`share_spec`).
    pub fn take_spec(&self, model: &str, shared: Option<&SharedSpec>) {
        let spec = shared.map_or_else(super::spec::Spec::default, |s| super::spec::Spec {
            config: s.config.as_deref().map(Arc::from),
            unloaded: s.unloaded,
        });
        self.specs.replace(model, spec);
    }

    /// Takes a copy off the books and unloads it, in the background: the registry does not
    /// count it (see `cluster::registry`).
    pub fn abandon_unaccounted(self: Arc<Self>, backend: &str, model: &str) {
        let Some(b) = self.pool.backends().iter().position(|x| x.name == backend) else {
            return;
        };
        let model = model.to_string();
        tokio::spawn(async move {
            self.books().remove_copy(b, &model, Instant::now());
            self.unload_on(b, &model, "abandon").await;
        });
    }

    /// Every model the books have a copy of, or a copy departing: what a resync must
    /// look up in the registry.
    pub fn held_models(&self) -> Vec<String> {
        let books = self.books();
        let mut models: Vec<String> = (books.backends().iter())
            .flat_map(|b| b.copies.keys().chain(b.departing.keys()).cloned())
            .collect();
        models.sort();
        models.dedup();
        models
    }

    /// This replica's in-use marks: the copies its requests hold, and those they used
    /// within `min_churn_age`.
    pub fn used_here(&self) -> Vec<InUse> {
        let (now, unix) = (Instant::now(), now_unix());
        let books = self.books();
        let since = now.checked_sub(books.min_churn_age()).unwrap_or(now);
        let backends = self.pool.backends();
        books
            .used_here(since)
            .into_iter()
            .map(|mark| InUse {
                backend: backends[mark.backend].name.clone(),
                model: mark.model,
                busy: mark.busy,
                last_used_unix: unix - now.saturating_duration_since(mark.last_used).as_secs_f64(),
            })
            .collect()
    }

    /// Takes the other replicas' in-use marks into the books (`Table::remote_use`).
    pub fn remote_use(&self, marks: &[InUse]) {
        let (now, unix) = (Instant::now(), now_unix());
        let backends = self.pool.backends();
        let marks: Vec<UseMark> = marks
            .iter()
            .filter_map(|mark| {
                let backend = backends.iter().position(|b| b.name == mark.backend)?;
                let ago = Duration::from_secs_f64((unix - mark.last_used_unix).max(0.0));
                Some(UseMark {
                    backend,
                    model: mark.model.clone(),
                    busy: mark.busy,
                    last_used: now.checked_sub(ago).unwrap_or(now),
                })
            })
            .collect();
        self.books().remote_use(&marks);
    }

    /// The leader's part when a replica died while loading `model` on `backend` (its lease
    /// is gone): the load is finished if the backend has the model ready, undone if it has
    /// not got it at all, and left for the next round (`false`) while the backend still
    /// loads it, or while its index was read before `seen_dead` (an older index may predate
    /// the load request the dead replica sent).
    pub fn finish_orphan(
        &self,
        model: &str,
        backend: &str,
        copy: &SharedCopy,
        seen_dead: tokio::time::Instant,
    ) -> bool {
        let Some(registry) = self.registry() else {
            return true;
        };
        let Some(b) = self.pool.backends().iter().position(|b| b.name == backend) else {
            return true;
        };
        let index = self.pool.backends()[b].index();
        if index.read_at().is_none_or(|at| at < seen_dead) {
            return false;
        }
        let ready = index.ready_versions(model);
        if ready.is_empty() && index.holds(model) {
            return false;
        }
        let to = (!ready.is_empty()).then(|| SharedCopy {
            state: SharedState::Ready,
            serving: ready,
            at_unix: now_unix(),
            ..copy.clone()
        });
        drop(index);
        tracing::info!(
            model,
            backend,
            finished = to.is_some(),
            "a replica died while loading this copy: finished it (the backend has it) or undid it"
        );
        let copies = vec![CopyChange {
            model: model.to_string(),
            from: Some(SharedState::Loading),
            lease: Some(copy.lease),
            to,
            backoff: None,
        }];
        registry.settle(self.change(b, copies, &[]));
        true
    }
}
