//! The admin API, on its own listener so it can stay private: what the gateway believes about
//! its backends and placement, as JSON, and the operator's levers (load, unload, drain).
//! It has the same edge as the KServe listener: request ids and one access-log line each.

use crate::Gateway;
use crate::error::GatewayError;
use crate::pipeline::admit;
use axum::Router;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use serde::Serialize;

/// Builds the admin router.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route("/admin/backends", get(backends))
        .route("/admin/placement", get(placement))
        .route("/admin/reload", post(reload))
        .route("/admin/config", get(running_config))
        .route("/admin/routes", get(routes))
        .route("/admin/whoami", get(whoami))
        .route("/admin/server", get(server))
        .route("/admin/cluster", get(cluster))
        .route("/admin/models/{model}/load", post(load))
        .route("/admin/models/{model}/unload", post(unload))
        .route("/admin/backends/{backend}/drain", post(drain))
        .route("/admin/backends/{backend}/undrain", post(undrain))
        .layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            require_admin,
        ))
        .layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            super::http::edge,
        ))
        .with_state(gateway)
}

/// What the gateway knows about the caller's connection: the subject of its verified client
/// certificate (mTLS), `null` without one. For checking an mTLS setup from the client side.
async fn whoami(
    peer: Option<axum::Extension<crate::tls::PeerIdentity>>,
) -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({
        "peer": peer.map(|axum::Extension(peer)| peer.subject),
    }))
}

/// The gateway's own name and version, and what server metadata reports for the pool (the
/// backends' identity, which `GET /v2` gives clients).
async fn server(State(gateway): State<Gateway>) -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({
        "name": crate::protocol::SERVER_NAME,
        "version": crate::protocol::SERVER_VERSION,
        "reported": crate::pipeline::server_metadata::server_metadata(&gateway).await,
    }))
}

/// The replicas sharing this gateway's registry (`[cluster]`): who is live, the leader,
/// the registry revision, and whether this replica is degraded (etcd unreachable).
async fn cluster(
    State(gateway): State<Gateway>,
) -> Result<axum::Json<serde_json::Value>, GatewayError> {
    match gateway.cluster() {
        Some(cluster) => Ok(axum::Json(cluster.snapshot())),
        None => Err(GatewayError::NotFound {
            path: "/admin/cluster (this gateway runs without [cluster])".into(),
        }),
    }
}

/// Every admin endpoint needs the admin role when auth is on (the listener being private
/// is a second fence, not the only one), checked against the request's own snapshot.
async fn require_admin(
    State(gateway): State<Gateway>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut ctx = super::http::request_ctx(&gateway, &request);
    let credentials = super::http::credentials(&request);
    let admitted = async {
        admit::authenticate(&mut ctx, credentials).await?;
        admit::admin(&mut ctx, "the admin API")
    }
    .await;
    match admitted {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

#[derive(Serialize)]
struct BackendView {
    name: String,
    url: String,
    ready: bool,
    in_flight: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<String>,
    /// Models the backend reports READY, as `name` and `version`.
    models: Vec<ModelView>,
}

#[derive(Serialize)]
struct ModelView {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<String>,
}

async fn backends(State(gateway): State<Gateway>) -> axum::Json<Vec<BackendView>> {
    let views = gateway
        .pool()
        .backends()
        .iter()
        .filter(|backend| !backend.is_retired())
        .map(|backend| BackendView {
            name: backend.name.clone(),
            url: backend.url.base.clone(),
            ready: backend.is_ready(),
            in_flight: backend.in_flight(),
            capacity: backend.capacity,
            last_error: backend.last_error(),
            models: backend
                .index()
                .entries()
                .iter()
                .filter(|e| e.is_ready())
                .map(|e| ModelView {
                    name: e.name.clone(),
                    version: e.version.clone(),
                })
                .collect(),
        })
        .collect();
    axum::Json(views)
}

async fn placement(State(gateway): State<Gateway>) -> axum::Json<serde_json::Value> {
    axum::Json(gateway.placement().snapshot())
}

async fn load(
    State(gateway): State<Gateway>,
    Path(model): Path<String>,
) -> Result<axum::Json<serde_json::Value>, GatewayError> {
    gateway.placement().load_now(&model).await?;
    Ok(axum::Json(
        serde_json::json!({ "model": model, "loaded": true }),
    ))
}

async fn unload(
    State(gateway): State<Gateway>,
    Path(model): Path<String>,
) -> axum::Json<serde_json::Value> {
    let copies = gateway.placement().unload(&model).await;
    axum::Json(serde_json::json!({ "model": model, "unloaded_copies": copies }))
}

async fn drain(
    State(gateway): State<Gateway>,
    Path(backend): Path<String>,
) -> Result<axum::Json<serde_json::Value>, GatewayError> {
    set_draining(&gateway, backend, true).await
}

async fn undrain(
    State(gateway): State<Gateway>,
    Path(backend): Path<String>,
) -> Result<axum::Json<serde_json::Value>, GatewayError> {
    set_draining(&gateway, backend, false).await
}

/// Draining stops new placements on the backend and moves its pinned models away; other
/// copies already there keep serving until evicted or unloaded.
async fn set_draining(
    gateway: &Gateway,
    backend: String,
    draining: bool,
) -> Result<axum::Json<serde_json::Value>, GatewayError> {
    if gateway.placement().set_draining(&backend, draining).await {
        Ok(axum::Json(
            serde_json::json!({ "backend": backend, "draining": draining }),
        ))
    } else {
        Err(GatewayError::NotFound {
            path: format!("backend '{backend}'"),
        })
    }
}

/// Reloads the config file: 200 with the new hash and what was unloaded, or 400 naming every
/// bad key (and nothing changes).
async fn reload(State(gateway): State<Gateway>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(path) = gateway.config_path() else {
        return GatewayError::BadRequest("the gateway was not started from a config file".into())
            .into_response();
    };
    match crate::reload::reload(&gateway, path).await {
        Ok(reloaded) => axum::Json(reloaded).into_response(),
        Err(errors) => {
            let message = errors
                .0
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            GatewayError::BadRequest(format!("config not reloaded: {message}")).into_response()
        }
    }
}

/// The running config, its hash and when it was loaded.
async fn running_config(State(gateway): State<Gateway>) -> axum::Json<serde_json::Value> {
    let live = gateway.live();
    let loaded_at = live
        .loaded_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    axum::Json(serde_json::json!({
        "hash": live.hash,
        "loaded_at_unix": loaded_at,
        "path": gateway.config_path(),
        "config": *live.config,
    }))
}

/// Every route: its targets with configured and current weights (a guard may have switched a
/// canary off), each target's figures over the guard's window, and every trip with its reason.
async fn routes(State(gateway): State<Gateway>) -> axum::Json<Vec<serde_json::Value>> {
    let live = gateway.live();
    let mut views: Vec<serde_json::Value> = live
        .routes
        .routes()
        .map(|route| {
            let guard = route.guard();
            let targets: Vec<_> = route
                .targets
                .iter()
                .enumerate()
                .map(|(i, target)| {
                    serde_json::json!({
                        "target": route.label(i),
                        "weight": target.weight,
                        "current_weight": route.weight(i),
                        "mirror_percent": target.mirror,
                        "window": guard.map(|g| g.figures(i)),
                    })
                })
                .collect();
            serde_json::json!({
                "route": route.name,
                "targets": targets,
                "trips": guard.map(|g| g.trips()).unwrap_or_default(),
            })
        })
        .collect();
    views.sort_by(|a, b| a["route"].as_str().cmp(&b["route"].as_str()));
    axum::Json(views)
}
