//! The admin API, on its own listener so it can stay private: what the gateway believes about
//! its backends, as JSON.

use crate::Gateway;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde::Serialize;

/// Builds the admin router.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route("/admin/backends", get(backends))
        .with_state(gateway)
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
