//! The metrics listener: the gateway's own series at `/metrics`, and every backend's Triton
//! series, labelled by backend, at `/metrics/backends`.

use crate::Gateway;
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
    (
        [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
        gateway.metrics().render(),
    )
}

async fn backends(State(gateway): State<Gateway>) -> impl IntoResponse {
    let timeout = gateway.config().upstream.health_timeout.0;
    let text = metrics_scrape::scrape_all(gateway.pool(), timeout).await;
    ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text)
}
