//! The pool as placement sees it: backends added and retired, drains, the placement gauges and
//! the admin view.

use super::*;

impl Placement {
    /// Opens books for a backend a reload added to the pool (at index `backend`).
    pub fn add_backend(&self, backend: &Backend) {
        let bytes = usable_of(backend, self.sizes);
        self.books().add_backend(bytes, Instant::now());
        metrics::gauge!(telemetry::PLACEMENT_CAPACITY, "backend" => backend.name.clone())
            .set(bytes as f64);
    }

    /// Takes a backend a reload removed out of placement: its pinned models move elsewhere
    /// first (as for a drain), then it is retired (never ready again; requests on it finish)
    /// and its books are closed.
    pub async fn retire(self: &Arc<Self>, name: &str) {
        let Some(index) = self.index_of(name) else {
            return;
        };
        self.set_draining(name, true).await;
        self.pool.backends()[index].retire();
        self.reconcile(index);
        tracing::info!(backend = name, "backend removed from the pool");
    }

    pub(super) fn index_of(&self, name: &str) -> Option<usize> {
        self.pool
            .backends()
            .iter()
            .position(|b| b.name == name && !b.is_retired())
    }

    /// Stops (or resumes) placing models on a backend; returns false for an unknown name.
    /// Draining also moves its pinned models: each gets a copy elsewhere first, then leaves.
    pub async fn set_draining(self: &Arc<Self>, backend: &str, draining: bool) -> bool {
        let Some(index) = self.index_of(backend) else {
            return false;
        };
        let pinned_here = {
            let mut books = self.books();
            books.set_draining(index, draining);
            books.pinned_on(index)
        };
        if draining {
            for model in pinned_here {
                if self.add_copy(&model, true).await {
                    if self.books().remove_copy(index, &model, Instant::now()) {
                        self.unload_on(index, &model, "drain").await;
                    }
                } else {
                    tracing::warn!(
                        model,
                        backend,
                        "no other backend can take this pinned model; it stays"
                    );
                }
            }
            self.publish_usage(index);
        }
        true
    }

    /// Sets a backend's placement gauges from the books: after every change to what is
    /// loaded there, and (through `publish_gauges`) at each scrape, since the LRU age grows
    /// while nothing changes.
    pub(super) fn publish_usage(&self, backend: usize) {
        let (used, loading, copies, lru) = {
            let books = self.books();
            let (used, loading, copies) = books.usage(backend);
            (
                used,
                loading,
                copies,
                books.lru_age(backend, Instant::now()),
            )
        };
        let name = self.pool.backends()[backend].name.clone();
        metrics::gauge!(telemetry::PLACEMENT_USED, "backend" => name.clone()).set(used as f64);
        metrics::gauge!(telemetry::PLACEMENT_LOADING, "backend" => name.clone())
            .set(loading as f64);
        metrics::gauge!(telemetry::PLACEMENT_MODELS, "backend" => name.clone()).set(copies as f64);
        metrics::gauge!(telemetry::PLACEMENT_LRU_AGE, "backend" => name).set(lru.as_secs_f64());
    }

    /// Brings every backend's placement gauges up to date, for a scrape.
    pub fn publish_gauges(&self) {
        for (index, backend) in self.pool.backends().iter().enumerate() {
            if !backend.is_retired() {
                self.publish_usage(index);
            }
        }
    }

    /// The admin view: every backend's books and every failing load.
    pub fn snapshot(&self) -> serde_json::Value {
        let now = Instant::now();
        let books = self.books();
        let backends: Vec<_> = books
            .backends()
            .iter()
            .zip(self.pool.backends().iter())
            .filter(|(_, backend)| !backend.is_retired())
            .map(|(b, backend)| {
                let mut models: Vec<_> = b
                    .copies
                    .iter()
                    .map(|(name, c)| {
                        serde_json::json!({
                            "name": name,
                            "size": c.size,
                            "size_source": c.source,
                            "state": match c.state {
                                table::CopyState::Ready => "ready",
                                table::CopyState::Loading(_) => "loading",
                                table::CopyState::Reloading(_) => "reloading",
                            },
                            "versions": c.serving,
                            "latest": c.versions.latest,
                            "idle_seconds": now.saturating_duration_since(c.last_used).as_secs_f64(),
                            "in_flight": c.in_flight,
                            "sequences": c.sequences,
                            "pinned": c.pinned,
                            "served": c.served,
                        })
                    })
                    .collect();
                models.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
                let mut unloading: Vec<_> = b.departing.keys().collect();
                unloading.sort();
                serde_json::json!({
                    "name": backend.name,
                    "ready": backend.is_ready(),
                    "draining": b.draining,
                    "capacity": b.usable,
                    "used": b.committed,
                    "free": b.free(),
                    "models": models,
                    "unloading": unloading,
                })
            })
            .collect();
        let failures: Vec<_> = books
            .failures(now)
            .into_iter()
            .map(|(model, b, count, retry_in, reason)| {
                serde_json::json!({
                    "model": model,
                    "backend": self.pool.backends()[b].name,
                    "failures": count,
                    "retry_in_seconds": retry_in.as_secs_f64(),
                    "error": reason.as_ref(),
                })
            })
            .collect();
        let sequences: serde_json::Map<String, serde_json::Value> = books
            .live_sequences(now)
            .into_iter()
            .map(|(model, live)| (model, live.into()))
            .collect();
        serde_json::json!({
            "policy": books.eviction_policy(),
            "backends": backends,
            "failed_loads": failures,
            "live_sequences": sequences,
        })
    }
}
