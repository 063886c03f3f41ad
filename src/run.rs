//! Running the gateway: its listeners and background tasks (health checks, discovery,
//! reloads, the registry session, warm-up) from start to a drained shutdown.

use crate::gateway::Gateway;
pub use crate::listen::Listeners;
use crate::{frontend, listen, placement, reload, telemetry, tls, trace, upstream};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Runs the gateway until `shutdown` is cancelled; then readiness turns false at once, the
/// listeners keep serving for `server.shutdown_delay` (so load balancers move away first),
/// stop accepting, let in-flight requests finish for up to `server.drain_timeout`, and it
/// returns.
pub async fn serve(
    gateway: Gateway,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tasks = TaskTracker::new();
    if let Some(endpoint) = &gateway.fixed_config().telemetry.otlp_endpoint {
        trace::start_export(endpoint).map_err(anyhow::Error::msg)?;
    }
    // The first DNS round comes before health checks and listeners, so the instances found
    // are checked at once; a group DNS does not answer for starts empty (requests wait).
    reload::discover(&gateway).await;
    gateway.start_health_checks(health_checks(&gateway, &tasks, &shutdown));
    spawn_background(&gateway, &tasks, &shutdown);
    gateway.warn_if_open();
    let workers = listen::Workers::start(
        &gateway.fixed_config().server,
        endpoints(&gateway, listeners, &tasks, &shutdown)?,
    )?;
    tasks.close();

    shutdown.cancelled().await;
    drain(&gateway, workers).await;
    tasks.wait().await;
    let _ = tokio::task::spawn_blocking(trace::flush).await;
    tracing::info!("stopped");
    Ok(())
}

/// The health checks of every backend, with what placement learns from each.
fn health_checks(
    gateway: &Gateway,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> upstream::HealthChecks {
    let config = gateway.fixed_config();
    let placement = gateway.placement().clone();
    let books = gateway.placement().clone();
    upstream::HealthChecks {
        interval: config.upstream.health_interval.0,
        timeout: config.upstream.health_timeout.0,
        tasks: tasks.clone(),
        shutdown: shutdown.clone(),
        after_check: Arc::new(move |backend| placement.reconcile(backend)),
        read_queues: !config.placement.queue_max_age.0.is_zero(),
        loading: Arc::new(move |backend| books.loading_on(backend)),
        load_timeout: config.placement.load_timeout.0,
    }
}

/// The loops that run beside the listeners until shutdown: discovery, warm-up, placement's
/// rebalancing and reconciling, metric upkeep, reload triggers, the signature cache's
/// follower, certificate and JWKS refreshes, and the registry session.
fn spawn_background(gateway: &Gateway, tasks: &TaskTracker, shutdown: &CancellationToken) {
    tasks.spawn(reload::follow_dns(gateway.clone(), shutdown.clone()));
    spawn_warm_up(gateway, tasks, shutdown);
    tasks.spawn(gateway.placement().clone().rebalance_loop(shutdown.clone()));
    tasks.spawn(gateway.placement().clone().reconcile_loop(shutdown.clone()));
    tasks.spawn(telemetry::upkeep(
        gateway.metrics().clone(),
        shutdown.clone(),
    ));
    if let Some(path) = gateway.config_path() {
        reload::spawn_triggers(gateway, path, Duration::from_secs(1), tasks, shutdown);
    }
    tasks.spawn(forget_signatures_on_change(
        gateway.clone(),
        shutdown.clone(),
    ));
    if let Some(tls) = gateway.tls() {
        tls.spawn_watch(Duration::from_secs(1), tasks, shutdown);
    }
    tasks.spawn(refresh_jwks(gateway.clone(), shutdown.clone()));
    if let Some(cluster) = gateway.cluster() {
        tasks.spawn(cluster.clone().run(gateway.clone(), shutdown.clone()));
    }
}

/// Shutdown, once asked for: not ready at once, still serving for `server.shutdown_delay`,
/// then no new connections, and in-flight requests given up to `server.drain_timeout`.
async fn drain(gateway: &Gateway, workers: listen::Workers) {
    gateway.begin_draining();
    workers.begin_drain();
    let server = &gateway.fixed_config().server;
    let (delay, drain) = (server.shutdown_delay.0, server.drain_timeout.0);
    tracing::info!(
        shutdown_delay_ms = delay.as_millis() as u64,
        "shutting down: not ready, still serving while load balancers notice"
    );
    tokio::time::sleep(delay).await;
    workers.stop_accepting();
    tracing::info!(
        drain_timeout_ms = drain.as_millis() as u64,
        "shutting down: listeners closed, draining in-flight requests"
    );
    if tokio::time::timeout(drain, workers.drained())
        .await
        .is_err()
    {
        tracing::warn!("drain timeout reached with requests still in flight; exiting anyway");
    }
    workers.abort().await;
}

/// What each listener serves. HTTP, gRPC and admin speak TLS when `[listen.tls]` is set;
/// metrics never does.
fn endpoints(
    gateway: &Gateway,
    listeners: Listeners,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> std::io::Result<Vec<(listen::Endpoint, tokio::net::TcpListener)>> {
    let tls = gateway.tls().cloned();
    let scheme = if tls.is_some() { "TLS" } else { "plain" };
    let workers = gateway.fixed_config().server.worker_count();
    let endpoint = |name, answers, tls: &Option<Arc<tls::ServerTls>>| listen::Endpoint {
        name,
        answers,
        tls: tls.clone(),
        dated: true,
    };
    let edge = |answer: listen::Answer| listen::Answers::Edge(gateway.clone(), answer);
    tracing::info!(addr = %listeners.http.local_addr()?, scheme, workers, "serving KServe v2 HTTP");
    let http = endpoint("http", edge(frontend::http::serve), &tls);
    let mut endpoints = vec![(http, listeners.http)];
    if let Some(listener) = listeners.metrics {
        tracing::info!(addr = %listener.local_addr()?, "serving metrics");
        let router = frontend::metrics::router(gateway.clone());
        endpoints.push((
            endpoint("metrics", listen::Answers::Router(router), &None),
            listener,
        ));
    }
    if let Some(listener) = listeners.admin {
        tracing::info!(addr = %listener.local_addr()?, scheme, "serving admin API");
        endpoints.push((
            endpoint("admin", edge(frontend::admin::serve), &tls),
            listener,
        ));
    }
    if let Some(listener) = listeners.grpc {
        tracing::info!(addr = %listener.local_addr()?, scheme, "serving KServe v2 gRPC");
        let router = frontend::grpc::router(gateway.clone(), tasks, shutdown);
        // Undated, as no gRPC server's answers are (`listen::Endpoint::dated`).
        let grpc = listen::Endpoint {
            dated: false,
            ..endpoint("grpc", listen::Answers::Router(router), &tls)
        };
        endpoints.push((grpc, listener));
    }
    Ok(endpoints)
}

/// Drops a model's cached signature whenever placement loads or unloads it, so the next
/// request is checked against what the backend now serves; its description (metadata and
/// config) only when it is loaded again, so a model unloaded is still described.
async fn forget_signatures_on_change(gateway: Gateway, shutdown: CancellationToken) {
    let mut events = gateway.placement().subscribe();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = events.recv() => event,
        };
        match event {
            Ok(placement::ModelEvent::Loaded(model)) => {
                gateway.signatures().invalidate(&model);
                gateway.signatures().forget_described(&model);
            }
            Ok(placement::ModelEvent::Unloaded(model)) => gateway.signatures().invalidate(&model),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "signature cache missed placement events");
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Reads the JWKS sources of the live config again every `auth.jwks_refresh_interval`
/// (first at once, so keys from URLs are there before the first token). Follows reloads:
/// each round refreshes whatever config is live then.
async fn refresh_jwks(gateway: Gateway, shutdown: CancellationToken) {
    loop {
        let auth = gateway.live().auth.clone();
        auth.refresh_jwks().await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(auth.refresh_interval()) => {}
        }
    }
}

/// Loads pinned and preload models once the first backend is ready.
fn spawn_warm_up(gateway: &Gateway, tasks: &TaskTracker, shutdown: &CancellationToken) {
    let preload: Vec<String> = gateway
        .fixed_config()
        .models
        .iter()
        .filter(|m| m.preload && !m.pinned())
        .map(|m| m.name.clone())
        .collect();
    if preload.is_empty() && !gateway.fixed_config().models.iter().any(|m| m.pinned()) {
        return;
    }
    let gateway = gateway.clone();
    let shutdown = shutdown.clone();
    tasks.spawn(async move {
        let interval = gateway.fixed_config().upstream.health_interval.0;
        while !gateway.pool().any_ready() {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval / 4) => {}
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = gateway.placement().warm_up(preload) => {}
        }
    });
}

/// Cancels `token` on SIGTERM or SIGINT.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => tracing::info!("SIGINT received"),
            _ = term => tracing::info!("SIGTERM received"),
        }
        token.cancel();
    });
}
