//! Placement shared by replicas (`[cluster]`): the pool's copies live in a registry every
//! replica can change only by compare-and-set, and each replica's books mirror it.
//!
//! A replica still decides alone, on its own books, but its decision counts only once the
//! registry agrees: the copies and the backend it touches must be as the books saw them
//! (`Change::expect`). A replica that loses the race takes the registry's records into its
//! books (`Placement::mirror`, forced) and decides again, so it waits on the winner's load
//! or serves from the winner's copy. What other replicas agree reaches the books the same
//! way, through the registry's watch, so a warm hit never waits on the registry.
//!
//! This module is the contract placement needs; `cluster::registry` keeps it in etcd.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;

/// A copy as the registry holds it: where it is, in which state, for what and whose.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedCopy {
    /// What the pool may do with it.
    pub state: SharedState,
    /// Bytes it is counted for against the backend's capacity.
    pub bytes: u64,
    /// Loaded to serve the default policy (a request without a version).
    pub latest: bool,
    /// Versions asked for by number.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub pinned: BTreeSet<u64>,
    /// The version numbers it serves (or will, once loaded).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub serving: BTreeSet<u64>,
    /// The replica that made the last change (for a load: the one running it).
    pub replica: String,
    /// That replica's lease: a load whose lease has ended is finished or undone by the
    /// leader (`Placement::housekeep`).
    pub lease: i64,
    /// When the state was set, seconds since the Unix epoch: an index read before it says
    /// nothing about this copy.
    pub at_unix: f64,
}

/// A copy's state in the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharedState {
    /// A replica is loading it: others wait on it, nobody else loads it there.
    Loading,
    /// Serving, to every replica.
    Ready,
    /// Being unloaded: served no more, its bytes still held until the backend lets go.
    Departing,
}

impl SharedCopy {
    /// Bytes it adds to a backend's (committed, loading, departing) totals.
    pub fn counts(copy: Option<&SharedCopy>) -> [i64; 3] {
        let Some(copy) = copy else { return [0; 3] };
        let bytes = i64::try_from(copy.bytes).unwrap_or(i64::MAX);
        match copy.state {
            SharedState::Loading => [bytes, bytes, 0],
            SharedState::Ready => [bytes, 0, 0],
            SharedState::Departing => [0, 0, bytes],
        }
    }
}

/// The registry's record of one model: its copies, and its failed loads, by backend name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelRecord {
    /// Copies by backend name.
    pub copies: BTreeMap<String, SharedCopy>,
    /// Backends where its last load failed: no replica loads it there again before
    /// `retry_at_unix`, so a failing model is not retried once per replica.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backoffs: BTreeMap<String, SharedBackoff>,
}

/// A model's failed loads on one backend, as every replica backs off from them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedBackoff {
    /// Failures in a row.
    pub failures: u32,
    /// Not before, seconds since the Unix epoch.
    pub retry_at_unix: f64,
    /// The backend's message.
    pub reason: String,
}

/// A registry key the books take in (`Table::mirror`), whose revision a change compares
/// before it counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Synced {
    /// `copies/{model}`.
    Model(String),
    /// `backends/{backend}`, by the backend's place in the pool.
    Backend(usize),
}

/// A change to copies on one backend, agreed or settled as one transaction.
#[derive(Clone, Debug)]
pub struct Change {
    /// The backend's name.
    pub backend: String,
    /// Its usable bytes (capacity less the buffer): the registry refuses a change that
    /// would commit more.
    pub usable: u64,
    /// Each model's copy there: `from` (the state it must be in, `None`: absent) and `to`
    /// (`None`: gone).
    pub copies: Vec<CopyChange>,
    /// The revisions the books saw each touched model's record at (`agree` only; `0`: it
    /// did not exist).
    pub expect_models: Vec<(String, i64)>,
    /// And the backend's record.
    pub expect_backend: i64,
}

/// One copy's part of a `Change`.
#[derive(Clone, Debug)]
pub struct CopyChange {
    /// The model.
    pub model: String,
    /// What `settle` requires the registry's copy to be before it changes it: its state
    /// (`None`: absent; `agree` compares revisions instead)...
    pub from: Option<SharedState>,
    /// ...and, when set, the lease it was stamped with (a load: only its loader settles it).
    pub lease: Option<i64>,
    /// What it becomes.
    pub to: Option<SharedCopy>,
    /// A failed load's backoff there (a copy that turns ready clears it).
    pub backoff: Option<SharedBackoff>,
}

/// What `agree` answered.
#[derive(Debug)]
pub enum Agreed {
    /// The change is the registry's: the touched records as written.
    Yes(Vec<Record>),
    /// Another replica changed a touched key first, or the change would overcommit the
    /// backend: the records as they are now, to take into the books before deciding again.
    Lost(Vec<Record>),
    /// The registry cannot be reached: the records as last known, to undo the change in the
    /// books.
    Unreachable(Vec<Record>),
}

/// A key's current value, as `Placement::mirror` takes it.
#[derive(Clone, Debug)]
pub enum Record {
    /// `copies/{model}` (`None`: no copies) at its revision (for a deleted key, the
    /// deletion's: the books then take it as absent, revision 0).
    Model(String, Option<ModelRecord>, i64),
    /// `backends/{backend}` at a revision (its totals are the registry's business).
    Backend(String, i64),
}

/// One replica's use of one copy, as its in-use marks publish it (on the replica's lease,
/// so they go with it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InUse {
    /// The backend's name.
    pub backend: String,
    /// The model.
    pub model: String,
    /// A request or a live sequence of that replica holds it now.
    pub busy: bool,
    /// When that replica's requests last finished with it, seconds since the Unix epoch.
    pub last_used_unix: f64,
}

/// What the repository API said of a model (`placement::spec`), shared so every replica
/// loads it with the same override and none loads a model another replica unloaded on
/// purpose. `{prefix}/specs/{model}`; no key: the default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedSpec {
    /// The config override its copies are loaded with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// Unloaded through the repository API.
    pub unloaded: bool,
}

/// A boxed future, as a trait object's method returns it.
pub type Pending<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The registry placement agrees its changes with.
pub trait Registry: Send + Sync + std::fmt::Debug {
    /// This replica's name and its current lease, stamped on the copies it changes.
    fn me(&self) -> (String, i64);
    /// Whether the registry can be reached now: no load is decided blind.
    fn reachable(&self) -> bool;
    /// Whether this replica runs the pool's housekeeping (the election's leader).
    fn leads(&self) -> bool;
    /// Agrees a change this replica decided, before any of it is carried out.
    fn agree(&self, change: Change) -> Pending<Agreed>;
    /// The registry's records of `models`, as this replica last saw them.
    fn known(&self, models: &[String]) -> Vec<Record>;
    /// Records how an agreed change ended (a load done or failed, a copy gone); retried in
    /// the background, in order, until the registry has it.
    fn settle(&self, change: Change);
    /// Publishes a model's spec after the repository API changed it (`None`: the default),
    /// in order with the settles.
    fn share_spec(&self, model: &str, spec: Option<SharedSpec>);
}
