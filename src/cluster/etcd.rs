//! The etcd connection: options from `[cluster]`, the client (`client`, over our own stubs
//! of etcd's v3 API), and one way to make a round trip (timed into
//! `infergate_cluster_etcd_duration_seconds`, bounded by a deadline).
//!
//! The channel under the client is ours too (`EtcdChannel`, over the gateway's rustls
//! connector, so `[cluster.tls]` needs no second TLS stack): it reconnects by itself, and a
//! call made while no endpoint is up waits for one rather than failing: every call goes
//! through `call`, whose deadline turns that wait into an error, so the session notices etcd
//! is gone.

mod client;

pub use client::pb::etcdserverpb::{
    Compare, RequestOp, ResponseOp, TxnRequest, WatchResponse, response_op,
};
pub use client::pb::mvccpb::{Event, KeyValue, event::EventType};
pub use client::{Client, KeepAlive, Watch};

use crate::config;
use crate::telemetry;
use crate::tls::HttpsConnector;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// Longest wait for one round trip before etcd counts as unreachable.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The connector to `[cluster]`'s endpoints, plain or with `[cluster.tls]` (whose files are
/// read here, once, so a file that does not load stops the gateway at start).
pub fn connector(cluster: &config::Cluster) -> Result<HttpsConnector, String> {
    crate::tls::etcd_connector(cluster.tls.as_ref(), CALL_TIMEOUT).map_err(|e| e.to_string())
}

/// The channel over `connector` to `[cluster]`'s endpoints; connects lazily (but needs the
/// runtime, which its workers are spawned on). One per replica, so which endpoint is up is
/// remembered from one session to the next.
pub fn channel(
    cluster: &config::Cluster,
    connector: &HttpsConnector,
) -> Result<EtcdChannel, String> {
    EtcdChannel::over(&cluster.etcd, connector)
}

/// A client over `channel` with `[cluster]`'s credentials. Authenticating with a user is
/// the one round trip made here.
pub async fn connect(cluster: &config::Cluster, channel: &EtcdChannel) -> Result<Client, String> {
    let mut user = None;
    if let (Some(name), Some(env)) = (&cluster.username, &cluster.password_env) {
        let password = std::env::var(env).map_err(|_| {
            format!("cluster.password_env: the environment variable {env} is not set")
        })?;
        user = Some((name.clone(), password));
    }
    tokio::time::timeout(CALL_TIMEOUT, Client::connect(channel, user))
        .await
        .map_err(|_| "etcd did not answer the connection within 2s".to_string())?
        .map_err(|e| format!("cannot connect to etcd: {e}"))
}

type EtcdRequest = http::Request<tonic::body::Body>;
type EtcdResponse = http::Response<tonic::body::Body>;

/// The etcd endpoints as one channel: calls go to one endpoint until a call there fails at
/// the transport (refused, reset, keep-alive unanswered), then to the next, as etcd's own
/// clients pin an endpoint. The TLS under it is the gateway's rustls connector.
#[derive(Clone)]
pub struct EtcdChannel {
    /// One lazily connecting channel per endpoint (each clone holds its own handles, so the
    /// one polled ready is the one called).
    channels: Vec<Channel>,
    /// The endpoint calls go to, shared by every clone.
    current: Arc<AtomicUsize>,
    /// The endpoint `poll_ready` readied, for the `call` after it.
    picked: usize,
}

impl EtcdChannel {
    fn over(endpoints: &[String], connector: &HttpsConnector) -> Result<EtcdChannel, String> {
        let channels = endpoints
            .iter()
            .map(|url| {
                let endpoint = Endpoint::from_shared(url.clone())
                    .map_err(|e| format!("cluster.etcd: {url:?}: {e}"))?
                    .connect_timeout(CALL_TIMEOUT)
                    .tcp_nodelay(true)
                    // HTTP/2 pings find an etcd that stopped answering without closing the
                    // connection; no per-request timeout: a follower's campaign waits, by
                    // design, until it is elected, and every other call is bounded by `call`.
                    .http2_keep_alive_interval(Duration::from_secs(2))
                    .keep_alive_timeout(CALL_TIMEOUT)
                    .keep_alive_while_idle(true);
                Ok(endpoint.connect_with_connector_lazy(connector.clone()))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            channels,
            current: Arc::new(AtomicUsize::new(0)),
            picked: 0,
        })
    }
}

// The error stays tonic's own (not boxed): the generated clients' futures are then `Send`.
impl tower::Service<EtcdRequest> for EtcdChannel {
    type Response = EtcdResponse;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<EtcdResponse, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.picked = self.current.load(Ordering::Relaxed) % self.channels.len();
        self.channels[self.picked].poll_ready(cx)
    }

    fn call(&mut self, request: EtcdRequest) -> Self::Future {
        let (picked, count, current) = (self.picked, self.channels.len(), self.current.clone());
        let answer = self.channels[picked].call(request);
        Box::pin(async move {
            answer.await.inspect_err(|_| {
                // Move on, unless another call already did.
                let _ = current.compare_exchange(
                    picked,
                    (picked + 1) % count,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            })
        })
    }
}

/// One round trip named `op`: timed, and an error once `CALL_TIMEOUT` passes.
pub async fn call<T>(
    op: &'static str,
    replica: &str,
    rpc: impl Future<Output = Result<T, tonic::Status>>,
) -> Result<T, String> {
    call_until(op, replica, Instant::now() + CALL_TIMEOUT, rpc).await
}

/// `call`, given until `until` to answer: a lease's renewal may wait as long as the lease
/// is not at risk, so one slow answer on a busy machine is not an outage.
pub async fn call_until<T>(
    op: &'static str,
    replica: &str,
    until: Instant,
    rpc: impl Future<Output = Result<T, tonic::Status>>,
) -> Result<T, String> {
    let started = Instant::now();
    let outcome = tokio::time::timeout_at(until.into(), rpc).await;
    metrics::histogram!(telemetry::CLUSTER_ETCD_DURATION, "op" => op, "replica" => replica.to_string())
        .record(started.elapsed().as_secs_f64());
    match outcome {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(format!("etcd {op} failed: {error}")),
        Err(_) => Err(format!(
            "etcd {op} did not answer within {:?}",
            until.saturating_duration_since(started)
        )),
    }
}
