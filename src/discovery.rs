//! The pool follows its Tritons: each DNS group (`backends[].dns`, a Kubernetes headless
//! Service) is resolved every `upstream.discovery_interval`. An address that appears joins
//! the pool empty (it takes traffic after its first good health check); one that vanishes is
//! drained as a reload drains a removed backend: no new requests, requests on it finish,
//! placement forgets its copies and, with `[cluster]`, the registry does too.
//!
//! An answer with no addresses (NXDOMAIN, or a name with no A/AAAA records: a Service scaled
//! to zero) empties the group; a failed lookup (timeout, SERVFAIL, no server) keeps the last
//! addresses, so a DNS outage never empties a working pool.

use crate::config::{Config, Discovered, Upstream};
use crate::telemetry;
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Time one group's lookup may take before the round counts it as failed.
const LOOKUP_LIMIT: Duration = Duration::from_secs(5);

/// What one group's lookup found: its addresses, or why DNS did not answer.
pub struct Answer {
    name: String,
    dns: String,
    addresses: Result<BTreeSet<IpAddr>, String>,
}

/// The resolver and what it last found, shared by the discovery rounds and reloads (which
/// turn a config's groups into instances with it); `reload::discover` applies a round.
pub struct Discovery {
    resolver: Result<TokioResolver, String>,
    found: Mutex<Discovered>,
    /// Wakes the loop before its interval: a reload may have added a group.
    wake: Notify,
    interval: Duration,
}

impl Discovery {
    /// A resolver as `upstream` says (`dns_server`, or the system's). A system without a
    /// DNS configuration fails only the groups' lookups, each round, by name.
    pub fn new(upstream: &Upstream) -> Self {
        Self {
            resolver: resolver(upstream.dns_server),
            found: Mutex::default(),
            wake: Notify::new(),
            interval: upstream.discovery_interval.0,
        }
    }

    /// The addresses each group resolved to last.
    pub fn found(&self) -> Discovered {
        self.found.lock().expect("discovery lock").clone()
    }

    /// Asks for a round now (a reload changed the groups).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Looks up every group of `config` at once: each group's name, its DNS name, and what
    /// DNS answered.
    pub async fn lookup_groups(&self, config: &Config) -> Vec<Answer> {
        let groups: Vec<(String, String)> = (config.dns_groups())
            .map(|g| (g.name.clone(), g.dns.clone().unwrap_or_default()))
            .collect();
        let lookups = groups.into_iter().map(|(name, dns)| async move {
            let addresses = self.lookup(&dns).await;
            Answer {
                name,
                dns,
                addresses,
            }
        });
        futures_util::future::join_all(lookups).await
    }

    /// What was found before `answers`, and after them for the groups `config` has now: an
    /// answer replaces its group's addresses; a failed lookup keeps them (counted, logged);
    /// an answer for a group a reload changed or dropped meanwhile is left out.
    pub fn answered(&self, config: &Config, answers: Vec<Answer>) -> (Discovered, Discovered) {
        let before = self.found();
        let mut after = before.clone();
        after.retain(|name, _| config.dns_groups().any(|g| &g.name == name));
        for Answer {
            name,
            dns,
            addresses,
        } in answers
        {
            if !config
                .dns_groups()
                .any(|g| g.name == name && g.dns.as_deref() == Some(&dns))
            {
                continue;
            }
            match addresses {
                Ok(addresses) => {
                    metrics::gauge!(telemetry::DISCOVERED_BACKENDS, "group" => name.clone())
                        .set(addresses.len() as f64);
                    after.insert(name, addresses);
                }
                Err(error) => {
                    metrics::counter!(telemetry::DISCOVERY_FAILURES, "group" => name.clone())
                        .increment(1);
                    tracing::warn!(
                        group = name,
                        dns,
                        error,
                        "DNS discovery failed; the group keeps its last instances"
                    );
                }
            }
        }
        (before, after)
    }

    /// Keeps what a round found, once the pool has taken it.
    pub fn keep(&self, found: Discovered) {
        *self.found.lock().expect("discovery lock") = found;
    }

    /// Waits for the next round: `upstream.discovery_interval`, or a wake. False once
    /// `shutdown` is cancelled.
    pub async fn next_round(&self, shutdown: &CancellationToken) -> bool {
        tokio::select! {
            _ = shutdown.cancelled() => false,
            _ = tokio::time::sleep(self.interval) => true,
            _ = self.wake.notified() => true,
        }
    }

    /// One name's addresses: empty when DNS says there are none, an error when it did not
    /// answer.
    async fn lookup(&self, name: &str) -> Result<BTreeSet<IpAddr>, String> {
        let resolver = self.resolver.as_ref().map_err(Clone::clone)?;
        match tokio::time::timeout(LOOKUP_LIMIT, resolver.lookup_ip(name)).await {
            Err(_) => Err(format!("no answer within {}s", LOOKUP_LIMIT.as_secs())),
            Ok(Ok(answer)) => Ok(answer.iter().collect()),
            Ok(Err(e)) if e.is_no_records_found() => Ok(BTreeSet::new()),
            Ok(Err(e)) => Err(e.to_string()),
        }
    }
}

/// A resolver that asks every round: nothing is cached, A and AAAA both.
fn resolver(server: Option<std::net::SocketAddr>) -> Result<TokioResolver, String> {
    let mut builder = match server {
        Some(server) => {
            let mut name_server = NameServerConfig::udp_and_tcp(server.ip());
            for connection in &mut name_server.connections {
                connection.port = server.port();
            }
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(vec![name_server]),
                TokioRuntimeProvider::default(),
            )
        }
        None => TokioResolver::builder_tokio()
            .map_err(|e| format!("cannot read the system's DNS configuration: {e}"))?,
    };
    let options = builder.options_mut();
    options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    options.cache_size = 0;
    options.positive_max_ttl = Some(Duration::ZERO);
    options.negative_max_ttl = Some(Duration::ZERO);
    options.timeout = Duration::from_secs(2);
    options.attempts = 2;
    builder
        .build()
        .map_err(|e| format!("cannot build a DNS resolver: {e}"))
}
