//! The session loop: register on a lease, read the registry, campaign, then keep the lease
//! alive and the view current until etcd fails; then degraded, back off, and start over.
//!
//! A session reuses the previous lease when etcd still holds it (etcd renews leases when
//! it restarts, so after a short outage the records are still there); otherwise it grants a
//! new one and writes the records again.

use super::Cluster;
use super::Host;
use super::etcd::{
    self, Client, Compare, Event, EventType, KeepAlive, KeyValue, RequestOp, TxnRequest, Watch,
    WatchResponse, call, response_op,
};
use super::shared::Shared;
use super::view::{self, Change, Entry, ReplicaRecord};
use crate::placement::Placement;
use crate::telemetry;
use std::collections::HashMap;
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

    /// One session; `Ok` on shutdown, else why it ended. Starts the session (lease, record,
    /// view, campaign), then serves its four clocks until one of them fails: the lease's
    /// renewal, the watch, the election, and the publishing of shared state.
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
        let revision = self.read_view(client, prefix.clone()).await?;
        *self.client.lock().expect("cluster client") = Some(client.clone());
        let placement = gateway.placement();
        self.resync(placement);
        let mut publishing = Publishing::default();
        let mut watch = call("watch", &me, client.watch_prefix(prefix, revision + 1)).await?;
        let mut campaign = Some(self.campaign(client, lease));
        self.set_degraded(None);
        shared.apply(self, gateway);
        let mut clock = LeaseClock {
            id: lease,
            ttl: Duration::from_secs(self.config.lease_seconds() as u64),
            renewed: std::time::Instant::now(),
        };
        // Renewed four times a lease; a renewal may take until a quarter of the lease is
        // left since the last one etcd confirmed: one late answer (a busy machine, etcd
        // paused a moment) is not an outage, and the replica degrades only when the lease
        // is really at risk.
        let mut keep_alive = tokio::time::interval((clock.ttl / 4).max(Duration::from_millis(250)));
        let mut sync = tokio::time::interval(SYNC_INTERVAL);
        let own_record = self.view().key(&format!("{}{me}", view::REPLICAS));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = keep_alive.tick() => self.renew(&mut keeper, &mut watch, &mut clock).await?,
                message = watch.message() => self.follow_watch(message, &own_record, placement)?,
                elected = async { (&mut campaign.as_mut().expect("campaigning").0).await }, if campaign.is_some() => {
                    campaign = None;
                    match elected {
                        Ok(Ok(_)) => tracing::info!(replica = %me, "elected leader of the pool's housekeeping"),
                        Ok(Err(error)) => return Err(format!("etcd election failed: {error}")),
                        Err(error) => return Err(format!("election task failed: {error}")),
                    }
                }
                _ = sync.tick() => {
                    self.publish_shared(shared, gateway, client, &clock, &mut publishing).await?;
                }
            }
        }
    }

    /// Reads the whole registry into the view; returns the revision it was read at, where
    /// the watch takes over.
    async fn read_view(&self, client: &mut Client, prefix: String) -> Result<i64, String> {
        let read = call("get", self.replica(), client.get_prefix(prefix)).await?;
        let revision = read.header.map_or(0, |h| h.revision);
        self.view().reset(
            read.kvs
                .iter()
                .map(|kv| (String::from_utf8_lossy(&kv.key).into_owned(), entry(kv))),
            revision,
        );
        Ok(revision)
    }

    /// Stands for the pool's housekeeping on the session's lease, in a task of its own: the
    /// wait to lead may last the whole session, and ends with it.
    fn campaign(&self, client: &Client, lease: i64) -> Abort<Result<(), tonic::Status>> {
        let election = self.view().key(view::ELECTION);
        let mut client = client.clone();
        let me = self.replica().to_string();
        Abort(tokio::spawn(async move {
            client.campaign(election, me, lease).await
        }))
    }

    /// Renews the lease and reads how far the view lags etcd; `Err` when the renewal did
    /// not come back before the lease was at risk, or etcd no longer has the lease.
    async fn renew(
        &self,
        keeper: &mut KeepAlive,
        watch: &mut Watch,
        clock: &mut LeaseClock,
    ) -> Result<(), String> {
        let sent = std::time::Instant::now();
        let answer = etcd::call_until(
            "keep_alive",
            self.replica(),
            clock.at_risk(),
            keeper.renew(),
        )
        .await?;
        clock.renewed = sent;
        if answer.ttl <= 0 {
            return Err(format!("lease {:x} expired", clock.id));
        }
        let current = answer.header.map_or(0, |h| h.revision);
        let lag = (current - self.view().revision()).max(0);
        self.gauge(telemetry::CLUSTER_WATCH_LAG).set(lag as f64);
        // Ask for a progress notice, so a quiet prefix still moves the view's
        // revision up to etcd's and the lag reads true.
        watch
            .request_progress()
            .await
            .map_err(|e| format!("etcd watch failed: {e}"))
    }

    /// Applies one watch answer to the view and mirrors it into placement's books; `Err`
    /// when the watch ended, or this replica's own record went (its lease is gone).
    fn follow_watch(
        &self,
        message: Result<Option<WatchResponse>, tonic::Status>,
        own_record: &str,
        placement: &Arc<Placement>,
    ) -> Result<(), String> {
        let answer = message
            .map_err(|e| format!("etcd watch failed: {e}"))?
            .ok_or("etcd ended the watch")?;
        if answer.canceled {
            return Err(format!(
                "etcd cancelled the watch: {}",
                answer.cancel_reason
            ));
        }
        let revision = answer.header.map_or(0, |h| h.revision);
        let changes: Vec<Change> = answer.events.iter().filter_map(change).collect();
        if changes
            .iter()
            .any(|c| matches!(c, Change::Delete(key) if key.as_str() == own_record))
        {
            return Err("this replica's record was deleted".into());
        }
        self.view().apply(changes.iter().cloned(), revision);
        self.mirror_changes(placement, &changes, revision);
        Ok(())
    }

    /// Publishes shared state and this replica's use marks, then (as leader) finishes
    /// orphaned records. A failure is tried again on the next tick while the lease is safe;
    /// past that it ends the session.
    async fn publish_shared(
        &self,
        shared: &mut Shared,
        gateway: &impl Host,
        client: &mut Client,
        clock: &LeaseClock,
        publishing: &mut Publishing,
    ) -> Result<(), String> {
        let placement = gateway.placement();
        let published = match shared.publish(self, gateway, client).await {
            Ok(()) => {
                shared.apply(self, gateway);
                self.publish_marks(placement, client, clock.id, &mut publishing.marks_sent)
                    .await
            }
            Err(reason) => Err(reason),
        };
        match published {
            Ok(()) => self.finish_orphans(placement, &mut publishing.orphans),
            // What was not published goes on the next tick, while the lease is safe.
            Err(reason) if std::time::Instant::now() < clock.at_risk() => {
                tracing::info!(replica = %self.replica(), %reason, "etcd was slow to take shared state; publishing again");
            }
            Err(reason) => return Err(reason),
        }
        Ok(())
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

/// A session's lease, and when etcd last confirmed its renewal.
struct LeaseClock {
    id: i64,
    ttl: Duration,
    renewed: std::time::Instant,
}

impl LeaseClock {
    /// When a quarter of the lease is left since the last confirmed renewal: until then a
    /// slow renewal or publish is waited out, after it the session ends.
    fn at_risk(&self) -> std::time::Instant {
        self.renewed + self.ttl * 3 / 4
    }
}

/// What a session has published of this replica's use, and the orphaned records its
/// leader is finishing; both start over with each session.
#[derive(Default)]
struct Publishing {
    marks_sent: Option<Vec<u8>>,
    orphans: HashMap<(String, String, i64), Option<tokio::time::Instant>>,
}

/// A task aborted when dropped: a session's campaign ends with the session.
struct Abort<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Abort<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
