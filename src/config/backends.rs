//! `[[backends]]`: the Triton pool as the operator describes it. An entry is one Triton at
//! fixed URLs, or a group found in DNS (a Kubernetes headless Service) whose every address
//! is one Triton. The gateway runs on instances: a fixed entry is one, a group is as many
//! as its name resolved to when last asked (`Config::instances`).

use super::{ByteSize, Config, ConfigError, grpc_endpoint};
use crate::config::BackendUrl;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Triton's own ports, the defaults of a DNS group's instances.
const TRITON_HTTP_PORT: u16 = 8000;
const TRITON_GRPC_PORT: u16 = 8001;

/// One `[[backends]]` entry: a Triton instance at fixed URLs (`http`), or a DNS group
/// (`dns`), whose addresses each become an instance named `<name>-<address>`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// Unique name, used in metrics, logs and the admin API; a group's instances are named
    /// `<name>-<address>`.
    pub name: String,
    /// Base URL of its HTTP/REST endpoint: `http://host:port`, `https://host:port` (TLS,
    /// HTTP/1.1), or `h2c://host:port` for HTTP/2 with prior knowledge. Required without
    /// `dns`.
    pub http: Option<String>,
    /// URL of its gRPC endpoint, `http://host:port` or `https://host:port`: where the gRPC
    /// front-end forwards. Required when `listen.grpc` is set.
    pub grpc: Option<String>,
    /// URL of its Prometheus metrics, re-exported under `/metrics/backends`.
    pub metrics: Option<String>,
    /// Memory the backend (each instance of a group) offers to models (used by placement).
    pub capacity: Option<ByteSize>,
    /// PEM CA bundle for this backend's `https://` URLs, instead of `upstream.tls_ca`.
    pub tls_ca: Option<PathBuf>,
    /// A DNS name whose A and AAAA records are the group's instances, re-resolved every
    /// `upstream.discovery_interval`: a headless Service such as
    /// `triton.models.svc.cluster.local`. Instances are called over plain HTTP/1.1.
    pub dns: Option<String>,
    /// A group's HTTP port on each address (default 8000, Triton's).
    pub http_port: Option<u16>,
    /// A group's gRPC port on each address (default 8001, Triton's).
    pub grpc_port: Option<u16>,
    /// A group's metrics port on each address; without it, its metrics are not re-exported.
    pub metrics_port: Option<u16>,
}

/// Between a group's name and an address in its instances' names (`triton-10.0.0.7`).
const INSTANCE_SEPARATOR: char = '-';

/// The addresses each DNS group resolved to last, by group name.
pub type Discovered = BTreeMap<String, BTreeSet<IpAddr>>;

impl Backend {
    /// The CA bundle its `https://` URLs are verified with (`None`: the system's roots).
    pub fn tls_ca<'a>(&'a self, upstream: &'a super::Upstream) -> Option<&'a Path> {
        self.tls_ca.as_deref().or(upstream.tls_ca.as_deref())
    }

    /// The group's instance at one address: its name and URLs filled in, `dns` cleared.
    pub fn instance(&self, address: IpAddr) -> Backend {
        let host = match address {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let url = |port: u16| format!("http://{host}:{port}");
        Backend {
            name: format!("{}{INSTANCE_SEPARATOR}{address}", self.name),
            http: Some(url(self.http_port.unwrap_or(TRITON_HTTP_PORT))),
            grpc: Some(url(self.grpc_port.unwrap_or(TRITON_GRPC_PORT))),
            metrics: self
                .metrics_port
                .map(|port| format!("{}/metrics", url(port))),
            capacity: self.capacity,
            tls_ca: None,
            dns: None,
            http_port: None,
            grpc_port: None,
            metrics_port: None,
        }
    }

    /// Adds the entry's problems to `errors`, keyed `backends[i].…`.
    fn check(&self, i: usize, grpc_listener: bool, errors: &mut Vec<ConfigError>) {
        let mut error = |key: &str, message: String| {
            errors.push(ConfigError {
                key: format!("backends[{i}].{key}"),
                message,
            })
        };
        match (&self.dns, &self.http) {
            (Some(_), Some(_)) => error(
                "http",
                "a dns group's instances are called at http_port on each address; leave \
                 http out, or dns for a single backend"
                    .into(),
            ),
            (None, None) => error(
                "http",
                "required: the backend's URL (http://host:port), or dns = \"<name>\" for a \
                 group found in DNS"
                    .into(),
            ),
            (None, Some(http)) => {
                if let Err(message) = BackendUrl::parse(http) {
                    error("http", message);
                }
            }
            (Some(dns), None) => {
                if dns.trim().is_empty() {
                    error("dns", "must not be empty".into());
                }
            }
        }
        if self.dns.is_some() {
            for (key, set) in [
                ("grpc", self.grpc.is_some()),
                ("metrics", self.metrics.is_some()),
                ("tls_ca", self.tls_ca.is_some()),
            ] {
                if set {
                    error(
                        key,
                        "a dns group's instances are called over plain http at each address; \
                         use grpc_port and metrics_port"
                            .into(),
                    );
                }
            }
            return;
        }
        for (key, set) in [
            ("http_port", self.http_port.is_some()),
            ("grpc_port", self.grpc_port.is_some()),
            ("metrics_port", self.metrics_port.is_some()),
        ] {
            if set {
                error(key, "only for a dns group; put the port in the URL".into());
            }
        }
        if let Some(metrics) = &self.metrics
            && let Err(message) = BackendUrl::parse(metrics)
        {
            error("metrics", message);
        }
        match &self.grpc {
            Some(url) => {
                if let Err(message) = grpc_endpoint(url) {
                    error("grpc", message);
                }
            }
            None if grpc_listener => error(
                "grpc",
                "required when listen.grpc is set: the gRPC front-end forwards to each \
                 backend's gRPC endpoint (http://host:port)"
                    .into(),
            ),
            None => {}
        }
    }
}

impl Config {
    /// The instances the gateway runs on: each fixed entry, and each group's addresses as
    /// `discovered` last found them (none before its first answer).
    pub fn instances(&self, discovered: &Discovered) -> Vec<Backend> {
        let mut instances = Vec::new();
        for backend in &self.backends {
            if backend.dns.is_none() {
                instances.push(backend.clone());
            } else if let Some(addresses) = discovered.get(&backend.name) {
                instances.extend(addresses.iter().map(|a| backend.instance(*a)));
            }
        }
        instances
    }

    /// The config key (`backends[i]`) of the entry an instance comes from, to name it in an
    /// error: a fixed backend by its name, a group's instance by the group's.
    pub fn key_of_instance(&self, instance: &str) -> String {
        let from = |backend: &Backend| match &backend.dns {
            None => instance == backend.name,
            Some(_) => instance
                .strip_prefix(backend.name.as_str())
                .is_some_and(|rest| rest.starts_with(INSTANCE_SEPARATOR)),
        };
        match self.backends.iter().position(from) {
            Some(i) => format!("backends[{i}]"),
            None => "backends".into(),
        }
    }

    /// The DNS groups, by entry.
    pub fn dns_groups(&self) -> impl Iterator<Item = &Backend> {
        self.backends.iter().filter(|b| b.dns.is_some())
    }

    /// The `[[backends]]` entries' problems: at least one, unique names, each one's keys.
    pub(super) fn check_backends(&self, errors: &mut Vec<ConfigError>) {
        if self.backends.is_empty() {
            errors.push(ConfigError {
                key: "backends".into(),
                message: "at least one [[backends]] entry is required".into(),
            });
        }
        let mut names = HashSet::new();
        for (i, backend) in self.backends.iter().enumerate() {
            let message = if backend.name.trim().is_empty() {
                Some("must not be empty".to_string())
            } else if !names.insert(backend.name.as_str()) {
                Some(format!("duplicate backend name {:?}", backend.name))
            } else {
                None
            };
            if let Some(message) = message {
                errors.push(ConfigError {
                    key: format!("backends[{i}].name"),
                    message,
                });
            }
            backend.check(i, self.listen.grpc.is_some(), errors);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GROUP: &str = r#"
        [listen]
        http = "127.0.0.1:0"
        grpc = "127.0.0.1:0"
        [[backends]]
        name = "fixed"
        http = "http://10.0.0.1:8000"
        grpc = "http://10.0.0.1:8001"
        [[backends]]
        name = "triton"
        dns = "triton.models.svc.cluster.local"
        metrics_port = 8002
        capacity = "2GiB"
    "#;

    #[test]
    fn a_group_has_one_instance_per_address_at_tritons_ports() {
        let config = Config::parse(GROUP).unwrap();
        assert!(config.instances(&Discovered::new()).len() == 1);
        let found = Discovered::from([(
            "triton".to_string(),
            BTreeSet::from(["10.0.0.7".parse().unwrap(), "fd00::7".parse().unwrap()]),
        )]);
        let instances = config.instances(&found);
        let names: Vec<&str> = instances.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["fixed", "triton-10.0.0.7", "triton-fd00::7"]);
        let v6 = &instances[2];
        assert_eq!(v6.http.as_deref(), Some("http://[fd00::7]:8000"));
        assert_eq!(v6.grpc.as_deref(), Some("http://[fd00::7]:8001"));
        assert_eq!(v6.metrics.as_deref(), Some("http://[fd00::7]:8002/metrics"));
        assert_eq!(v6.capacity, Some(ByteSize(2 << 30)));
        assert!(BackendUrl::parse(v6.http.as_deref().unwrap()).is_ok());
        assert!(grpc_endpoint(v6.grpc.as_deref().unwrap()).is_ok());
        assert_eq!(config.key_of_instance("triton-fd00::7"), "backends[1]");
        assert_eq!(config.key_of_instance("fixed"), "backends[0]");
    }

    #[test]
    fn a_group_is_described_by_ports_and_a_fixed_backend_by_urls() {
        let errors = |text: &str| match Config::parse(text) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        };
        let both = GROUP.replace("metrics_port = 8002", "http = \"http://x:1\"");
        assert!(errors(&both)[0].starts_with("backends[1].http: a dns group"));
        let port = GROUP.replace(
            "grpc = \"http://10.0.0.1:8001\"",
            "grpc = \"http://10.0.0.1:8001\"\nhttp_port = 1",
        );
        assert!(errors(&port)[0].starts_with("backends[0].http_port: only for a dns group"));
        let neither = GROUP.replace("dns = \"triton.models.svc.cluster.local\"", "");
        assert!(errors(&neither)[0].starts_with("backends[1].http: required"));
        let url = GROUP.replace("metrics_port = 8002", "metrics = \"http://x:2\"");
        assert!(errors(&url)[0].starts_with("backends[1].metrics: a dns group"));
    }
}
