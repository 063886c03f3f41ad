//! Queue-aware choice between copies, against real Tritons: a backend's own queue for a model
//! (Triton's `nv_inference_pending_request_count`, read with the health checks) steers
//! requests to the copy with the shorter queue, and makes a model whose copies are backed up
//! get another one. What this gateway sends itself is not all there is: other replicas and
//! clients calling a Triton directly fill its queue too.

mod support;

use serde_json::json;
use std::time::{Duration, Instant};
use support::gateway::{TestGateway, pool_config};
use support::{Triton, TritonOptions};

fn slow_body(delay_ms: u64) -> serde_json::Value {
    json!({
        "parameters": {"delay_ms": delay_ms},
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]
    })
}

/// Keeps `clients` requests of `delay_ms` each queued on `slow_model` of one Triton, called
/// directly (as another replica would), until the returned guard is dropped.
fn flood(triton: &Triton, clients: usize, delay_ms: u64) -> tokio::task::JoinSet<()> {
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let url = format!("{}/v2/models/slow_model/infer", triton.http_url());
        flood.spawn(async move {
            let client = reqwest::Client::new();
            loop {
                let _ = client.post(&url).json(&slow_body(delay_ms)).send().await;
            }
        });
    }
    flood
}

/// Requests `slow_model` answered by each backend, from the gateway's own metrics.
async fn served_by(gateway: &TestGateway, backend: &str) -> u64 {
    let backend = format!("backend=\"{backend}\"");
    let filters = ["model=\"slow_model\"", &backend];
    gateway
        .metric_sum("infergate_requests_total", &filters)
        .await as u64
}

async fn placed_on(gateway: &TestGateway, model: &str) -> usize {
    let placed = gateway.placed().await;
    placed
        .iter()
        .filter(|b| b.iter().any(|m| m == model))
        .count()
}

/// Two copies, one behind a queue the gateway did not fill: every request goes to the other
/// copy, and none waits behind the queue. With queue readings off, the gateway's own count
/// (nothing in flight on either) sends requests into the queue.
#[tokio::test]
async fn requests_go_to_the_copy_with_the_shorter_queue() {
    let tritons = [
        Triton::start(TritonOptions::default()).await.unwrap(),
        Triton::start(TritonOptions::default()).await.unwrap(),
    ];
    for (name, queue_max_age, shifted) in [("qa-off", "0s", false), ("qa-on", "5s", true)] {
        let config = pool_config(
            name,
            &[&tritons[0], &tritons[1]],
            "1GiB",
            &format!("scale_up_rps = 0.0\nqueue_max_age = \"{queue_max_age}\""),
            "[[models]]\nname = \"slow_model\"\nmin_copies = 2\n",
        );
        let gateway = TestGateway::start(&config).await;
        support::eventually(Duration::from_secs(60), "two copies", async || {
            placed_on(&gateway, "slow_model").await == 2
        })
        .await;
        // The copy an idle gateway picks is the one the queue goes to.
        let client = reqwest::Client::new();
        let url = format!("{}/v2/models/slow_model/infer", gateway.url());
        let response = client.post(&url).json(&slow_body(0)).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let picked = if served_by(&gateway, &format!("{name}-0")).await > 0 {
            0
        } else {
            1
        };
        let queued = flood(&tritons[picked], 4, 300);
        // Long enough for a health check to read the queue.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let queue_backend = format!("{name}-{picked}");
        let before = served_by(&gateway, &queue_backend).await;
        let mut slowest = Duration::ZERO;
        for _ in 0..10 {
            let started = Instant::now();
            let response = client.post(&url).json(&slow_body(0)).send().await.unwrap();
            assert_eq!(response.status(), 200);
            slowest = slowest.max(started.elapsed());
        }
        let into_queue = served_by(&gateway, &queue_backend).await - before;
        drop(queued);
        if shifted {
            assert_eq!(into_queue, 0, "no request is sent behind the queue");
            assert!(slowest < Duration::from_millis(600), "slowest {slowest:?}");
        } else {
            assert!(
                into_queue > 0,
                "without queue readings the queue is not seen"
            );
        }
    }
}

/// A model whose one copy is backed up by requests the gateway did not send gets a second
/// copy, with scaling by request rate off.
#[tokio::test]
async fn a_backed_up_copy_gets_another() {
    let tritons = [
        Triton::start(TritonOptions::default()).await.unwrap(),
        Triton::start(TritonOptions::default()).await.unwrap(),
    ];
    let config = pool_config(
        "qscale",
        &[&tritons[0], &tritons[1]],
        "1GiB",
        "scale_up_rps = 0.0\nscale_up_queue = 2.0\nrebalance_interval = \"200ms\"",
        "",
    );
    let gateway = TestGateway::start(&config).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v2/models/slow_model/infer", gateway.url());
    let response = client.post(&url).json(&slow_body(0)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(placed_on(&gateway, "slow_model").await, 1);
    let first = gateway
        .placed()
        .await
        .iter()
        .position(|b| b.iter().any(|m| m == "slow_model"))
        .unwrap();
    let _queued = flood(&tritons[first], 5, 300);
    support::eventually(Duration::from_secs(30), "a second copy", async || {
        placed_on(&gateway, "slow_model").await == 2
    })
    .await;
}
