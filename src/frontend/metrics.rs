//! The metrics listener: the gateway's own series at `/metrics` (with every backend's Triton
//! series too, labelled by backend, unless `telemetry.merge_backend_metrics` is off), and the
//! backends' series alone at `/metrics/backends`.

use crate::gateway::Gateway;
use crate::upstream::metrics_scrape;
use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use http::header;

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Builds the metrics router.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route("/metrics", get(own))
        .route("/metrics/backends", get(backends))
        .with_state(gateway)
}

async fn own(State(gateway): State<Gateway>) -> impl IntoResponse {
    // The LRU age grows while nothing changes: read the books now, not at the last change.
    gateway.placement().publish_gauges();
    let mut text = gateway.metrics().render();
    if gateway.fixed_config().telemetry.merge_backend_metrics {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&scrape(&gateway).await);
    }
    ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text)
}

async fn backends(State(gateway): State<Gateway>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
        scrape(&gateway).await,
    )
}

async fn scrape(gateway: &Gateway) -> String {
    let timeout = gateway.fixed_config().upstream.health_timeout.0;
    metrics_scrape::scrape_all(gateway.pool(), timeout).await
}
