//! The Triton pool as the gateway sees it: each backend's address, pooled client, health and
//! the models it reports, updated by `health` and read lock-free by every request.

mod client;
mod driven;
mod ejection;
mod ends;
mod failure;
pub mod grpc;
mod health;
pub mod identity;
mod index;
mod load_queue;
pub mod metrics_scrape;
mod multiplex;
mod queues;
mod triton;

pub use client::{UpstreamClient, forward};
pub use ejection::Ejection;
pub use health::{HealthChecks, refresh_index};
pub use index::{ModelEntry, ModelIndex};
pub use load_queue::{LoadQueue, Priority};
pub use queues::Queues;
pub use triton::{TritonClient, TritonError, model_path};

use crate::config;
use crate::config::BackendUrl;
use crate::error::GatewayError;
use arc_swap::ArcSwap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// One Triton instance: identity, client and live state.
#[derive(Debug)]
pub struct Backend {
    /// Config name, used in metrics, logs and the admin API.
    pub name: String,
    /// Where its HTTP/REST endpoint is.
    pub url: BackendUrl,
    /// Where its Prometheus metrics are, if configured.
    pub metrics_url: Option<String>,
    /// Capacity from config (for placement).
    pub capacity: Option<u64>,
    /// The pooled connection to it.
    pub client: UpstreamClient,
    /// Its gRPC endpoint, where the gRPC front-end forwards, if configured.
    pub grpc: Option<grpc::GrpcUpstream>,
    /// Its series of `infergate_upstream_duration_seconds`, registered once.
    upstream_duration: metrics::Histogram,
    /// `health.ready()`, read by every request without the lock.
    ready: AtomicBool,
    health: Mutex<ejection::HealthState>,
    thresholds: ejection::Thresholds,
    /// Failed requests in a row (`record_request_failure`).
    failures: AtomicU32,
    in_flight: AtomicUsize,
    index: ArcSwap<ModelIndex>,
    /// Its Triton's queue per model at the last reading (`health`).
    queues: arc_swap::ArcSwapOption<Queues>,
    /// Refreshes are numbered when they start; only a newer one may replace the index, so a
    /// slow poll that began before a load cannot overwrite what a refresh after it saw.
    index_requests: AtomicU64,
    index_applied: Mutex<u64>,
    last_error: Mutex<Option<String>>,
    retired: AtomicBool,
    /// Loads allowed at once here (`placement.max_loading_concurrency`), requests first.
    pub load_slots: Arc<LoadQueue>,
    /// Loads running here now (holding a slot), for the admin API and scaling decisions.
    pub loads_running: AtomicUsize,
    /// Loads and unloads placement has under way here (`start_change`).
    changes: AtomicUsize,
}

impl Backend {
    /// Builds a backend from its (validated) config entry. It starts not ready: it takes
    /// traffic after its first successful health check.
    pub fn new(
        config: &config::Backend,
        upstream: &config::Upstream,
        load_concurrency: usize,
    ) -> Result<Self, String> {
        let url = BackendUrl::parse(
            config
                .http
                .as_deref()
                .ok_or("a DNS group is not one backend")?,
        )?;
        let ca = config.tls_ca(upstream);
        Ok(Self {
            name: config.name.clone(),
            // The metrics URL goes through the same pool, so it may be https:// too.
            client: UpstreamClient::new(
                &url,
                upstream,
                url.tls
                    || config
                        .metrics
                        .as_deref()
                        .is_some_and(|m| m.starts_with("https://")),
                ca,
            )?,
            grpc: config
                .grpc
                .as_deref()
                .map(|url| grpc::GrpcUpstream::new(url, upstream, ca))
                .transpose()?,
            upstream_duration: crate::telemetry::upstream_duration(&config.name),
            url,
            metrics_url: config.metrics.clone(),
            capacity: config.capacity.map(config::ByteSize::bytes),
            ready: AtomicBool::new(false),
            health: Mutex::default(),
            thresholds: ejection::Thresholds {
                unhealthy: upstream.unhealthy_threshold,
                healthy: upstream.healthy_threshold,
                failed_requests: upstream.eject_after_failures,
            },
            failures: AtomicU32::new(0),
            in_flight: AtomicUsize::new(0),
            index: ArcSwap::from_pointee(ModelIndex::default()),
            queues: arc_swap::ArcSwapOption::empty(),
            index_requests: AtomicU64::new(0),
            index_applied: Mutex::new(0),
            last_error: Mutex::new(None),
            retired: AtomicBool::new(false),
            load_slots: LoadQueue::new(load_concurrency),
            loads_running: AtomicUsize::new(0),
            changes: AtomicUsize::new(0),
        })
    }

    /// Takes the backend out for good (a reload removed it): never ready again, its health
    /// checks stop; requests already on it finish.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        self.set_ready(false);
    }

    /// Whether a reload removed the backend.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Passed its last health check and is not ejected.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Requests currently sent to it and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The models it reported at its last index refresh.
    pub fn index(&self) -> Arc<ModelIndex> {
        self.index.load_full()
    }

    /// Whether its last index names `model`: placement asks this of every backend on each
    /// decision, so it reads the index in place rather than sharing it (`index`), whose
    /// count every worker would write.
    pub fn knows(&self, model: &str) -> bool {
        self.index.load().knows(model)
    }

    /// Requests waiting for `model` in its Triton's queue, by the last reading when it is
    /// younger than `max_age` (`None`: no reading to trust).
    pub fn pending(&self, model: &str, max_age: std::time::Duration) -> Option<u64> {
        let queues = self.queues.load();
        queues
            .as_ref()?
            .pending(model, max_age, tokio::time::Instant::now())
    }

    /// Keeps a new reading of its queues.
    pub fn set_queues(&self, queues: Queues) {
        self.queues.store(Some(Arc::new(queues)));
    }

    /// Why it last failed, for the admin API.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("last_error lock").clone()
    }

    /// Counts one request in flight until the guard drops.
    pub fn start_request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Counts a load or unload placement runs here until the guard drops. A busy Triton may
    /// answer nothing for seconds while it loads or unloads a model (a python stub starting
    /// on a loaded machine stalls it); a check that goes unanswered then is the gateway's own
    /// work, not a backend that is down (see `health::check`).
    pub fn start_change(self: &Arc<Self>) -> Changing {
        self.changes.fetch_add(1, Ordering::AcqRel);
        Changing(self.clone())
    }

    /// Whether placement has a load or unload under way here.
    pub fn is_changing(&self) -> bool {
        self.changes.load(Ordering::Acquire) > 0
    }

    /// Records a successful health check (`ejection`: in at once at start-up, after
    /// `upstream.healthy_threshold` in a row once taken out; ends an ejection by traffic).
    fn mark_healthy(&self) {
        self.failures.store(0, Ordering::Relaxed);
        let ready = {
            let mut health = self.health.lock().expect("health lock");
            health.check_passed(self.thresholds);
            health.ready()
        };
        if !self.is_retired() {
            self.set_ready(ready);
        }
    }

    /// Records a failed health check: out after `upstream.unhealthy_threshold` in a row.
    fn mark_unhealthy(&self, reason: String) {
        *self.last_error.lock().expect("last_error lock") = Some(reason);
        let (ejected, ready) = {
            let mut health = self.health.lock().expect("health lock");
            (health.check_failed(self.thresholds), health.ready())
        };
        self.set_ready(ready);
        if let Some(ejection) = ejected {
            self.ejected(ejection);
        }
    }

    /// Records a request the backend failed (a connection reset or timed out, a
    /// 502/503/504): after `upstream.eject_after_failures` in a row it is ejected until a
    /// health check succeeds again.
    pub fn record_request_failure(&self, reason: &str) {
        self.count_failure(reason, false);
    }

    /// Records how a request's exchange with it failed, for every way of reaching it: a
    /// connection refused, reset, broken or closed before an answer counts against it (see
    /// `record_request_failure`); a refusal ejects it at once, since nothing listens there,
    /// as gRPC's clients take a subchannel whose connection failed out of their picks (its
    /// requests go elsewhere meanwhile, `pipeline::forward`, and no load starts there).
    /// Anything else (the client's body, its deadline) is not the backend's.
    pub fn record_error(&self, error: &GatewayError) {
        match error {
            GatewayError::UpstreamUnreachable {
                reason, refused, ..
            } => self.count_failure(reason, *refused),
            GatewayError::UpstreamFailed { reason, .. } => self.count_failure(reason, false),
            GatewayError::UpstreamClosed { .. } => {
                self.count_failure("closed the connection before answering", false)
            }
            _ => {}
        }
    }

    /// One more failure in the streak; ejects at the threshold, or `at_once`.
    fn count_failure(&self, reason: &str, at_once: bool) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        *self.last_error.lock().expect("last_error lock") = Some(reason.to_string());
        if failures < self.thresholds.failed_requests && !at_once {
            return;
        }
        let ejected = self.health.lock().expect("health lock").eject();
        if let Some(ejection) = ejected {
            tracing::warn!(backend = %self.name, failures, reason, "backend ejected after failed requests");
            self.set_ready(false);
            self.ejected(ejection);
        }
    }

    /// Counts an ejection, for autoscalers and alerts.
    fn ejected(&self, ejection: Ejection) {
        metrics::counter!(crate::telemetry::BACKEND_EJECTIONS,
            "backend" => self.name.clone(), "reason" => ejection.as_str())
        .increment(1);
    }

    /// Records a backend's HTTP answer to a request: a 502, 503 or 504 (Envoy's gateway
    /// failures: the backend, or a proxy in front of it, could not serve) counts against it;
    /// anything else resets the streak. A 500 does not: Triton answers it for a model's own
    /// failure (a python model that raised), which another backend would answer the same.
    pub fn record_answer(&self, status: http::StatusCode) {
        use http::StatusCode as S;
        match status {
            S::BAD_GATEWAY | S::SERVICE_UNAVAILABLE | S::GATEWAY_TIMEOUT => {
                self.record_request_failure(&format!("answered {status}"))
            }
            _ => self.record_success(),
        }
    }

    /// Records how long the backend took until its response headers.
    pub fn record_latency(&self, elapsed: std::time::Duration) {
        self.upstream_duration.record(elapsed.as_secs_f64());
    }

    /// Records a request that reached the backend, which resets the failure streak.
    pub fn record_success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Numbers an index refresh as it starts; pass the ticket to `set_index`.
    pub fn index_ticket(&self) -> u64 {
        self.index_requests.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Replaces the model index with what refresh `ticket` read, unless a refresh that
    /// started later has already been applied.
    pub fn set_index(&self, ticket: u64, index: ModelIndex) {
        let mut applied = self.index_applied.lock().expect("index lock");
        if ticket > *applied {
            *applied = ticket;
            self.index.store(Arc::new(index));
        }
    }

    fn set_ready(&self, ready: bool) {
        let was = self.ready.swap(ready, Ordering::AcqRel);
        if was != ready {
            if ready {
                tracing::info!(backend = %self.name, "backend is ready");
            } else {
                tracing::warn!(backend = %self.name, reason = ?self.last_error(), "backend is not ready");
            }
        }
        crate::telemetry::backend_up(&self.name, ready);
    }
}

/// Keeps a backend's in-flight count up while a request is outstanding.
#[derive(Debug)]
pub struct InFlight(Arc<Backend>);

impl InFlight {
    /// The backend being used.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Keeps a backend counted as changing (`Backend::start_change`) while a load or unload runs.
#[derive(Debug)]
pub struct Changing(Arc<Backend>);

impl Drop for Changing {
    fn drop(&mut self) {
        self.0.changes.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every configured backend. A reload adds backends at the end and retires removed ones in
/// place, so a backend's index never changes while the gateway runs.
#[derive(Debug, Default)]
pub struct Pool {
    backends: ArcSwap<Vec<Arc<Backend>>>,
    /// Serializes changes (reloads), so two cannot lose each other's backend.
    changing: Mutex<()>,
}

impl Pool {
    /// Builds the pool from config: its fixed backends (DNS groups join as they resolve).
    pub fn new(config: &config::Config) -> Result<Self, String> {
        let backends = config
            .instances(&config::Discovered::new())
            .iter()
            .map(|b| Self::build(b, config).map(Arc::new))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            backends: ArcSwap::from_pointee(backends),
            changing: Mutex::new(()),
        })
    }

    /// A backend as `config` describes it.
    pub fn build(backend: &config::Backend, config: &config::Config) -> Result<Backend, String> {
        Backend::new(
            backend,
            &config.upstream,
            config.placement.max_loading_concurrency,
        )
    }

    /// Every backend slot, ready or not, retired ones included (indices are stable).
    pub fn backends(&self) -> Arc<Vec<Arc<Backend>>> {
        self.backends.load_full()
    }

    /// Backends that currently take traffic.
    pub fn ready(&self) -> Vec<Arc<Backend>> {
        self.backends
            .load()
            .iter()
            .filter(|b| b.is_ready())
            .cloned()
            .collect()
    }

    /// Whether any backend takes traffic.
    pub fn any_ready(&self) -> bool {
        self.backends.load().iter().any(|b| b.is_ready())
    }

    /// A backend in service by config name.
    pub fn get(&self, name: &str) -> Option<Arc<Backend>> {
        self.backends
            .load()
            .iter()
            .find(|b| b.name == name && !b.is_retired())
            .cloned()
    }

    /// Adds a backend (a reload added it); returns its index. It takes traffic after its
    /// first good health check.
    pub fn add(&self, backend: Backend) -> usize {
        let _changing = self.changing.lock().expect("pool lock");
        let mut backends = Vec::clone(&self.backends.load());
        backends.push(Arc::new(backend));
        let index = backends.len() - 1;
        self.backends.store(Arc::new(backends));
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passive_failures_eject_after_threshold_and_a_refused_connection_at_once() {
        let config: config::Config = config::Config::parse(
            r#"
            [listen]
            http = "127.0.0.1:0"
            [upstream]
            eject_after_failures = 2
            [[backends]]
            name = "b"
            http = "http://127.0.0.1:1"
            "#,
        )
        .unwrap();
        let backend = Backend::new(&config.backends[0], &config.upstream, 1).unwrap();
        backend.mark_healthy();
        backend.record_request_failure("refused");
        assert!(backend.is_ready());
        backend.record_request_failure("refused");
        assert!(!backend.is_ready());
        assert_eq!(backend.last_error().as_deref(), Some("refused"));
        backend.mark_healthy();
        assert!(backend.is_ready());
        backend.record_error(&GatewayError::UpstreamUnreachable {
            backend: "b".into(),
            reason: "Connection refused".into(),
            refused: true,
        });
        assert!(!backend.is_ready(), "a refused connection ejects at once");
        backend.mark_healthy();
        assert!(backend.is_ready());
    }

    // Requests are health checks too: a 502/503/504 counts like a refused connection, a
    // 500 (a model's own failure) resets the streak as any answer does.
    #[test]
    fn gateway_failures_on_requests_eject_but_a_models_500_does_not() {
        let config = config::Config::parse(
            "[listen]\nhttp = \"127.0.0.1:0\"\n[[backends]]\nname = \"b\"\nhttp = \"http://127.0.0.1:1\"",
        )
        .unwrap();
        let backend = Backend::new(&config.backends[0], &config.upstream, 1).unwrap();
        backend.mark_healthy();
        for _ in 0..5 {
            backend.record_answer(http::StatusCode::SERVICE_UNAVAILABLE);
            backend.record_answer(http::StatusCode::BAD_GATEWAY);
            backend.record_answer(http::StatusCode::INTERNAL_SERVER_ERROR);
        }
        assert!(backend.is_ready(), "a 500 between them resets the streak");
        backend.record_answer(http::StatusCode::GATEWAY_TIMEOUT);
        backend.record_answer(http::StatusCode::SERVICE_UNAVAILABLE);
        backend.record_answer(http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(!backend.is_ready());
        assert_eq!(
            backend.last_error().as_deref(),
            Some("answered 503 Service Unavailable")
        );
        backend.mark_healthy();
        assert!(backend.is_ready(), "a good check ends the ejection");
    }

    #[test]
    fn a_stale_index_never_replaces_a_newer_one() {
        let config = config::Config::parse(
            "[listen]\nhttp = \"127.0.0.1:0\"\n[[backends]]\nname = \"b\"\nhttp = \"http://127.0.0.1:1\"",
        )
        .unwrap();
        let backend = Backend::new(&config.backends[0], &config.upstream, 1).unwrap();
        let ready = |name: &str| {
            ModelIndex::from_json(
                format!(r#"[{{"name":"{name}","version":"1","state":"READY"}}]"#).as_bytes(),
            )
            .unwrap()
        };
        let slow = backend.index_ticket();
        let fresh = backend.index_ticket();
        backend.set_index(fresh, ready("after_load"));
        backend.set_index(slow, ready("before_load"));
        assert_eq!(backend.index().ready_versions("after_load"), [1].into());
    }
}
