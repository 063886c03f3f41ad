//! Housekeeping: warm-up, the rebalance loop that adds copies for hot models, and
//! reconciliation of the books with each backend's repository index (adopting, dropping, and
//! reloading newer versions).

use super::*;

impl Placement {
    /// Loads pinned models (`min_copies` copies each, evicting if need be) and preload models
    /// (one copy, free space only) at start. Failures are logged; requests will retry them.
    pub async fn warm_up(self: &Arc<Self>, preload: Vec<String>) {
        let mut pinned: Vec<(&String, &usize)> =
            self.min_copies.iter().filter(|(_, n)| **n > 0).collect();
        pinned.sort();
        for (model, &copies) in pinned {
            match self.acquire(&ModelRef::new(model.clone(), None)).await {
                Ok(_) => tracing::info!(model, "loaded at start"),
                Err(error) => tracing::warn!(model, %error, "not loaded at start"),
            }
            for _ in 1..copies {
                self.add_copy(model, true).await;
            }
        }
        for model in preload {
            match self
                .acquire_with(&ModelRef::new(model.clone(), None), None, false, None)
                .await
            {
                Ok(_) => tracing::info!(model, "preloaded"),
                Err(error) => tracing::info!(model, %error, "not preloaded"),
            }
        }
    }

    /// Loads one more copy of a model on a backend that lacks it, and waits for it.
    pub(super) async fn add_copy(self: &Arc<Self>, model: &str, allow_evict: bool) -> bool {
        let sizing = self.estimator.sizing(model);
        let view = self.view(model);
        let plan = self
            .books()
            .plan_extra_copy(model, &sizing, &view, allow_evict, Instant::now());
        let Some(plan) = plan else { return false };
        let mut done = plan.done.subscribe();
        self.clone().run_load(plan, Priority::Background).await;
        matches!(
            done.wait_for(Option::is_some).await.as_deref(),
            Ok(Some(Ok(())))
        )
    }

    /// Runs `rebalance` every `rebalance_interval` until `shutdown`.
    pub async fn rebalance_loop(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let mut last = HashMap::new();
        let mut ticker = tokio::time::interval(self.scaling.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => self.rebalance(&mut last).await,
            }
        }
    }

    /// Gives a model another copy when each copy served more than `scale_up_rps` since the
    /// last round, or when more than `scale_up_queue` requests wait per copy in the
    /// backends' own queues (what other replicas send counts too); free space only, up to
    /// `max_copies`. Unloads copies beyond a model's first (or its `min_copies`) that have
    /// been idle for `scale_down_idle`.
    pub(super) async fn rebalance(self: &Arc<Self>, last: &mut HashMap<String, u64>) {
        if !self.runs_housekeeping() {
            return;
        }
        // Sequences idle past their timeout no longer hold their copies.
        self.books().expire_sequences(Instant::now());
        let seconds = self.scaling.interval.as_secs_f64();
        let demand = self.books().demand();
        let mut hot = Vec::new();
        for (model, (copies, served)) in &demand {
            let previous = last.insert(model.clone(), *served).unwrap_or(*served);
            let rate = served.saturating_sub(previous) as f64 / seconds / *copies as f64;
            let max = self
                .max_copies
                .get(model)
                .copied()
                .unwrap_or(self.scaling.max_copies);
            let busy = self.scaling.up_rps > 0.0 && rate > self.scaling.up_rps;
            let queued = self.queued(model) / *copies as f64;
            let backed_up = self.scale_up_queue > 0.0 && queued > self.scale_up_queue;
            if (busy || backed_up) && *copies < max {
                hot.push((model.clone(), rate, queued));
            }
        }
        last.retain(|model, _| demand.contains_key(model));
        for (model, rate, queued) in hot {
            tracing::info!(
                model,
                rps_per_copy = rate,
                queued_per_copy = queued,
                "model is busy: adding a copy"
            );
            if !self.add_copy(&model, false).await {
                tracing::debug!(model, "no backend has free space for another copy");
            }
        }
        let keep = |model: &str| self.min_copies.get(model).copied().unwrap_or(0);
        let idle =
            self.books()
                .take_idle_extra_copies(self.scaling.down_idle, &keep, Instant::now());
        for (b, model) in idle {
            self.unload_from(&[b], &model, "idle").await;
        }
    }

    /// Requests waiting for `model` in one backend's own queue, by its fresh reading (0 with
    /// readings off).
    pub(super) fn queued_on(&self, backend: &Backend, model: &str) -> usize {
        if self.queue_max_age.is_zero() {
            return 0;
        }
        backend
            .pending(model, self.queue_max_age)
            .map_or(0, |n| n as usize)
    }

    /// Requests waiting for `model` in the backends' own queues, by their fresh readings.
    pub(super) fn queued(&self, model: &str) -> f64 {
        let backends = self.pool.backends();
        let waiting = backends
            .iter()
            .filter_map(|b| b.pending(model, self.queue_max_age));
        waiting.sum::<u64>() as f64
    }

    /// Runs reconciliation on start and every `reconcile_interval` until `shutdown`: each
    /// ready backend's index is read afresh, then `reconcile`. (Health checks reconcile a
    /// backend at once when it fails or comes up.)
    pub async fn reconcile_loop(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let mut ticker = tokio::time::interval(self.reconcile_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => self.reconcile_all().await,
            }
        }
    }

    pub(super) async fn reconcile_all(self: &Arc<Self>) {
        for (i, backend) in self.pool.backends().iter().enumerate() {
            if backend.is_retired() || !backend.is_ready() {
                continue;
            }
            match crate::upstream::refresh_index(backend, Duration::from_secs(2)).await {
                Ok(()) => self.reconcile(i),
                Err(reason) => {
                    tracing::warn!(backend = %backend.name, %reason, "index read for reconciliation failed")
                }
            }
        }
    }

    /// Brings the books for one backend in line with its last health check and index, and
    /// reloads copies serving "latest" whose model has a newer version on disk.
    pub fn reconcile(self: &Arc<Self>, backend_index: usize) {
        if !self.runs_housekeeping() {
            return;
        }
        let backend = &self.pool.backends()[backend_index];
        let index = backend.index();
        let names: BTreeSet<&str> = index
            .entries()
            .iter()
            .filter(|e| e.is_ready())
            .map(|e| e.name.as_str())
            .collect();
        let ready_models: Vec<Indexed> = names
            .into_iter()
            .map(|name| Indexed {
                name: name.to_string(),
                estimate: self.estimator.estimate(name),
                serving: index.ready_versions(name),
            })
            .collect();
        let pinned = |name: &str| self.pinned.contains(name);
        let changed = self.books().reconcile(
            backend_index,
            backend.is_ready(),
            &ready_models,
            index.read_at(),
            &pinned,
            Instant::now(),
        );
        for model in &changed.adopted {
            tracing::info!(model, backend = %backend.name, "adopted a model the backend already had");
            self.settle_copy(backend_index, model, None);
        }
        for model in &changed.dropped {
            self.settle_copy(backend_index, model, Some(registry::SharedState::Ready));
        }
        let unknown: Vec<String> = {
            let books = self.books();
            changed
                .adopted
                .iter()
                .filter(|m| books.is_sequence_model(m).is_none())
                .cloned()
                .collect()
        };
        if !unknown.is_empty() {
            let placement = self.clone();
            let backend = backend.clone();
            tokio::spawn(async move {
                for model in unknown {
                    placement.learn_sequencing(&backend, &model).await;
                }
            });
        }
        for model in &changed.dropped {
            tracing::info!(model, backend = %backend.name, "model is gone from the backend");
            let _ = self.events.send(ModelEvent::Unloaded(model.clone()));
        }
        if backend.is_ready() {
            self.reload_newer_versions(backend_index);
        }
        self.publish_usage(backend_index);
    }

    /// Loads again (a plain load, or the union for a copy that also serves numbered
    /// versions) each copy serving "latest" whose model gained a newer version directory:
    /// Triton loads the new version, then unloads the old one once its requests are done.
    /// The repository is read on the blocking pool: it is often a network file system, and
    /// a slow directory listing must not stall the requests on the runtime's threads.
    pub(super) fn reload_newer_versions(self: &Arc<Self>, backend_index: usize) {
        let latest = self.books().latest_copies(backend_index);
        if latest.is_empty() {
            return;
        }
        let placement = self.clone();
        tokio::spawn(async move {
            let scanner = placement.clone();
            let newer = tokio::task::spawn_blocking(move || {
                latest
                    .into_iter()
                    .filter_map(|(model, serving)| {
                        let newest = scanner.estimator.rescan(&model)?;
                        serving
                            .is_some_and(|v| v < newest)
                            .then_some((model, serving, newest))
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
            for (model, serving, newest) in newer {
                placement.reload_newer(backend_index, &model, serving, newest);
            }
        });
    }

    /// Plans loading the copy of `model` on a backend again, to serve `versions` (evicting
    /// for room if need be): what a newer version on disk and a config change both do.
    pub(super) fn plan_reload(
        &self,
        backend: usize,
        model: &str,
        versions: &Versions,
    ) -> Result<LoadPlan, GatewayError> {
        let sizing = self.estimator.sizing(model);
        let view = self.view(model);
        self.books().reload_on(
            &[backend],
            model,
            (versions, &sizing),
            &view,
            true,
            Instant::now(),
        )
    }

    /// Plans and starts the reload of `model` on a backend, for a newer version on disk.
    pub(super) fn reload_newer(
        self: &Arc<Self>,
        backend_index: usize,
        model: &str,
        serving: Option<u64>,
        newest: u64,
    ) {
        match self.plan_reload(backend_index, model, &Versions::latest()) {
            Ok(plan) => {
                tracing::info!(model, backend = %self.pool.backends()[backend_index].name,
                    from = serving, to = newest, "newer version on disk: reloading");
                tokio::spawn(self.clone().run_load(plan, Priority::Background));
            }
            Err(error) => {
                tracing::info!(model, %error, "newer version on disk, not reloaded yet")
            }
        }
    }
}
