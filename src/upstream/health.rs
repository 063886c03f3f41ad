//! Active health checks: each backend's `/v2/health/ready` and repository index are polled on
//! an interval, so traffic only goes where a model is actually READY, and a backend that comes
//! back is readmitted without a restart.

use super::{Backend, ModelIndex, Pool};
use bytes::Bytes;
use http::{Method, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What runs every backend's checks: one task per backend, stopped by `shutdown` (or when
/// a reload retires the backend). `after_check(i)` runs after a check of backend `i` that
/// found it not ready or brought it back: placement reconciles it there at once (an ejected
/// backend holds nothing; one that comes up may hold models), and otherwise every
/// `placement.reconcile_interval`.
#[derive(Clone)]
pub struct HealthChecks {
    /// Time between checks.
    pub interval: Duration,
    /// Time allowed for one check.
    pub timeout: Duration,
    /// Where the tasks are tracked, for shutdown.
    pub tasks: TaskTracker,
    /// Stops every check.
    pub shutdown: CancellationToken,
    /// Runs after a check that found a backend not ready or brought it back, with its index.
    pub after_check: Arc<dyn Fn(usize) + Send + Sync>,
}

impl HealthChecks {
    /// Starts checking every backend of the pool.
    pub fn spawn_all(&self, pool: &Pool) {
        for (i, backend) in pool.backends().iter().enumerate() {
            self.spawn(i, backend.clone());
        }
    }

    /// Starts checking backend `i`: at once, then every `interval`.
    pub fn spawn(&self, i: usize, backend: Arc<Backend>) {
        let this = self.clone();
        self.tasks.spawn(async move {
            let mut ticker = tokio::time::interval(this.interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = this.shutdown.cancelled() => return,
                    _ = ticker.tick() => {
                        if backend.is_retired() {
                            return;
                        }
                        let was_ready = backend.is_ready();
                        check(&backend, this.timeout).await;
                        if !backend.is_ready() || !was_ready {
                            (this.after_check)(i);
                        }
                    }
                }
            }
        });
    }
}

/// One check: the server probe, then the index. A backend takes traffic only when both
/// answer, so placement never works from an index older than the last good probe.
///
/// Triton's `/v2/health/ready` turns false for good once any model fails to load (strict
/// readiness), which would take a whole server out for one broken model. So a server that
/// is live but not ready still serves the models its index lists READY.
pub async fn check(backend: &Backend, timeout: Duration) {
    if let Err(reason) = probe(backend, timeout).await {
        return backend.mark_unhealthy(reason);
    }
    match refresh_index(backend, timeout).await {
        Ok(()) => backend.mark_healthy(),
        Err(reason) => backend.mark_unhealthy(reason),
    }
}

async fn probe(backend: &Backend, timeout: Duration) -> Result<(), String> {
    let get = |path| {
        backend
            .client
            .call(backend, Method::GET, path, Bytes::new(), timeout)
    };
    match get("/v2/health/ready").await {
        Ok((StatusCode::OK, _)) => Ok(()),
        Ok((ready_status, _)) => match get("/v2/health/live").await {
            Ok((StatusCode::OK, _)) => {
                tracing::debug!(backend = %backend.name, %ready_status, "backend is live but not ready; serving its READY models");
                Ok(())
            }
            Ok((status, _)) => Err(format!("health check answered {status}")),
            Err(error) => Err(error.to_string()),
        },
        Err(error) => Err(error.to_string()),
    }
}

/// Reads the backend's repository index into its state.
pub async fn refresh_index(backend: &Backend, timeout: Duration) -> Result<(), String> {
    let ticket = backend.index_ticket();
    let sent = tokio::time::Instant::now();
    let (status, body) = backend
        .client
        .call(
            backend,
            Method::POST,
            "/v2/repository/index",
            Bytes::from_static(b"{}"),
            timeout,
        )
        .await
        .map_err(|e| e.to_string())?;
    if status != StatusCode::OK {
        return Err(format!("repository index answered {status}"));
    }
    let index = ModelIndex::from_json(&body)
        .map_err(|e| format!("repository index is not valid JSON: {e}"))?
        .with_read_at(sent);
    backend.set_index(ticket, index);
    Ok(())
}
