//! `Gateway`: the state every request and background task shares (the pool, placement, the
//! live config, caches), as one cheap handle. It sits below the pipeline, the front-ends and
//! the control loops that are handed it, and above the parts it holds.

use crate::config::{self, Config};
use crate::live::Live;
use crate::{
    cluster, discovery, error, flow, hold, openai, placement, telemetry, tls, upstream, validate,
};
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use upstream::Pool;

/// Settles once the requests routed on replaced configs have let go of their route choice
/// (`Gateway::swap_live`); shared, so the next reload's waits on it too.
pub(crate) type Settled = Shared<BoxFuture<'static, bool>>;

/// Shared gateway state: a cheap handle, cloned into every handler.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    pool: Arc<Pool>,
    placement: Arc<placement::Placement>,
    live: arc_swap::ArcSwap<Live>,
    /// Settles once no request routed on any config replaced so far still holds its route
    /// choice (`swap_live`).
    replaced: std::sync::Mutex<Settled>,
    /// Held for the length of a reload: SIGHUP, the file watcher and `POST /admin/reload`
    /// may ask at once, and each reload compares with the config the last one left.
    reloading: tokio::sync::Mutex<()>,
    config_path: Option<std::path::PathBuf>,
    /// Starts health checks for backends a reload adds (set when `serve` starts).
    health: std::sync::OnceLock<upstream::HealthChecks>,
    signatures: Arc<validate::SignatureCache>,
    /// Each model's tokenizer and chat template, for the OpenAI endpoints.
    texts: openai::TextCache,
    /// Requests waiting for a pool that cannot take them right now.
    holding: hold::Holding,
    /// Each model's slots and waiting room (`[[models]].max_in_flight`).
    flow: flow::Flow,
    metrics: PrometheusHandle,
    draining: AtomicBool,
    /// The listeners' certificates (and client CAs), when `[listen.tls]` is set.
    tls: Option<Arc<tls::ServerTls>>,
    /// What the backends say about themselves, for server metadata.
    server_identity: upstream::identity::IdentityCache,
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
            Live::new(config.clone(), &text, None).map_err(anyhow::Error::msg)?,
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
                replaced: std::sync::Mutex::new(futures_util::future::ready(true).boxed().shared()),
                reloading: tokio::sync::Mutex::new(()),
                config_path: None,
                health: std::sync::OnceLock::new(),
                signatures,
                texts: Default::default(),
                holding: Default::default(),
                flow: Default::default(),
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
    pub fn server_identity(&self) -> &upstream::identity::IdentityCache {
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
            inner.live =
                arc_swap::ArcSwap::from_pointee(Live::new(inner.config.clone(), &text, None)?);
        }
        Ok(gateway)
    }

    /// What a request reads from the reloadable config (routes): take it once per request
    /// and keep it to the end.
    pub fn live(&self) -> Arc<Live> {
        self.inner.live.load_full()
    }

    /// Replaces the live config in one atomic store. Returns what settles once every request
    /// routed on the replaced config, and on every config before it, has let go of its route
    /// choice (true), or `server.drain_timeout` passed first for one of them (false): a
    /// request routed two reloads ago whose body is still arriving may still ask for a
    /// target the last reload removed.
    pub(crate) fn swap_live(&self, live: Live) -> Settled {
        let old = self.inner.live.swap(Arc::new(live));
        let limit = self.inner.config.server.drain_timeout.0;
        let mut replaced = self.inner.replaced.lock().expect("replaced lock");
        let before = replaced.clone();
        let settled = async move { before.await & old.routes.settled(limit).await }
            .boxed()
            .shared();
        *replaced = settled.clone();
        settled
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

    /// Each model's tokenizer and chat template (`openai::text`), read once.
    pub fn texts(&self) -> &openai::TextCache {
        &self.inner.texts
    }

    /// The requests held for the pool (`hold`).
    pub fn holding(&self) -> &hold::Holding {
        &self.inner.holding
    }

    /// Each model's slots and waiting room: the flow phase's state.
    pub fn flow(&self) -> &flow::Flow {
        &self.inner.flow
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

    /// Starts health checks for the backends a reload or discovery adds later (`add_backend`);
    /// set once, when the gateway starts serving.
    pub(crate) fn start_health_checks(&self, health: upstream::HealthChecks) {
        health.spawn_all(self.pool());
        let _ = self.inner.health.set(health);
    }

    /// Shutdown has begun: readiness turns false from now on.
    pub(crate) fn begin_draining(&self) {
        self.inner.draining.store(true, Ordering::Relaxed);
    }

    /// "No public ingress without auth": say so loudly when a listener that reaches models or
    /// the admin API is bound beyond loopback with `auth.mode = "none"`, at start and after each
    /// reload (one may have turned auth off).
    pub(crate) fn warn_if_open(&self) {
        let live = self.live();
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
}

impl cluster::Host for Gateway {
    fn placement(&self) -> &Arc<placement::Placement> {
        Gateway::placement(self)
    }

    fn live(&self) -> Arc<Live> {
        Gateway::live(self)
    }
}
