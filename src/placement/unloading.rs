//! Unloading: a copy taken off a backend (evicted, unloaded explicitly, gone from its index)
//! and its departure awaited, so its memory is counted until Triton has let it go.

use super::*;

impl Placement {
    /// Unloads a copy the books have taken off (it departs, see `Books::departing`) from
    /// backend `b`: `POST .../unload`, then Triton's index is followed until the model has
    /// gone (Triton answers at once and unloads for a second or more), and only then are its
    /// bytes free on the books. An unload that fails frees them at once: reconciliation
    /// adopts the copy again if the backend still has it.
    pub(super) async fn unload_on(&self, b: usize, model: &str, reason: &'static str) {
        let backend = self.pool.backends()[b].clone();
        let _changing = backend.start_change();
        if self.send_unload(&backend, model, reason).await {
            self.await_departure(&backend, model).await;
        }
        self.books().departed(b, model, Instant::now());
        self.settle_copy(b, model, Some(registry::SharedState::Departing));
        let _ = self.events.send(ModelEvent::Unloaded(model.to_string()));
    }

    /// `POST .../unload`; true when the backend took it. Failures are logged and counted.
    pub(super) async fn send_unload(
        &self,
        backend: &Backend,
        model: &str,
        reason: &'static str,
    ) -> bool {
        let answer = TritonClient::new(backend, self.load_timeout)
            .unload(model)
            .await;
        let result = match &answer {
            Ok(()) => "success",
            Err(_) => "failure",
        };
        metrics::counter!(telemetry::PLACEMENT_UNLOADS, "backend" => backend.name.clone(), "reason" => reason, "result" => result)
            .increment(1);
        match answer {
            Ok(()) => {
                tracing::info!(model, backend = %backend.name, reason, "model unloaded");
                return true;
            }
            Err(error) => tracing::warn!(model, backend = %backend.name,
                error = error.reason(), "unload failed"),
        }
        false
    }

    /// Reads the backend's index, more and more slowly, until it holds the model no more
    /// (no version READY, LOADING or UNLOADING), the backend is out of service, or
    /// `load_timeout` passes.
    pub(super) async fn await_departure(&self, backend: &Backend, model: &str) {
        let deadline = Instant::now() + self.load_timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            let read = crate::upstream::refresh_index(backend, Duration::from_secs(2)).await;
            if read.is_ok() && !backend.index().holds(model) {
                return;
            }
            if !backend.is_ready() || backend.is_retired() {
                return;
            }
            if Instant::now() + pause > deadline {
                tracing::warn!(model, backend = %backend.name,
                    "the backend still holds an unloaded model after placement.load_timeout; its room is counted free again");
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(320));
        }
    }

    /// Unloads a model from every backend (in-flight requests finish first: Triton waits for
    /// them). Returns how many copies were unloaded. Requests load it again (the admin API).
    pub async fn unload(&self, model: &str) -> usize {
        let backends = self.books().remove_everywhere(model, Instant::now());
        self.unload_from(&backends, model, "request").await;
        backends.len()
    }

    /// Unloads a model the books no longer hold from each of `backends`, and says so.
    pub(super) async fn unload_from(&self, backends: &[usize], model: &str, reason: &'static str) {
        for &b in backends {
            if !self.agree_departure(b, model).await {
                continue;
            }
            self.unload_on(b, model, reason).await;
            self.publish_usage(b);
        }
    }

    /// Whether the books hold a copy of `model` (loaded for one of `versions`, when given).
    pub fn holds(&self, model: &str, versions: Option<&BTreeSet<u64>>) -> bool {
        self.books().backends().iter().any(|books| {
            books
                .copies
                .get(model)
                .is_some_and(|copy| versions.is_none_or(|v| !copy.versions.pinned.is_disjoint(v)))
        })
    }

    /// A request's backend said it has no such model (or none ready) before doing any work:
    /// the books were wrong about that copy. It is taken off (reconciliation adopts it
    /// again should the backend report it READY after all), so that placing the request
    /// again finds another copy or loads one.
    pub fn copy_gone(&self, lease: &Lease) {
        let dropped = self
            .books()
            .copy_gone(lease.backend, &lease.model, Instant::now());
        let backend = &lease.backend().name;
        metrics::counter!(telemetry::PLACEMENT_STALE_COPIES, "backend" => backend.clone())
            .increment(1);
        tracing::warn!(
            model = lease.model,
            backend,
            dropped,
            "the backend does not have a copy the books had; placing the request again"
        );
        if dropped {
            let _ = self.events.send(ModelEvent::Unloaded(lease.model.clone()));
            self.publish_usage(lease.backend);
            self.settle_copy(
                lease.backend,
                &lease.model,
                Some(registry::SharedState::Ready),
            );
        }
    }

    /// Unloads every copy of a model no route uses any more, if no request holds one (the
    /// gateway's own leases: a request may hold one before it reaches Triton) and no load
    /// of it runs. Returns how many copies were unloaded, or `None` while it is busy.
    pub async fn unload_if_idle(&self, model: &str) -> Option<usize> {
        let backends = self.books().take_if_idle(model, Instant::now())?;
        self.unload_from(&backends, model, "unrouted").await;
        Some(backends.len())
    }

    /// Loads each copy serving one of the numbered `versions` (which no route uses any more)
    /// again without them, or unloads it when it served nothing else, once no request holds
    /// one of them. Returns false, doing nothing, while one is held or a load of the model
    /// runs.
    pub async fn drop_versions_if_idle(
        self: &Arc<Self>,
        model: &str,
        versions: &BTreeSet<u64>,
    ) -> bool {
        let sizing = self.estimator.sizing(model);
        let Some(narrowed) = self
            .books()
            .narrow(model, versions, &sizing, Instant::now())
        else {
            return false;
        };
        for step in narrowed {
            match step {
                Narrowed::Unload(b) => self.unload_from(&[b], model, "unrouted").await,
                Narrowed::Load(plan) => self.clone().run_load(plan, Priority::Background).await,
            }
        }
        true
    }
}
