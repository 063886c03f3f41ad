//! State the replicas share beyond their records: canary guard trips (one replica's trip
//! switches the canary off on all), learned model sizes (they outlive every replica), and
//! the live replica count that divides per-tenant limits.
//!
//! `publish` writes what this replica learned since the last round; `apply` brings local
//! state in line with the view. Both run every quarter second in the session loop, never
//! on the request path.

use super::Cluster;
use super::Host;
use super::etcd::{Client, Compare, RequestOp, TxnRequest, call};
use super::view::{self, View};
use crate::routing::guard::Trip;
use crate::telemetry;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

/// `{prefix}/trips/{route}/{target}`: a canary some replica's guard switched off.
#[derive(Debug, Deserialize, Serialize)]
pub struct TripRecord {
    /// The route (the name clients call).
    pub route: String,
    /// The canary's label, `model[/version]`.
    pub target: String,
    /// `error_rate` or `p95_ratio`.
    pub reason: String,
    /// The figures, in words.
    pub message: String,
    /// When, seconds since the Unix epoch.
    pub at_unix: f64,
    /// The replica whose guard tripped.
    pub replica: String,
    /// The route's config when it tripped: a replica whose route differs (a reload
    /// changed it, as a local trip lasts until the route changes) does not apply it.
    pub route_config: serde_json::Value,
}

/// `{prefix}/sizes/{model}`: a model's learned size per version.
#[derive(Debug, Deserialize, Serialize)]
pub struct SizeRecord {
    /// Bytes per version.
    pub bytes: u64,
    /// The replica that measured it.
    pub replica: String,
    /// When, seconds since the Unix epoch.
    pub at_unix: f64,
}

/// What the session loop has published and applied, so each fact crosses once.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Local trips written to the registry: (route, target, at_unix bits).
    published_trips: HashSet<(String, String, u64)>,
    /// The learned sizes as this replica last saw its estimator hold them.
    known_sizes: HashMap<String, u64>,
    /// The registry revision of each size applied or written here.
    size_revisions: HashMap<String, i64>,
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Shared {
    /// Writes this replica's new trips and learned sizes.
    pub(super) async fn publish(
        &mut self,
        cluster: &Cluster,
        gateway: &impl Host,
        client: &mut Client,
    ) -> Result<(), String> {
        self.publish_trips(cluster, gateway, client).await?;
        self.publish_sizes(cluster, gateway, client).await
    }

    /// Brings local state in line with the view: the limits' share, trips, sizes.
    pub(super) fn apply(&mut self, cluster: &Cluster, gateway: &impl Host) {
        let view = cluster.view();
        let replicas = view.replicas().len().max(1);
        gateway
            .live()
            .auth
            .limit_share()
            .set_replicas(u32::try_from(replicas).unwrap_or(u32::MAX));
        cluster
            .gauge(telemetry::CLUSTER_REPLICAS)
            .set(replicas as f64);
        apply_trips(&view, gateway);
        let placement = gateway.placement();
        for (model, entry) in view.under(view::SIZES) {
            if self
                .size_revisions
                .get(model)
                .is_some_and(|r| *r >= entry.mod_revision)
            {
                continue;
            }
            let Ok(record) = serde_json::from_slice::<SizeRecord>(&entry.value) else {
                continue;
            };
            placement.estimator().learn(model, record.bytes);
            self.known_sizes.insert(model.to_string(), record.bytes);
            self.size_revisions
                .insert(model.to_string(), entry.mod_revision);
        }
    }

    async fn publish_trips(
        &mut self,
        cluster: &Cluster,
        gateway: &impl Host,
        client: &mut Client,
    ) -> Result<(), String> {
        let live = gateway.live();
        for route in live.routes.routes() {
            let Some(guard) = route.guard() else { continue };
            for trip in guard.trips().into_iter().filter(|t| t.replica.is_none()) {
                let id = (
                    route.name.to_string(),
                    trip.target.clone(),
                    trip.at_unix.to_bits(),
                );
                if self.published_trips.contains(&id) {
                    continue;
                }
                let route_config = route_config(&live, &route.name).unwrap_or_default();
                let record = TripRecord {
                    route: route.name.to_string(),
                    target: trip.target.clone(),
                    reason: trip.reason.to_string(),
                    message: trip.message.clone(),
                    at_unix: trip.at_unix,
                    replica: cluster.replica().to_string(),
                    route_config,
                };
                let key =
                    cluster
                        .view()
                        .key(&format!("{}{}/{}", view::TRIPS, route.name, trip.target));
                let value = serde_json::to_vec(&record).expect("a trip serializes");
                // The first replica to trip writes the record; a later one (its guard saw
                // the same canary fail before the first trip reached it) loses the race.
                let txn = TxnRequest {
                    compare: vec![Compare::absent(key.clone())],
                    success: vec![RequestOp::put(key, value, 0)],
                    failure: Vec::new(),
                };
                let answer = call("txn", cluster.replica(), client.txn(txn)).await?;
                if !answer.succeeded {
                    metrics::counter!(telemetry::CLUSTER_CONFLICTS, "key" => "trip", "replica" => cluster.replica().to_string())
                        .increment(1);
                }
                self.published_trips.insert(id);
            }
        }
        Ok(())
    }

    async fn publish_sizes(
        &mut self,
        cluster: &Cluster,
        gateway: &impl Host,
        client: &mut Client,
    ) -> Result<(), String> {
        for (model, bytes) in gateway.placement().estimator().learned() {
            if self.known_sizes.get(&model) == Some(&bytes) {
                continue;
            }
            let record = SizeRecord {
                bytes,
                replica: cluster.replica().to_string(),
                at_unix: now_unix(),
            };
            let key = cluster.view().key(&format!("{}{model}", view::SIZES));
            let value = serde_json::to_vec(&record).expect("a size serializes");
            let put = call("put", cluster.replica(), client.put(key, value, 0)).await?;
            let revision = put.header.map_or(0, |h| h.revision);
            self.known_sizes.insert(model.clone(), bytes);
            self.size_revisions.insert(model, revision);
        }
        Ok(())
    }
}

/// The route's config as written, which a trip record carries to tell whether another
/// replica runs the same route.
fn route_config(live: &crate::live::Live, route: &str) -> Option<serde_json::Value> {
    let config = live.config.routes.iter().find(|r| r.model == route)?;
    serde_json::to_value(config).ok()
}

/// Switches off every canary the registry holds a trip for, where this replica runs the
/// same route config the trip was made under.
fn apply_trips(view: &View, gateway: &impl Host) {
    let live = gateway.live();
    for (_, entry) in view.under(view::TRIPS) {
        let Ok(record) = serde_json::from_slice::<TripRecord>(&entry.value) else {
            continue;
        };
        let Some(route) = live.routes.routes().find(|r| *r.name == *record.route) else {
            continue;
        };
        if route_config(&live, &record.route).is_none_or(|config| config != record.route_config) {
            continue;
        }
        let already = route
            .guard()
            .is_some_and(|g| g.trips().iter().any(|t| t.target == record.target));
        if already {
            continue;
        }
        route.apply_trip(Trip {
            reason: match record.reason.as_str() {
                "error_rate" => "error_rate",
                "p95_ratio" => "p95_ratio",
                _ => "other",
            },
            target: record.target,
            message: record.message,
            at_unix: record.at_unix,
            replica: Some(record.replica),
        });
    }
}

/// The trips in the registry, for `GET /admin/cluster`.
pub(super) fn trips(view: &View) -> Vec<serde_json::Value> {
    view.under(view::TRIPS)
        .filter_map(|(_, entry)| serde_json::from_slice(&entry.value).ok())
        .collect()
}

/// The learned sizes in the registry, by model, for `GET /admin/cluster`.
pub(super) fn sizes(view: &View) -> serde_json::Map<String, serde_json::Value> {
    view.under(view::SIZES)
        .filter_map(|(model, entry)| {
            Some((
                model.to_string(),
                serde_json::from_slice(&entry.value).ok()?,
            ))
        })
        .collect()
}
