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

/// Starts one checker task per backend; they stop when `shutdown` is cancelled.
pub fn spawn_health_checks(
    pool: &Arc<Pool>,
    interval: Duration,
    timeout: Duration,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) {
    for backend in pool.backends() {
        let backend = backend.clone();
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = ticker.tick() => check(&backend, timeout).await,
                }
            }
        });
    }
}

/// One check: ready probe, then the index. A backend is ready only when both answer, so
/// placement never works from an index older than the last good probe.
pub async fn check(backend: &Backend, timeout: Duration) {
    let probe = backend
        .client
        .call(
            backend,
            Method::GET,
            "/v2/health/ready",
            Bytes::new(),
            timeout,
        )
        .await;
    match probe {
        Ok((StatusCode::OK, _)) => {}
        Ok((status, _)) => {
            return backend.mark_unhealthy(format!("health check answered {status}"));
        }
        Err(error) => return backend.mark_unhealthy(error.to_string()),
    }
    match refresh_index(backend, timeout).await {
        Ok(()) => backend.mark_healthy(),
        Err(reason) => backend.mark_unhealthy(reason),
    }
}

/// Reads the backend's repository index into its state.
pub async fn refresh_index(backend: &Backend, timeout: Duration) -> Result<(), String> {
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
        .map_err(|e| format!("repository index is not valid JSON: {e}"))?;
    backend.set_index(index);
    Ok(())
}
