//! Active health checks with thresholds, against real Tritons (default flags) paused with
//! SIGSTOP: one slow moment is not an outage, a backend is taken out only after
//! `upstream.unhealthy_threshold` failed checks in a row and comes back after
//! `upstream.healthy_threshold` good ones, and each ejection is counted.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::gateway::{TestGateway, config_for, min_copies};
use support::{Triton, TritonOptions};

async fn triton() -> Triton {
    Triton::start(TritonOptions::default())
        .await
        .expect("triton starts")
}

/// `config_for`'s config with these health-check timings in place of its quick ones.
fn with_checks(config: String, interval: &str, timeout: &str) -> String {
    config
        .replace(
            "health_interval = \"200ms\"",
            &format!("health_interval = \"{interval}\""),
        )
        .replace(
            "health_timeout = \"3s\"",
            &format!("health_timeout = \"{timeout}\""),
        )
}

/// One add_sub inference through the gateway: its status (0 when none came).
async fn infer(client: &reqwest::Client, url: &str) -> u16 {
    support::infer(client, url, "add_sub", &support::add_sub_request())
        .await
        .0
}

/// `infergate_backend_ejections_total` of one backend, over every reason.
async fn ejections(gateway: &TestGateway, backend: &str) -> f64 {
    let filter = format!("backend=\"{backend}\"");
    gateway
        .metric_sum("infergate_backend_ejections_total", &[&filter])
        .await
}

/// Whether the admin API shows backend `i` ready.
async fn is_ready(gateway: &TestGateway, i: usize) -> bool {
    gateway.admin_backends().await[i]["ready"] == true
}

/// Polls until backend `i`'s readiness is `ready`; how long that took.
async fn until_ready_is(gateway: &TestGateway, i: usize, ready: bool) -> Duration {
    let started = Instant::now();
    while is_ready(gateway, i).await != ready {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "backend {i} never became ready={ready}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// Issue 29's case: steady traffic over two Tritons with a copy of add_sub each, the default
/// checks (every 2 s, 1 s each), and one Triton SIGSTOPped for 3 s. Its checks time out
/// at most twice meanwhile, under the threshold of 3: it keeps its place, and the requests
/// sent to it wait and are served once it resumes. No request fails.
#[tokio::test]
async fn a_triton_paused_for_three_seconds_under_traffic_fails_no_request_and_keeps_its_place() {
    let (t0, t1) = tokio::join!(triton(), triton());
    let config = with_checks(config_for("paused", &[&t0, &t1], "", ""), "2s", "1s")
        + &min_copies("add_sub", 2);
    let gateway = TestGateway::start(&config).await;
    gateway.wait_for_copies("add_sub", 2).await;

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (url, stop) = (gateway.url(), stop.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut statuses = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    statuses.push(infer(&client, &url).await);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    t0.pause();
    let paused = Instant::now();
    let mut taken_out = false;
    while paused.elapsed() < Duration::from_secs(3) {
        taken_out |= !is_ready(&gateway, 0).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t0.resume();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut statuses = Vec::new();
    for client in clients {
        statuses.extend(client.await.unwrap());
    }
    assert!(statuses.len() >= 20, "only {} requests", statuses.len());
    let failed: Vec<_> = statuses.iter().filter(|&&s| s != 200).collect();
    assert!(
        failed.is_empty(),
        "failed: {failed:?} of {}",
        statuses.len()
    );
    assert!(!taken_out, "paused-0 was taken out before the threshold");
    assert_eq!(ejections(&gateway, "paused-0").await, 0.0);
    assert!(is_ready(&gateway, 0).await && is_ready(&gateway, 1).await);
}

/// Checks every 200 ms, 300 ms each, thresholds 3 and 2: a paused Triton is taken out only
/// once three checks in a row have failed (no sooner than 900 ms), counted once as a
/// `health_check` ejection; resumed, it comes back after two good checks, not one.
#[tokio::test]
async fn a_backend_is_taken_out_after_unhealthy_threshold_and_back_after_healthy_threshold() {
    let t0 = triton().await;
    let config = with_checks(
        config_for(
            "thresholds",
            &[&t0],
            "unhealthy_threshold = 3\nhealthy_threshold = 2",
            "",
        ),
        "200ms",
        "300ms",
    );
    let gateway = TestGateway::start(&config).await;
    t0.pause();
    let out_after = until_ready_is(&gateway, 0, false).await;
    assert!(
        out_after >= Duration::from_millis(850),
        "taken out after {out_after:?}: sooner than three failed checks of 300 ms"
    );
    let counted = gateway.metrics_text("/metrics").await;
    let line =
        "infergate_backend_ejections_total{backend=\"thresholds-0\",reason=\"health_check\"} 1";
    assert!(counted.contains(line), "{counted}");
    let backends = gateway.admin_backends().await;
    assert!(
        backends[0]["last_error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{backends:?}"
    );

    t0.resume();
    let back_after = until_ready_is(&gateway, 0, true).await;
    assert!(
        back_after >= Duration::from_millis(150),
        "back after {back_after:?}: sooner than two good checks 200 ms apart"
    );
    assert_eq!(infer(&reqwest::Client::new(), &gateway.url()).await, 200);
    assert_eq!(ejections(&gateway, "thresholds-0").await, 1.0);
}

/// Requests are the best health signal: a Triton killed under traffic is ejected by its
/// first refused connection (nothing listens there) long before its checks, every 2 s
/// here, would take it out; counted once, as `requests`. The request it refused goes to
/// the other: no client sees the dead backend.
#[tokio::test]
async fn a_killed_backend_is_ejected_by_its_first_refused_request_and_counted() {
    let (t0, t1) = tokio::join!(triton(), triton());
    let config = with_checks(config_for("outlier", &[&t0, &t1], "", ""), "2s", "1s")
        + &min_copies("add_sub", 2);
    let gateway = TestGateway::start(&config).await;
    gateway.wait_for_copies("add_sub", 2).await;
    let mut tritons = [t0, t1];
    tritons[0].kill();
    let killed = Instant::now();
    let client = reqwest::Client::new();
    while is_ready(&gateway, 0).await {
        assert!(
            killed.elapsed() < Duration::from_millis(1500),
            "not ejected by its requests"
        );
        assert_eq!(infer(&client, &gateway.url()).await, 200);
    }
    let metrics = gateway.metrics_text("/metrics").await;
    let line = "infergate_backend_ejections_total{backend=\"outlier-0\",reason=\"requests\"} 1";
    assert!(metrics.contains(line), "{metrics}");
    for _ in 0..5 {
        assert_eq!(infer(&client, &gateway.url()).await, 200);
    }
    // Its checks fail too now, but it is out already: still one ejection.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(ejections(&gateway, "outlier-0").await, 1.0);
}
