//! Hold, don't fail: a request the pool cannot take right now waits for it (up to
//! `server.ready_wait`, never past the client's deadline) instead of an immediate 503.
//! Against real Triton, started with its default flags after the gateway, as a pod that
//! comes up first or a pool scaled from zero.

mod support;

use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::gateway::{TestGateway, pool_config};
use support::{Triton, TritonOptions};

fn add_sub() -> Value {
    json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}]})
}

/// Two Tritons whose ports are known, stopped: the gateway's config names them before
/// they run.
async fn stopped_tritons() -> (Triton, Triton) {
    let (t0, t1) = tokio::join!(
        Triton::start(TritonOptions::default()),
        Triton::start(TritonOptions::default())
    );
    let (mut t0, mut t1) = (t0.unwrap(), t1.unwrap());
    t0.kill();
    t1.kill();
    (t0, t1)
}

/// p-th percentile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at]
}

/// Sorts the held requests' waits and prints their p50 and p99 (the figures the closing
/// notes give), with what else the test saw.
fn report_waits(waited: &mut [Duration], and: std::fmt::Arguments<'_>) {
    waited.sort();
    println!(
        "held requests: p50 {:?}, p99 {:?}; {and}",
        percentile(waited, 0.5),
        percentile(waited, 0.99),
    );
}

#[tokio::test]
async fn requests_sent_before_the_tritons_start_wait_and_are_served() {
    let (mut t0, mut t1) = stopped_tritons().await;
    let config = pool_config("early", &[&t0, &t1], "1GiB", "", "");
    let gateway = TestGateway::start_unready(&config, None).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v2/models/add_sub/infer", gateway.url());
    let grpc_url = gateway.grpc_url();

    // Eight requests over three seconds (two of them gRPC), while no Triton runs.
    let started = Instant::now();
    let mut sent = Vec::new();
    for i in 0..8 {
        let (client, url, grpc_url) = (client.clone(), url.clone(), grpc_url.clone());
        sent.push(tokio::spawn(async move {
            let at = Instant::now();
            let ok = if i % 4 == 3 {
                let mut grpc = GrpcInferenceServiceClient::connect(grpc_url).await.unwrap();
                let request = support::grpc::fp32_infer(
                    "add_sub",
                    &[("INPUT0", [1.0, 2.0, 3.0, 4.0]), ("INPUT1", [1.0; 4])],
                );
                grpc.model_infer(request)
                    .await
                    .map(drop)
                    .map_err(|s| s.to_string())
            } else {
                let answer = client.post(&url).json(&add_sub()).send().await.unwrap();
                let status = answer.status();
                let body = answer.text().await.unwrap();
                (status == 200)
                    .then_some(())
                    .ok_or(format!("{status} {body}"))
            };
            (ok, at.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(375)).await;
    }
    // The Tritons come up (empty, default flags) after the last request was sent.
    let (r0, r1) = tokio::join!(
        t0.restart(TritonOptions::default()),
        t1.restart(TritonOptions::default())
    );
    r0.unwrap();
    r1.unwrap();
    let mut waited = Vec::new();
    for request in sent {
        let (ok, took) = request.await.unwrap();
        assert!(ok.is_ok(), "a held request failed: {ok:?}");
        assert!(
            took < Duration::from_secs(10),
            "held past ready_wait: {took:?}"
        );
        waited.push(took);
    }
    report_waits(
        &mut waited,
        format_args!("the Tritons up after {:?}", started.elapsed()),
    );
    let metrics = gateway.metrics_text("/metrics").await;
    assert!(
        metrics.contains("infergate_requests_held_total{model=\"add_sub\",outcome=\"served\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_request_is_refused_once_ready_wait_ends_naming_why() {
    let (t0, t1) = stopped_tritons().await;
    let mut config = pool_config("late", &[&t0, &t1], "1GiB", "", "");
    config.push_str("[server]\nready_wait = \"1s\"\n");
    let gateway = TestGateway::start_unready(&config, None).await;
    let started = Instant::now();
    let answer = reqwest::Client::new()
        .post(format!("{}/v2/models/add_sub/infer", gateway.url()))
        .json(&add_sub())
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(answer.status(), 503);
    assert!(answer.headers().contains_key("retry-after"));
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"], "no backend is ready to serve requests");
    assert!(
        (Duration::from_millis(900)..Duration::from_secs(3)).contains(&took),
        "{took:?}"
    );
    // A client's deadline shorter than ready_wait ends the wait first.
    let mut grpc = GrpcInferenceServiceClient::connect(gateway.grpc_url())
        .await
        .unwrap();
    let mut request = tonic::Request::new(support::grpc::fp32_infer(
        "add_sub",
        &[("INPUT0", [1.0; 4]), ("INPUT1", [1.0; 4])],
    ));
    request.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let refused = grpc.model_infer(request).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{refused:?}"
    );
}

/// Scale to zero and back: a warm pool loses every Triton (as a Deployment scaled to zero
/// overnight), requests arrive and wait, and one Triton comes back, empty. Every request is
/// served once it is up, within `ready_wait`, none before; the gateway learns that the copies
/// it had are gone and loads the model again, once.
#[tokio::test]
async fn a_pool_scaled_to_zero_and_back_serves_the_requests_that_waited() {
    let (t0, t1) = tokio::join!(
        Triton::start(TritonOptions::default()),
        Triton::start(TritonOptions::default())
    );
    let (mut t0, mut t1) = (t0.unwrap(), t1.unwrap());
    let config = pool_config("zero", &[&t0, &t1], "1GiB", "", "");
    let gateway = TestGateway::start(&config).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v2/models/add_sub/infer", gateway.url());
    let warm = client.post(&url).json(&add_sub()).send().await.unwrap();
    assert_eq!(warm.status(), 200);

    t0.kill();
    t1.kill();
    let ready = format!("{}/v2/health/ready", gateway.url());
    let gone = Instant::now();
    while client.get(&ready).send().await.unwrap().status() == 200 {
        assert!(
            gone.elapsed() < Duration::from_secs(10),
            "still ready with no Triton"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut sent = Vec::new();
    for _ in 0..6 {
        let (client, url) = (client.clone(), url.clone());
        sent.push(tokio::spawn(async move {
            let at = Instant::now();
            let answer = client.post(&url).json(&add_sub()).send().await.unwrap();
            let status = answer.status();
            let body = answer.text().await.unwrap();
            (status, body, at.elapsed(), Instant::now())
        }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let back = Instant::now();
    t0.restart(TritonOptions::default()).await.unwrap();
    let up = Instant::now();
    let mut waited = Vec::new();
    for request in sent {
        let (status, body, took, answered) = request.await.unwrap();
        assert_eq!(status, 200, "a held request failed: {body}");
        assert!(answered >= back, "answered before any Triton was back");
        assert!(
            took < Duration::from_secs(10),
            "held past ready_wait: {took:?}"
        );
        waited.push(took);
    }
    report_waits(
        &mut waited,
        format_args!("Triton up {:?} after the last was sent", up - back),
    );
    assert_eq!(t0.loaded_models().await.unwrap(), ["add_sub"]);
    let loads = t0.log().matches("loading: add_sub:1").count();
    assert_eq!(
        loads, 1,
        "add_sub loaded {loads} times on the Triton that came back"
    );
}
