//! Placement against real Triton: models load on first request, on one backend, evicted in
//! LRU order within capacity; Triton's index and its python stub processes always match the
//! gateway's books; one load per cold burst; failing loads back off; pinned models stay; a
//! dead backend's models move; versions asked for are loaded, and a newer version on disk
//! replaces "latest" without a failed request.
//!
//! Sizes come from tests/models (scripts/setup.sh pads sized_a/b/c to 1, 2 and 4 MiB): with
//! `size_multiplier = 1.0` their estimates are a little over 1, 2 and 4 MiB.

mod support;

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::gateway::{TestGateway, pool_config, pool_config_in};
use support::{
    Triton, TritonOptions, copy_dir, eventually_every, identity_request, model_repository,
};

async fn empty_triton(verbose: bool) -> Triton {
    Triton::start(TritonOptions {
        verbose,
        ..Default::default()
    })
    .await
    .expect("triton starts")
}

async fn infer(gateway: &TestGateway, model: &str) -> (u16, Value) {
    infer_path(gateway, model).await
}

/// Infers on `model`, or on one version of it (`model/versions/v`).
async fn infer_path(gateway: &TestGateway, model: &str) -> (u16, Value) {
    let (status, _, body) = timed_infer(&gateway.url(), model).await;
    (status, body)
}

/// Triton's READY models, the gateway's books and the stub processes agree, and no backend
/// is over its capacity.
async fn assert_books_match(gateway: &TestGateway, tritons: &[&Triton]) {
    let what = "the books match Triton (books, Triton, stubs)";
    let every = Duration::from_millis(100);
    eventually_every(every, Duration::from_secs(15), what, async || {
        let placed = gateway.placed().await;
        let mut loaded = Vec::new();
        for triton in tritons {
            let mut models = triton.loaded_models().await.unwrap();
            models.sort();
            loaded.push(models);
        }
        let stubs: Vec<usize> = tritons.iter().map(|t| t.stub_count()).collect();
        let counts: Vec<usize> = loaded.iter().map(Vec::len).collect();
        if placed == loaded && stubs == counts {
            Ok(())
        } else {
            Err((placed, loaded, stubs))
        }
    })
    .await;
    for backend in gateway.placement().await["backends"].as_array().unwrap() {
        let (used, capacity) = (
            backend["used"].as_u64().unwrap(),
            backend["capacity"].as_u64().unwrap(),
        );
        assert!(used <= capacity, "{backend}");
    }
}

fn triton_load_calls(triton: &Triton, model: &str) -> usize {
    triton
        .log()
        .matches(&format!(
            "HTTP request: 2 /v2/repository/models/{model}/load"
        ))
        .count()
}

#[tokio::test]
async fn a_cold_request_loads_exactly_one_model_on_one_backend() {
    let (t0, t1) = tokio::join!(empty_triton(false), empty_triton(false));
    let gateway = TestGateway::start(&pool_config("cold", &[&t0, &t1], "1GiB", "", "")).await;
    assert_books_match(&gateway, &[&t0, &t1]).await;
    assert_eq!(
        t0.stub_count() + t1.stub_count(),
        0,
        "nothing loaded before it is asked for"
    );

    let (status, body) = infer(&gateway, "sized_a").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outputs"][0]["data"], json!([1.0, 2.0, 3.0, 4.0]));
    let placed = gateway.placed().await;
    assert_eq!(placed.concat(), ["sized_a"], "{placed:?}");
    assert_books_match(&gateway, &[&t0, &t1]).await;

    // Served warm from then on, no second copy.
    for _ in 0..5 {
        assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    }
    assert_eq!(gateway.placed().await.concat(), ["sized_a"]);
    let placement = gateway.placement().await;
    let copy = placement["backends"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["models"].as_array().unwrap().clone())
        .next()
        .unwrap();
    assert_eq!(copy["size_source"], "disk");
    assert!(copy["size"].as_u64().unwrap() > 1 << 20, "{copy}");

    // A model no backend's repository has is not loaded anywhere.
    let (status, body) = infer(&gateway, "no_such_model").await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test]
async fn filling_the_pool_evicts_least_recently_used_within_capacity() {
    let t0 = empty_triton(false).await;
    let gateway = TestGateway::start(&pool_config(
        "lru",
        &[&t0],
        "6.5MiB",
        "mem_buffer = \"0\"\nsize_multiplier = 1.0\nmin_churn_age = \"0s\"",
        "",
    ))
    .await;
    // a (1 MiB) and b (2 MiB) fit; a is then used again, so b is least recently used.
    assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    assert_eq!(infer(&gateway, "sized_b").await.0, 200);
    assert_books_match(&gateway, &[&t0]).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    // c (4 MiB) needs b's room, not a's.
    assert_eq!(infer(&gateway, "sized_c").await.0, 200);
    assert_eq!(gateway.placed().await, [["sized_a", "sized_c"]]);
    assert_books_match(&gateway, &[&t0]).await;
    // b again: a is the least recently used, and evicting it makes room.
    assert_eq!(infer(&gateway, "sized_b").await.0, 200);
    assert_eq!(gateway.placed().await, [["sized_b", "sized_c"]]);
    assert_books_match(&gateway, &[&t0]).await;

    let metrics = gateway.metrics_text("/metrics").await;
    let evictions = support::metric_sum(
        &metrics,
        "infergate_placement_evictions_total",
        &["{backend=\"lru-0\"}"],
    );
    assert_eq!(evictions, 2.0, "{metrics}");
}

#[tokio::test]
async fn a_hundred_concurrent_cold_requests_cause_one_load() {
    let (t0, t1) = tokio::join!(empty_triton(true), empty_triton(true));
    // No scaling: exactly one load is the point here.
    let gateway = TestGateway::start(&pool_config(
        "burst",
        &[&t0, &t1],
        "1GiB",
        "scale_up_rps = 0.0",
        "",
    ))
    .await;
    let url = format!("{}/v2/models/sized_b/infer", gateway.url());
    let client = reqwest::Client::new();
    let requests = (0..100).map(|_| {
        let client = client.clone();
        let url = url.clone();
        async move {
            client
                .post(url)
                .json(&identity_request())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    let statuses = futures_util::future::join_all(requests).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(
        triton_load_calls(&t0, "sized_b") + triton_load_calls(&t1, "sized_b"),
        1
    );
    assert_books_match(&gateway, &[&t0, &t1]).await;
}

#[tokio::test]
async fn a_failing_model_is_tried_elsewhere_then_refused_with_backoff() {
    let (t0, t1) = tokio::join!(empty_triton(true), empty_triton(true));
    let gateway = TestGateway::start(&pool_config(
        "failing",
        &[&t0, &t1],
        "1GiB",
        "load_failure_backoff = \"30s\"",
        "",
    ))
    .await;
    let (status, body) = infer(&gateway, "failing_model").await;
    assert_eq!(status, 503, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.starts_with("model 'failing_model' failed to load:"),
        "{error}"
    );
    assert!(
        error.contains("initialize always fails"),
        "Triton's message is kept: {error}"
    );
    assert_eq!(
        triton_load_calls(&t0, "failing_model"),
        1,
        "tried on each backend once"
    );
    assert_eq!(triton_load_calls(&t1, "failing_model"), 1);

    // Backing off: refused at once, without another load, with a Retry-After.
    let started = Instant::now();
    let (status, body) = infer(&gateway, "failing_model").await;
    assert_eq!(status, 503);
    assert!(started.elapsed() < Duration::from_millis(500));
    let retry_after: u64 = body["retry_after"].as_str().unwrap().parse().unwrap();
    assert!((20..=30).contains(&retry_after), "{body}");
    assert_eq!(
        triton_load_calls(&t0, "failing_model") + triton_load_calls(&t1, "failing_model"),
        2
    );

    let failed = &gateway.placement().await["failed_loads"];
    assert_eq!(failed.as_array().unwrap().len(), 2, "{failed}");
    // Other models are unaffected.
    assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    assert_books_match(&gateway, &[&t0, &t1]).await;
}

#[tokio::test]
async fn churn_guard_answers_503_instead_of_evicting_a_model_in_use() {
    let t0 = empty_triton(false).await;
    let gateway = TestGateway::start(&pool_config(
        "churn",
        &[&t0],
        "5MiB",
        "mem_buffer = \"0\"\nsize_multiplier = 1.0\nmin_churn_age = \"60s\"",
        "",
    ))
    .await;
    assert_eq!(infer(&gateway, "sized_c").await.0, 200);
    let (status, body) = infer(&gateway, "sized_b").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("recently used"),
        "{body}"
    );
    let retry_after: u64 = body["retry_after"].as_str().unwrap().parse().unwrap();
    assert!((50..=60).contains(&retry_after), "{body}");
    assert_eq!(gateway.placed().await, [["sized_c"]]);
    assert_books_match(&gateway, &[&t0]).await;
}

/// Room for one model at a time (each is 3 MiB by `[[models]] size`, the backend holds 5):
/// what waiting for room (`placement.room_wait`) needs to show.
fn one_at_a_time(name: &str, triton: &Triton, room_wait: &str) -> String {
    let models: String = ["slow_model", "sized_a", "sized_b"]
        .iter()
        .map(|m| format!("[[models]]\nname = \"{m}\"\nsize = \"3MiB\"\n"))
        .collect();
    let placement = format!(
        "mem_buffer = \"0\"\nmin_churn_age = \"0s\"\nscale_up_rps = 0.0\nroom_wait = \"{room_wait}\""
    );
    pool_config(name, &[triton], "5MiB", &placement, &models)
}

/// Sends slow_model a request that sleeps `delay_ms` there, and returns once the gateway
/// counts it in flight on its copy: from then on the only backend's memory is in use.
async fn hold_the_backend(gateway: &TestGateway, delay_ms: u64) -> tokio::task::JoinHandle<u16> {
    let url = format!("{}/v2/models/slow_model/infer", gateway.url());
    let slow = tokio::spawn(async move {
        let body = json!({"parameters": {"delay_ms": delay_ms},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]});
        let response = reqwest::Client::new().post(url).json(&body).send().await;
        response.unwrap().status().as_u16()
    });
    let every = Duration::from_millis(20);
    eventually_every(
        every,
        Duration::from_secs(20),
        "slow_model busy",
        async || {
            let placement = gateway.placement().await;
            let busy = placement["backends"][0]["models"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == "slow_model" && m["in_flight"] == 1);
            if busy { Ok(()) } else { Err(placement) }
        },
    )
    .await;
    slow
}

/// A cold request that finds the only backend's memory held by a copy in use for a few
/// seconds waits for it (`placement.room_wait`) instead of an immediate 503: it is placed
/// as soon as that request lets go, and a second waiter is placed after the first, in the
/// order they came. With a wait shorter than the copy stays busy, the answer is 503 with
/// Retry-After once the wait is over, not before. A gRPC deadline ends the wait sooner, with
/// DEADLINE_EXCEEDED, and the request leaves the queue: it is never placed after its client
/// has gone.
#[tokio::test]
async fn a_cold_request_waits_for_room_in_arrival_order_then_is_refused() {
    let t0 = empty_triton(true).await;
    let gateway = TestGateway::start(&one_at_a_time("roomwait", &t0, "15s")).await;
    let slow = hold_the_backend(&gateway, 2000).await;
    let started = Instant::now();
    let first = tokio::spawn({
        let gateway_url = gateway.url();
        async move { timed_infer(&gateway_url, "sized_a").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = tokio::spawn({
        let gateway_url = gateway.url();
        async move { timed_infer(&gateway_url, "sized_b").await }
    });
    let slow_done = {
        assert_eq!(slow.await.unwrap(), 200);
        started.elapsed()
    };
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!((first.0, second.0), (200, 200), "{first:?} {second:?}");
    assert!(first.1 > slow_done, "placed only once slow_model let go");
    assert!(
        first.1 < second.1,
        "first come, first placed: {first:?} {second:?}"
    );
    assert_eq!(
        gateway
            .metric_sum("infergate_placement_room_waits_total", &["placed"])
            .await,
        2.0
    );
    assert_eq!(gateway.placed().await, [["sized_b"]]);
    assert_books_match(&gateway, &[&t0]).await;
    drop(gateway);

    // The same with a wait of 500 ms while slow_model is busy for 3 s more.
    let gateway = TestGateway::start(&one_at_a_time("roomshort", &t0, "500ms")).await;
    let slow = hold_the_backend(&gateway, 3000).await;
    let (status, took, body) = timed_infer(&gateway.url(), "sized_a").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        took >= Duration::from_millis(500),
        "refused before its wait: {took:?}"
    );
    assert!(
        took < Duration::from_millis(2500),
        "waited past room_wait: {took:?}"
    );
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("no backend has room"),
        "{body}"
    );
    assert_eq!(body["retry_after"], "1", "{body}");
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(
        gateway
            .metric_sum("infergate_placement_room_waits_total", &["refused"])
            .await,
        1.0
    );
    drop(gateway);

    // A long wait, and a gRPC client whose deadline comes first.
    let gateway = TestGateway::start(&one_at_a_time("roomgrpc", &t0, "15s")).await;
    let slow = hold_the_backend(&gateway, 2500).await;
    let loads_of_a = triton_load_calls(&t0, "sized_a");
    // By hand, not with a gRPC client: the only timer is the grpc-timeout header, so what
    // ends the wait is the gateway's.
    let message = support::grpc::fp32_infer("sized_a", &[("INPUT0", [1.0, 2.0, 3.0, 4.0])]);
    let asked = Instant::now();
    let refused = support::grpc::raw_unary(
        gateway.grpc,
        "ModelInfer",
        &message,
        &[("grpc-timeout", "700m")],
    )
    .await;
    assert_eq!(
        refused.status, "4",
        "DEADLINE_EXCEEDED: {}",
        refused.message
    );
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_millis(2000),
        "{took:?}"
    );
    assert!(
        refused
            .message
            .starts_with("deadline exceeded: the client's deadline of"),
        "{}",
        refused.message
    );
    // Placement ended the wait at the deadline itself (counted so), not only the call's
    // timer dropping it.
    assert_eq!(
        gateway
            .metric_sum("infergate_placement_room_waits_total", &["deadline"])
            .await,
        1.0
    );
    // The next waiter gets the room when slow_model lets go: the one that went is not placed.
    let (status, _, body) = timed_infer(&gateway.url(), "sized_b").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(
        triton_load_calls(&t0, "sized_a"),
        loads_of_a,
        "placed after its deadline"
    );
    assert_eq!(gateway.placed().await, [["sized_b"]]);
}

/// One inference on `model` at the gateway `url`: status, time taken, body (with the
/// Retry-After header as `retry_after`).
async fn timed_infer(url: &str, model: &str) -> (u16, Duration, Value) {
    let started = Instant::now();
    let response = support::infer_post(&reqwest::Client::new(), url, model, &identity_request())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").cloned();
    let mut body: Value = response.json().await.unwrap_or(Value::Null);
    if let Some(value) = retry_after {
        body["retry_after"] = json!(value.to_str().unwrap());
    }
    (status, started.elapsed(), body)
}

#[tokio::test]
async fn a_pinned_model_is_loaded_at_start_and_never_evicted() {
    let t0 = empty_triton(false).await;
    let gateway = TestGateway::start(&pool_config(
        "pinned",
        &[&t0],
        "7MiB",
        "mem_buffer = \"0\"\nsize_multiplier = 1.0\nmin_churn_age = \"0s\"",
        "[[models]]\nname = \"sized_c\"\nmin_copies = 1\n",
    ))
    .await;
    eventually_every(
        Duration::from_millis(100),
        Duration::from_secs(60),
        "the pinned model loaded at start",
        async || gateway.placed().await == [["sized_c"]],
    )
    .await;
    assert_eq!(infer(&gateway, "sized_b").await.0, 200);
    // sized_a does not fit beside both; only sized_b may make room.
    assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    assert_eq!(gateway.placed().await, [["sized_a", "sized_c"]]);
    // Nothing can make room for a second 4 MiB model but the pinned one: refused.
    let (status, body) = infer(&gateway, "sized_c_twin").await;
    assert!(status == 404 || status == 503, "{body}");
    assert_books_match(&gateway, &[&t0]).await;
    let pinned = gateway.placement().await["backends"][0]["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "sized_c")
        .unwrap()["pinned"]
        .clone();
    assert_eq!(pinned, true);
}

#[tokio::test]
async fn a_dead_backends_models_reload_on_the_other() {
    let (mut t0, mut t1) = tokio::join!(empty_triton(false), empty_triton(false));
    let gateway = TestGateway::start(&pool_config("dead", &[&t0, &t1], "1GiB", "", "")).await;
    assert_eq!(
        infer(&gateway, "add_sub_int").await.0,
        400,
        "wrong datatype is Triton's 400"
    );
    assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    let holder = gateway
        .placed()
        .await
        .iter()
        .position(|m| m.contains(&"sized_a".to_string()))
        .unwrap();
    if holder == 0 {
        t0.kill()
    } else {
        t1.kill()
    }

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut failures = Vec::new();
    let mut last: (u16, Value);
    loop {
        let (status, body) = infer(&gateway, "sized_a").await;
        last = (status, body.clone());
        match status {
            200 => {
                let placed = gateway.placed().await;
                if placed[1 - holder].contains(&"sized_a".to_string()) {
                    break;
                }
            }
            _ => failures.push((status, body)),
        }
        assert!(
            Instant::now() < deadline,
            "sized_a never moved: last answer {last:?}, books {:?}",
            gateway.placed().await
        );
    }
    // The dead backend refuses connections: each request it had is placed again.
    assert!(
        failures.is_empty(),
        "failed requests while the backend died: {failures:?}"
    );
    let survivor = if holder == 0 { &t1 } else { &t0 };
    assert!(
        survivor
            .loaded_models()
            .await
            .unwrap()
            .contains(&"sized_a".to_string())
    );
    assert!(gateway.placed().await[holder].is_empty());
}

/// Where a copy of `model` is on the books: (backend index, state) for each.
async fn copies_of(gateway: &TestGateway, model: &str) -> Vec<(usize, String)> {
    gateway.placement().await["backends"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .flat_map(|(b, backend)| {
            backend["models"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["name"] == model)
                .map(move |m| (b, m["state"].as_str().unwrap().to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Triton with its default flags answers `/v2/health/ready` with 400 while any model loads,
/// and a busy Triton may answer nothing for seconds while it loads (on this project's 2-core
/// machines index reads took 1–3.5 s during the churn test's loads). Neither is a backend
/// that is down: the gateway's own load must not cost the backend its place in the pool,
/// or the next request for the loading model would load a second copy elsewhere. The
/// stall is made certain by pausing the loading Triton for three health timeouts. The model
/// takes 1.5 s to load, so the load is still under way when the test reads readiness.
#[tokio::test]
async fn a_load_in_progress_never_costs_a_backend_its_place() {
    let (t0, t1) = tokio::join!(empty_triton(true), empty_triton(true));
    let config = pool_config("busy", &[&t0, &t1], "1GiB", "scale_up_rps = 0.0", "")
        .replace("health_timeout = \"3s\"", "health_timeout = \"300ms\"");
    let gateway = std::sync::Arc::new(TestGateway::start(&config).await);
    let first = tokio::spawn({
        let gateway = gateway.clone();
        async move { infer(&gateway, "slow_load").await }
    });
    let loading = eventually_every(
        Duration::from_millis(10),
        Duration::from_secs(10),
        "slow_load loading",
        async || match &copies_of(&gateway, "slow_load").await[..] {
            [(b, state)] if state == "loading" => Some(*b),
            _ => None,
        },
    )
    .await;
    let tritons = [&t0, &t1];
    // Loading, with Triton's default flags: not ready, as Triton says, but live.
    let ready = reqwest::get(format!("{}/v2/health/ready", tritons[loading].http_url()))
        .await
        .unwrap()
        .status();
    assert_eq!(ready, 400, "Triton's strict readiness while a model loads");
    tritons[loading].pause();
    let stalled = Instant::now();
    let mut seen_unready = Vec::new();
    while stalled.elapsed() < Duration::from_millis(900) {
        for backend in gateway.admin_backends().await {
            if backend["ready"] == false {
                seen_unready.push(backend["name"].to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A request for the model arrives meanwhile: it waits for the load under way.
    let second = tokio::spawn({
        let gateway = gateway.clone();
        async move { infer(&gateway, "slow_load").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    tritons[loading].resume();
    for request in [first, second] {
        let (status, body) = request.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    assert!(
        seen_unready.is_empty(),
        "a backend was taken out while loading: {seen_unready:?}"
    );
    assert_eq!(
        copies_of(&gateway, "slow_load").await,
        [(loading, "ready".to_string())],
        "one copy, where it was loading"
    );
    assert_books_match(&gateway, &tritons).await;
    assert_eq!(triton_load_calls(tritons[loading], "slow_load"), 1);
    assert_eq!(
        triton_load_calls(tritons[1 - loading], "slow_load"),
        0,
        "no second copy was loaded elsewhere"
    );
}

/// The last line of defence: a copy unloaded behind the gateway's back (here straight on
/// Triton, before reconciliation could notice) is refused by Triton with 404 "has no
/// available versions" before any work. The gateway drops that copy, places the request
/// again (loading the model anew) and sends it once more, body and all, over HTTP and gRPC.
#[tokio::test]
async fn a_request_for_a_copy_that_is_gone_is_placed_again() {
    let t0 = empty_triton(false).await;
    // Reconciliation stays out of it: only the request finds out.
    let gateway = TestGateway::start(&pool_config(
        "gone",
        &[&t0],
        "1GiB",
        "reconcile_interval = \"1h\"",
        "",
    ))
    .await;
    let request = json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4],
        "data": [5, 6, 7, 8]}]});
    let http = |model: &'static str| {
        let url = format!("{}/v2/models/{model}/infer", gateway.url());
        let request = request.clone();
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .json(&request)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    assert_eq!(http("sized_a").await.0, 200);
    t0.unload_model("sized_a").await.unwrap();
    let (status, body) = http("sized_a").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outputs"][0]["data"], json!([5.0, 6.0, 7.0, 8.0]));
    assert_eq!(
        gateway
            .metric_sum("infergate_placement_stale_copies_total", &["gone-0"])
            .await,
        1.0
    );
    assert_eq!(loads(&gateway, "new", "success", "gone-").await, 2.0);

    use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    let mut grpc = GrpcInferenceServiceClient::connect(gateway.grpc_url())
        .await
        .unwrap();
    let message = support::grpc::fp32_infer("sized_b", &[("INPUT0", [1.0, 2.0, 3.0, 4.0])]);
    grpc.model_infer(message.clone()).await.unwrap();
    t0.unload_model("sized_b").await.unwrap();
    let answer = grpc
        .model_infer(message)
        .await
        .expect("placed again")
        .into_inner();
    assert_eq!(
        answer.raw_output_contents[0],
        message_bytes([1.0, 2.0, 3.0, 4.0])
    );
    assert_eq!(
        gateway
            .metric_sum("infergate_placement_stale_copies_total", &["gone-0"])
            .await,
        2.0
    );
    assert_books_match(&gateway, &[&t0]).await;
}

fn message_bytes(values: [f32; 4]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[tokio::test]
async fn a_models_size_is_learned_from_the_backends_memory_metric() {
    let t0 = empty_triton(false).await;
    let stub = support::gpu_memory_stub(t0.http_url()).await;
    let config = pool_config("learn", &[&t0], "16GiB", "", "")
        .replace(&t0.metrics_url(), &format!("http://{stub}/metrics"));
    let gateway = TestGateway::start(&config).await;
    assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    let placement = gateway.placement().await;
    let copy = &placement["backends"][0]["models"][0];
    assert_eq!(copy["name"], "sized_a");
    assert_eq!(copy["size_source"], "learned", "{copy}");
    assert_eq!(copy["size"], 3u64 << 30);
    // Statistics come first, where the backend reports the model's memory; the python
    // backend reports none, so the size is the metric's.
    let stats = t0.model_stats("sized_a").await;
    assert_eq!(
        stats["model_stats"][0]["memory_usage"],
        json!([]),
        "{stats}"
    );
    assert_eq!(placement["backends"][0]["used"], 3u64 << 30);
    // The learned size outlives an unload: the next load is placed by it.
    let unloaded: Value = reqwest::Client::new()
        .post(format!(
            "http://{}/admin/models/sized_a/unload",
            gateway.admin
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(unloaded["unloaded_copies"], 1);
    assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    assert_eq!(
        gateway.placement().await["backends"][0]["models"][0]["size"],
        3u64 << 30
    );
}

/// Where the backend reports a model's memory in its statistics (`memory_usage`, as ONNX
/// Runtime and TensorRT do on GPUs; here a front for the real Triton adds it, 5 GiB), that
/// is the size learned, even though the memory metric rose by another amount (3 GiB).
#[tokio::test]
async fn a_models_size_reported_in_its_statistics_comes_before_the_metric() {
    let t0 = empty_triton(false).await;
    let (front, metrics) = tokio::join!(
        support::reporting_memory(t0.http_url(), 5 << 30),
        support::gpu_memory_stub(t0.http_url())
    );
    let config = pool_config("reported", &[&t0], "16GiB", "", "")
        .replace(&t0.http_url(), &format!("http://{front}"))
        .replace(&t0.metrics_url(), &format!("http://{metrics}/metrics"));
    let gateway = TestGateway::start(&config).await;
    assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    let placement = gateway.placement().await;
    let copy = &placement["backends"][0]["models"][0];
    assert_eq!(copy["name"], "sized_a");
    assert_eq!(copy["size_source"], "reported", "{copy}");
    assert_eq!(copy["size"], 5u64 << 30);
    assert_eq!(placement["backends"][0]["used"], 5u64 << 30);
}

/// A model directory `name` under `repo`: sized_a's identity model, or (`out_of_memory`) one
/// whose initialize asks NumPy for 1 PiB, more than any machine has, so Triton's load fails
/// with a real MemoryError, as a model too big for a GPU's free memory does.
fn hungry_model(repo: &std::path::Path, name: &str, out_of_memory: bool) {
    let dir = repo.join(name);
    copy_dir(&model_repository().join("sized_a"), &dir);
    let config = std::fs::read_to_string(dir.join("config.pbtxt")).unwrap();
    std::fs::write(
        dir.join("config.pbtxt"),
        config.replace("name: \"sized_a\"", &format!("name: \"{name}\"")),
    )
    .unwrap();
    std::fs::remove_file(dir.join("1/weights.bin")).ok();
    if out_of_memory {
        std::fs::write(
            dir.join("1/model.py"),
            "import numpy as np\n\n\nclass TritonPythonModel:\n    def initialize(self, args):\n        \
             self.weights = np.empty(1 << 50, dtype=np.uint8)\n\n    def execute(self, requests):\n        \
             raise RuntimeError(\"unreachable\")\n",
        )
        .unwrap();
    }
}

/// A load that fails for lack of memory raises the model's estimate before the retry, so the
/// retry goes where the larger size fits. Backends 0 and 1 run out of memory loading
/// `hungry`; backend 2 loads it, once `filler` (only it has that model) is evicted. `hungry`
/// is estimated at `default_model_size`, 1 GiB: backend 0 has the most room, and fails. The
/// estimate doubles to 2 GiB, which backend 1 (1.5 GiB) cannot hold, so the retry goes to
/// backend 2. With the estimate left at 1 GiB the retry would go to backend 1 (more free
/// room than backend 2) and fail again there.
#[tokio::test]
async fn a_load_out_of_memory_raises_the_estimate_before_the_retry() {
    let small = tempfile::tempdir().unwrap();
    let roomy = tempfile::tempdir().unwrap();
    hungry_model(small.path(), "hungry", true);
    hungry_model(roomy.path(), "hungry", false);
    hungry_model(roomy.path(), "filler", false);
    let start = |repo: &std::path::Path| {
        Triton::start(TritonOptions {
            verbose: true,
            repository: Some(repo.to_path_buf()),
            ..Default::default()
        })
    };
    let (t0, t1, t2) = tokio::join!(
        start(small.path()),
        start(small.path()),
        start(roomy.path())
    );
    let (t0, t1, t2) = (t0.unwrap(), t1.unwrap(), t2.unwrap());
    let nowhere = tempfile::tempdir().unwrap();
    let mut config = pool_config_in(
        nowhere.path(),
        "oom",
        &[&t0, &t1, &t2],
        "CAPACITY",
        "mem_buffer = \"0\"\nmin_churn_age = \"0s\"\nscale_up_rps = 0.0\ndefault_model_size = \"1GiB\"",
        "[[models]]\nname = \"filler\"\nsize = \"2GiB\"\n",
    );
    for capacity in ["4GiB", "1536MiB", "3GiB"] {
        config = config.replacen("\"CAPACITY\"", &format!("\"{capacity}\""), 1);
    }
    let gateway = TestGateway::start(&config).await;
    assert_eq!(infer(&gateway, "filler").await.0, 200);
    assert_eq!(gateway.placed().await, [vec![], vec![], vec!["filler"]]);

    let (status, body) = infer(&gateway, "hungry").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(triton_load_calls(&t0, "hungry"), 1);
    assert_eq!(
        triton_load_calls(&t1, "hungry"),
        0,
        "no retry where 2 GiB cannot fit"
    );
    assert_eq!(triton_load_calls(&t2, "hungry"), 1);
    let placement = gateway.placement().await;
    let copy = &placement["backends"][2]["models"][0];
    assert_eq!(copy["name"], "hungry", "{placement}");
    assert_eq!(copy["size"], 2u64 << 30, "{copy}");
    assert_eq!(copy["size_source"], "learned_from_failure", "{copy}");
    let failed = placement["failed_loads"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{placement}");
    assert_eq!(failed[0]["backend"], "oom-0");
    let error = failed[0]["error"].as_str().unwrap();
    assert!(
        error.contains("MemoryError: Unable to allocate"),
        "Triton's words: {error}"
    );
    assert_books_match(&gateway, &[&t0, &t1, &t2]).await;
}

#[tokio::test]
async fn a_busy_model_gets_a_second_copy_and_loses_it_when_idle() {
    let (t0, t1) = tokio::join!(empty_triton(false), empty_triton(false));
    let gateway = TestGateway::start(&pool_config(
        "scale",
        &[&t0, &t1],
        "1GiB",
        "scale_up_rps = 5.0\nmax_copies = 2\nscale_down_idle = \"2s\"\nrebalance_interval = \"500ms\"",
        "",
    ))
    .await;
    // Steady traffic well above 5 requests/s for one copy.
    let deadline = Instant::now() + Duration::from_secs(15);
    while gateway
        .placed()
        .await
        .iter()
        .filter(|m| m.contains(&"sized_a".to_string()))
        .count()
        < 2
    {
        for _ in 0..10 {
            assert_eq!(infer(&gateway, "sized_a").await.0, 200);
        }
        assert!(Instant::now() < deadline, "no second copy under load");
    }
    assert_eq!(gateway.placed().await, [["sized_a"], ["sized_a"]]);
    assert_books_match(&gateway, &[&t0, &t1]).await;
    // Both copies serve.
    for _ in 0..20 {
        assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    }
    // Idle: back to one copy, and one stub process.
    let deadline = Instant::now() + Duration::from_secs(15);
    while gateway.placed().await.concat().len() != 1 {
        assert!(Instant::now() < deadline, "extra copy never unloaded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_books_match(&gateway, &[&t0, &t1]).await;
    // Triton stops the unloaded copy's stub process on its own time.
    while t0.stub_count() + t1.stub_count() != 1 {
        assert!(
            Instant::now() < deadline,
            "the extra copy's stub process stays"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn draining_a_backend_moves_its_pinned_models_and_places_nothing_new_there() {
    let (t0, t1) = tokio::join!(empty_triton(false), empty_triton(false));
    let gateway = TestGateway::start(&pool_config(
        "drain",
        &[&t0, &t1],
        "1GiB",
        "",
        "[[models]]\nname = \"sized_c\"\nmin_copies = 1\n",
    ))
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let ready = |placement: Value| {
        placement["backends"].as_array().unwrap().iter().any(|b| {
            b["models"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == "sized_c" && m["state"] == "ready")
        })
    };
    while !ready(gateway.placement().await) {
        assert!(
            Instant::now() < deadline,
            "pinned model not loaded at start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let holder = gateway
        .placed()
        .await
        .iter()
        .position(|m| !m.is_empty())
        .unwrap();
    let name = format!("drain-{holder}");
    let answer: Value = reqwest::Client::new()
        .post(format!(
            "http://{}/admin/backends/{name}/drain",
            gateway.admin
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["draining"], true);
    let placed = gateway.placed().await;
    assert!(placed[holder].is_empty(), "{placed:?}");
    assert_eq!(placed[1 - holder], ["sized_c"]);
    // New models go elsewhere while it drains.
    assert_eq!(infer(&gateway, "sized_a").await.0, 200);
    assert_eq!(infer(&gateway, "sized_b").await.0, 200);
    assert!(gateway.placed().await[holder].is_empty());
    assert_eq!(
        gateway.placement().await["backends"][holder]["draining"],
        true
    );
    let tritons = [&t0, &t1];
    assert_books_match(&gateway, &tritons).await;
    // An unknown backend is a clear 404.
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/admin/backends/nope/drain",
            gateway.admin
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

/// Each backend's books agree with its Triton version by version: the books' (model, versions)
/// are the READY rows of Triton's index, one python stub runs per READY version, and no
/// backend is over its capacity.
async fn assert_versions_match(gateway: &TestGateway, tritons: &[&Triton]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let placed = gateway.placed_versions().await;
        let mut indexed = Vec::new();
        let mut stubs_match = true;
        for triton in tritons {
            let rows = triton.ready_versions().await.unwrap();
            stubs_match &= triton.stub_count() == rows.len();
            let mut copies: Vec<(String, Vec<u64>)> = Vec::new();
            for (name, version) in rows {
                match copies.last_mut() {
                    Some((last, versions)) if *last == name => versions.push(version),
                    _ => copies.push((name, vec![version])),
                }
            }
            indexed.push(copies);
        }
        if placed == indexed && stubs_match {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "books {placed:?} vs Triton {indexed:?} (stubs match: {stubs_match})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for backend in gateway.placement().await["backends"].as_array().unwrap() {
        let sizes: u64 = backend["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["size"].as_u64().unwrap())
            .sum();
        assert_eq!(sizes, backend["used"].as_u64().unwrap(), "{backend}");
        assert!(
            backend["used"].as_u64() <= backend["capacity"].as_u64(),
            "{backend}"
        );
    }
}

/// The version that answered and its first output (INPUT0[0] = 1, plus 100 × version).
/// Inference requests to one model path, one after another until stopped: what a client
/// sees while placement changes the model under it.
struct InferLoop {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(u16, String, Value)>>,
}

impl InferLoop {
    fn start(gateway: &TestGateway, path: &str) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let url = format!("{}/v2/models/{path}/infer", gateway.url());
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let client = reqwest::Client::new();
                let mut answers = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let response = client
                        .post(&url)
                        .json(&identity_request())
                        .send()
                        .await
                        .unwrap();
                    let status = response.status().as_u16();
                    let body: Value = response.json().await.unwrap_or(Value::Null);
                    answers.push((status, answered_by(&body).0, body));
                }
                answers
            }
        });
        Self { stop, task }
    }

    /// Each answer: status, the version that answered, the body.
    async fn stop(self) -> Vec<(u16, String, Value)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

fn answered_by(body: &Value) -> (String, f64) {
    (
        body["model_version"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        body["outputs"][0]["data"][0].as_f64().unwrap_or_default(),
    )
}

/// The sum of `infergate_placement_loads_total` for a reason and result.
async fn loads(gateway: &TestGateway, reason: &str, result: &str, backend_prefix: &str) -> f64 {
    let filters = [
        format!("backend=\"{backend_prefix}"),
        format!("reason=\"{reason}\""),
        format!("result=\"{result}\""),
    ];
    let filters: Vec<&str> = filters.iter().map(String::as_str).collect();
    gateway
        .metric_sum("infergate_placement_loads_total", &filters)
        .await
}

#[tokio::test]
async fn each_version_asked_for_is_loaded_where_the_model_is_not() {
    let (t0, t1) = tokio::join!(empty_triton(false), empty_triton(false));
    let gateway = TestGateway::start(&pool_config(
        "versions2",
        &[&t0, &t1],
        "1GiB",
        "scale_up_rps = 0.0",
        "",
    ))
    .await;
    let (status, body) = infer_path(&gateway, "versioned/versions/1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(answered_by(&body), ("1".into(), 101.0));
    let (status, body) = infer_path(&gateway, "versioned/versions/2").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(answered_by(&body), ("2".into(), 201.0));
    // One copy per backend, each loaded for its version alone.
    let mut placed = gateway.placed_versions().await.concat();
    placed.sort();
    assert_eq!(
        placed,
        [("versioned".into(), vec![1]), ("versioned".into(), vec![2])]
    );
    assert_versions_match(&gateway, &[&t0, &t1]).await;
    // Each keeps answering for its version.
    for version in ["1", "2"] {
        let (status, body) = infer_path(&gateway, &format!("versioned/versions/{version}")).await;
        assert_eq!((status, answered_by(&body).0), (200, version.to_string()));
    }
    // A version the repository does not have is refused without a load, as Triton refuses
    // a version it does not have.
    let (status, body) = infer_path(&gateway, "versioned/versions/9").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(loads(&gateway, "new", "success", "versions2-").await, 2.0);
    assert_eq!(loads(&gateway, "new", "failure", "versions2-").await, 0.0);
}

#[tokio::test]
async fn a_second_version_on_the_only_backend_is_loaded_beside_the_first() {
    let t0 = empty_triton(false).await;
    let gateway = TestGateway::start(&pool_config(
        "versions1",
        &[&t0],
        "1GiB",
        "size_multiplier = 1.0",
        "",
    ))
    .await;
    let (status, body) = infer_path(&gateway, "versioned/versions/1").await;
    assert_eq!(
        (status, answered_by(&body)),
        (200, ("1".into(), 101.0)),
        "{body}"
    );
    let one_version = gateway.placement().await["backends"][0]["models"][0]["size"]
        .as_u64()
        .unwrap();
    // Version 1 is asked for without pause while version 2 is loaded beside it.
    let looping = InferLoop::start(&gateway, "versioned/versions/1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, body) = infer_path(&gateway, "versioned/versions/2").await;
    assert_eq!(
        (status, answered_by(&body)),
        (200, ("2".into(), 201.0)),
        "{body}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answers = looping.stop().await;
    assert!(answers.len() > 5, "{answers:?}");
    assert!(
        answers.iter().all(|a| (a.0, a.1.as_str()) == (200, "1")),
        "version 1 kept answering while 2 loaded: {answers:?}"
    );
    assert_eq!(
        gateway.placed_versions().await,
        [[("versioned".into(), vec![1, 2])]]
    );
    assert_versions_match(&gateway, &[&t0]).await;
    let copy = &gateway.placement().await["backends"][0]["models"][0];
    assert!(
        copy["size"].as_u64().unwrap() > one_version,
        "counts both versions: {copy}"
    );
    assert_eq!(copy["latest"], false);
    assert_eq!(
        loads(&gateway, "version", "success", "versions1-").await,
        1.0
    );
    // Without a version, Triton's newest loaded version answers: 2 is also the newest on disk.
    let (status, body) = infer_path(&gateway, "versioned").await;
    assert_eq!(
        (status, answered_by(&body).0),
        (200, "2".to_string()),
        "{body}"
    );
    assert_versions_match(&gateway, &[&t0]).await;
}

#[tokio::test]
async fn a_newer_version_on_disk_replaces_latest_without_a_failed_request() {
    let repository = tempfile::Builder::new()
        .prefix("infergate-versions-")
        .tempdir()
        .unwrap();
    let model_dir = repository.path().join("versioned");
    copy_dir(&model_repository().join("versioned"), &model_dir);
    let t0 = Triton::start(TritonOptions {
        repository: Some(repository.path().to_path_buf()),
        ..Default::default()
    })
    .await
    .expect("triton starts");
    let gateway = TestGateway::start(&pool_config_in(
        repository.path(),
        "newer",
        &[&t0],
        "1GiB",
        "reconcile_interval = \"500ms\"",
        "",
    ))
    .await;
    let (status, body) = infer(&gateway, "versioned").await;
    assert_eq!(
        (status, answered_by(&body)),
        (200, ("2".into(), 201.0)),
        "{body}"
    );
    assert_eq!(
        gateway.placed_versions().await,
        [[("versioned".into(), vec![2])]]
    );

    // Requests without a version run without pause while version 3 appears on disk.
    let looping = InferLoop::start(&gateway, "versioned");
    tokio::time::sleep(Duration::from_millis(300)).await;
    copy_dir(&model_dir.join("2"), &model_dir.join("3"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = infer(&gateway, "versioned").await;
        if (status, answered_by(&body)) == (200, ("3".into(), 301.0)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never served version 3: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answers = looping.stop().await;
    let failed: Vec<_> = answers.iter().filter(|a| a.0 != 200).collect();
    assert!(
        failed.is_empty(),
        "failed while the version changed: {failed:?}"
    );
    let served: std::collections::BTreeSet<&str> = answers.iter().map(|a| a.1.as_str()).collect();
    assert_eq!(served, ["2", "3"].into(), "the loop saw the change");
    // Version 2 is gone from Triton, and the books say what Triton says.
    let deadline = Instant::now() + Duration::from_secs(15);
    while t0.ready_versions().await.unwrap() != [("versioned".to_string(), 3)] {
        assert!(Instant::now() < deadline, "{:?}", t0.ready_versions().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        gateway.placed_versions().await,
        [[("versioned".into(), vec![3])]]
    );
    assert_versions_match(&gateway, &[&t0]).await;
    assert_eq!(loads(&gateway, "reload", "success", "newer-").await, 1.0);
    assert_eq!(
        gateway.placement().await["backends"][0]["models"][0]["latest"],
        true
    );
}

/// A repository of `count` identity models `fat_0`, `fat_1`, ... of 1 MiB each on disk
/// (sized_a's model under other names), for churn: with `size_multiplier = 1.0` and
/// `mem_buffer = "0"` a backend of `2.5MiB` holds two of them.
fn fat_repository(count: usize) -> tempfile::TempDir {
    let repository = tempfile::Builder::new()
        .prefix("infergate-fat-")
        .tempdir()
        .unwrap();
    let source = model_repository().join("sized_a");
    let config = std::fs::read_to_string(source.join("config.pbtxt")).unwrap();
    for i in 0..count {
        let dir = repository.path().join(format!("fat_{i}"));
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::write(
            dir.join("config.pbtxt"),
            config.replace("\"sized_a\"", &format!("\"fat_{i}\"")),
        )
        .unwrap();
        std::fs::copy(source.join("1/model.py"), dir.join("1/model.py")).unwrap();
        std::fs::write(dir.join("1/weights.bin"), vec![0u8; 1 << 20]).unwrap();
    }
    repository
}

/// The most models each Triton held at once, from its index sampled every 20 ms: READY,
/// LOADING and UNLOADING all hold memory (Triton answers an unload at once and takes a
/// second or more to let the model go).
struct Occupancy {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(usize, Vec<String>)>>,
}

impl Occupancy {
    fn watch(tritons: &[&Triton]) -> Self {
        let urls: Vec<String> = tritons.iter().map(|t| t.http_url()).collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let client = reqwest::Client::new();
                let mut peak: Vec<(usize, Vec<String>)> = vec![(0, Vec::new()); urls.len()];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (url, peak) in urls.iter().zip(&mut peak) {
                        let Ok(response) = client
                            .post(format!("{url}/v2/repository/index"))
                            .json(&json!({}))
                            .send()
                            .await
                        else {
                            continue;
                        };
                        let rows: Value = response.json().await.unwrap_or(Value::Null);
                        let held: Vec<String> = rows
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter(|r| {
                                matches!(
                                    r["state"].as_str(),
                                    Some("READY" | "LOADING" | "UNLOADING")
                                )
                            })
                            .map(|r| format!("{} {}", r["name"], r["state"]))
                            .collect();
                        if held.len() > peak.0 {
                            *peak = (held.len(), held);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                peak
            }
        });
        Self { stop, task }
    }

    async fn stop(self) -> Vec<(usize, Vec<String>)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Eviction churn, as issue 13 measured it: 4 clients over 8 models on 2 backends that hold
/// 2 each, so most model switches evict, and reconciliation reads each index every 100 ms
/// while evictions and loads are under way. Every answer is right (200 with the input back)
/// or a 503 with Retry-After; no request reaches a copy that is gone (Triton's 404 "has no
/// available versions"); Triton never holds more models than its capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_churn_answers_every_request_within_capacity() {
    const MODELS: usize = 8;
    const CLIENTS: usize = 4;
    const REQUESTS: usize = 5000;
    let repository = fat_repository(MODELS);
    let options = || TritonOptions {
        repository: Some(repository.path().to_path_buf()),
        ..Default::default()
    };
    let (t0, t1) = tokio::join!(Triton::start(options()), Triton::start(options()));
    let (t0, t1) = (t0.expect("triton starts"), t1.expect("triton starts"));
    let gateway = TestGateway::start(&pool_config_in(
        repository.path(),
        "churn",
        &[&t0, &t1],
        "2.5MiB",
        "mem_buffer = \"0\"\nsize_multiplier = 1.0\nmin_churn_age = \"0s\"\nscale_up_rps = 0.0\n\
         reconcile_interval = \"100ms\"",
        "",
    ))
    .await;
    let occupancy = Occupancy::watch(&[&t0, &t1]);
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let clients = (0..CLIENTS).map(|c| {
        let url = gateway.url();
        let sent = sent.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (c as u64 + 1);
            let mut odd = Vec::new();
            let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
            while sent.load(std::sync::atomic::Ordering::Relaxed) < REQUESTS {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let model = format!("fat_{}", (seed >> 33) as usize % MODELS);
                // A burst on one model, as a client working through a batch does.
                for i in 0..40 {
                    let n = sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as f32;
                    let data = [n, n + 1.0, i as f32, c as f32];
                    let response = client
                        .post(format!("{url}/v2/models/{model}/infer"))
                        .json(&json!({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                            "shape": [4], "data": data}]}))
                        .send()
                        .await
                        .unwrap();
                    let status = response.status().as_u16();
                    let retry_after = response.headers().contains_key("retry-after");
                    let body: Value = response.json().await.unwrap_or(Value::Null);
                    *statuses.entry(status).or_default() += 1;
                    match status {
                        200 if body["outputs"][0]["data"] == json!(data) => {}
                        503 if retry_after => {}
                        _ => odd.push((model.clone(), status, body)),
                    }
                }
            }
            (statuses, odd)
        })
    });
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut odd = Vec::new();
    for client in futures_util::future::join_all(clients).await {
        let (counts, answers) = client.unwrap();
        for (status, n) in counts {
            *statuses.entry(status).or_default() += n;
        }
        odd.extend(answers);
    }
    let peak = occupancy.stop().await;
    let total: usize = statuses.values().sum();
    let loads = loads(&gateway, "new", "success", "churn-").await;
    eprintln!(
        "churn: {total} requests in {:.1}s: {statuses:?}, {loads} loads, most held at once {:?}",
        started.elapsed().as_secs_f64(),
        peak.iter().map(|p| p.0).collect::<Vec<_>>()
    );
    assert!(total >= REQUESTS);
    assert!(
        odd.is_empty(),
        "{} wrong answers, first: {:?}",
        odd.len(),
        &odd[..odd.len().min(5)]
    );
    for (held, rows) in &peak {
        assert!(*held <= 2, "a Triton held {held} models at once: {rows:?}");
    }
    assert!(
        loads >= 20.0,
        "too little churn to prove anything: {loads} loads"
    );
    assert_books_match(&gateway, &[&t0, &t1]).await;
}

/// `infergate-load --sequence-length 40 -c 8 --check` for `seconds` against `sequence_sum`
/// (as `perf_analyzer --sequence-length 40 --concurrency-range 8` runs a sequence model):
/// 8 sequences at a time, every answer checked to be the sequence's running sum.
async fn sequences(
    url: &str,
    protocol: &str,
    extra: &[&str],
    seconds: u64,
) -> infergate_load::stats::StepSummary {
    use infergate_load::runner::{Progress, run_step};
    let duration = format!("{seconds}s");
    let mut args = vec![
        "infergate-load",
        "--url",
        url,
        "--protocol",
        protocol,
        "-m",
        "sequence_sum",
        "-i",
        "INPUT0:FP32:1",
        "--sequence-length",
        "40",
        "-c",
        "8",
        "--check",
        "--quiet",
        "--warmup",
        "0s",
        "--duration",
        &duration,
        "--windows",
        "1",
        "--timeout",
        "10s",
    ];
    args.extend_from_slice(extra);
    let plan = <infergate_load::cli::Args as clap::Parser>::try_parse_from(args)
        .unwrap()
        .into_plan()
        .unwrap();
    let step = plan.steps[0];
    let progress = Progress {
        enabled: false,
        prefix: String::new(),
    };
    let result = match protocol {
        "grpc" => {
            let transport = std::sync::Arc::new(plan.grpc_transport(step.connections).unwrap());
            run_step(transport, step, plan.timing, progress).await
        }
        _ => {
            let transport = std::sync::Arc::new(plan.http_transport(step.connections).unwrap());
            run_step(transport, step, plan.timing, progress).await
        }
    };
    infergate_load::stats::StepSummary::from_result(&result, plan.stability)
}

/// Issue 13, item 2: once placement gives a sequence model a second copy, every request of
/// a sequence still reaches the copy that saw it start. Over HTTP (JSON, numeric ids; binary,
/// string ids) and unary gRPC (numeric and string ids), 8 concurrent sequences of 40: every
/// answer is the right running sum, and Triton never refuses one for a missing START.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_stay_on_the_copy_that_saw_them_start() {
    let (t0, t1) = tokio::join!(empty_triton(false), empty_triton(false));
    let gateway = TestGateway::start(&pool_config(
        "seq",
        &[&t0, &t1],
        "1GiB",
        "scale_up_rps = 5.0\nmax_copies = 2\nrebalance_interval = \"500ms\"\nscale_down_idle = \"1h\"",
        "",
    ))
    .await;
    let runs: [(&str, &str, &[&str]); 4] = [
        ("http", "http", &[]),
        ("grpc", "grpc", &[]),
        ("http", "http", &["--binary", "--string-sequence-ids"]),
        (
            "grpc",
            "grpc",
            &["--string-sequence-ids", "--sequence-id-start", "5000"],
        ),
    ];
    for (i, (protocol, which, extra)) in runs.into_iter().enumerate() {
        let url = if which == "grpc" {
            gateway.grpc_url()
        } else {
            gateway.url()
        };
        // The first run is long enough for the second copy to load and take sequences.
        let seconds = if i == 0 { 8 } else { 3 };
        let summary = sequences(&url, protocol, extra, seconds).await;
        assert!(
            summary.errors == 0 && summary.ok >= 8 * 40,
            "{protocol} {extra:?}: {} ok, errors {:?}",
            summary.ok,
            summary.errors_by_kind
        );
        if i == 0 {
            // The first run made the model busy enough for a second copy.
            let copies = copies_of(&gateway, "sequence_sum").await;
            assert_eq!(
                copies,
                [(0, "ready".to_string()), (1, "ready".to_string())],
                "{copies:?}"
            );
        }
    }
    for triton in [&t0, &t1] {
        assert!(
            !triton.log().contains("must specify the START flag"),
            "{}",
            triton.log()
        );
        assert!(
            triton_successes(triton, "sequence_sum").await > 100.0,
            "both copies served sequences"
        );
    }
}

/// `nv_inference_request_success` of a model on one Triton.
async fn triton_successes(triton: &Triton, model: &str) -> f64 {
    let model = format!("model=\"{model}\"");
    triton
        .metric_sum("nv_inference_request_success", &[&model])
        .await
}

/// A sequence whose copy has gone (here unloaded straight on Triton, behind the gateway's
/// back) gets a clear error on its next request, over HTTP and gRPC, and is not restarted on
/// a copy loaded elsewhere or anew: its running sum went with the copy. Starting it again
/// works. Validation is off here: the sequence id is read for placement all the same.
#[tokio::test]
async fn a_sequence_whose_copy_is_gone_gets_a_clear_error() {
    let t0 = empty_triton(false).await;
    let gateway = TestGateway::start(&pool_config(
        "lost",
        &[&t0],
        "1GiB",
        "reconcile_interval = \"1h\"",
        "[validation]\nenabled = false\n",
    ))
    .await;
    // The model has one sequence slot per copy (direct scheduling): one sequence at a time.
    let url = format!("{}/v2/models/sequence_sum/infer", gateway.url());
    let step = |value: f32, start: bool, end: bool| {
        let url = url.clone();
        async move {
            let body = json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                "data": [value]}],
                "parameters": {"sequence_id": 77, "sequence_start": start, "sequence_end": end}});
            let response = reqwest::Client::new()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let sum = |answer: (u16, Value)| answer.1["outputs"][0]["data"][0].as_f64();
    assert_eq!(sum(step(1.0, true, false).await), Some(1.0));
    assert_eq!(sum(step(2.0, false, false).await), Some(3.0));
    t0.unload_model("sequence_sum").await.unwrap();
    let (status, body) = step(4.0, false, false).await;
    assert_eq!(status, 409, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("sequence 77 of model 'sequence_sum'") && error.contains("sequence_start"),
        "{error}"
    );
    assert_eq!(
        loads(&gateway, "new", "success", "lost-").await,
        1.0,
        "not restarted on a copy loaded anew"
    );
    // Started again, it runs from its new start.
    assert_eq!(sum(step(4.0, true, false).await), Some(4.0));
    assert_eq!(sum(step(1.0, false, true).await), Some(5.0));

    use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    let mut grpc = GrpcInferenceServiceClient::connect(gateway.grpc_url())
        .await
        .unwrap();
    let message = |value, start, end| sequence_message(text_id("user-3"), value, start, end);
    let answer = grpc.model_infer(message(5.0, true, false)).await.unwrap();
    assert_eq!(
        &answer.into_inner().raw_output_contents[0][..],
        &5.0f32.to_le_bytes()
    );
    t0.unload_model("sequence_sum").await.unwrap();
    let lost = grpc
        .model_infer(message(1.0, false, false))
        .await
        .unwrap_err();
    assert_eq!(lost.code(), tonic::Code::Aborted, "{lost:?}");
    assert!(lost.message().contains("sequence 'user-3'"), "{lost:?}");
    assert_eq!(loads(&gateway, "new", "success", "lost-").await, 2.0);
    let answer = grpc.model_infer(message(2.0, true, true)).await.unwrap();
    assert_eq!(
        &answer.into_inner().raw_output_contents[0][..],
        &2.0f32.to_le_bytes()
    );
}

fn text_id(id: &str) -> infergate::protocol::inference::infer_parameter::ParameterChoice {
    infergate::protocol::inference::infer_parameter::ParameterChoice::StringParam(id.into())
}

/// A `sequence_sum` request of a sequence, as tritonclient.grpc sends it: the value as raw
/// contents, the id (`int64_param` or `string_param`) and flags among the parameters.
fn sequence_message(
    id: infergate::protocol::inference::infer_parameter::ParameterChoice,
    value: f32,
    start: bool,
    end: bool,
) -> infergate::protocol::inference::ModelInferRequest {
    use infergate::protocol::inference::InferParameter;
    use infergate::protocol::inference::infer_parameter::ParameterChoice;
    use infergate::protocol::inference::model_infer_request::InferInputTensor;
    let mut message = support::grpc::fp32_infer("sequence_sum", &[]);
    message.inputs = vec![InferInputTensor {
        name: "INPUT0".into(),
        datatype: "FP32".into(),
        shape: vec![1],
        ..Default::default()
    }];
    message.raw_input_contents = vec![value.to_le_bytes().to_vec().into()];
    for (name, choice) in [
        ("sequence_id", id),
        ("sequence_start", ParameterChoice::BoolParam(start)),
        ("sequence_end", ParameterChoice::BoolParam(end)),
    ] {
        let parameter_choice = Some(choice);
        message
            .parameters
            .insert(name.into(), InferParameter { parameter_choice });
    }
    message
}

/// The running sum in a `sequence_sum` answer.
fn running_sum(answer: &infergate::protocol::inference::ModelInferResponse) -> f32 {
    f32::from_le_bytes(answer.raw_output_contents[0][..4].try_into().unwrap())
}

/// One client stream: where requests go in, where answers come out.
type Stream = (
    tokio::sync::mpsc::Sender<infergate::protocol::inference::ModelInferRequest>,
    tonic::Streaming<infergate::protocol::inference::ModelStreamInferResponse>,
);

/// Sends a `sequence_sum` request down a stream and returns the running sum it answers.
async fn ask(
    stream: &mut Stream,
    message: infergate::protocol::inference::ModelInferRequest,
) -> f32 {
    stream.0.send(message).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(30), stream.1.message())
        .await
        .expect("an answer")
        .unwrap()
        .unwrap();
    assert_eq!(answer.error_message, "", "{answer:?}");
    running_sum(&answer.infer_response.unwrap())
}

/// On `ModelStreamInfer`, a sequence continued on another stream than the one it started on
/// still reaches its copy: with two copies, each of two streams starts a sequence (one on
/// each copy), then each continues the other's. Before, each stream sent every request down
/// its own backend stream, and the other copy refused the continuation.
#[tokio::test]
async fn sequences_on_streams_follow_their_copy() {
    use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use infergate::protocol::inference::infer_parameter::ParameterChoice;
    let (t0, t1) = tokio::join!(empty_triton(false), empty_triton(false));
    let gateway = TestGateway::start(&pool_config(
        "seqstream",
        &[&t0, &t1],
        "1GiB",
        "scale_up_rps = 0.0",
        "[[models]]\nname = \"sequence_sum\"\nmin_copies = 2\n",
    ))
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while copies_of(&gateway, "sequence_sum").await
        != [(0, "ready".to_string()), (1, "ready".to_string())]
    {
        assert!(Instant::now() < deadline, "two copies at start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let open = || async {
        let (requests, queue) = tokio::sync::mpsc::channel(4);
        let stream: Stream;
        let answers = GrpcInferenceServiceClient::connect(gateway.grpc_url())
            .await
            .unwrap()
            .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(queue))
            .await
            .unwrap()
            .into_inner();
        stream = (requests, answers);
        stream
    };
    let (mut first, mut second) = (open().await, open().await);
    let (a, b) = (|| ParameterChoice::Int64Param(11), || text_id("b"));
    assert_eq!(
        ask(&mut first, sequence_message(a(), 1.0, true, false)).await,
        1.0
    );
    assert_eq!(
        ask(&mut second, sequence_message(b(), 2.0, true, false)).await,
        2.0
    );
    for round in 0..3 {
        let n = round as f32 + 1.0;
        assert_eq!(
            ask(&mut second, sequence_message(a(), 1.0, false, false)).await,
            1.0 + n
        );
        assert_eq!(
            ask(&mut first, sequence_message(b(), 2.0, false, false)).await,
            2.0 + 2.0 * n
        );
    }
    let live = gateway.placement().await["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["models"][0]["sequences"].as_u64().unwrap())
        .collect::<Vec<_>>();
    assert_eq!(live, [1, 1], "one sequence on each copy");
    assert_eq!(
        ask(&mut first, sequence_message(a(), 1.0, false, true)).await,
        5.0
    );
    assert_eq!(
        ask(&mut second, sequence_message(b(), 2.0, false, true)).await,
        10.0
    );
    assert_eq!(gateway.placement().await["live_sequences"], json!({}));
}
