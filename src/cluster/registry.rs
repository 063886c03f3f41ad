//! The pool's placement registry in etcd (`placement::registry` is the contract):
//! - `{prefix}/copies/{model}`: the model's copies by backend (`ModelRecord`);
//! - `{prefix}/backends/{backend}`: the backend's usable bytes and what its copies commit,
//!   load and release (`BackendRecord`), rewritten by every change on the backend, so two
//!   changes there conflict;
//! - `{prefix}/inuse/{replica}`: the replica's in-use marks, on its lease.
//!
//! `agree` is one transaction comparing the touched keys' revisions with those the books
//! saw; `settle` runs in order in the background and retries until etcd has it.

use super::Cluster;
use super::etcd::{Client, Compare, RequestOp, ResponseOp, TxnRequest, call, response_op};
use super::view::{self, View};
use crate::placement::Placement;
use crate::placement::registry::{
    Agreed, Change, CopyChange, InUse, ModelRecord, Pending, Record, Registry, SharedCopy,
    SharedSpec,
};
use crate::telemetry;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// `{prefix}/backends/{backend}`: what the registry's copies hold on one backend.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendRecord {
    /// Capacity less `mem_buffer`, as the replica that wrote it has it configured.
    pub usable: u64,
    /// Bytes of its copies loading or ready.
    pub committed: u64,
    /// Of those, bytes still loading.
    pub loading: u64,
    /// Bytes of copies being unloaded, still held.
    pub departing: u64,
}

impl BackendRecord {
    /// The totals of every copy the view has on `backend`, with `changed` models' copies
    /// replaced by the given ones.
    fn of(
        view: &View,
        backend: &str,
        usable: u64,
        changed: &[(String, Option<&SharedCopy>)],
    ) -> Self {
        let mut totals = [0i64; 3];
        let mut add = |copy: Option<&SharedCopy>| {
            for (total, bytes) in totals.iter_mut().zip(SharedCopy::counts(copy)) {
                *total += bytes;
            }
        };
        for (model, entry) in view.under(view::COPIES) {
            if changed.iter().any(|(m, _)| m == model) {
                continue;
            }
            if let Ok(record) = serde_json::from_slice::<ModelRecord>(&entry.value) {
                add(record.copies.get(backend));
            }
        }
        for (_, copy) in changed {
            add(*copy);
        }
        let [committed, loading, departing] = totals.map(|t| t.max(0) as u64);
        Self {
            usable,
            committed,
            loading,
            departing,
        }
    }
}

fn model_key(view: &View, model: &str) -> String {
    view.key(&format!("{}{model}", view::COPIES))
}

fn backend_key(view: &View, backend: &str) -> String {
    view.key(&format!("{}{backend}", view::BACKENDS))
}

/// A model's record in the view, and its revision (0: absent).
fn model_in(view: &View, model: &str) -> (Option<ModelRecord>, i64) {
    let entry = view.get(&format!("{}{model}", view::COPIES));
    let record = entry.and_then(|e| serde_json::from_slice(&e.value).ok());
    (record, entry.map_or(0, |e| e.mod_revision))
}

/// A backend record's revision in the view (0: absent).
fn backend_in(view: &View, backend: &str) -> i64 {
    view.get(&format!("{}{backend}", view::BACKENDS))
        .map_or(0, |e| e.mod_revision)
}

/// The touched models' records as the view has them, with their revisions.
fn touched(view: &View, change: &Change) -> Vec<(String, Option<ModelRecord>, i64)> {
    (change.copies.iter())
        .map(|c| {
            let (record, revision) = model_in(view, &c.model);
            (c.model.clone(), record, revision)
        })
        .collect()
}

/// The records the view has for a change's keys: what the books take when it is not agreed.
fn known(view: &View, change: &Change) -> Vec<Record> {
    let models = touched(view, change).into_iter();
    models
        .map(|(model, record, revision)| Record::Model(model, record, revision))
        .chain([Record::Backend(
            change.backend.clone(),
            backend_in(view, &change.backend),
        )])
        .collect()
}

/// Compares a key's revision: `0` means it must not exist.
fn unchanged(key: &str, revision: i64) -> Compare {
    if revision == 0 {
        Compare::absent(key)
    } else {
        Compare::written_at(key, revision)
    }
}

/// A change as one transaction over `current` (each touched model's record as it is now,
/// at its revision) and the backend's revision: `None` when a copy is not `from` what a
/// settle requires, or when an agreement would overcommit the backend.
struct Plan {
    txn: TxnRequest,
    written: Vec<(String, Option<ModelRecord>)>,
}

/// Builds the `Plan` (see there): each model's record with its copy changed, then the
/// backend's record, each compared at the revision it was read at.
fn plan(
    view: &View,
    change: &Change,
    current: &[(String, Option<ModelRecord>, i64)],
    backend_revision: i64,
    settling: bool,
) -> Option<Plan> {
    let mut compares = Vec::new();
    let mut puts = Vec::new();
    let mut written = Vec::new();
    let mut changed: Vec<(String, Option<SharedCopy>)> = Vec::new();
    let mut before: Vec<(String, Option<SharedCopy>)> = Vec::new();
    for ((model, record, revision), copy) in current.iter().zip(&change.copies) {
        let (record, old) = apply_copy(record.as_ref(), &change.backend, copy, settling)?;
        before.push((model.clone(), old));
        changed.push((model.clone(), copy.to.clone()));
        let key = model_key(view, model);
        compares.push(unchanged(&key, *revision));
        let (put, kept) = model_write(key, record);
        puts.push(put);
        written.push((model.clone(), kept));
    }
    let will = backend_after(view, change, &before, &changed, settling)?;
    let key = backend_key(view, &change.backend);
    compares.push(unchanged(&key, backend_revision));
    puts.push(RequestOp::put(
        key,
        serde_json::to_vec(&will).expect("a record serializes"),
        0,
    ));
    let txn = TxnRequest {
        compare: compares,
        success: puts,
        failure: Vec::new(),
    };
    Some(Plan { txn, written })
}

/// One model's record with the change's copy on `backend` applied (a backoff kept, or
/// cleared by a ready copy), and the copy as it was; `None` when a settle finds the copy
/// not in the state, or not on the lease, it requires.
fn apply_copy(
    record: Option<&ModelRecord>,
    backend: &str,
    copy: &CopyChange,
    settling: bool,
) -> Option<(ModelRecord, Option<SharedCopy>)> {
    let mut record = record.cloned().unwrap_or_default();
    let old = record.copies.get(backend).cloned();
    if settling {
        let state_ok = old.as_ref().map(|c| c.state) == copy.from;
        let lease_ok = copy
            .lease
            .is_none_or(|l| old.as_ref().is_some_and(|c| c.lease == l));
        if !(state_ok && lease_ok) {
            return None;
        }
    }
    match &copy.to {
        Some(to) => record.copies.insert(backend.to_owned(), to.clone()),
        None => record.copies.remove(backend),
    };
    if let Some(backoff) = &copy.backoff {
        record.backoffs.insert(backend.to_owned(), backoff.clone());
    } else if copy
        .to
        .as_ref()
        .is_some_and(|c| c.state == crate::placement::registry::SharedState::Ready)
    {
        record.backoffs.remove(backend);
    }
    Some((record, old))
}

/// The write for a model's record: an empty record is deleted rather than kept, so the
/// registry holds only models some backend has or backs off. Returns what was written.
fn model_write(key: String, record: ModelRecord) -> (RequestOp, Option<ModelRecord>) {
    if record.copies.is_empty() && record.backoffs.is_empty() {
        (RequestOp::delete(key), None)
    } else {
        let value = serde_json::to_vec(&record).expect("a record serializes");
        (RequestOp::put(key, value, 0), Some(record))
    }
}

/// The backend's record after the change, `None` when an agreement would overcommit it.
fn backend_after(
    view: &View,
    change: &Change,
    before: &[(String, Option<SharedCopy>)],
    changed: &[(String, Option<SharedCopy>)],
    settling: bool,
) -> Option<BackendRecord> {
    /// `BackendRecord::of` reads copies by reference.
    fn borrowed(copies: &[(String, Option<SharedCopy>)]) -> Vec<(String, Option<&SharedCopy>)> {
        copies
            .iter()
            .map(|(m, c)| (m.clone(), c.as_ref()))
            .collect()
    }
    let (old, new) = (borrowed(before), borrowed(changed));
    let was = BackendRecord::of(view, &change.backend, change.usable, &old);
    let will = BackendRecord::of(view, &change.backend, change.usable, &new);
    // The books' rule: what is committed, and what departing copies still hold from before,
    // fits in the usable bytes; a change that commits nothing more always may, and a settle
    // records what happened on the backend.
    if !settling && will.committed > was.committed && will.committed + was.departing > change.usable
    {
        return None;
    }
    Some(will)
}

impl Registry for Cluster {
    fn me(&self) -> (String, i64) {
        (
            self.replica().to_string(),
            self.lease.load(Ordering::Relaxed),
        )
    }

    fn reachable(&self) -> bool {
        !self.is_degraded()
    }

    fn leads(&self) -> bool {
        !self.is_degraded() && self.view().leader().as_deref() == Some(self.replica())
    }

    fn agree(&self, change: Change) -> Pending<Agreed> {
        let client = self.client.lock().expect("cluster client").clone();
        let view = self.view();
        let Some(client) = client.filter(|_| !self.is_degraded()) else {
            return Box::pin(std::future::ready(Agreed::Unreachable(known(
                &view, &change,
            ))));
        };
        // The view is as new as the books, or newer: a key it has at another revision than
        // the books saw has changed since they decided.
        let records = known(&view, &change);
        let stale = (change.expect_models.iter())
            .any(|(model, expected)| model_in(&view, model).1 != *expected)
            || backend_in(&view, &change.backend) != change.expect_backend;
        let current = touched(&view, &change);
        let planned = (!stale)
            .then(|| plan(&view, &change, &current, change.expect_backend, false))
            .flatten();
        drop(view);
        let Some(Plan { mut txn, written }) = planned else {
            return Box::pin(std::future::ready(Agreed::Lost(records)));
        };
        let me = self.replica().to_string();
        let backend = change.backend.clone();
        let (reads, prefix) = {
            let view = self.view();
            let reads: Vec<RequestOp> = (change.copies.iter())
                .map(|c| RequestOp::get(model_key(&view, &c.model)))
                .chain([RequestOp::get(backend_key(&view, &backend))])
                .collect();
            (reads, view.key(""))
        };
        // Lost: the touched keys as they are now, for the books.
        txn.failure = reads;
        let models: Vec<String> = change.copies.iter().map(|c| c.model.clone()).collect();
        Box::pin(async move {
            let mut client = client;
            let answer = match call("txn", &me, client.txn(txn)).await {
                Ok(answer) => answer,
                Err(_) => return Agreed::Unreachable(records),
            };
            let revision = answer.header.map_or(0, |h| h.revision);
            if answer.succeeded {
                let mut done: Vec<Record> = written
                    .into_iter()
                    .map(|(model, record)| Record::Model(model, record, revision))
                    .collect();
                done.push(Record::Backend(backend, revision));
                return Agreed::Yes(done);
            }
            Agreed::Lost(answered(&prefix, answer.responses, &models, &backend))
        })
    }

    fn known(&self, models: &[String]) -> Vec<Record> {
        let view = self.view();
        (models.iter())
            .map(|model| {
                let (record, revision) = model_in(&view, model);
                Record::Model(model.clone(), record, revision)
            })
            .collect()
    }

    fn settle(&self, change: Change) {
        let _ = self.settles.send(Write::Settle(change));
    }

    fn share_spec(&self, model: &str, spec: Option<SharedSpec>) {
        let _ = self.settles.send(Write::Spec(model.to_string(), spec));
    }
}

/// The records a failed transaction's gets returned, for every touched key (absent: no
/// copies, revision 0).
fn answered(
    prefix: &str,
    responses: Vec<ResponseOp>,
    models: &[String],
    backend: &str,
) -> Vec<Record> {
    let mut records: Vec<Record> = models
        .iter()
        .map(|m| Record::Model(m.clone(), None, 0))
        .chain([Record::Backend(backend.to_string(), 0)])
        .collect();
    for response in responses {
        let Some(response_op::Response::ResponseRange(got)) = response.response else {
            continue;
        };
        for kv in got.kvs {
            let key = String::from_utf8_lossy(&kv.key);
            let Some(relative) = key.strip_prefix(prefix) else {
                continue;
            };
            for record in records.iter_mut() {
                match record {
                    Record::Model(model, shared, revision)
                        if relative.strip_prefix(view::COPIES) == Some(model.as_str()) =>
                    {
                        *shared = serde_json::from_slice(&kv.value).ok();
                        *revision = kv.mod_revision;
                    }
                    Record::Backend(name, revision)
                        if relative.strip_prefix(view::BACKENDS) == Some(name.as_str()) =>
                    {
                        *revision = kv.mod_revision;
                    }
                    _ => {}
                }
            }
        }
    }
    records
}

/// What the background writer applies, in order (`settle_loop`).
#[derive(Debug)]
pub enum Write {
    /// How an agreed change ended.
    Settle(Change),
    /// A model's spec (`None`: back to the default).
    Spec(String, Option<SharedSpec>),
}

/// Why a settle must be tried again.
enum Retry {
    /// A touched key changed between the read and the transaction.
    Conflict,
    /// etcd cannot be reached.
    Unreachable,
}

impl Cluster {
    /// Applies settles one at a time, in order, each until etcd has it (or it no longer
    /// applies: the copy is not what it was when the outcome was reported).
    pub(super) async fn settle_loop(
        self: Arc<Self>,
        mut changes: tokio::sync::mpsc::UnboundedReceiver<Write>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        loop {
            let change = tokio::select! {
                _ = shutdown.cancelled() => return,
                change = changes.recv() => match change { Some(c) => c, None => return },
            };
            let mut pause = Duration::from_millis(100);
            loop {
                let written = match &change {
                    Write::Settle(change) => self.try_settle(change).await,
                    Write::Spec(model, spec) => self.put_spec(model, spec.as_ref()).await,
                };
                match written {
                    Ok(()) => break,
                    Err(Retry::Conflict) => {
                        metrics::counter!(telemetry::CLUSTER_CONFLICTS, "key" => "settle", "replica" => self.replica().to_string())
                            .increment(1);
                    }
                    Err(Retry::Unreachable) => {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(pause) => {}
                        }
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                }
            }
        }
    }

    /// A load this replica finished that the registry no longer has (the leader undid it,
    /// taking this replica for dead, and the room may be someone else's now): it is
    /// unloaded, so the backend holds only what the registry counts.
    fn abandon_if_unaccounted(
        &self,
        change: &Change,
        current: &[(String, Option<ModelRecord>, i64)],
    ) {
        use crate::placement::registry::SharedState;
        let Some(placement) = self.placement.get() else {
            return;
        };
        for (copy, (_, record, _)) in change.copies.iter().zip(current) {
            let finished_load = copy.from == Some(SharedState::Loading)
                && copy
                    .to
                    .as_ref()
                    .is_some_and(|c| c.state == SharedState::Ready);
            let counted = record
                .as_ref()
                .is_some_and(|r| r.copies.contains_key(&change.backend));
            if finished_load && !counted {
                tracing::warn!(
                    model = copy.model,
                    backend = change.backend,
                    "the registry no longer counts a copy this replica loaded (its load was undone): unloading it"
                );
                placement
                    .clone()
                    .abandon_unaccounted(&change.backend, &copy.model);
            }
        }
    }

    async fn put_spec(&self, model: &str, spec: Option<&SharedSpec>) -> Result<(), Retry> {
        let client = self.client.lock().expect("cluster client").clone();
        let Some(mut client) = client.filter(|_| !self.is_degraded()) else {
            return Err(Retry::Unreachable);
        };
        let key = self.view().key(&format!("{}{model}", view::SPECS));
        let me = self.replica();
        let written = match spec {
            Some(spec) => {
                let value = serde_json::to_vec(spec).expect("a spec serializes");
                call("put", me, client.put(key, value, 0)).await.map(drop)
            }
            None => call("delete", me, client.delete(key)).await,
        };
        written.map_err(|_| Retry::Unreachable)
    }

    async fn try_settle(&self, change: &Change) -> Result<(), Retry> {
        let client = self.client.lock().expect("cluster client").clone();
        let Some(mut client) = client.filter(|_| !self.is_degraded()) else {
            return Err(Retry::Unreachable);
        };
        let me = self.replica().to_string();
        let mut current = Vec::new();
        for copy in &change.copies {
            let key = model_key(&self.view(), &copy.model);
            let got = call("get", &me, client.get(key))
                .await
                .map_err(|_| Retry::Unreachable)?;
            let kv = got.kvs.first();
            let record = kv.and_then(|kv| serde_json::from_slice(&kv.value).ok());
            current.push((
                copy.model.clone(),
                record,
                kv.map_or(0, |kv| kv.mod_revision),
            ));
        }
        let key = backend_key(&self.view(), &change.backend);
        let got = call("get", &me, client.get(key))
            .await
            .map_err(|_| Retry::Unreachable)?;
        let backend_revision = got.kvs.first().map_or(0, |kv| kv.mod_revision);
        let planned = plan(&self.view(), change, &current, backend_revision, true);
        let Some(Plan { txn, .. }) = planned else {
            tracing::debug!(
                backend = change.backend,
                "a settle no longer applies: the registry moved on"
            );
            self.abandon_if_unaccounted(change, &current);
            return Ok(());
        };
        let answer = call("txn", &me, client.txn(txn))
            .await
            .map_err(|_| Retry::Unreachable)?;
        if answer.succeeded {
            Ok(())
        } else {
            Err(Retry::Conflict)
        }
    }

    /// Takes the watch's changes to placement keys into the books: copies, backends, and
    /// other replicas' in-use marks.
    pub(super) fn mirror_changes(
        &self,
        placement: &Arc<Placement>,
        changes: &[view::Change],
        revision: i64,
    ) {
        let view = self.view();
        let prefix = view.key("");
        let mut records = Vec::new();
        let mut marks_changed = false;
        let mut specs: Vec<(String, Option<SharedSpec>)> = Vec::new();
        for change in changes {
            let key = match change {
                view::Change::Put(key, _) | view::Change::Delete(key) => key,
            };
            let Some(relative) = key.strip_prefix(&prefix) else {
                continue;
            };
            if let Some(model) = relative.strip_prefix(view::COPIES) {
                // A deleted record carries the deletion's revision: news to the books.
                let (record, at) = model_in(&view, model);
                let at = if record.is_some() { at } else { revision };
                records.push(Record::Model(model.to_string(), record, at));
            } else if let Some(backend) = relative.strip_prefix(view::BACKENDS) {
                let entry = view.get(relative);
                records.push(Record::Backend(
                    backend.to_string(),
                    entry.map_or(0, |e| e.mod_revision),
                ));
            } else if relative.starts_with(view::INUSE) {
                marks_changed = true;
            } else if let Some(model) = relative.strip_prefix(view::SPECS) {
                let spec = view
                    .get(relative)
                    .and_then(|e| serde_json::from_slice(&e.value).ok());
                specs.push((model.to_string(), spec));
            }
        }
        let marks = marks_changed.then(|| self.others_marks(&view));
        drop(view);
        if !records.is_empty() {
            placement.mirror(&records);
        }
        if let Some(marks) = marks {
            placement.remote_use(&marks);
        }
        for (model, spec) in specs {
            placement.take_spec(&model, spec.as_ref());
        }
    }

    /// Takes the whole registry into the books, as a session starts: every model the view
    /// has, and every model the books have that it does not (gone while this replica was
    /// away).
    pub(super) fn resync(&self, placement: &Arc<Placement>) {
        let view = self.view();
        let mut records: Vec<Record> = view
            .under(view::COPIES)
            .map(|(model, e)| {
                Record::Model(
                    model.to_string(),
                    serde_json::from_slice(&e.value).ok(),
                    e.mod_revision,
                )
            })
            .collect();
        records.extend(
            view.under(view::BACKENDS)
                .map(|(b, e)| Record::Backend(b.to_string(), e.mod_revision)),
        );
        let known: HashSet<String> = view
            .under(view::COPIES)
            .map(|(m, _)| m.to_string())
            .collect();
        for model in placement.held_models() {
            if !known.contains(&model) {
                records.push(Record::Model(model, None, view.revision()));
            }
        }
        let marks = self.others_marks(&view);
        let specs: Vec<(String, Option<SharedSpec>)> = (view.under(view::SPECS))
            .map(|(m, e)| (m.to_string(), serde_json::from_slice(&e.value).ok()))
            .collect();
        drop(view);
        placement.mirror(&records);
        placement.remote_use(&marks);
        for (model, spec) in specs {
            placement.take_spec(&model, spec.as_ref());
        }
    }

    fn others_marks(&self, view: &View) -> Vec<InUse> {
        let mine = self.replica();
        view.under(view::INUSE)
            .filter(|(replica, _)| *replica != mine)
            .filter_map(|(_, e)| serde_json::from_slice::<Vec<InUse>>(&e.value).ok())
            .flatten()
            .collect()
    }

    /// Publishes this replica's in-use marks on its lease when they changed since `sent`.
    pub(super) async fn publish_marks(
        &self,
        placement: &Placement,
        client: &mut Client,
        lease: i64,
        sent: &mut Option<Vec<u8>>,
    ) -> Result<(), String> {
        let mut marks = placement.used_here();
        marks.sort_by(|a, b| (&a.model, &a.backend).cmp(&(&b.model, &b.backend)));
        // Times move on every use; published to the second, a steady stream of requests
        // writes once a second at most.
        for mark in &mut marks {
            mark.last_used_unix = mark.last_used_unix.floor();
        }
        let value = serde_json::to_vec(&marks).expect("marks serialize");
        if sent.as_ref() == Some(&value) {
            return Ok(());
        }
        let key = self
            .view()
            .key(&format!("{}{}", view::INUSE, self.replica()));
        call("put", self.replica(), client.put(key, value.clone(), lease)).await?;
        *sent = Some(value);
        Ok(())
    }

    /// The leader's round over loads whose replica died (its lease is gone): each is
    /// finished or undone once (`Placement::finish_orphan`). `orphans` holds, per load,
    /// when this leader first saw its replica gone, or `None` once the load is settled.
    pub(super) fn finish_orphans(
        &self,
        placement: &Placement,
        orphans: &mut HashMap<(String, String, i64), Option<tokio::time::Instant>>,
    ) {
        if !self.leads() {
            return;
        }
        let view = self.view();
        let live: HashSet<i64> = view.under(view::REPLICAS).map(|(_, e)| e.lease).collect();
        let mut found = Vec::new();
        for (model, entry) in view.under(view::COPIES) {
            let Ok(record) = serde_json::from_slice::<ModelRecord>(&entry.value) else {
                continue;
            };
            for (backend, copy) in record.copies {
                let dead = !live.contains(&copy.lease);
                if dead && copy.state == crate::placement::registry::SharedState::Loading {
                    found.push(((model.to_string(), backend, copy.lease), copy));
                }
            }
        }
        drop(view);
        let now = tokio::time::Instant::now();
        for (id, copy) in found {
            let Some(seen_dead) = *orphans.entry(id.clone()).or_insert(Some(now)) else {
                continue;
            };
            if placement.finish_orphan(&id.0, &id.1, &copy, seen_dead) {
                orphans.insert(id, None);
            }
        }
    }
}
