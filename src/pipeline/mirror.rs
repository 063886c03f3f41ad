//! Shadow traffic: a route's mirror targets get a copy of a share of its inference requests,
//! sent after the client's own request is on its way, their answers read and dropped. The
//! client's answer and latency never depend on a mirror: copies run in tasks of their own,
//! and when too many are already in flight a copy is dropped (and counted) rather than
//! queued.

use super::ModelRef;
use crate::Gateway;
use crate::error::GatewayError;
use crate::telemetry;
use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// Copies in flight at most, across the process: a slow mirror costs memory for the bodies
/// it holds, never the clients' requests.
const MAX_IN_FLIGHT: usize = 64;

static IN_FLIGHT: Semaphore = Semaphore::const_new(MAX_IN_FLIGHT);

/// What a mirror copy of a request needs to know (`Routed::mirror_copy` makes one).
pub struct Copy {
    /// The route the client called.
    pub route: String,
    /// The mirror targets drawn for this request.
    pub mirrors: Vec<ModelRef>,
    /// Held by each copy until it has placed its target, as the client's request holds it:
    /// a reload that drops a mirror waits for its copies before unloading it.
    pub resolved: Option<TaskTrackerToken>,
}

/// Sends a copy of an HTTP inference request to each mirror. The body is read whole (it
/// usually already is, after validation: then this costs no copy) and handed back for the
/// client's own request. `uri` is the one the client sent (naming the route), and `rewrite`
/// turns it into a target's.
pub async fn http(
    gateway: &Gateway,
    (copy, uri): (Copy, http::Uri),
    request: Request<Body>,
    rewrite: fn(&http::Uri, &ModelRef) -> http::Uri,
) -> Result<Request<Body>, GatewayError> {
    let (parts, body) = request.into_parts();
    let limit = gateway.config().server.max_body_size.bytes();
    let body = crate::validate::collect(body, limit, None).await?;
    for target in copy.mirrors {
        let Ok(permit) = IN_FLIGHT.try_acquire() else {
            count(&copy.route, &target, "dropped");
            continue;
        };
        let mut mirrored = Request::builder()
            .method(parts.method.clone())
            .uri(rewrite(&uri, &target))
            .body(Body::from(body.clone()))
            .expect("parts of a valid request");
        *mirrored.headers_mut() = parts.headers.clone();
        let (gateway, route, resolved) =
            (gateway.clone(), copy.route.clone(), copy.resolved.clone());
        tokio::spawn(async move {
            let outcome = send(&gateway, &target, mirrored, resolved).await;
            drop(permit);
            if let Err(error) = &outcome {
                tracing::debug!(route, model = target.name, %error, "mirror copy failed");
            }
            count(
                &route,
                &target,
                if outcome.is_ok() { "sent" } else { "failed" },
            );
        });
    }
    Ok(Request::from_parts(parts, Body::from(body)))
}

/// Places the mirror target like any model (it may be loaded for this) and reads its answer
/// to the end, so the connection goes back to the pool.
async fn send(
    gateway: &Gateway,
    target: &ModelRef,
    request: Request<Body>,
    resolved: Option<TaskTrackerToken>,
) -> Result<(), String> {
    let lease = gateway
        .placement()
        .acquire(target)
        .await
        .map_err(|e| e.to_string())?;
    drop(resolved);
    let response = crate::upstream::forward(lease.backend(), request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let _ = response.into_body().collect().await;
    if status.is_server_error() {
        return Err(format!("answered {status}"));
    }
    Ok(())
}

/// Sends a copy of a gRPC inference request to each mirror, over the backend's gRPC channel.
pub fn grpc(
    gateway: &Gateway,
    copy: Copy,
    message: &crate::protocol::inference::ModelInferRequest,
) {
    for target in copy.mirrors {
        let Ok(permit) = IN_FLIGHT.try_acquire() else {
            count(&copy.route, &target, "dropped");
            continue;
        };
        let mut message = message.clone();
        message.model_name.clone_from(&target.name);
        message.model_version = target.version.clone().unwrap_or_default();
        let (gateway, route, resolved) =
            (gateway.clone(), copy.route.clone(), copy.resolved.clone());
        tokio::spawn(async move {
            let outcome = async {
                let lease = gateway.placement().acquire(&target).await.ok()?;
                drop(resolved);
                let timeout = gateway.config().upstream.request_timeout.0;
                crate::upstream::grpc::unary(lease.backend(), timeout, |mut client| async move {
                    client.model_infer(message).await
                })
                .await
                .ok()
            }
            .await;
            drop(permit);
            count(
                &route,
                &target,
                if outcome.is_some() { "sent" } else { "failed" },
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
