//! `[cluster]`: gateway replicas behind one load balancer share a registry in etcd, as
//! ModelMesh's instances do. Each replica keeps a record on its own lease, campaigns in
//! etcd's election (the leader is the one housekeeping will run on), keeps a local view of
//! every key under the prefix current through one watch, and shares what must be pooled:
//! canary guard trips, learned model sizes, and the replica count that divides per-tenant
//! limits.
//!
//! Nothing on the request path waits on etcd: requests read local state the session loop
//! updates. When etcd cannot be reached the replica is `degraded`: it goes on serving from
//! what it last knew, retries with backoff, and re-registers when etcd returns.

mod etcd;
mod registry;
mod session;
mod shared;
pub mod view;

use crate::config;
use crate::telemetry;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;
use view::View;

/// What the registry session reads and changes in the gateway that runs it: the placement
/// books it shares with the other replicas, and the live routes whose guards' trips it
/// publishes and applies. The gateway holds the cluster and is its host, so the session
/// names this, not the gateway.
pub trait Host: Clone + Send + Sync + 'static {
    /// The placement books.
    fn placement(&self) -> &std::sync::Arc<crate::placement::Placement>;
    /// The running config's snapshot.
    fn live(&self) -> std::sync::Arc<crate::live::Live>;
}

/// One replica's membership in the pool: its view of the registry and whether etcd is
/// reachable. Built with the gateway; `run` (spawned by `serve`) does the talking.
pub struct Cluster {
    config: config::Cluster,
    view: Mutex<View>,
    degraded: AtomicBool,
    /// Set once a session has read the registry: readiness waits for it.
    joined: AtomicBool,
    /// Why the last session ended, while degraded.
    last_error: Mutex<Option<String>>,
    /// The lease this replica's keys are bound to (0 before the first grant).
    lease: AtomicI64,
    started_at_unix: f64,
    /// The placement it shares, for copies the registry no longer counts (`registry`).
    placement: std::sync::OnceLock<std::sync::Arc<crate::placement::Placement>>,
    /// To etcd: plain TCP, or TLS with `[cluster.tls]`'s files (read once, at start).
    connector: crate::tls::HttpsConnector,
    /// The current session's etcd client, for placement's transactions (`registry`).
    client: Mutex<Option<etcd::Client>>,
    /// Outcomes placement reports, applied in order by `settle_loop`.
    settles: tokio::sync::mpsc::UnboundedSender<registry::Write>,
    settles_rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<registry::Write>>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("replica", &self.config.replica)
            .field("degraded", &self.is_degraded())
            .finish()
    }
}

impl Cluster {
    /// The replica's state before it has reached etcd: degraded until the first session
    /// registers it. Fails when `[cluster.tls]`'s files do not load (naming the key).
    pub fn new(config: &config::Cluster) -> Result<Self, String> {
        let connector = etcd::connector(config)?;
        let (settles, settles_rx) = tokio::sync::mpsc::unbounded_channel();
        let this = Self {
            connector,
            client: Mutex::new(None),
            placement: std::sync::OnceLock::new(),
            settles,
            settles_rx: Mutex::new(Some(settles_rx)),
            view: Mutex::new(View::new(&config.prefix)),
            config: config.clone(),
            degraded: AtomicBool::new(true),
            joined: AtomicBool::new(false),
            last_error: Mutex::new(Some("not connected to etcd yet".into())),
            lease: AtomicI64::new(0),
            started_at_unix: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        };
        this.gauge(telemetry::CLUSTER_DEGRADED).set(1.0);
        Ok(this)
    }

    /// This replica's name in the registry.
    pub fn replica(&self) -> &str {
        &self.config.replica
    }

    /// True while etcd cannot be reached: the replica serves from its last view.
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// True once a session has read the registry and mirrored its copies: from then on
    /// the replica knows what the pool placed, even through a later outage.
    pub fn has_joined(&self) -> bool {
        self.joined.load(Ordering::Relaxed)
    }

    fn view(&self) -> MutexGuard<'_, View> {
        self.view.lock().expect("cluster view")
    }

    fn gauge(&self, name: &'static str) -> metrics::Gauge {
        metrics::gauge!(name, "replica" => self.config.replica.clone())
    }

    /// Marks the replica degraded (with the reason) or, with `None`, healthy again (and
    /// joined: the session calls it once it has read the registry).
    fn set_degraded(&self, reason: Option<String>) {
        let degraded = reason.is_some();
        if !degraded {
            self.joined.store(true, Ordering::Relaxed);
        }
        if self.degraded.swap(degraded, Ordering::Relaxed) != degraded {
            match &reason {
                Some(reason) => {
                    tracing::warn!(replica = self.replica(), %reason, "cluster degraded: serving from the last view of the registry")
                }
                None => tracing::info!(
                    replica = self.replica(),
                    "cluster registry reached: not degraded"
                ),
            }
        }
        *self.last_error.lock().expect("cluster error") = reason;
        self.gauge(telemetry::CLUSTER_DEGRADED)
            .set(f64::from(u8::from(degraded)));
    }

    /// `GET /admin/cluster`: the replicas, the leader, the registry revision and whether
    /// this replica is degraded.
    pub fn snapshot(&self) -> serde_json::Value {
        let view = self.view();
        let leader = view.leader();
        serde_json::json!({
            "replica": self.replica(),
            "prefix": self.config.prefix,
            "degraded": self.is_degraded(),
            "joined": self.has_joined(),
            "degraded_reason": *self.last_error.lock().expect("cluster error"),
            "revision": view.revision(),
            "leader": leader,
            "is_leader": leader.as_deref() == Some(self.replica()),
            "lease": format!("{:x}", self.lease.load(Ordering::Relaxed)),
            "lease_ttl_seconds": self.config.lease_seconds(),
            "replicas": view.replicas(),
            "trips": shared::trips(&view),
            "sizes": shared::sizes(&view),
        })
    }
}
