//! The etcd connection: options from `[cluster]`, and one way to make a round trip (timed
//! into `infergate_cluster_etcd_duration_seconds`, bounded by a deadline).
//!
//! etcd-client balances over the endpoints and reconnects by itself, and a call made while
//! no endpoint is up waits for one rather than failing: every call goes through `call`,
//! whose deadline turns that wait into an error, so the session notices etcd is gone.

use crate::config;
use crate::telemetry;
use std::future::Future;
use std::time::{Duration, Instant};

/// Longest wait for one round trip before etcd counts as unreachable.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Connects (lazily: no endpoint need be up yet) with `[cluster]`'s TLS and credentials.
pub async fn connect(cluster: &config::Cluster) -> Result<etcd_client::Client, String> {
    // No per-request timeout on the client: a follower's campaign waits, by design, until
    // it is elected; every other call is bounded by `call`.
    let mut options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(CALL_TIMEOUT)
        // HTTP/2 pings find an etcd that stopped answering without closing the connection.
        .with_keep_alive(Duration::from_secs(2), CALL_TIMEOUT)
        .with_keep_alive_while_idle(true);
    if let (Some(user), Some(env)) = (&cluster.username, &cluster.password_env) {
        let password = std::env::var(env).map_err(|_| {
            format!("cluster.password_env: the environment variable {env} is not set")
        })?;
        options = options.with_user(user, password);
    }
    let endpoints = cluster.etcd.clone();
    tokio::time::timeout(
        CALL_TIMEOUT,
        etcd_client::Client::connect(endpoints, Some(options)),
    )
    .await
    .map_err(|_| "etcd did not answer the connection within 2s".to_string())?
    .map_err(|e| format!("cannot connect to etcd: {e}"))
}

/// One round trip named `op`: timed, and an error once `CALL_TIMEOUT` passes.
pub async fn call<T>(
    op: &'static str,
    replica: &str,
    rpc: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    let started = Instant::now();
    let outcome = tokio::time::timeout(CALL_TIMEOUT, rpc).await;
    metrics::histogram!(telemetry::CLUSTER_ETCD_DURATION, "op" => op, "replica" => replica.to_string())
        .record(started.elapsed().as_secs_f64());
    match outcome {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(format!("etcd {op} failed: {error}")),
        Err(_) => Err(format!("etcd {op} did not answer within {CALL_TIMEOUT:?}")),
    }
}
