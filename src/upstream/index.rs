//! A backend's repository index (`POST /v2/repository/index`): which models it has and in
//! which state. Refreshed by the health loop; read by placement to find a backend for a model.

use foldhash::HashMap;
use serde::{Deserialize, Serialize};

/// One row of Triton's repository index.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct ModelEntry {
    /// Model name.
    pub name: String,
    /// Version, absent for models never loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `READY`, `UNAVAILABLE`, `LOADING`, ...; absent for models never loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Why it is not ready, when Triton says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ModelEntry {
    /// Loaded and serving.
    pub fn is_ready(&self) -> bool {
        self.state.as_deref() == Some("READY")
    }
}

/// The models one backend reports, by name.
#[derive(Clone, Debug, Default)]
pub struct ModelIndex {
    entries: Vec<ModelEntry>,
    by_name: HashMap<String, Vec<usize>>,
    read_at: Option<tokio::time::Instant>,
}

impl ModelIndex {
    /// Builds the index from Triton's JSON answer.
    pub fn from_json(body: &[u8]) -> Result<Self, serde_json::Error> {
        let entries: Vec<ModelEntry> = serde_json::from_slice(body)?;
        Ok(Self::from_entries(entries))
    }

    /// Builds the index from rows.
    pub fn from_entries(entries: Vec<ModelEntry>) -> Self {
        let mut by_name: HashMap<String, Vec<usize>> = HashMap::default();
        for (i, entry) in entries.iter().enumerate() {
            by_name.entry(entry.name.clone()).or_default().push(i);
        }
        Self {
            entries,
            by_name,
            read_at: None,
        }
    }

    /// The rows, as Triton listed them, for the repository API to merge.
    pub fn into_entries(self) -> Vec<ModelEntry> {
        self.entries
    }

    /// Stamps when the request that produced this index was sent: placement ignores an index
    /// read before its own last change to that backend.
    pub fn with_read_at(mut self, at: tokio::time::Instant) -> Self {
        self.read_at = Some(at);
        self
    }

    /// When the request for this index was sent.
    pub fn read_at(&self) -> Option<tokio::time::Instant> {
        self.read_at
    }

    /// The versions of the model READY here.
    pub fn ready_versions(&self, model: &str) -> std::collections::BTreeSet<u64> {
        self.rows(model)
            .filter(|e| e.is_ready())
            .filter_map(|e| e.version.as_deref()?.parse().ok())
            .collect()
    }

    /// Whether the backend still holds the model in memory: a version of it READY, LOADING
    /// or UNLOADING (Triton answers an unload at once and reports UNLOADING until it is done).
    pub fn holds(&self, model: &str) -> bool {
        self.rows(model)
            .any(|e| matches!(e.state.as_deref(), Some("READY" | "LOADING" | "UNLOADING")))
    }

    /// Whether this index shows a model LOADING (or UNLOADING) and was read less than
    /// `max_age` ago: Triton busy with a load someone started (another gateway, an operator)
    /// answers slowly, and a stale index says nothing about now.
    pub fn loading_within(&self, max_age: std::time::Duration) -> bool {
        self.read_at.is_some_and(|at| at.elapsed() < max_age)
            && self
                .entries
                .iter()
                .any(|e| matches!(e.state.as_deref(), Some("LOADING" | "UNLOADING")))
    }

    /// Whether the model is in this backend's repository at all.
    pub fn knows(&self, model: &str) -> bool {
        self.by_name.contains_key(model)
    }

    /// All rows, in Triton's order.
    pub fn entries(&self) -> &[ModelEntry] {
        &self.entries
    }

    fn rows<'a>(&'a self, model: &str) -> impl Iterator<Item = &'a ModelEntry> + 'a {
        self.by_name
            .get(model)
            .into_iter()
            .flatten()
            .map(|&i| &self.entries[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tritons_index() {
        let body = br#"[{"name":"add_sub","version":"1","state":"READY"},
                        {"name":"old","version":"1","state":"UNAVAILABLE","reason":"unloaded"},
                        {"name":"never"}]"#;
        let index = ModelIndex::from_json(body).unwrap();
        assert_eq!(index.ready_versions("add_sub"), [1].into());
        assert!(index.ready_versions("old").is_empty());

        assert!(index.holds("add_sub") && !index.holds("old") && !index.holds("never"));
        let going = br#"[{"name":"m","version":"1","state":"UNLOADING"}]"#;
        assert!(ModelIndex::from_json(going).unwrap().holds("m"));
        assert!(index.knows("never"));
        assert!(!index.knows("other"));
        assert_eq!(index.entries().len(), 3);
    }

    // A Triton busy loading a model someone else asked for is a reason to be slow, but only
    // while the index saying so is fresh.
    #[tokio::test(start_paused = true)]
    async fn a_loading_model_in_a_fresh_index_says_the_backend_is_busy() {
        let max_age = std::time::Duration::from_secs(90);
        let loading = br#"[{"name":"m","version":"1","state":"LOADING"},{"name":"n","version":"1","state":"READY"}]"#;
        let read = tokio::time::Instant::now();
        let index = ModelIndex::from_json(loading).unwrap().with_read_at(read);
        assert!(index.loading_within(max_age));
        tokio::time::advance(max_age).await;
        assert!(!index.loading_within(max_age), "too old to say");
        let ready = br#"[{"name":"n","version":"1","state":"READY"}]"#;
        let index = ModelIndex::from_json(ready)
            .unwrap()
            .with_read_at(tokio::time::Instant::now());
        assert!(!index.loading_within(max_age));
    }
}
