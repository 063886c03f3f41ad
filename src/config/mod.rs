//! The TOML config file: serde types, defaults and validation.
//!
//! The core never sees TOML. `Config::load` parses and validates the whole file and returns
//! every problem at once, each named by its key, so `infergate check` can list them all and a
//! reload can refuse a bad file without touching the running one.

mod auth;
mod backends;
mod band;
mod cluster;
mod parse;
mod placement;
mod routes;
mod units;
mod url;

pub use auth::{ApiKey, Auth, AuthMode, JwtKey, Tenant, algorithm_family};
pub use backends::{Backend, Discovered};
pub use band::Band;
pub use cluster::{Cluster, ClusterTls};
pub use placement::{EvictionPolicy, Model, Placement};
pub use routes::{Guard, GuardLatency, RouteConfig, RouteTarget, StickyKey};
pub use units::{ByteSize, HumanDuration};
pub use url::{BackendUrl, grpc_endpoint};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The whole config file, as the operator wrote it (with defaults filled in).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the gateway listens.
    pub listen: Listen,
    /// Request handling limits and shutdown.
    #[serde(default)]
    pub server: Server,
    /// How backends are called and watched.
    #[serde(default)]
    pub upstream: Upstream,
    /// The Triton pool.
    #[serde(default)]
    pub backends: Vec<Backend>,
    /// Which model is loaded where.
    #[serde(default)]
    pub placement: Placement,
    /// Per-model settings (sizes, pins, preloads).
    #[serde(default)]
    pub models: Vec<Model>,
    /// Checking inference requests against the model's signature.
    #[serde(default)]
    pub validation: Validation,
    /// Model names split across targets by weight (canary rollouts).
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Authentication, tenants and their limits.
    #[serde(default)]
    pub auth: Auth,
    /// What the gateway tells monitoring: merged metrics, exported traces.
    #[serde(default)]
    pub telemetry: Telemetry,
    /// Replicas sharing one registry in etcd; absent: one process, books in memory.
    pub cluster: Option<Cluster>,
}

/// Metrics and traces for the monitoring stack. Read at start: a change needs a restart.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Telemetry {
    /// `/metrics` also carries every backend's Triton series (labelled `backend`, as
    /// `/metrics/backends` serves them), so one Prometheus job covers the whole pool.
    pub merge_backend_metrics: bool,
    /// OTLP/gRPC collector (`http://host:4317`) that receives a span per request; none: no
    /// spans are recorded (trace context is still taken or started and passed on).
    pub otlp_endpoint: Option<String>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            merge_backend_metrics: true,
            otlp_endpoint: None,
        }
    }
}

/// Inference requests are checked against the model's signature (fetched from a backend
/// that serves it) before they are forwarded; see `validate`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Validation {
    /// Off: inference bodies stream to the backend unread, as every other request does.
    pub enabled: bool,
    /// Signatures kept, one per model and version asked for.
    pub signature_cache_capacity: u64,
    /// Time allowed to fetch a signature (model metadata and config) from a backend; past
    /// it the request is forwarded unvalidated.
    pub signature_fetch_timeout: HumanDuration,
}

impl Validation {
    /// A cache of no signatures, or a fetch that times out at once, would make every request
    /// for a cold model go unchecked or fail.
    fn check(&self, error: &mut impl FnMut(String, String)) {
        if self.signature_cache_capacity == 0 {
            error(
                "validation.signature_cache_capacity".into(),
                "must be at least 1".into(),
            );
        }
        if self.signature_fetch_timeout.0.is_zero() {
            error(
                "validation.signature_fetch_timeout".into(),
                "must be greater than 0".into(),
            );
        }
    }
}

impl Default for Validation {
    fn default() -> Self {
        Self {
            enabled: true,
            signature_cache_capacity: 1024,
            signature_fetch_timeout: HumanDuration(Duration::from_secs(2)),
        }
    }
}

/// Listener addresses. Each runs its own server so metrics and admin can stay private.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    /// KServe v2 HTTP/REST.
    pub http: SocketAddr,
    /// Prometheus `/metrics` and `/metrics/backends`.
    pub metrics: Option<SocketAddr>,
    /// Admin API.
    pub admin: Option<SocketAddr>,
    /// KServe v2 gRPC (`inference.GRPCInferenceService`, grpc.health.v1, reflection).
    pub grpc: Option<SocketAddr>,
    /// TLS for the HTTP, gRPC and admin listeners (metrics stays plain: scrapers sit on the
    /// private side). Absent: every listener is plain TCP.
    pub tls: Option<ListenTls>,
}

/// Server certificate and optional client-certificate verification (mTLS). The files are
/// read again when they change and on config reload; a bad new file keeps the old one.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ListenTls {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the leaf certificate.
    pub key: PathBuf,
    /// PEM bundle of the CAs that sign client certificates; set, it turns on mTLS.
    pub client_ca: Option<PathBuf>,
    /// `required` (default): a client without a certificate signed by `client_ca` fails
    /// the handshake; `optional`: it may connect without one (any certificate it does send
    /// must verify), and the auth stage decides.
    pub client_auth: Option<ClientAuth>,
    /// Which field of a verified client certificate becomes the request's `PeerIdentity`:
    /// `cn` (default), `dns_san`, `uri_san` or `email_san` (the first such name).
    pub client_identity: Option<ClientIdentity>,
}

impl ListenTls {
    /// Whether a client must present a certificate (only with `client_ca`).
    pub fn client_auth(&self) -> ClientAuth {
        self.client_auth.unwrap_or(ClientAuth::Required)
    }

    /// Which certificate field names the client.
    pub fn client_identity(&self) -> ClientIdentity {
        self.client_identity.unwrap_or(ClientIdentity::Cn)
    }
}

/// Whether a client certificate is required when `listen.tls.client_ca` is set.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// No certificate, no connection.
    Required,
    /// Connections without a certificate are let through (without a `PeerIdentity`).
    Optional,
}

/// The client-certificate field that names the peer.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClientIdentity {
    /// The subject's common name.
    Cn,
    /// The first DNS subject alternative name.
    DnsSan,
    /// The first URI subject alternative name (SPIFFE IDs live here).
    UriSan,
    /// The first email (RFC 822) subject alternative name.
    EmailSan,
}

/// Limits on what a client may send, and how long shutdown waits.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Server {
    /// Largest request body accepted; larger ones get 413.
    pub max_body_size: ByteSize,
    /// How long in-flight requests may run after SIGTERM before the process exits anyway.
    pub drain_timeout: HumanDuration,
    /// Largest gRPC request message accepted; larger ones get RESOURCE_EXHAUSTED.
    pub max_grpc_message_size: ByteSize,
    /// The name `GET /v2` and `ServerMetadata` report instead of the backends' own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// How long a client has to send a whole request head (and an idle keep-alive connection
    /// to start its next one): slowloris clients are closed, as nginx's
    /// `client_header_timeout` does.
    pub header_read_timeout: HumanDuration,
    /// Longest wait between two reads of a request body; a body that stalls longer fails its
    /// request and the connection is closed (nginx's `client_body_timeout`).
    pub body_read_timeout: HumanDuration,
    /// Slowest average rate, in bytes per second, a request body may come at once it has
    /// been waited for longer than `min_body_rate_grace`; slower gets 408 and the
    /// connection is closed (Kestrel's `MinRequestBodyDataRate`). `body_read_timeout` alone
    /// lets a byte every few seconds hold a connection for ever (slow POST). 0 turns it off.
    pub min_body_rate: ByteSize,
    /// How long a body may be waited for before `min_body_rate` applies: room for a
    /// client's slow start without cutting it.
    pub min_body_rate_grace: HumanDuration,
    /// Open client connections per worker; past it new ones are closed at accept and counted,
    /// so file descriptors and memory stay bounded.
    pub max_connections: usize,
    /// Shared-nothing workers (a single-threaded runtime and its own listening sockets
    /// each); unset means one per core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// After SIGTERM, how long readiness reads false while the listeners still accept and
    /// serve, so a load balancer stops sending before they close.
    pub shutdown_delay: HumanDuration,
    /// How long a request waits for a pool that cannot take it right now (no backend ready,
    /// the registry briefly unreachable) before it is refused with 503; never past the
    /// client's deadline. `0s` refuses at once.
    pub ready_wait: HumanDuration,
    /// Requests that may wait so at once; past it a request is refused at once.
    pub max_waiting: usize,
    /// How long a request waits for a slot on a saturated model (`[[models]].max_in_flight`)
    /// before it is refused with 503 and `Retry-After`, when its client set no sooner
    /// deadline; a request the queue cannot serve in time is refused at once.
    pub queue_timeout: HumanDuration,
    /// Requests waiting at once for one saturated model, all tenants and bands: past it a
    /// newcomer pushes out the newest request of a lower band, or is refused.
    pub max_queued: usize,
    /// Body bytes of the requests waiting at once for one saturated model (each body has
    /// arrived whole and is in memory while it waits), so a queue of large bodies cannot
    /// exhaust memory: past it a newcomer is refused.
    pub max_queued_bytes: ByteSize,
}

impl Server {
    /// The message keys: a zero size would refuse every request, and a gRPC message length
    /// is 32 bits, so more than 4GiB cannot be honoured.
    fn check_size_and_name_keys(&self, error: &mut impl FnMut(String, String)) {
        if self.max_body_size.bytes() == 0 {
            error(
                "server.max_body_size".into(),
                "must be greater than 0".into(),
            );
        }
        if self.max_grpc_message_size.bytes() == 0
            || self.max_grpc_message_size.bytes() > u32::MAX as u64
        {
            error(
                "server.max_grpc_message_size".into(),
                "must be greater than 0 and at most 4GiB (a gRPC message length is 32 bits)".into(),
            );
        }
        if self.name.as_deref().is_some_and(str::is_empty) {
            error(
                "server.name".into(),
                "must not be empty (leave it out to report the backends' own name)".into(),
            );
        }
    }

    /// The accept path's keys: a zero would close every connection or serve none.
    fn check_connection_keys(&self, error: &mut impl FnMut(String, String)) {
        for (key, value) in [
            ("server.header_read_timeout", self.header_read_timeout),
            ("server.body_read_timeout", self.body_read_timeout),
            ("server.min_body_rate_grace", self.min_body_rate_grace),
        ] {
            if value.0.is_zero() {
                error(key.into(), "must be greater than 0".into());
            }
        }
        if self.max_connections == 0 {
            error(
                "server.max_connections".into(),
                "must be at least 1 (it is per worker)".into(),
            );
        }
        if self.workers == Some(0) {
            error(
                "server.workers".into(),
                "must be at least 1 (leave it out for one per core)".into(),
            );
        }
    }

    /// `workers`, or one per core when unset.
    pub fn worker_count(&self) -> usize {
        self.workers.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        })
    }
}

impl Default for Server {
    fn default() -> Self {
        Self {
            max_body_size: ByteSize(64 << 20),
            drain_timeout: HumanDuration(Duration::from_secs(30)),
            max_grpc_message_size: ByteSize(64 << 20),
            name: None,
            header_read_timeout: HumanDuration(Duration::from_secs(30)),
            body_read_timeout: HumanDuration(Duration::from_secs(60)),
            min_body_rate: ByteSize(240),
            min_body_rate_grace: HumanDuration(Duration::from_secs(5)),
            max_connections: 10_000,
            workers: None,
            shutdown_delay: HumanDuration(Duration::from_secs(5)),
            ready_wait: HumanDuration(Duration::from_secs(10)),
            max_waiting: 1024,
            queue_timeout: HumanDuration(Duration::from_secs(10)),
            max_queued: 1024,
            max_queued_bytes: ByteSize(256 << 20),
        }
    }
}

/// Timeouts, pooling and health checking for every backend.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Upstream {
    /// Time allowed to open a TCP connection to a backend.
    pub connect_timeout: HumanDuration,
    /// Time allowed from sending a request until the backend's response headers arrive.
    pub request_timeout: HumanDuration,
    /// Idle pooled connections are closed after this long.
    pub pool_idle_timeout: HumanDuration,
    /// Idle connections kept per backend.
    pub pool_max_idle: usize,
    /// How often each backend's `/v2/health/live` and repository index are polled.
    pub health_interval: HumanDuration,
    /// Time allowed for one health check.
    pub health_timeout: HumanDuration,
    /// Failed requests in a row (a connection reset or timed out, a 502/503/504) that eject
    /// a backend until its next successful health check: traffic is the best health signal.
    /// A refused connection ejects it at once: nothing listens there.
    pub eject_after_failures: u32,
    /// Failed health checks in a row that take a backend out (Envoy's
    /// `unhealthy_threshold`): one slow answer on a busy machine is not an outage. A check
    /// unanswered while a model loads there (this replica's load, another's, or one its
    /// repository index shows LOADING) does not count at all.
    pub unhealthy_threshold: u32,
    /// Good health checks in a row that bring a backend taken out back (Envoy's
    /// `healthy_threshold`), so a flapping backend does not flap traffic. A backend that
    /// never passed a check comes in on its first good one.
    pub healthy_threshold: u32,
    /// PEM bundle of the CAs that sign `https://` backends' certificates; without it (and
    /// without `backends[].tls_ca`) the system's roots are used.
    pub tls_ca: Option<PathBuf>,
    /// How often each DNS group (`backends[].dns`) is resolved again: new addresses join the
    /// pool, vanished ones are drained.
    pub discovery_interval: HumanDuration,
    /// The DNS server groups are resolved with (`ip:port`); without it, the system's
    /// (`/etc/resolv.conf`, with its search domains).
    pub dns_server: Option<SocketAddr>,
}

impl Upstream {
    /// Health counts and timeouts: a zero count flaps a backend on every probe, and a zero
    /// timeout or interval fails or spins every call.
    fn check(&self, error: &mut impl FnMut(String, String)) {
        for (key, value) in [
            ("upstream.eject_after_failures", self.eject_after_failures),
            ("upstream.unhealthy_threshold", self.unhealthy_threshold),
            ("upstream.healthy_threshold", self.healthy_threshold),
        ] {
            if value == 0 {
                error(key.into(), "must be at least 1".into());
            }
        }
        for (key, value) in [
            ("upstream.connect_timeout", self.connect_timeout),
            ("upstream.request_timeout", self.request_timeout),
            ("upstream.health_interval", self.health_interval),
            ("upstream.discovery_interval", self.discovery_interval),
            ("upstream.health_timeout", self.health_timeout),
        ] {
            if value.0.is_zero() {
                error(key.into(), "must be greater than 0".into());
            }
        }
    }
}

impl Default for Upstream {
    fn default() -> Self {
        Self {
            connect_timeout: HumanDuration(Duration::from_secs(2)),
            request_timeout: HumanDuration(Duration::from_secs(60)),
            pool_idle_timeout: HumanDuration(Duration::from_secs(90)),
            pool_max_idle: 256,
            health_interval: HumanDuration(Duration::from_secs(2)),
            health_timeout: HumanDuration(Duration::from_secs(1)),
            eject_after_failures: 3,
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            tls_ca: None,
            discovery_interval: HumanDuration(Duration::from_secs(5)),
            dns_server: None,
        }
    }
}

/// One problem in a config file, with the key it concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key path, e.g. `backends[1].name`; empty when the file as a whole is unreadable.
    pub key: String,
    /// What is wrong and what would be right.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

/// Every problem found in a config file.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                key: String::new(),
                message: format!("cannot read {}: {e}", path.display()),
            }])
        })?;
        Self::parse(&text)
    }

    /// Parses and validates config text; the error lists every problem found (see `parse`).
    pub fn parse(text: &str) -> Result<Self, ConfigErrors> {
        parse::parse(text)
    }

    /// Checks what serde cannot: uniqueness, URLs, sensible numbers. Each section checks its
    /// own keys; the order here is the order the errors are reported in.
    fn validate(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        self.check_backends(&mut errors);
        let mut error = |key: String, message: String| errors.push(ConfigError { key, message });
        self.server.check_size_and_name_keys(&mut error);
        self.server.check_connection_keys(&mut error);
        self.validation.check(&mut error);
        self.upstream.check(&mut error);
        self.check_client_certificate_keys(&mut error);
        if let Some(endpoint) = &self.telemetry.otlp_endpoint
            && let Err(message) = crate::trace::check_endpoint(endpoint)
        {
            errors.push(ConfigError {
                key: "telemetry.otlp_endpoint".into(),
                message,
            });
        }
        self.placement.validate(&self.models, &mut errors);
        if let Some(cluster) = &self.cluster {
            cluster.validate(&mut errors);
        }
        routes::validate(&self.routes, &mut errors);
        self.auth.validate(&mut errors);
        self.claims_for_sticky_keys(&mut errors);
        errors
    }

    /// Client-certificate keys span two tables (`listen.tls` verifies the certificates,
    /// `auth` trusts them), so neither table can check them alone: each needs `client_ca`.
    fn check_client_certificate_keys(&self, error: &mut impl FnMut(String, String)) {
        if let Some(tls) = &self.listen.tls
            && tls.client_ca.is_none()
        {
            for (key, set) in [
                ("listen.tls.client_auth", tls.client_auth.is_some()),
                ("listen.tls.client_identity", tls.client_identity.is_some()),
            ] {
                if set {
                    error(
                        key.into(),
                        "needs listen.tls.client_ca (the CAs that sign client certificates)".into(),
                    );
                }
            }
        }
        if self.auth.client_certificates
            && self
                .listen
                .tls
                .as_ref()
                .is_none_or(|t| t.client_ca.is_none())
        {
            error(
                "auth.client_certificates".into(),
                "needs listen.tls.client_ca (clients must present verified certificates)".into(),
            );
        }
    }

    /// A `claim:` sticky key needs verified tokens: without JWT keys no request has claims,
    /// and every request would get a fresh choice, which is not what the route asks for.
    fn claims_for_sticky_keys(&self, errors: &mut Vec<ConfigError>) {
        let verifies_tokens =
            self.auth.mode == AuthMode::Required && !self.auth.jwt_keys.is_empty();
        for (i, route) in self.routes.iter().enumerate() {
            if !verifies_tokens
                && let Some(Ok(StickyKey::Claim(name))) =
                    route.sticky.as_deref().map(StickyKey::parse)
            {
                errors.push(ConfigError {
                    key: format!("routes[{i}].sticky"),
                    message: format!(
                        "claim:{name} keys on a verified JWT's claim, and this config verifies none \
                         (it needs auth.mode = \"required\" and [[auth.jwt_keys]]); use header:NAME"
                    ),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [listen]
        http = "127.0.0.1:8000"
        [[backends]]
        name = "triton-0"
        http = "http://127.0.0.1:19000"
    "#;

    fn errors(text: &str) -> Vec<String> {
        Config::parse(text)
            .unwrap_err()
            .0
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let config = Config::parse(MINIMAL).unwrap();
        assert_eq!(config.server.max_body_size.bytes(), 64 << 20);
        assert_eq!(config.upstream.request_timeout.0, Duration::from_secs(60));
        assert_eq!(config.backends[0].capacity, None);
    }

    #[test]
    fn example_config_is_valid() {
        let text = include_str!("../../config/gateway.toml");
        let config = Config::parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.backends.len(), 2);
    }

    #[test]
    fn image_config_is_valid() {
        // The image starts with this file (docker/Dockerfile); nothing else reads it.
        let text = include_str!("../../docker/gateway.toml");
        Config::parse(text).unwrap_or_else(|e| panic!("docker/gateway.toml: {e}"));
    }

    #[test]
    fn eviction_policy_and_model_weights_are_read_and_checked() {
        let config = Config::parse(&format!(
            "{MINIMAL}[placement]\npolicy = \"gdsf\"\n[[models]]\nname = \"m\"\nkeep = true\ncost_weight = 2.5\n"
        ))
        .unwrap();
        assert_eq!(config.placement.policy, EvictionPolicy::Gdsf);
        assert!(config.models[0].keep);
        assert_eq!(config.models[0].cost_weight, Some(2.5));
        assert_eq!(
            Config::parse(MINIMAL).unwrap().placement.policy,
            EvictionPolicy::Tinylfu
        );
        let tinylfu = Config::parse(&format!("{MINIMAL}[placement]\npolicy = \"tinylfu\"\n"));
        assert_eq!(tinylfu.unwrap().placement.policy, EvictionPolicy::Tinylfu);
        let found = errors(&format!("{MINIMAL}[placement]\npolicy = \"fifo\"\n"));
        assert!(
            found[0].starts_with("placement.policy") && found[0].contains("`lru`, `lfu`, `gdsf`"),
            "{found:?}"
        );
        let found = errors(&format!(
            "{MINIMAL}[[models]]\nname = \"m\"\ncost_weight = 0\n"
        ));
        assert_eq!(found, ["models[0].cost_weight: must be a positive number"]);
    }

    /// Flow control's keys are read, and settings that could never hold are named: a zero
    /// `max_in_flight`, weight or bound, a highest band below the default one, a band that
    /// does not exist.
    #[test]
    fn flow_keys_are_read_and_checked() {
        let config = Config::parse(&format!(
            "{MINIMAL}[server]\nqueue_timeout = \"2s\"\nmax_queued = 64\nmax_queued_bytes = \"8MiB\"\n\
             [[models]]\nname = \"m\"\nmax_in_flight = 4\n\
             [[auth.tenants]]\nname = \"t\"\npriority = \"sheddable\"\nmax_priority = \"critical\"\nweight = 3\nmax_queued = 8\n"
        ))
        .unwrap();
        assert_eq!(config.server.queue_timeout.0, Duration::from_secs(2));
        assert_eq!(config.server.max_queued, 64);
        assert_eq!(config.server.max_queued_bytes.bytes(), 8 << 20);
        assert_eq!(config.models[0].max_in_flight, Some(4));
        let tenant = &config.auth.tenants[0];
        assert_eq!(
            (
                tenant.priority,
                tenant.max_priority,
                tenant.weight,
                tenant.max_queued
            ),
            (
                Some(Band::Sheddable),
                Some(Band::Critical),
                Some(3),
                Some(8)
            )
        );
        let found = errors(&format!(
            "{MINIMAL}[[models]]\nname = \"m\"\nmax_in_flight = 0\n\
             [[auth.tenants]]\nname = \"t\"\npriority = \"critical\"\nmax_priority = \"standard\"\nweight = 0\nmax_queued = 0\n"
        ));
        assert_eq!(found.len(), 4, "{found:?}");
        for key in [
            "models[0].max_in_flight: must be at least 1",
            "auth.tenants[0].weight: must be at least 1",
            "auth.tenants[0].max_queued: must be at least 1",
            "auth.tenants[0].max_priority: must be at least priority (critical)",
        ] {
            assert!(
                found.iter().any(|f| f.starts_with(key)),
                "{key} in {found:?}"
            );
        }
        let found = errors(&format!(
            "{MINIMAL}[[auth.tenants]]\nname = \"t\"\npriority = \"urgent\"\n"
        ));
        assert!(found[0].contains("critical"), "{found:?}");
    }

    #[test]
    fn unknown_key_is_named() {
        let found = errors(&format!("{MINIMAL}\ncolour = \"blue\""));
        assert_eq!(found.len(), 1);
        assert!(found[0].contains("colour"), "{found:?}");

        let found = errors(&MINIMAL.replace("name = \"triton-0\"", "name = \"t\"\nweight = 3"));
        assert!(found[0].starts_with("backends[0]"), "{found:?}");
        assert!(found[0].contains("weight"), "{found:?}");
    }

    #[test]
    fn mirrors_and_guards_are_checked_by_key() {
        let route = |targets: &str, guard: &str| {
            errors(&format!(
                "{MINIMAL}[[routes]]\nmodel = \"r\"\ntargets = [{targets}]\n{guard}"
            ))
        };
        let found = route(r#"{ model = "a" }"#, "");
        assert!(
            found[0].starts_with("routes[0].targets[0].weight: required"),
            "{found:?}"
        );
        let found = route(
            r#"{ model = "a", weight = 1, mirror = true, percent = 5 }"#,
            "",
        );
        assert!(
            found[0].starts_with("routes[0].targets[0].weight: a mirror never answers"),
            "{found:?}"
        );
        let found = route(r#"{ model = "a", mirror = true, percent = 101 }"#, "");
        assert!(
            found[0].contains("101 is not between 0 and 100"),
            "{found:?}"
        );
        let found = route(
            r#"{ model = "a", weight = 1 }"#,
            "guard = { window = \"10s\" }",
        );
        assert!(
            found[0].starts_with("routes[0].guard: set max_error_rate"),
            "{found:?}"
        );
        let found = route(
            r#"{ model = "a", weight = 1 }"#,
            "guard = { max_error_rate = 2.0 }",
        );
        assert!(
            found[0].starts_with("routes[0].guard.max_error_rate"),
            "{found:?}"
        );
    }

    /// A sticky header is read on every request of its route, by a name parsed once: one
    /// that is no header name is refused when the config is read, not never matched.
    #[test]
    fn a_sticky_header_is_a_header_name() {
        let route = |key: &str| {
            format!(
                "{MINIMAL}[[routes]]\nmodel = \"r\"\nsticky = \"{key}\"\ntargets = [{{ model = \"a\", weight = 1 }}]\n"
            )
        };
        let found = errors(&route("header:x user"));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("routes[0].sticky: invalid sticky key \"header:x user\": \"x user\" is not a header name"),
            "{found:?}"
        );
        assert!(Config::parse(&route("header:X-User-Id")).is_ok());
        assert_eq!(
            StickyKey::parse("header:X-User-Id"),
            Ok(StickyKey::Header(http::HeaderName::from_static(
                "x-user-id"
            )))
        );
    }

    #[test]
    fn a_claim_sticky_key_needs_verified_tokens() {
        let route = "[[routes]]\nmodel = \"r\"\nsticky = \"claim:sub\"\ntargets = [{ model = \"a\", weight = 1 }]\n";
        let found = errors(&format!("{MINIMAL}{route}"));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("routes[0].sticky: claim:sub keys on a verified JWT's claim"),
            "{found:?}"
        );
        let api_keys_only = format!(
            "{MINIMAL}[auth]\nmode = \"required\"\n[[auth.api_keys]]\nname = \"k\"\nsha256 = \"{}\"\n{route}",
            "0".repeat(64)
        );
        assert_eq!(errors(&api_keys_only).len(), 1);
        let with_jwt = format!(
            "{MINIMAL}[auth]\nmode = \"required\"\n[[auth.jwt_keys]]\nalgorithms = [\"HS256\"]\nsecret_env = \"S\"\n{route}"
        );
        assert!(Config::parse(&with_jwt).is_ok());
        let header = format!(
            "{MINIMAL}{}",
            route.replace("claim:sub", "header:x-user-id")
        );
        assert!(Config::parse(&header).is_ok());
    }

    #[test]
    fn every_error_is_reported_past_the_first_bad_key() {
        let text = r#"
            colour = "blue"
            [listen]
            http = "127.0.0.1:8000"
            [server]
            max_body_size = "64 furlongs"
            [[backends]]
            name = "a"
            http = "http://127.0.0.1:1"
            capacity = "2 parsecs"
            weight = 3
            [[backends]]
            name = "a"
            http = "http://127.0.0.1:2"
        "#;
        let found = errors(text);
        assert_eq!(found.len(), 5, "{found:#?}");
        assert!(found[0].starts_with("colour: unknown field"), "{found:#?}");
        assert!(found[0].ends_with("(line 2, column 13)"), "{found:#?}");
        assert!(
            found[1].starts_with("server.max_body_size: unknown size unit"),
            "{found:#?}"
        );
        assert!(found[1].ends_with("(line 6, column 29)"), "{found:#?}");
        assert!(
            found[2].starts_with("backends[0].capacity: unknown size unit"),
            "{found:#?}"
        );
        assert!(
            found[3].starts_with("backends[0].weight: unknown field"),
            "{found:#?}"
        );
        assert_eq!(found[4], "backends[1].name: duplicate backend name \"a\"");
    }

    #[test]
    fn a_dropped_value_is_reported_once_and_its_table_not_judged_on_defaults() {
        // A bad required value is not reported again as missing; with nothing to fall back
        // to, the collection ends there.
        let found = errors(
            r#"
            [listen]
            http = "127.0.0.1:8000"
            [[backends]]
            name = 7
            http = "http://127.0.0.1:1"
            [[backends]]
            name = "a"
            http = 7
            "#,
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with("backends[0].name: invalid type"),
            "{found:#?}"
        );

        let found = errors(
            r#"
            [listen]
            http = "127.0.0.1:8000"
            [upstream]
            connect_timeout = 5
            eject_after_failures = 0
            [[backends]]
            name = "a"
            http = "http://127.0.0.1:1"
            [[backends]]
            name = "a"
            http = "http://127.0.0.1:2"
            "#,
        );
        // A bad optional value falls back to its default: other tables are still checked
        // across keys; its own table is not (its checks would judge a value nobody wrote).
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found[0].starts_with("upstream.connect_timeout:"),
            "{found:#?}"
        );
        assert_eq!(found[1], "backends[1].name: duplicate backend name \"a\"");
    }

    #[test]
    fn bad_size_is_named_with_its_key() {
        let text = format!("{MINIMAL}capacity = \"2 parsecs\"");
        let found = errors(&text);
        assert!(found[0].starts_with("backends[0].capacity:"), "{found:?}");
        assert!(found[0].contains("unknown size unit"), "{found:?}");
    }

    #[test]
    fn every_semantic_error_is_reported() {
        let text = r#"
            [listen]
            http = "127.0.0.1:8000"
            [upstream]
            eject_after_failures = 0
            [[backends]]
            name = "a"
            http = "http://127.0.0.1:1"
            [[backends]]
            name = "a"
            http = "ftp://nowhere"
        "#;
        let found = errors(text);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(
            found
                .iter()
                .any(|e| e.starts_with("backends[1].name: duplicate"))
        );
        assert!(found.iter().any(|e| e.starts_with("backends[1].http:")));
        assert!(
            found
                .iter()
                .any(|e| e.starts_with("upstream.eject_after_failures:"))
        );
    }

    #[test]
    fn grpc_listener_needs_backend_grpc_urls() {
        let config = Config::parse(MINIMAL).unwrap();
        assert_eq!(config.server.max_grpc_message_size.bytes(), 64 << 20);
        assert!(config.listen.grpc.is_none());

        let with_listener = MINIMAL.replace(
            "http = \"127.0.0.1:8000\"",
            "http = \"127.0.0.1:8000\"\ngrpc = \"127.0.0.1:8001\"",
        );
        let found = errors(&with_listener);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("backends[0].grpc: required"),
            "{found:?}"
        );

        let found = errors(&format!("{with_listener}grpc = \"ftp://x\"\n"));
        assert!(found[0].starts_with("backends[0].grpc:"), "{found:?}");
        let config = Config::parse(&format!(
            "{with_listener}grpc = \"http://127.0.0.1:19001\"\n"
        ))
        .unwrap();
        assert_eq!(
            config.backends[0].grpc.as_deref(),
            Some("http://127.0.0.1:19001")
        );
    }

    #[test]
    fn tls_keys_parse_and_client_options_need_a_client_ca() {
        let with_tls = |extra: &str| {
            MINIMAL.replace(
                "http = \"127.0.0.1:8000\"",
                &format!(
                    "http = \"127.0.0.1:8000\"\n[listen.tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n{extra}\n"
                ),
            )
        };
        let config = Config::parse(&with_tls("")).unwrap();
        let tls = config.listen.tls.unwrap();
        assert_eq!(tls.client_auth(), ClientAuth::Required);
        assert_eq!(tls.client_identity(), ClientIdentity::Cn);

        let found = errors(&with_tls("client_auth = \"optional\""));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("listen.tls.client_auth: needs listen.tls.client_ca"));
        let found = errors(&with_tls(
            "client_ca = \"ca.pem\"\nclient_identity = \"serial\"",
        ));
        assert!(
            found[0].starts_with("listen.tls.client_identity"),
            "{found:?}"
        );
        let found = errors(&with_tls("certificate = \"x\""));
        assert!(found[0].contains("certificate"), "{found:?}");

        let config = Config::parse(&format!(
            "{MINIMAL}tls_ca = \"b.pem\"\n[upstream]\ntls_ca = \"u.pem\"\n"
        ))
        .unwrap();
        let ca = config.backends[0].tls_ca(&config.upstream);
        assert_eq!(ca, Some(Path::new("b.pem")));
    }

    #[test]
    fn accept_path_keys_have_defaults_and_zero_is_refused_by_name() {
        let config = Config::parse(MINIMAL).unwrap();
        assert_eq!(config.server.header_read_timeout.0, Duration::from_secs(30));
        assert_eq!(config.server.body_read_timeout.0, Duration::from_secs(60));
        assert_eq!(config.server.max_connections, 10_000);
        assert_eq!(config.server.shutdown_delay.0, Duration::from_secs(5));
        let cores = std::thread::available_parallelism().unwrap().get();
        assert_eq!(config.server.worker_count(), cores);
        let text = format!(
            "{MINIMAL}[server]\nheader_read_timeout = \"0s\"\nbody_read_timeout = \"0ms\"\n\
             max_connections = 0\nworkers = 0\nshutdown_delay = \"0s\"\n"
        );
        let found = errors(&text);
        let keys = [
            "server.header_read_timeout: must be greater than 0",
            "server.body_read_timeout: must be greater than 0",
            "server.max_connections: must be at least 1",
            "server.workers: must be at least 1",
        ];
        assert_eq!(found.len(), keys.len(), "{found:#?}");
        for (found, key) in found.iter().zip(keys) {
            assert!(found.starts_with(key), "{found} does not start with {key}");
        }
        let two = Config::parse(&format!("{MINIMAL}[server]\nworkers = 2\n")).unwrap();
        assert_eq!(two.server.worker_count(), 2);
    }

    #[test]
    fn the_minimum_body_rate_is_on_by_default_and_may_be_turned_off_but_not_its_grace() {
        let config = Config::parse(MINIMAL).unwrap();
        assert_eq!(config.server.min_body_rate.bytes(), 240);
        assert_eq!(config.server.min_body_rate_grace.0, Duration::from_secs(5));
        let off = format!("{MINIMAL}[server]\nmin_body_rate = 0\n");
        assert_eq!(Config::parse(&off).unwrap().server.min_body_rate.bytes(), 0);
        let text =
            format!("{MINIMAL}[server]\nmin_body_rate = \"1KiB\"\nmin_body_rate_grace = \"0s\"\n");
        let found = errors(&text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("server.min_body_rate_grace: must be greater than 0"),
            "{found:?}"
        );
    }

    #[test]
    fn health_thresholds_default_like_envoys_and_zero_is_refused_by_name() {
        let config = Config::parse(MINIMAL).unwrap();
        assert_eq!(config.upstream.unhealthy_threshold, 3);
        assert_eq!(config.upstream.healthy_threshold, 2);
        let text = format!("{MINIMAL}[upstream]\nunhealthy_threshold = 0\nhealthy_threshold = 0\n");
        let found = errors(&text);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("upstream.unhealthy_threshold: must be at least 1"));
        assert!(found[1].starts_with("upstream.healthy_threshold: must be at least 1"));
    }

    #[test]
    fn server_name_overrides_the_reported_name_and_is_not_empty() {
        assert_eq!(Config::parse(MINIMAL).unwrap().server.name, None);
        let with = |value: &str| format!("{MINIMAL}[server]\nname = \"{value}\"\n");
        let config = Config::parse(&with("serving")).unwrap();
        assert_eq!(config.server.name.as_deref(), Some("serving"));
        let found = errors(&with(""));
        assert!(
            found[0].starts_with("server.name: must not be empty"),
            "{found:?}"
        );
    }

    #[test]
    fn reconcile_interval_is_a_duration_above_zero() {
        let config = Config::parse(MINIMAL).unwrap();
        assert_eq!(
            config.placement.reconcile_interval.0,
            Duration::from_secs(10)
        );
        let with =
            |value: &str| format!("{MINIMAL}[placement]\nreconcile_interval = \"{value}\"\n");
        let config = Config::parse(&with("2.5s")).unwrap();
        assert_eq!(
            config.placement.reconcile_interval.0,
            Duration::from_millis(2500)
        );
        let found = errors(&with("0s"));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("placement.reconcile_interval: must be greater than 0"),
            "{found:?}"
        );
        let found = errors(&with("soon"));
        assert!(
            found[0].starts_with("placement.reconcile_interval"),
            "{found:?}"
        );
    }

    #[test]
    fn bad_address_is_named() {
        let found = errors(&MINIMAL.replace("127.0.0.1:8000", "localhost-ish"));
        assert!(found[0].starts_with("listen.http:"), "{found:?}");
    }
}
