//! infergate: a KServe v2 gateway in front of a pool of NVIDIA Triton Inference Servers.
//!
//! `Gateway` is the shared state every request sees; `serve` runs the listeners on sockets
//! the caller bound (so tests can bind port 0) until shutdown, then drains.
#![forbid(unsafe_code)]

#[cfg(test)]
mod architecture_tests;
mod auth;
mod body;
mod cluster;
pub mod config;
mod discovery;
mod error;
mod fnv;
mod frontend;
mod listen;
mod log_text;
mod model;
mod pipeline;
mod placement;
pub mod protocol;
mod reload;
mod routing;
mod services;
mod telemetry;
mod tls;
mod trace;
mod upstream;
mod validate;
mod worker;

pub use auth::hash_key;
pub use telemetry::{LogFormat, flush_logs, init_logging};

/// Gateway internals for this workspace's own tools, and for nothing else: the placement
/// simulator (`simulator/`, the `infergate-simulate` binary) replays traces against the real
/// placement table, the criterion benches (`benches/`) time the hot paths, `infergate check`
/// builds what a config names, and the integration tests reach a few parts directly. One facade, so
/// what they reach is listed in one place; no stability promise, hidden from the docs.
#[doc(hidden)]
pub mod internals {
    pub use crate::auth::{Auth, Credentials};
    pub use crate::config::{ByteSize, Config, EvictionPolicy, HumanDuration};
    pub use crate::error::GatewayError;
    pub use crate::model::ModelRef;
    pub use crate::pipeline::{Caller, PIN_HEADER, RouteTable};
    pub use crate::placement::estimate::{Estimate, SizeSource};
    pub use crate::placement::policy::EvictionOrder;
    pub use crate::placement::table::{BackendView, Decision, Policy, Table};
    pub use crate::tls::{ServerTls, certificate_identity, etcd_connector};
    pub use crate::trace::{RequestTrace, TRACEPARENT};
    pub use crate::upstream::{Backend, Pool};
    pub use crate::validate::http::{BodyView, Parsed, parse};
    pub use crate::validate::{DataType, InputSpec, Signature, check};
    pub use crate::validate::{SignatureCache, json};
}

use config::Config;
pub use listen::Listeners;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use upstream::Pool;

/// Shared gateway state: a cheap handle, cloned into every handler.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    pool: Arc<Pool>,
    placement: Arc<placement::Placement>,
    live: arc_swap::ArcSwap<pipeline::Live>,
    /// Held for the length of a reload: SIGHUP, the file watcher and `POST /admin/reload`
    /// may ask at once, and each reload compares with the config the last one left.
    reloading: tokio::sync::Mutex<()>,
    config_path: Option<std::path::PathBuf>,
    /// Starts health checks for backends a reload adds (set when `serve` starts).
    health: std::sync::OnceLock<upstream::HealthChecks>,
    signatures: Arc<validate::SignatureCache>,
    /// Requests waiting for a pool that cannot take them right now.
    holding: pipeline::hold::Holding,
    metrics: PrometheusHandle,
    draining: AtomicBool,
    /// The listeners' certificates (and client CAs), when `[listen.tls]` is set.
    tls: Option<Arc<tls::ServerTls>>,
    /// What the backends say about themselves, for server metadata.
    server_identity: services::server_metadata::IdentityCache,
    /// Membership in the replicas' registry, with `[cluster]`.
    cluster: Option<Arc<cluster::Cluster>>,
    /// DNS groups' resolver and the addresses it last found.
    discovery: Arc<discovery::Discovery>,
}

impl Gateway {
    /// Builds the state from a validated config. Backends start not ready until their first
    /// health check passes.
    pub fn new(config: Config) -> anyhow::Result<Self> {
        // First: backends register their metric series as they are built.
        let metrics = telemetry::metrics_handle();
        let pool = Arc::new(Pool::new(&config).map_err(anyhow::Error::msg)?);
        let placement = Arc::new(placement::Placement::new(&config, pool.clone()));
        let text = toml::to_string(&config).unwrap_or_default();
        let live = arc_swap::ArcSwap::from_pointee(
            pipeline::Live::new(config.clone(), &text, None).map_err(anyhow::Error::msg)?,
        );
        let signatures = Arc::new(validate::SignatureCache::new(&config.validation));
        let discovery = Arc::new(discovery::Discovery::new(&config.upstream));
        let tls = match &config.listen.tls {
            Some(settings) => Some(Arc::new(
                tls::ServerTls::new(settings).map_err(|e| anyhow::anyhow!("{e}"))?,
            )),
            None => None,
        };
        let cluster = match &config.cluster {
            Some(settings) => Some(Arc::new(
                cluster::Cluster::new(settings).map_err(anyhow::Error::msg)?,
            )),
            None => None,
        };
        if let Some(cluster) = &cluster {
            placement.share_through(cluster.clone());
        }
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                pool,
                placement,
                live,
                reloading: tokio::sync::Mutex::new(()),
                config_path: None,
                health: std::sync::OnceLock::new(),
                signatures,
                holding: Default::default(),
                metrics,
                draining: AtomicBool::new(false),
                tls,
                server_identity: Default::default(),
                cluster,
                discovery,
            }),
        })
    }

    /// The parts of the config a reload cannot change (listeners, server, upstream,
    /// placement, validation, telemetry, cluster), as the gateway started with them. What a
    /// reload changes (routes, backends, auth) is read from the request's snapshot
    /// (`RequestCtx::live`) or `live()`, never from here.
    pub fn fixed_config(&self) -> &Config {
        &self.inner.config
    }

    /// The backends' identity last read, for server metadata.
    pub fn server_identity(&self) -> &services::server_metadata::IdentityCache {
        &self.inner.server_identity
    }

    /// The backend pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.inner.pool
    }

    /// Builds the state from a config file, which reloads (SIGHUP, `POST /admin/reload`, or
    /// when the file changes) while `serve` runs.
    pub fn from_file(path: &std::path::Path) -> Result<Self, config::ConfigErrors> {
        let config = Config::load(path)?;
        let mut gateway = Self::new(config).map_err(|e| {
            config::ConfigErrors(vec![config::ConfigError {
                key: String::new(),
                message: format!("{e:#}"),
            }])
        })?;
        let inner = Arc::get_mut(&mut gateway.inner).expect("not shared yet");
        inner.config_path = Some(path.to_path_buf());
        if let Ok(text) = std::fs::read_to_string(path) {
            inner.live = arc_swap::ArcSwap::from_pointee(pipeline::Live::new(
                inner.config.clone(),
                &text,
                None,
            )?);
        }
        Ok(gateway)
    }

    /// What a request reads from the reloadable config (routes): take it once per request
    /// and keep it to the end.
    pub fn live(&self) -> Arc<pipeline::Live> {
        self.inner.live.load_full()
    }

    /// Replaces the live config in one atomic store; returns the one it replaced.
    pub(crate) fn swap_live(&self, live: pipeline::Live) -> Arc<pipeline::Live> {
        self.inner.live.swap(Arc::new(live))
    }

    /// Taken by a reload for its whole length: one reload at a time.
    pub(crate) fn reload_lock(&self) -> &tokio::sync::Mutex<()> {
        &self.inner.reloading
    }

    /// DNS groups' resolver and the addresses it last found.
    pub(crate) fn discovery(&self) -> &Arc<discovery::Discovery> {
        &self.inner.discovery
    }

    /// Adds a backend to the pool and to placement, and starts its health checks: it takes
    /// traffic after its first good one.
    pub(crate) fn add_backend(&self, backend: upstream::Backend) {
        let index = self.inner.pool.add(backend);
        let backend = self.inner.pool.backends()[index].clone();
        self.inner.placement.add_backend(&backend);
        if let Some(health) = self.inner.health.get() {
            health.spawn(index, backend);
        }
        tracing::info!(backend = %self.inner.pool.backends()[index].name, "backend added to the pool");
    }

    /// The file the config came from, if any (what reload reads).
    pub fn config_path(&self) -> Option<&std::path::Path> {
        self.inner.config_path.as_deref()
    }

    /// The listeners' TLS state, when `[listen.tls]` is set.
    pub fn tls(&self) -> Option<&Arc<tls::ServerTls>> {
        self.inner.tls.as_ref()
    }

    /// This replica's membership in the pool's registry, with `[cluster]`.
    pub fn cluster(&self) -> Option<&Arc<cluster::Cluster>> {
        self.inner.cluster.as_ref()
    }

    /// Which model is loaded where.
    pub fn placement(&self) -> &Arc<placement::Placement> {
        &self.inner.placement
    }

    /// Model signatures for request validation. Placement must call
    /// `SignatureCache::invalidate` whenever it loads, unloads or reloads a model.
    pub fn signatures(&self) -> &Arc<validate::SignatureCache> {
        &self.inner.signatures
    }

    /// The requests held for the pool (`pipeline::hold`).
    pub fn holding(&self) -> &pipeline::hold::Holding {
        &self.inner.holding
    }

    /// The Prometheus renderer.
    pub fn metrics(&self) -> &PrometheusHandle {
        &self.inner.metrics
    }

    /// True once shutdown has begun: readiness turns false so load balancers move away.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Relaxed)
    }

    /// The gateway's readiness, for every protocol's probe: ready while at least one backend
    /// is, not once shutdown has begun, and in a pool not before the replica has read the
    /// registry once (a later etcd outage leaves it ready: it serves what it knows).
    pub fn readiness(&self) -> Result<(), error::GatewayError> {
        if self.is_draining() {
            Err(error::GatewayError::ShuttingDown)
        } else if self.cluster().is_some_and(|c| !c.has_joined()) {
            Err(error::GatewayError::NotJoined)
        } else if !self.pool().any_ready() {
            Err(error::GatewayError::NoBackendReady)
        } else {
            Ok(())
        }
    }
}

/// Runs the gateway until `shutdown` is cancelled; then readiness turns false at once, the
/// listeners keep serving for `server.shutdown_delay` (so load balancers move away first),
/// stop accepting, let in-flight requests finish for up to `server.drain_timeout`, and it
/// returns.
pub async fn serve(
    gateway: Gateway,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tasks = TaskTracker::new();
    if let Some(endpoint) = &gateway.fixed_config().telemetry.otlp_endpoint {
        trace::start_export(endpoint).map_err(anyhow::Error::msg)?;
    }
    let upstream_config = &gateway.fixed_config().upstream;
    let placement = gateway.placement().clone();
    let books = gateway.placement().clone();
    let health = upstream::HealthChecks {
        interval: upstream_config.health_interval.0,
        timeout: upstream_config.health_timeout.0,
        tasks: tasks.clone(),
        shutdown: shutdown.clone(),
        after_check: Arc::new(move |backend| placement.reconcile(backend)),
        read_queues: !gateway.fixed_config().placement.queue_max_age.0.is_zero(),
        loading: Arc::new(move |backend| books.loading_on(backend)),
        load_timeout: gateway.fixed_config().placement.load_timeout.0,
    };
    // The first DNS round comes before health checks and listeners, so the instances found
    // are checked at once; a group DNS does not answer for starts empty (requests wait).
    gateway.discovery().round(&gateway).await;
    let discovery = gateway.discovery().clone();
    tasks.spawn({
        let (gateway, shutdown) = (gateway.clone(), shutdown.clone());
        async move { discovery.run(gateway, shutdown).await }
    });
    health.spawn_all(gateway.pool());
    let _ = gateway.inner.health.set(health);
    spawn_warm_up(&gateway, &tasks, &shutdown);
    tasks.spawn(gateway.placement().clone().rebalance_loop(shutdown.clone()));
    tasks.spawn(gateway.placement().clone().reconcile_loop(shutdown.clone()));
    tasks.spawn(telemetry::upkeep(
        gateway.metrics().clone(),
        shutdown.clone(),
    ));
    if let Some(path) = gateway.config_path() {
        reload::spawn_triggers(&gateway, path, Duration::from_secs(1), &tasks, &shutdown);
    }
    tasks.spawn(forget_signatures_on_change(
        gateway.clone(),
        shutdown.clone(),
    ));
    if let Some(tls) = gateway.tls() {
        tls.spawn_watch(Duration::from_secs(1), &tasks, &shutdown);
    }
    tasks.spawn(refresh_jwks(gateway.clone(), shutdown.clone()));
    if let Some(cluster) = gateway.cluster() {
        tasks.spawn(cluster.clone().run(gateway.clone(), shutdown.clone()));
    }
    warn_if_open(&gateway);
    let workers = listen::Workers::start(
        &gateway.fixed_config().server,
        endpoints(&gateway, listeners, &tasks, &shutdown)?,
    )?;
    tasks.close();

    shutdown.cancelled().await;
    gateway.inner.draining.store(true, Ordering::Relaxed);
    workers.begin_drain();
    let server = &gateway.fixed_config().server;
    let (delay, drain) = (server.shutdown_delay.0, server.drain_timeout.0);
    tracing::info!(
        shutdown_delay_ms = delay.as_millis() as u64,
        "shutting down: not ready, still serving while load balancers notice"
    );
    tokio::time::sleep(delay).await;
    workers.stop_accepting();
    tracing::info!(
        drain_timeout_ms = drain.as_millis() as u64,
        "shutting down: listeners closed, draining in-flight requests"
    );
    if tokio::time::timeout(drain, workers.drained())
        .await
        .is_err()
    {
        tracing::warn!("drain timeout reached with requests still in flight; exiting anyway");
    }
    workers.abort().await;
    tasks.wait().await;
    let _ = tokio::task::spawn_blocking(trace::flush).await;
    tracing::info!("stopped");
    Ok(())
}

/// What each listener serves. HTTP, gRPC and admin speak TLS when `[listen.tls]` is set;
/// metrics never does.
fn endpoints(
    gateway: &Gateway,
    listeners: Listeners,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> std::io::Result<Vec<(listen::Endpoint, tokio::net::TcpListener)>> {
    let tls = gateway.tls().cloned();
    let scheme = if tls.is_some() { "TLS" } else { "plain" };
    let workers = gateway.fixed_config().server.worker_count();
    let endpoint = |name, answers, tls: &Option<Arc<tls::ServerTls>>| listen::Endpoint {
        name,
        answers,
        tls: tls.clone(),
    };
    let edge = |answer: listen::Answer| listen::Answers::Edge(gateway.clone(), answer);
    tracing::info!(addr = %listeners.http.local_addr()?, scheme, workers, "serving KServe v2 HTTP");
    let http = endpoint("http", edge(frontend::http::serve), &tls);
    let mut endpoints = vec![(http, listeners.http)];
    if let Some(listener) = listeners.metrics {
        tracing::info!(addr = %listener.local_addr()?, "serving metrics");
        let router = frontend::metrics::router(gateway.clone());
        endpoints.push((
            endpoint("metrics", listen::Answers::Router(router), &None),
            listener,
        ));
    }
    if let Some(listener) = listeners.admin {
        tracing::info!(addr = %listener.local_addr()?, scheme, "serving admin API");
        endpoints.push((
            endpoint("admin", edge(frontend::admin::serve), &tls),
            listener,
        ));
    }
    if let Some(listener) = listeners.grpc {
        tracing::info!(addr = %listener.local_addr()?, scheme, "serving KServe v2 gRPC");
        let router = frontend::grpc::router(gateway.clone(), tasks, shutdown);
        endpoints.push((
            endpoint("grpc", listen::Answers::Router(router), &tls),
            listener,
        ));
    }
    Ok(endpoints)
}

/// Drops a model's cached signature whenever placement loads or unloads it, so the next
/// request is checked against what the backend now serves; its description (metadata and
/// config) only when it is loaded again, so a model unloaded is still described.
async fn forget_signatures_on_change(gateway: Gateway, shutdown: CancellationToken) {
    let mut events = gateway.placement().subscribe();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = events.recv() => event,
        };
        match event {
            Ok(placement::ModelEvent::Loaded(model)) => {
                gateway.signatures().invalidate(&model);
                gateway.signatures().forget_described(&model);
            }
            Ok(placement::ModelEvent::Unloaded(model)) => gateway.signatures().invalidate(&model),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "signature cache missed placement events");
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Reads the JWKS sources of the live config again every `auth.jwks_refresh_interval`
/// (first at once, so keys from URLs are there before the first token). Follows reloads:
/// each round refreshes whatever config is live then.
async fn refresh_jwks(gateway: Gateway, shutdown: CancellationToken) {
    loop {
        let auth = gateway.live().auth.clone();
        auth.refresh_jwks().await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(auth.refresh_interval()) => {}
        }
    }
}

/// "No public ingress without auth": say so loudly when a listener that reaches models or
/// the admin API is bound beyond loopback with `auth.mode = "none"`, at start and after each
/// reload (one may have turned auth off).
pub(crate) fn warn_if_open(gateway: &Gateway) {
    let live = gateway.live();
    if live.auth.is_on() {
        return;
    }
    let listen = &live.config.listen;
    let open: Vec<String> = [Some(listen.http), listen.grpc, listen.admin]
        .into_iter()
        .flatten()
        .filter(|addr| !addr.ip().is_loopback())
        .map(|addr| addr.to_string())
        .collect();
    if !open.is_empty() {
        tracing::warn!(
            listeners = open.join(", "),
            "listening beyond loopback with auth.mode = \"none\": anyone who can reach these \
             addresses may call every model and the repository API"
        );
    }
}

/// Loads pinned and preload models once the first backend is ready.
fn spawn_warm_up(gateway: &Gateway, tasks: &TaskTracker, shutdown: &CancellationToken) {
    let preload: Vec<String> = gateway
        .fixed_config()
        .models
        .iter()
        .filter(|m| m.preload && !m.pinned())
        .map(|m| m.name.clone())
        .collect();
    if preload.is_empty() && !gateway.fixed_config().models.iter().any(|m| m.pinned()) {
        return;
    }
    let gateway = gateway.clone();
    let shutdown = shutdown.clone();
    tasks.spawn(async move {
        let interval = gateway.fixed_config().upstream.health_interval.0;
        while !gateway.pool().any_ready() {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval / 4) => {}
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = gateway.placement().warm_up(preload) => {}
        }
    });
}

/// Cancels `token` on SIGTERM or SIGINT.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => tracing::info!("SIGINT received"),
            _ = term => tracing::info!("SIGTERM received"),
        }
        token.cancel();
    });
}
