//! The repository API's levers on placement, as Triton's model control works: a load with
//! a config override (applied to every copy, `spec`), an explicit unload that holds, and the
//! calls that ask before they load (readiness, metadata, config, statistics).

use super::table::{self, BackendView, Decision};
use super::{Lease, Placement, Priority, Versions};
use crate::error::GatewayError;
use crate::model::{Ask, ModelRef};
use crate::upstream::Backend;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

impl Placement {
    /// Loads a model now through the repository API, with `config` (an override, checked to
    /// be a JSON object) or without (a plain load, back to the repository's config): every
    /// copy loaded with another config is loaded again (or, to drop an override without
    /// `placement.model_repository`, unloaded), then the model is placed as a request would
    /// place it, and it is wanted again after an explicit unload. A load that fails puts
    /// the previous spec back.
    pub async fn load(
        self: &Arc<Self>,
        model: &str,
        config: Option<Arc<str>>,
    ) -> Result<(), GatewayError> {
        self.check_known(model).await?;
        let previous = self.specs.loaded(model, config.clone());
        if previous.config != config {
            self.books().forget_failures(model);
        }
        let applied = self.apply_spec(model, &config).await;
        let loaded = match applied {
            Ok(()) => self.acquire(&ModelRef::new(model, None)).await.map(drop),
            Err(error) => Err(error),
        };
        if loaded.is_err() && previous.config != config {
            self.specs.replace(model, previous.clone());
            if let Err(error) = self.apply_spec(model, &previous.config).await {
                tracing::warn!(model, %error, "could not put the previous config back");
            }
        } else if loaded.is_err() {
            self.specs.replace(model, previous);
        }
        self.share_spec(model);
        loaded
    }

    /// The admin API's load: as a request would place it (with its override), wanted again
    /// after an explicit unload.
    pub async fn load_now(self: &Arc<Self>, model: &str) -> Result<(), GatewayError> {
        self.specs.wanted(model);
        self.share_spec(model);
        self.acquire(&ModelRef::new(model, None)).await.map(drop)
    }

    /// A model no ready backend's index has is refused as Triton refuses it; the indexes are
    /// read again first, so a model just added to the repository is found.
    async fn check_known(&self, model: &str) -> Result<(), GatewayError> {
        let known = || self.view(model).iter().any(|v| v.ready && v.knows);
        if known() {
            return Ok(());
        }
        for backend in self.pool.backends().iter().filter(|b| b.is_ready()) {
            if let Err(reason) =
                crate::upstream::refresh_index(backend, Duration::from_secs(2)).await
            {
                tracing::warn!(backend = %backend.name, %reason, "index refresh before a load failed");
            }
        }
        if known() {
            Ok(())
        } else if self.pool.ready().is_empty() {
            Err(GatewayError::NoBackendReady)
        } else {
            Err(GatewayError::UnknownModelLoad {
                model: model.to_string(),
            })
        }
    }

    /// Brings every copy of `model` to `config`: waits for loads that run, then loads each
    /// ready copy that served another config again, where it is (a failure is the answer).
    async fn apply_spec(
        self: &Arc<Self>,
        model: &str,
        config: &Option<Arc<str>>,
    ) -> Result<(), GatewayError> {
        // Each round settles what it found; a load started meanwhile takes one more.
        for _ in 0..4 {
            let (stale, running) = self.books().stale_copies(model, config);
            if let Some(mut running) = running {
                let _ = tokio::time::timeout(self.load_timeout, running.wait_for(Option::is_some))
                    .await;
                continue;
            }
            if stale.is_empty() {
                return Ok(());
            }
            for backend in stale {
                self.reload_for_spec(backend, model, config.is_none())
                    .await?;
            }
        }
        Ok(())
    }

    /// Loads one copy again for its model's current config. Dropping an override without
    /// `placement.model_repository` (nothing to send but a plain load, which keeps it)
    /// unloads the copy instead: Triton forgets an override once the model is unloaded.
    async fn reload_for_spec(
        self: &Arc<Self>,
        backend: usize,
        model: &str,
        plain: bool,
    ) -> Result<(), GatewayError> {
        if plain && self.repository.is_none() {
            if self.books().remove_copy(backend, model, Instant::now()) {
                self.unload_from(&[backend], model, "config").await;
            }
            return Ok(());
        }
        let plan = self.plan_reload(backend, model, &Versions::default())?;
        let mut done = plan.done.subscribe();
        self.clone().run_load(plan, Priority::Request).await;
        match done.wait_for(Option::is_some).await.as_deref() {
            Ok(Some(Err(reason))) => Err(GatewayError::LoadFailed {
                model: model.to_string(),
                reason: reason.to_string(),
                retry_after: Duration::from_secs(1),
            }),
            _ => Ok(()),
        }
    }

    /// An unload through the repository API: the model's override goes, and no request
    /// loads it again until a load says so; loads already running finish first, so none
    /// leaves a copy behind.
    pub async fn unload_explicitly(&self, model: &str) -> usize {
        self.specs.unloaded(model);
        self.share_spec(model);
        for _ in 0..4 {
            let (_, running) = self.books().stale_copies(model, &None);
            let Some(mut running) = running else { break };
            let _ =
                tokio::time::timeout(self.load_timeout, running.wait_for(Option::is_some)).await;
        }
        self.unload(model).await
    }

    /// A lease on a copy that is loaded now, for a request that asks before (or instead of)
    /// loading: readiness, metadata, config. `None` when no copy is loaded but the model is
    /// servable (a ready backend's repository has it, the version asked for exists, and no
    /// explicit unload holds): the next request that loads would place it. A model unloaded
    /// explicitly (a copy may still be leaving, or have been loaded behind the gateway's
    /// back) is `NotLoaded`, worded for `ask`; an unknown one Triton's own refusal.
    pub fn lease_loaded(
        self: &Arc<Self>,
        model: &ModelRef,
        ask: Ask,
    ) -> Result<Option<Lease>, GatewayError> {
        let view = self.view(&model.name);
        if self.specs.is_unloaded(&model.name) {
            return Err(not_loaded(model, ask));
        }
        if let Some(Decision::Serve(backend)) = self.books().hit(model, &view) {
            let in_flight = self.pool.backends()[backend].start_request();
            return Ok(Some(Lease {
                placement: self.clone(),
                backend,
                model: model.name.clone(),
                version: model.version_number().ok().flatten(),
                in_flight,
            }));
        }
        match self.servable(model, &view) {
            Ok(()) => Ok(None),
            // Triton's readiness words every model it would not serve alike.
            Err(GatewayError::UnknownModel { .. } | GatewayError::UnknownVersion { .. })
                if ask == Ask::Ready =>
            {
                Err(not_loaded(model, ask))
            }
            Err(error) => Err(error),
        }
    }

    /// The backends with a ready copy serving what `model` asks for (statistics are read
    /// from each), or why there is none.
    pub fn holders(&self, model: &ModelRef, ask: Ask) -> Result<Vec<Arc<Backend>>, GatewayError> {
        let view = self.view(&model.name);
        let holders = self.books().holders(model, &view);
        if holders.is_empty() || self.specs.is_unloaded(&model.name) {
            self.servable(model, &view)?;
            return Err(not_loaded(model, ask));
        }
        Ok(holders
            .into_iter()
            .map(|b| self.pool.backends()[b].clone())
            .collect())
    }

    /// Whether a request that loads would place `model`: a ready backend, one whose
    /// repository has the model, and a version a load would not refuse; else why not, as a
    /// load would refuse it.
    fn servable(&self, model: &ModelRef, view: &[BackendView]) -> Result<(), GatewayError> {
        if !view.iter().any(|v| v.ready) {
            return Err(GatewayError::NoBackendReady);
        }
        if !view.iter().any(|v| v.ready && v.knows) {
            return Err(GatewayError::UnknownModel {
                model: model.name.clone(),
            });
        }
        table::requested_version(model, &self.estimator.sizing(&model.name)).map(drop)
    }
}

/// `NotLoaded` for a request for `model`.
pub(super) fn not_loaded(model: &ModelRef, ask: Ask) -> GatewayError {
    GatewayError::NotLoaded {
        model: model.name.clone(),
        version: model.version.clone(),
        ask,
    }
}
