//! Shadow traffic: a route's mirror targets get a copy of a share of its inference requests,
//! sent after the client's own request is on its way, their answers read and dropped. The
//! client's answer and latency never depend on a mirror: copies run in tasks of their own,
//! and when too many are already in flight a copy is dropped (and counted) rather than
//! queued.

use crate::gateway::Gateway;
use crate::model::ModelRef;
use crate::routing::Shadow;
use crate::telemetry;
use crate::upstream::Backend;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Copies in flight at most, across the process: a slow mirror costs memory for the bodies
/// it holds, never the clients' requests.
const MAX_IN_FLIGHT: usize = 64;

static IN_FLIGHT: Semaphore = Semaphore::const_new(MAX_IN_FLIGHT);

/// Sends a copy of the request to each mirror, each in a task of its own: its target is
/// placed like any model (it may be loaded for this), then `send` (the front-end's: the
/// same request, named for the target) sends it to the copy's backend and reads the answer
/// to its end. A copy over `MAX_IN_FLIGHT` is dropped and counted.
pub fn spawn<S, F>(gateway: &Gateway, shadow: Shadow, send: S)
where
    S: Fn(Arc<Backend>, ModelRef) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<(), String>> + Send + 'static,
{
    for target in shadow.mirrors {
        let Ok(permit) = IN_FLIGHT.try_acquire() else {
            count(&shadow.route, &target, "dropped");
            continue;
        };
        let (gateway, route, resolved, send) = (
            gateway.clone(),
            shadow.route.clone(),
            shadow.resolved.clone(),
            send.clone(),
        );
        tokio::spawn(async move {
            let outcome = async {
                let lease = gateway
                    .placement()
                    .acquire(&target)
                    .await
                    .map_err(|e| e.to_string())?;
                drop(resolved);
                send(lease.backend().clone(), target.clone()).await
            }
            .await;
            drop(permit);
            if let Err(error) = &outcome {
                tracing::debug!(route = &*route, model = target.name, %error, "mirror copy failed");
            }
            count(
                &route,
                &target,
                if outcome.is_ok() { "sent" } else { "failed" },
            );
        });
    }
}

fn count(route: &str, target: &ModelRef, outcome: &'static str) {
    let label = match &target.version {
        Some(version) => format!("{}/{version}", target.name),
        None => target.name.clone(),
    };
    metrics::counter!(telemetry::MIRRORED, "route" => route.to_string(), "target" => label, "outcome" => outcome)
        .increment(1);
}
