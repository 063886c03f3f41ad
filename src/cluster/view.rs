//! The replica's local copy of the registry: every key under the prefix with its value and
//! revisions, as of one etcd revision. One `get` fills it when a session starts, the watch
//! keeps it current, and everything this replica knows of the pool is read from it, so
//! nothing on the request path waits on etcd. Placement's compare-and-set reads the
//! `mod_revision`s it compares from here (`registry`).

use serde::Deserialize;
use std::collections::BTreeMap;

/// One key as etcd last reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The value (JSON for every key infergate writes).
    pub value: Vec<u8>,
    /// When the key was created: an election's candidates are ordered by it.
    pub create_revision: i64,
    /// When the key last changed: what a compare-and-set compares.
    pub mod_revision: i64,
    /// The lease the key is bound to (0: none).
    pub lease: i64,
}

/// A change the watch reported.
#[derive(Clone, Debug)]
pub enum Change {
    /// The key was created or changed.
    Put(String, Entry),
    /// The key was deleted (or its lease expired).
    Delete(String),
}

/// The registry under one prefix, as of `revision`.
#[derive(Debug)]
pub struct View {
    prefix: String,
    keys: BTreeMap<String, Entry>,
    revision: i64,
}

/// A replica record's value.
#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq)]
pub struct ReplicaRecord {
    /// Its `cluster.replica`.
    pub name: String,
    /// When it registered, seconds since the Unix epoch.
    pub started_at_unix: f64,
    /// The gateway's version.
    pub version: String,
}

/// The relative paths of the registry's key kinds (after `{prefix}/`).
pub const REPLICAS: &str = "replicas/";
/// Candidates of the housekeeping election (etcd's election API writes them).
pub const ELECTION: &str = "election";
/// Canary guard trips.
pub const TRIPS: &str = "trips/";
/// Learned model sizes.
pub const SIZES: &str = "sizes/";
/// Each model's copies (`placement::registry::ModelRecord`).
pub const COPIES: &str = "copies/";
/// Each backend's totals (`cluster::registry::BackendRecord`).
pub const BACKENDS: &str = "backends/";
/// What the repository API said of each model (`placement::registry::SharedSpec`).
pub const SPECS: &str = "specs/";
/// Each replica's in-use marks, on its lease.
pub const INUSE: &str = "inuse/";

impl View {
    /// An empty view of the keys under `prefix` (no trailing '/').
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: format!("{prefix}/"),
            keys: BTreeMap::new(),
            revision: 0,
        }
    }

    /// The full key of a relative one: `{prefix}/{relative}`.
    pub fn key(&self, relative: &str) -> String {
        format!("{}{relative}", self.prefix)
    }

    /// Replaces everything with a fresh read taken at `revision`.
    pub fn reset(&mut self, keys: impl IntoIterator<Item = (String, Entry)>, revision: i64) {
        self.keys = keys.into_iter().collect();
        self.revision = revision;
    }

    /// Applies the watch's changes, which etcd reported as of `revision`.
    pub fn apply(&mut self, changes: impl IntoIterator<Item = Change>, revision: i64) {
        for change in changes {
            match change {
                Change::Put(key, entry) => {
                    self.keys.insert(key, entry);
                }
                Change::Delete(key) => {
                    self.keys.remove(&key);
                }
            }
        }
        self.revision = self.revision.max(revision);
    }

    /// The etcd revision the view is current to.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// A key's entry, by its relative path.
    pub fn get(&self, relative: &str) -> Option<&Entry> {
        self.keys.get(&self.key(relative))
    }

    /// Every key under a relative path, with the rest of the key after it.
    pub fn under<'a>(&'a self, relative: &str) -> impl Iterator<Item = (&'a str, &'a Entry)> {
        let start = self.key(relative);
        let skip = start.len();
        self.keys
            .range(start.clone()..)
            .take_while(move |(key, _)| key.starts_with(&start))
            .map(move |(key, entry)| (&key[skip..], entry))
    }

    /// The live replicas' records, by name (a record goes with its replica's lease).
    pub fn replicas(&self) -> Vec<ReplicaRecord> {
        self.under(REPLICAS)
            .filter_map(|(_, entry)| serde_json::from_slice(&entry.value).ok())
            .collect()
    }

    /// The elected replica: etcd's election makes the candidate with the oldest key (the
    /// lowest create revision) the leader until its lease ends.
    pub fn leader(&self) -> Option<String> {
        let prefix = format!("{ELECTION}/");
        self.under(&prefix)
            .min_by_key(|(_, entry)| entry.create_revision)
            .map(|(_, entry)| String::from_utf8_lossy(&entry.value).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(value: &str, create: i64) -> Entry {
        Entry {
            value: value.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: create,
            lease: 7,
        }
    }

    #[test]
    fn keys_of_other_prefixes_and_kinds_stay_apart() {
        let mut view = View::new("/p");
        let record = |name: &str| {
            serde_json::json!({"name": name, "started_at_unix": 1.0, "version": "v"}).to_string()
        };
        view.reset(
            [
                ("/p/replicas/a".to_string(), entry(&record("a"), 3)),
                ("/p/replicas/b".to_string(), entry(&record("b"), 4)),
                ("/p/replicasx".to_string(), entry(&record("x"), 4)),
                ("/pp/replicas/c".to_string(), entry(&record("c"), 5)),
                ("/p/election/1f".to_string(), entry("b", 9)),
                ("/p/election/0a".to_string(), entry("a", 6)),
            ],
            9,
        );
        let names: Vec<String> = view.replicas().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(view.leader().as_deref(), Some("a"), "the oldest candidate");
        view.apply(
            [
                Change::Delete("/p/election/0a".into()),
                Change::Delete("/p/replicas/a".into()),
            ],
            10,
        );
        assert_eq!(view.leader().as_deref(), Some("b"));
        assert_eq!(view.replicas().len(), 1);
        assert_eq!(view.revision(), 10);
        assert_eq!(view.get("replicas/b").unwrap().create_revision, 4);
    }
}
