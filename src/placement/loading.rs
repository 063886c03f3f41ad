//! Loading a model where placement decided: one load per plan, timed and measured (the size
//! Triton reports, the memory it took), a failed load backed off, and what a load taught
//! (sequencing, the versions it serves).

use super::*;

impl Placement {
    /// Carries out a load plan: unload the victims, load the model (one of
    /// `max_loading_concurrency` slots on the backend), record the outcome, tell the waiters.
    pub(super) async fn run_load(self: Arc<Self>, plan: LoadPlan, priority: Priority) {
        if !self.agree_plan(&plan).await {
            // Dropping the plan tells its waiters to decide again, on the registry's books;
            // the copy it booked goes first, or they would wait on it for ever.
            self.books().abandon(&plan, Instant::now());
            return;
        }
        let backend = self.pool.backends()[plan.backend].clone();
        // The decision already changed the books (a loading copy, victims taken off).
        self.publish_usage(plan.backend);
        let _slot = backend.load_slots.acquire(priority).await;
        let _changing = backend.start_change();
        self.evict_victims(&plan, &backend).await;
        let started = Instant::now();
        let outcome = self.measured_load(&plan, &backend).await;
        let serving = if outcome.is_ok() {
            let (serving, ()) = tokio::join!(
                self.serving_after_load(&backend, &plan.model),
                self.learn_sequencing(&backend, &plan.model)
            );
            serving
        } else {
            None
        };
        self.report_load(&plan, &backend, &outcome, started);
        let took = started.elapsed();
        self.book_load(&plan, &backend, &outcome, serving, took);
        self.publish_usage(plan.backend);
        self.settle_load(&plan);
        let failed = outcome.is_err();
        let _ = plan.done.send(Some(outcome));
        if failed {
            // A new copy that failed has left the books: its bytes are free.
            self.offer_room(plan.backend);
        }
    }

    /// The victims go first, all at once, and the load starts once Triton has let them go:
    /// the backend never holds more than its capacity.
    async fn evict_victims(&self, plan: &LoadPlan, backend: &Backend) {
        let unloads = plan.evict.iter().map(|victim| {
            metrics::counter!(telemetry::PLACEMENT_EVICTIONS, "backend" => backend.name.clone())
                .increment(1);
            metrics::histogram!(telemetry::PLACEMENT_EVICTED_IDLE)
                .record(victim.idle.as_secs_f64());
            self.unload_on(plan.backend, &victim.model, "evict")
        });
        futures_util::future::join_all(unloads).await;
    }

    /// Counts, times and logs a load's outcome, and tells subscribers (signature caches) of
    /// a success.
    fn report_load(
        &self,
        plan: &LoadPlan,
        backend: &Backend,
        outcome: &Result<(), Arc<str>>,
        started: Instant,
    ) {
        let result = if outcome.is_ok() {
            "success"
        } else {
            "failure"
        };
        metrics::counter!(telemetry::PLACEMENT_LOADS, "backend" => backend.name.clone(),
            "reason" => plan.reason.as_str(), "result" => result)
        .increment(1);
        metrics::histogram!(telemetry::PLACEMENT_LOAD_DURATION)
            .record(started.elapsed().as_secs_f64());
        match outcome {
            Ok(()) => {
                tracing::info!(model = plan.model, backend = %backend.name, versions = %plan.versions,
                    reason = plan.reason.as_str(), evicted = plan.evict.len(),
                    load_ms = started.elapsed().as_millis() as u64, "model loaded");
                let _ = self.events.send(ModelEvent::Loaded(plan.model.clone()));
            }
            Err(reason) => {
                tracing::warn!(model = plan.model, backend = %backend.name, versions = %plan.versions,
                    %reason, "model failed to load")
            }
        }
    }

    /// Writes a finished load into the books in one lock: the load time learned, the copy
    /// ready (or gone), the versions it serves, and for an ensemble the parts it brought,
    /// which then settle with the registry like any copy.
    fn book_load(
        &self,
        plan: &LoadPlan,
        backend: &Backend,
        outcome: &Result<(), Arc<str>>,
        serving: Option<BTreeSet<u64>>,
        took: Duration,
    ) {
        let group = if outcome.is_ok() {
            self.group(plan)
        } else {
            None
        };
        let parts_added = {
            let mut books = self.books();
            if outcome.is_ok() && plan.reason == LoadReason::New {
                books.learn_load_time(&plan.model, took);
            }
            books.finish_load(plan.backend, &plan.model, outcome, Instant::now());
            if let Some(serving) = serving {
                books.set_serving(plan.backend, &plan.model, serving);
            }
            group.map_or_else(Vec::new, |(own, parts)| {
                books.hold_parts(plan.backend, (&plan.model, own), &parts, Instant::now())
            })
        };
        for part in &parts_added {
            tracing::info!(model = part, ensemble = plan.model, backend = %backend.name,
                "loaded as a part of an ensemble");
            self.settle_copy(plan.backend, part, None);
        }
    }

    /// For an ensemble: its own estimate, and the sizing of each model it runs (read outside
    /// the books' lock, as sizing may read the disk); `None` for any other model.
    pub(super) fn group(
        &self,
        plan: &LoadPlan,
    ) -> Option<(estimate::Estimate, Vec<(String, Sizing)>)> {
        let parts = self.estimator.parts(&plan.model);
        if parts.is_empty() {
            return None;
        }
        let sizing = self.estimator.sizing(&plan.model).without_parts();
        let parts = parts
            .iter()
            .filter(|part| **part != plan.model)
            .map(|part| (part.clone(), self.estimator.sizing(part)))
            .collect();
        Some((sizing.estimate(&plan.versions), parts))
    }

    /// Reads whether the model has sequence batching, and its idle timeout, from its config
    /// on a backend that serves it: before any request is told of a load, so a sequence
    /// model's first requests are already read for their sequence ids.
    pub(super) async fn learn_sequencing(&self, backend: &Backend, model: &str) {
        let answer = TritonClient::new(backend, Duration::from_secs(2))
            .model_config(model, None)
            .await;
        match answer {
            Ok(body) => {
                if let Some(idle) = sequences::sequencing_of(&body) {
                    self.books().learn_sequencing(model, idle);
                }
            }
            Err(TritonError::Refused { status, .. }) => {
                tracing::debug!(model, backend = %backend.name, %status, "model config not read")
            }
            Err(error) => {
                tracing::debug!(model, backend = %backend.name, %error, "model config not read")
            }
        }
    }

    /// The versions the backend's index shows READY for the model, read again after a load
    /// so that no request is told of the load before the index knows it.
    pub(super) async fn serving_after_load(
        &self,
        backend: &Backend,
        model: &str,
    ) -> Option<BTreeSet<u64>> {
        match crate::upstream::refresh_index(backend, Duration::from_secs(2)).await {
            Ok(()) => Some(backend.index().ready_versions(model)),
            Err(reason) => {
                tracing::warn!(backend = %backend.name, %reason, "index refresh after a load failed");
                None
            }
        }
    }

    /// Loads, and learns the model's size per version: what Triton's statistics report in
    /// `memory_usage`, where the backend measures the model; else, where the backend reports
    /// memory and no other load ran beside this one, the rise of the memory metric (new
    /// copies only: a reload's rise is a part of the model, and its old versions go
    /// meanwhile). A load that failed for lack of memory raises the estimate before anyone
    /// decides again, so the retry goes where the larger size fits.
    pub(super) async fn measured_load(
        &self,
        plan: &LoadPlan,
        backend: &Arc<Backend>,
    ) -> Result<(), Arc<str>> {
        let model = plan.model.as_str();
        let running = &backend.loads_running;
        let alone_at_start = running.fetch_add(1, Ordering::AcqRel) == 0;
        let timeout = Duration::from_secs(2);
        // An ensemble's load is its parts' too: the rise is not the ensemble's own size.
        let measured = plan.reason == LoadReason::New && self.estimator.parts(model).is_empty();
        let before = if alone_at_start && measured {
            metrics_scrape::read_sum(backend, &self.memory_metric, timeout).await
        } else {
            None
        };
        let outcome = self.load_on(backend, plan).await;
        let alone_at_end = running.load(Ordering::Acquire) == 1;
        let learned = match &outcome {
            Ok(()) => match self.reported_size(backend, plan).await {
                Some(per_version) => Some((per_version, SizeSource::Reported)),
                None if alone_at_end => (self.metric_rise(backend, plan, before).await)
                    .map(|per_version| (per_version, SizeSource::Learned)),
                None => None,
            },
            Err(reason) if estimate::is_out_of_memory(reason) => {
                self.raise_after_out_of_memory(plan, backend);
                None
            }
            Err(_) => None,
        };
        if let Some((per_version, source)) = learned {
            self.estimator.learn_from(model, per_version, source);
            let estimate = self.estimator.sizing(model).estimate(&plan.versions);
            self.books().resize(plan.backend, model, estimate);
            tracing::info!(model, backend = %backend.name, per_version, ?source, "learned model size");
        }
        running.fetch_sub(1, Ordering::AcqRel);
        outcome
    }

    /// The bytes per version Triton's statistics report for the versions the load brought
    /// (their mean), or `None` when it reports none for them (the python backend on CPU).
    pub(super) async fn reported_size(&self, backend: &Backend, plan: &LoadPlan) -> Option<u64> {
        let answer = TritonClient::new(backend, Duration::from_secs(2))
            .model_statistics(Some((&plan.model, None)))
            .await
            .ok()?;
        let reported = estimate::reported_sizes(&answer, &plan.model, &self.memory_metric);
        let sizes: Vec<u64> = plan
            .serving
            .iter()
            .filter_map(|v| reported.get(v).copied())
            .collect();
        (!sizes.is_empty()).then(|| sizes.iter().sum::<u64>() / sizes.len() as u64)
    }

    /// How far the memory metric rose from `before` (read before the load) to now, per
    /// version the load brought.
    pub(super) async fn metric_rise(
        &self,
        backend: &Backend,
        plan: &LoadPlan,
        before: Option<f64>,
    ) -> Option<u64> {
        let before = before?;
        let timeout = Duration::from_secs(2);
        let after = metrics_scrape::read_sum(backend, &self.memory_metric, timeout).await?;
        let versions = plan.serving.len().max(1) as u64;
        (after > before).then_some((after - before) as u64 / versions)
    }

    /// A load failed for lack of memory: the model's estimate rises (doubles, up to the
    /// largest backend's usable bytes; see `Estimator::raise_after_out_of_memory`).
    pub(super) fn raise_after_out_of_memory(&self, plan: &LoadPlan, backend: &Backend) {
        let largest = self
            .books()
            .backends()
            .iter()
            .map(|b| b.usable)
            .max()
            .unwrap_or(0);
        let raised = self
            .estimator
            .raise_after_out_of_memory(&plan.model, &plan.versions, largest);
        match raised {
            Some(estimate) => tracing::warn!(model = plan.model, backend = %backend.name,
                bytes = estimate.bytes, "load ran out of memory: estimate raised"),
            None => tracing::warn!(model = plan.model, backend = %backend.name,
                "load ran out of memory; the estimate stays (set by config, or the largest backend's size)"),
        }
    }

    /// `POST .../load` for the plan's versions, within `load_timeout`. A new copy whose load
    /// times out is undone; a reloaded one is left serving what it served.
    pub(super) async fn load_on(
        &self,
        backend: &Arc<Backend>,
        plan: &LoadPlan,
    ) -> Result<(), Arc<str>> {
        let model = plan.model.as_str();
        let body = self.load_body(plan)?;
        let answer = TritonClient::new(backend, self.load_timeout)
            .load(model, body)
            .await;
        if let Err(error) = &answer
            && error.timed_out()
            && plan.reason == LoadReason::New
        {
            // Never on the books as loaded: nothing departs.
            self.send_unload(backend, model, "abandon").await;
        }
        answer.map_err(|error| error.reason().into())
    }

    /// The body of a load: the model's config override when it has one (with the versions
    /// named, for chosen versions); else a plain load for the default policy (Triton reads
    /// config.pbtxt, and a newer version directory replaces the old version), or the whole
    /// config.pbtxt with the versions named. A copy that served an override is loaded with
    /// its config.pbtxt written out: Triton keeps an override in force through a plain load.
    /// The copy's books record which override this load sends.
    pub(super) fn load_body(&self, plan: &LoadPlan) -> Result<Bytes, Arc<str>> {
        let config = self.specs.config(&plan.model);
        let had = self
            .books()
            .swap_config(plan.backend, &plan.model, config.clone());
        let versions: Vec<u64> = plan.serving.iter().copied().collect();
        let versions = (!plan.versions.is_default()).then_some(versions.as_slice());
        let source = match &config {
            Some(text) => model_config::Source::Override(text),
            None if versions.is_none() && had.is_none() => {
                return Ok(Bytes::from_static(b"{}"));
            }
            None => model_config::Source::Repository(self.repository.as_deref().ok_or_else(|| {
                Arc::<str>::from("loading chosen versions, or going back to the repository's config after an override, needs placement.model_repository (the model's config.pbtxt)")
            })?),
        };
        model_config::load_body(source, &plan.model, versions)
            .map(Bytes::from)
            .map_err(Arc::from)
    }
}
