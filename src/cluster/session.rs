//! The session loop: register on a lease, read the registry, campaign, then keep the lease
//! alive and the view current until etcd fails; then degraded, back off, and start over.
//!
//! A session reuses the previous lease when etcd still holds it (etcd renews leases when
//! it restarts, so after a short outage the records are still there); otherwise it grants a
//! new one and writes the records again.

use super::Cluster;
use super::Host;
use super::etcd::{
    self, Client, Compare, Event, EventType, KeyValue, RequestOp, TxnRequest, call, response_op,
};
use super::shared::Shared;
use super::view::{self, Change, Entry, ReplicaRecord};
use crate::telemetry;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// First pause after a failed session; doubles up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often shared state is published and applied (trips, sizes, the replica count).
const SYNC_INTERVAL: Duration = Duration::from_millis(250);

impl Cluster {
    /// Runs sessions until shutdown; then revokes the lease, so this replica's records go at
    /// once instead of after `lease_ttl`.
    pub async fn run(self: Arc<Self>, gateway: impl Host, shutdown: CancellationToken) {
        let _ = self.placement.set(gateway.placement().clone());
        if let Some(settles) = self.settles_rx.lock().expect("settles").take() {
            tokio::spawn(self.clone().settle_loop(settles, shutdown.clone()));
        }
        let channel = match etcd::channel(&self.config, &self.connector) {
            Ok(channel) => channel,
            Err(reason) => return self.set_degraded(Some(reason)),
        };
        let mut shared = Shared::default();
        let mut backoff = FIRST_BACKOFF;
        let mut client = None;
        loop {
            if client.is_none() {
                match etcd::connect(&self.config, &channel).await {
                    Ok(connected) => client = Some(connected),
                    Err(reason) => self.set_degraded(Some(reason)),
                }
            }
            if let Some(client) = &mut client {
                let ended = self.session(client, &gateway, &mut shared, &shutdown).await;
                match ended {
                    Ok(()) => {
                        self.revoke(client).await;
                        return;
                    }
                    Err(reason) => {
                        self.set_degraded(Some(reason));
                        backoff = FIRST_BACKOFF.max(backoff);
                    }
                }
            }
            // While degraded, shared state still follows the last view (a reload may have
            // brought a route back that a known trip switches off).
            shared.apply(&self, &gateway);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// One session; `Ok` on shutdown, else why it ended.
    async fn session(
        &self,
        client: &mut Client,
        gateway: &impl Host,
        shared: &mut Shared,
        shutdown: &CancellationToken,
    ) -> Result<(), String> {
        let lease = self.lease_for_session(client).await?;
        self.register(client, lease).await?;
        let me = self.replica().to_string();
        let mut keeper = call("keep_alive", &me, client.keep_alive(lease)).await?;
        let prefix = self.view().key("");
        let read = call("get", &me, client.get_prefix(prefix.clone())).await?;
        let revision = read.header.map_or(0, |h| h.revision);
        self.view().reset(
            read.kvs
                .iter()
                .map(|kv| (String::from_utf8_lossy(&kv.key).into_owned(), entry(kv))),
            revision,
        );
        *self.client.lock().expect("cluster client") = Some(client.clone());
        let placement = gateway.placement();
        self.resync(placement);
        let mut marks_sent = None;
        let mut orphans = std::collections::HashMap::new();
        let mut watch = call("watch", &me, client.watch_prefix(prefix, revision + 1)).await?;
        let election = self.view().key(view::ELECTION);
        let mut campaign = Some(Abort(tokio::spawn({
            let mut client = client.clone();
            let me = me.clone();
            async move { client.campaign(election, me, lease).await }
        })));
        self.set_degraded(None);
        shared.apply(self, gateway);
        let ttl = Duration::from_secs(self.config.lease_seconds() as u64);
        // Renewed four times a lease; a renewal may take until a quarter of the lease is
        // left since the last one etcd confirmed: one late answer (a busy machine, etcd
        // paused a moment) is not an outage, and the replica degrades only when the lease
        // is really at risk.
        let mut keep_alive = tokio::time::interval((ttl / 4).max(Duration::from_millis(250)));
        let mut renewed = std::time::Instant::now();
        let mut sync = tokio::time::interval(SYNC_INTERVAL);
        let own_record = self.view().key(&format!("{}{me}", view::REPLICAS));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = keep_alive.tick() => {
                    let sent = std::time::Instant::now();
                    let at_risk = renewed + ttl * 3 / 4;
                    let answer = etcd::call_until("keep_alive", &me, at_risk, keeper.renew()).await?;
                    renewed = sent;
                    if answer.ttl <= 0 {
                        return Err(format!("lease {lease:x} expired"));
                    }
                    let current = answer.header.map_or(0, |h| h.revision);
                    let lag = (current - self.view().revision()).max(0);
                    self.gauge(telemetry::CLUSTER_WATCH_LAG).set(lag as f64);
                    // Ask for a progress notice, so a quiet prefix still moves the view's
                    // revision up to etcd's and the lag reads true.
                    watch.request_progress().await.map_err(|e| format!("etcd watch failed: {e}"))?;
                }
                message = watch.message() => {
                    let answer = message
                        .map_err(|e| format!("etcd watch failed: {e}"))?
                        .ok_or("etcd ended the watch")?;
                    if answer.canceled {
                        return Err(format!("etcd cancelled the watch: {}", answer.cancel_reason));
                    }
                    let revision = answer.header.map_or(0, |h| h.revision);
                    let changes: Vec<Change> = answer.events.iter().filter_map(change).collect();
                    if changes.iter().any(|c| matches!(c, Change::Delete(key) if *key == own_record)) {
                        return Err("this replica's record was deleted".into());
                    }
                    self.view().apply(changes.iter().cloned(), revision);
                    self.mirror_changes(placement, &changes, revision);
                }
                elected = async { (&mut campaign.as_mut().expect("campaigning").0).await }, if campaign.is_some() => {
                    campaign = None;
                    match elected {
                        Ok(Ok(_)) => tracing::info!(replica = %me, "elected leader of the pool's housekeeping"),
                        Ok(Err(error)) => return Err(format!("etcd election failed: {error}")),
                        Err(error) => return Err(format!("election task failed: {error}")),
                    }
                }
                _ = sync.tick() => {
                    let published = match shared.publish(self, gateway, client).await {
                        Ok(()) => {
                            shared.apply(self, gateway);
                            self.publish_marks(placement, client, lease, &mut marks_sent).await
                        }
                        Err(reason) => Err(reason),
                    };
                    match published {
                        Ok(()) => self.finish_orphans(placement, &mut orphans),
                        // What was not published goes on the next tick, while the lease is safe.
                        Err(reason) if renewed.elapsed() < ttl * 3 / 4 => {
                            tracing::info!(replica = %me, %reason, "etcd was slow to take shared state; publishing again");
                        }
                        Err(reason) => return Err(reason),
                    }
                }
            }
        }
    }

    /// The previous lease when etcd still holds it, else a new one.
    async fn lease_for_session(&self, client: &mut Client) -> Result<i64, String> {
        let me = self.replica().to_string();
        let previous = self.lease.load(Ordering::Relaxed);
        if previous != 0 {
            let ttl = call("time_to_live", &me, client.time_to_live(previous)).await?;
            if ttl > 0 {
                return Ok(previous);
            }
        }
        let granted = call("grant", &me, client.grant(self.config.lease_seconds())).await?;
        self.lease.store(granted, Ordering::Relaxed);
        Ok(granted)
    }

    /// Writes this replica's record on its lease, unless another live replica holds the
    /// name (two replicas configured with one `cluster.replica`): that is refused, counted
    /// as a conflict, and the session tried again later.
    async fn register(&self, client: &mut Client, lease: i64) -> Result<(), String> {
        let me = self.replica().to_string();
        let key = self.view().key(&format!("{}{me}", view::REPLICAS));
        let record = ReplicaRecord {
            name: me.clone(),
            started_at_unix: self.started_at_unix,
            version: crate::protocol::SERVER_VERSION.to_string(),
        };
        let value = serde_json::to_vec(&record).expect("a record serializes");
        let txn = TxnRequest {
            compare: vec![Compare::absent(key.clone())],
            success: vec![RequestOp::put(key.clone(), value, lease)],
            failure: vec![RequestOp::get(key.clone())],
        };
        let answer = call("txn", &me, client.txn(txn)).await?;
        if answer.succeeded {
            return Ok(());
        }
        let holder = answer.responses.into_iter().find_map(|op| {
            let response_op::Response::ResponseRange(got) = op.response?;
            got.kvs.first().map(|kv| kv.lease)
        });
        if holder == Some(lease) {
            return Ok(());
        }
        metrics::counter!(telemetry::CLUSTER_CONFLICTS, "key" => "replica", "replica" => me.clone())
            .increment(1);
        Err(format!(
            "another live replica holds {key}: is cluster.replica {me:?} configured twice?"
        ))
    }

    /// Ends this replica's lease, taking its record and candidacy with it.
    async fn revoke(&self, client: &mut Client) {
        let lease = self.lease.swap(0, Ordering::Relaxed);
        if lease != 0
            && let Err(reason) = call("revoke", self.replica(), client.revoke(lease)).await
        {
            tracing::warn!(%reason, "could not revoke the cluster lease; the record goes after lease_ttl");
        }
    }
}

fn entry(kv: &KeyValue) -> Entry {
    Entry {
        value: kv.value.clone(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        lease: kv.lease,
    }
}

fn change(event: &Event) -> Option<Change> {
    let kv = event.kv.as_ref()?;
    let key = String::from_utf8_lossy(&kv.key).into_owned();
    Some(match event.r#type() {
        EventType::Put => Change::Put(key, entry(kv)),
        EventType::Delete => Change::Delete(key),
    })
}

/// A task aborted when dropped: a session's campaign ends with the session.
struct Abort<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Abort<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
