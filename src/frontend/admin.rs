//! The admin API, on its own listener so it can stay private: what the gateway believes about
//! its backends and placement, as JSON, and the operator's levers (load, unload, drain).
//! It has the same edge as the KServe listener: request ids and one access-log line each.

use super::http::{Gate, allow, around, decoded, segments};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::pipeline::RequestCtx;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::Method;
use http::request::Parts;
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;

/// Every request on the admin listener, as the listener calls it: the same edge as the
/// KServe listener's, letting in only callers with the admin role (when auth is on; the
/// listener being private is a second fence, not the only one).
pub(crate) fn serve(
    gateway: Gateway,
    request: Request,
) -> Pin<Box<dyn Future<Output = Response> + Send>> {
    Box::pin(async move {
        let encode = axum::response::IntoResponse::into_response;
        around(
            &gateway,
            request,
            Gate::Admins,
            encode,
            async |ctx, request| {
                // The admin API reads no body.
                let (parts, _) = request.into_parts();
                answer(ctx, &parts).await
            },
        )
        .await
    })
}

/// The admin endpoint of the request, and its answer.
async fn answer(ctx: &RequestCtx, request: &Parts) -> Result<Response, GatewayError> {
    let gateway = &ctx.gateway;
    let path = request.uri.path();
    let endpoint = endpoint(path)?.ok_or_else(|| GatewayError::NotFound {
        path: path.to_owned(),
    })?;
    allow(&request.method, &endpoint.method(), path)?;
    let json = |view: serde_json::Value| axum::Json(view).into_response();
    Ok(match endpoint {
        Endpoint::Backends => axum::Json(backends(gateway)).into_response(),
        Endpoint::Placement => json(gateway.placement().snapshot()),
        Endpoint::Reload => axum::Json(reload(gateway).await?).into_response(),
        Endpoint::Config => json(running_config(gateway)),
        Endpoint::Routes => axum::Json(routes(gateway)).into_response(),
        Endpoint::Whoami => json(whoami(ctx.peer.as_deref())),
        Endpoint::Server => json(server(gateway).await),
        Endpoint::Cluster => json(cluster(gateway)?),
        Endpoint::Flow => axum::Json(gateway.flow().snapshot()).into_response(),
        Endpoint::Load(model) => json(load(gateway, model).await?),
        Endpoint::Unload(model) => json(unload(gateway, model).await),
        Endpoint::Drain(backend, draining) => json(set_draining(gateway, backend, draining).await?),
    })
}

/// The admin API's endpoints.
enum Endpoint {
    Backends,
    Placement,
    Reload,
    Config,
    Routes,
    Whoami,
    Server,
    Cluster,
    /// The live queues of flow control: per model, its slots and who waits for them.
    Flow,
    Load(String),
    Unload(String),
    /// Drain (true) or undrain a backend.
    Drain(String, bool),
}

impl Endpoint {
    /// The method it takes: reading is GET, changing is POST.
    fn method(&self) -> Method {
        match self {
            Self::Reload | Self::Load(_) | Self::Unload(_) | Self::Drain(..) => Method::POST,
            _ => Method::GET,
        }
    }
}

/// The endpoint of a path (`None`: no such endpoint).
fn endpoint(path: &str) -> Result<Option<Endpoint>, GatewayError> {
    let Some(rest) = path.strip_prefix("/admin/") else {
        return Ok(None);
    };
    let (segments, count) = segments(rest);
    let named =
        |segment: &str| -> Result<String, GatewayError> { Ok(decoded(segment)?.into_owned()) };
    Ok(Some(match &segments[..count] {
        ["backends"] => Endpoint::Backends,
        ["placement"] => Endpoint::Placement,
        ["reload"] => Endpoint::Reload,
        ["config"] => Endpoint::Config,
        ["routes"] => Endpoint::Routes,
        ["whoami"] => Endpoint::Whoami,
        ["server"] => Endpoint::Server,
        ["cluster"] => Endpoint::Cluster,
        ["flow"] => Endpoint::Flow,
        ["models", model, "load"] if !model.is_empty() => Endpoint::Load(named(model)?),
        ["models", model, "unload"] if !model.is_empty() => Endpoint::Unload(named(model)?),
        ["backends", backend, "drain"] if !backend.is_empty() => {
            Endpoint::Drain(named(backend)?, true)
        }
        ["backends", backend, "undrain"] if !backend.is_empty() => {
            Endpoint::Drain(named(backend)?, false)
        }
        _ => return Ok(None),
    }))
}

/// What the gateway knows about the caller's connection: the subject of its verified client
/// certificate (mTLS), `null` without one. For checking an mTLS setup from the client side.
fn whoami(peer: Option<&str>) -> serde_json::Value {
    serde_json::json!({ "peer": peer })
}

/// The gateway's own name and version, and what server metadata reports for the pool (the
/// backends' identity, which `GET /v2` gives clients).
async fn server(gateway: &Gateway) -> serde_json::Value {
    serde_json::json!({
        "name": crate::protocol::SERVER_NAME,
        "version": crate::protocol::SERVER_VERSION,
        "reported": crate::services::server_metadata::server_metadata(gateway).await,
    })
}

/// The replicas sharing this gateway's registry (`[cluster]`): who is live, the leader,
/// the registry revision, and whether this replica is degraded (etcd unreachable).
fn cluster(gateway: &Gateway) -> Result<serde_json::Value, GatewayError> {
    match gateway.cluster() {
        Some(cluster) => Ok(cluster.snapshot()),
        None => Err(GatewayError::NotFound {
            path: "/admin/cluster (this gateway runs without [cluster])".into(),
        }),
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

fn backends(gateway: &Gateway) -> Vec<BackendView> {
    gateway
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
        .collect()
}

async fn load(gateway: &Gateway, model: String) -> Result<serde_json::Value, GatewayError> {
    gateway.placement().load_now(&model).await?;
    Ok(serde_json::json!({ "model": model, "loaded": true }))
}

async fn unload(gateway: &Gateway, model: String) -> serde_json::Value {
    let copies = gateway.placement().unload(&model).await;
    serde_json::json!({ "model": model, "unloaded_copies": copies })
}

/// Draining stops new placements on the backend and moves its pinned models away; other
/// copies already there keep serving until evicted or unloaded.
async fn set_draining(
    gateway: &Gateway,
    backend: String,
    draining: bool,
) -> Result<serde_json::Value, GatewayError> {
    if gateway.placement().set_draining(&backend, draining).await {
        Ok(serde_json::json!({ "backend": backend, "draining": draining }))
    } else {
        Err(GatewayError::NotFound {
            path: format!("backend '{backend}'"),
        })
    }
}

/// Reloads the config file: 200 with the new hash and what was unloaded, or 400 naming every
/// bad key (and nothing changes).
async fn reload(gateway: &Gateway) -> Result<crate::reload::Reloaded, GatewayError> {
    let Some(path) = gateway.config_path() else {
        return Err(GatewayError::BadRequest(
            "the gateway was not started from a config file".into(),
        ));
    };
    crate::reload::reload(gateway, path)
        .await
        .map_err(|errors| {
            let message = errors
                .0
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            GatewayError::BadRequest(format!("config not reloaded: {message}"))
        })
}

/// The running config, its hash and when it was loaded.
fn running_config(gateway: &Gateway) -> serde_json::Value {
    let live = gateway.live();
    let loaded_at = live
        .loaded_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    serde_json::json!({
        "hash": live.hash,
        "loaded_at_unix": loaded_at,
        "path": gateway.config_path(),
        "config": *live.config,
    })
}

/// Every route: its targets with configured and current weights (a guard may have switched a
/// canary off), each target's figures over the guard's window, and every trip with its reason.
fn routes(gateway: &Gateway) -> Vec<serde_json::Value> {
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
                "route": &*route.name,
                "targets": targets,
                "trips": guard.map(|g| g.trips()).unwrap_or_default(),
            })
        })
        .collect();
    views.sort_by(|a, b| a["route"].as_str().cmp(&b["route"].as_str()));
    views
}
