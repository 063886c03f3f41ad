//! `[cluster]`: several gateway replicas share one registry in etcd. Without the table the
//! gateway is one process with its books in memory, and no etcd code runs.

use super::{ConfigError, HumanDuration};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// etcd's smallest lease: a shorter TTL is raised to this by the server, so it is refused
/// here rather than silently lengthened.
const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// Where the registry lives and who this replica is in it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    /// etcd v3 endpoints (`http://host:port`, or `https://` with `[cluster.tls]`).
    pub etcd: Vec<String>,
    /// Every key lives under it: two pools never share a prefix.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// This replica's name in the registry; default: the host name.
    #[serde(default = "host_name")]
    pub replica: String,
    /// A dead replica's records vanish this long after its last keep-alive.
    #[serde(default = "default_lease_ttl")]
    pub lease_ttl: HumanDuration,
    /// etcd user (etcd's own authentication); needs `password_env`.
    pub username: Option<String>,
    /// Environment variable holding the etcd user's password (never the password itself,
    /// as `auth.jwt_keys[].secret_env` keeps secrets out of the file).
    pub password_env: Option<String>,
    /// TLS to etcd, as `[listen.tls]` names its files.
    pub tls: Option<ClusterTls>,
}

/// TLS to etcd: the CA that signs etcd's certificate, and optionally this replica's client
/// certificate for etcd's `--client-cert-auth`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterTls {
    /// PEM bundle of the CAs that sign etcd's server certificate.
    pub ca: PathBuf,
    /// PEM client certificate chain, leaf first (with `key`).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

fn default_prefix() -> String {
    "/infergate/default".into()
}

fn default_lease_ttl() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

/// The kernel's host name (what `hostname` prints; a Kubernetes pod's name).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "infergate".into())
}

impl Cluster {
    /// The lease TTL in whole seconds, as etcd grants leases (rounded up).
    pub fn lease_seconds(&self) -> i64 {
        let ttl = self.lease_ttl.0;
        (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)) as i64
    }

    /// Checks what serde cannot; every error names its key.
    pub(super) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let mut error = |key: &str, message: String| {
            errors.push(ConfigError {
                key: format!("cluster.{key}"),
                message,
            })
        };
        if self.etcd.is_empty() {
            error("etcd", "at least one etcd endpoint is required".into());
        }
        for (i, url) in self.etcd.iter().enumerate() {
            match url.split_once("://") {
                Some(("http", rest)) | Some(("https", rest))
                    if !rest.is_empty() && !rest.contains('/') => {}
                _ => error(
                    &format!("etcd[{i}]"),
                    format!(
                        "{url:?} is not an etcd endpoint: write http://host:port or https://host:port"
                    ),
                ),
            }
            if url.starts_with("https://") && self.tls.is_none() {
                error(
                    &format!("etcd[{i}]"),
                    "an https:// endpoint needs [cluster.tls] (ca: the CAs that sign etcd's certificate)".into(),
                );
            }
        }
        if !self.prefix.starts_with('/') || self.prefix.ends_with('/') || self.prefix.len() < 2 {
            error(
                "prefix",
                format!(
                    "{:?} must start with '/' and not end with one, e.g. \"/infergate/default\"",
                    self.prefix
                ),
            );
        }
        if self.replica.is_empty() || self.replica.contains('/') {
            error(
                "replica",
                format!(
                    "{:?} must be a non-empty name without '/' (it is a key in the registry)",
                    self.replica
                ),
            );
        }
        if self.lease_ttl.0 < MIN_LEASE_TTL {
            error(
                "lease_ttl",
                format!("{} is below etcd's smallest lease of 2s", self.lease_ttl),
            );
        }
        if self.username.is_some() != self.password_env.is_some() {
            error(
                if self.username.is_some() {
                    "password_env"
                } else {
                    "username"
                },
                "username and password_env go together (etcd's user and the environment variable holding its password)".into(),
            );
        }
        if let Some(tls) = &self.tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            error(
                if tls.cert.is_some() {
                    "tls.key"
                } else {
                    "tls.cert"
                },
                "cert and key go together (the client certificate etcd verifies)".into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(cluster: &str) -> Result<Config, String> {
        Config::parse(&format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\n[[backends]]\nname = \"b\"\nhttp = \"http://127.0.0.1:1\"\n[cluster]\n{cluster}"
        ))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_issue_table_parses_with_its_defaults() {
        let config = parse("etcd = [\"http://127.0.0.1:2379\"]").unwrap();
        let cluster = config.cluster.unwrap();
        assert_eq!(cluster.prefix, "/infergate/default");
        assert_eq!(cluster.lease_seconds(), 10);
        assert!(!cluster.replica.is_empty());
        let config = parse(
            "etcd = [\"http://127.0.0.1:2379\"]\nprefix = \"/p\"\nreplica = \"gw-0\"\nlease_ttl = \"2500ms\"",
        )
        .unwrap();
        let cluster = config.cluster.unwrap();
        assert_eq!(
            (cluster.replica.as_str(), cluster.lease_seconds()),
            ("gw-0", 3)
        );
    }

    #[test]
    fn every_bad_key_is_named() {
        let errors = parse(
            "etcd = [\"127.0.0.1:2379\", \"https://e:2379\"]\nprefix = \"p/\"\nreplica = \"a/b\"\nlease_ttl = \"1s\"\nusername = \"u\"\n[cluster.tls]\nca = \"/ca.pem\"\ncert = \"/c.pem\"",
        )
        .unwrap_err();
        for key in [
            "cluster.etcd[0]",
            "cluster.prefix",
            "cluster.replica",
            "cluster.lease_ttl",
            "cluster.password_env",
            "cluster.tls.key",
        ] {
            assert!(errors.contains(&format!("{key}: ")), "{key} in {errors}");
        }
        let errors = parse("etcd = []\nleader = true").unwrap_err();
        assert!(errors.contains("leader"), "{errors}");
        let errors = parse("etcd = [\"https://e:2379\"]").unwrap_err();
        assert!(
            errors.contains("cluster.etcd[0]: an https:// endpoint needs [cluster.tls]"),
            "{errors}"
        );
    }
}
