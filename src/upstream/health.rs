//! Active health checks: each backend's `/v2/health/live` and repository index are polled on
//! an interval, so traffic only goes where a model is actually READY, and a backend that comes
//! back is readmitted without a restart. How many checks take it out or bring it back is
//! `ejection`'s rule.

use super::{Backend, Pool, TritonClient, TritonError};
use bytes::Bytes;
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
    /// Whether each check of a ready backend with a `metrics` URL also reads its queues
    /// (`placement.queue_max_age` above 0).
    pub read_queues: bool,
    /// Whether placement's books have a load under way on backend `i`, this replica's or
    /// (`[cluster]`) another's seen in the registry: a reason for its checks to be slow.
    pub loading: Arc<dyn Fn(usize) -> bool + Send + Sync>,
    /// How long a LOADING model in a backend's last index excuses its slow checks
    /// (`placement.load_timeout`): a Triton that hangs mid-load is not excused for ever.
    pub load_timeout: Duration,
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
                        let busy = || {
                            backend.is_changing()
                                || (this.loading)(i)
                                || backend.index().loading_within(this.load_timeout)
                        };
                        check(&backend, this.timeout, busy).await;
                        if !backend.is_ready() || !was_ready {
                            (this.after_check)(i);
                        }
                        if this.read_queues && backend.is_ready() {
                            read_queues(&backend, this.timeout).await;
                        }
                    }
                }
            }
        });
    }
}

/// Reads a backend's queue per model from its metrics; a backend without a metrics URL,
/// or one that does not answer, keeps its last reading (which ages out).
async fn read_queues(backend: &Backend, timeout: Duration) {
    let started = tokio::time::Instant::now();
    if let Some(Ok(text)) = TritonClient::new(backend, timeout).metrics_text().await {
        backend.set_queues(super::Queues::parse(&text, started));
    }
}

/// One check: liveness, then the index. A backend takes traffic only when both answer, so
/// placement never works from an index older than the last good probe.
///
/// Readiness is read from the index, model by model, not from `/v2/health/ready`: with
/// Triton's default strict readiness that answers 400 while any model loads and for good
/// once one failed to load, which says nothing about the models that are READY. And a check
/// that goes unanswered while placement loads or unloads a model there is Triton busy with
/// a model loading there: the gateway's own load or unload, another replica's, or one its
/// index shows LOADING. The backend keeps its state (and its books) until it answers or the
/// load ends (within `placement.load_timeout`), and the check does not count. Any other
/// failure (refused, a wrong answer, slow with nothing loading) counts towards
/// `upstream.unhealthy_threshold` (`ejection`).
pub async fn check(backend: &Backend, timeout: Duration, busy: impl FnOnce() -> bool) {
    let outcome = match probe(backend, timeout).await {
        Ok(()) => refresh_index(backend, timeout).await,
        Err(failure) => Err(failure),
    };
    match outcome {
        Ok(()) => backend.mark_healthy(),
        Err(failure) if failure.timed_out && busy() => {
            tracing::debug!(backend = %backend.name, reason = failure.reason,
                "backend is busy with a model load; kept as it was");
        }
        Err(failure) => backend.mark_unhealthy(failure.reason),
    }
}

/// Why a check failed, and whether it was only the backend not answering in time.
#[derive(Debug)]
pub struct CheckFailure {
    /// For `last_error` and the logs.
    pub reason: String,
    /// The backend did not answer within the check's timeout.
    pub timed_out: bool,
}

impl CheckFailure {
    /// A failed call named `what` ("liveness check"), as the admin API and the logs show it.
    fn of(what: &str, error: &TritonError) -> Self {
        Self {
            reason: error.describe(what),
            timed_out: error.timed_out(),
        }
    }
}

impl std::fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

async fn probe(backend: &Backend, timeout: Duration) -> Result<(), CheckFailure> {
    TritonClient::new(backend, timeout)
        .live()
        .await
        .map_err(|e| CheckFailure::of("liveness check", &e))
}

/// Reads the backend's repository index into its state.
pub async fn refresh_index(backend: &Backend, timeout: Duration) -> Result<(), CheckFailure> {
    let ticket = backend.index_ticket();
    let sent = tokio::time::Instant::now();
    let index = TritonClient::new(backend, timeout)
        .repository_index(Bytes::from_static(b"{}"))
        .await
        .map_err(|e| CheckFailure::of("repository index", &e))?;
    backend.set_index(ticket, index.with_read_at(sent));
    Ok(())
}
