//! Config reload under load against real Triton: routes change with no failed request, an
//! invalid file changes nothing, fixed keys are refused by name, the file watcher reloads on
//! its own, and a target a reload removes is unloaded from Triton (no stub left behind).

mod support;

use infergate_load::cli::Args;
use infergate_load::runner::{Progress, run_step};
use infergate_load::stats::StepSummary;
use infergate_load::transport::http::{HttpOptions, HttpTransport};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::gateway::{TestGateway, pool_config};
use support::{Triton, TritonOptions};

fn config(triton: &Triton, targets: &str) -> String {
    pool_config(
        "reload",
        &[triton],
        "1GiB",
        "scale_up_rps = 0.0",
        &format!("[[routes]]\nmodel = \"ranker\"\ntargets = [{targets}]\n"),
    )
}

fn split(a: u32, b: u32) -> String {
    format!("{{ model = \"sized_a\", weight = {a} }}, {{ model = \"sized_b\", weight = {b} }}")
}

async fn admin(gateway: &TestGateway, method: reqwest::Method, path: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .request(method, format!("http://{}{path}", gateway.admin))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

async fn infer(client: &reqwest::Client, url: &str) -> Result<String, String> {
    let response = client
        .post(url)
        .json(&json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body: Value = response.json().await.map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("{status}: {body}"));
    }
    Ok(body["model_name"].as_str().unwrap_or_default().to_string())
}

/// Runs the load tool against the route for `windows` × `window`, as `infergate-load
/// --model ranker -i INPUT0:FP32:4 --check -c N` would, and sums what it saw.
async fn load(url: String, concurrency: usize, window: Duration, windows: usize) -> StepSummary {
    let (concurrency, window_ms, windows) = (
        concurrency.to_string(),
        format!("{}ms", window.as_millis()),
        windows.to_string(),
    );
    let args = [
        "infergate-load",
        "--url",
        &url,
        "--model",
        "ranker",
        "-i",
        "INPUT0:FP32:4",
        "--check",
        "--quiet",
        "-c",
        &concurrency,
        "--warmup",
        "0s",
        "--duration",
        &window_ms,
        "--windows",
        &windows,
        "--timeout",
        "10s",
    ];
    let plan = <Args as clap::Parser>::try_parse_from(args)
        .unwrap()
        .into_plan()
        .unwrap();
    let step = plan.steps[0];
    let transport = HttpTransport::new(
        &plan.endpoint,
        &plan.bodies,
        HttpOptions {
            connections: step.connections,
            http2: false,
            check: plan.check,
        },
    )
    .unwrap();
    let progress = Progress {
        enabled: false,
        prefix: String::new(),
    };
    let result = run_step(Arc::new(transport), step, plan.timing, progress).await;
    StepSummary::from_result(&result, plan.stability)
}

/// Share of `sized_b` over `n` requests, sent at once.
async fn canary_share(client: &reqwest::Client, url: &str, n: usize) -> f64 {
    let answers = futures_util::future::join_all((0..n).map(|_| infer(client, url))).await;
    let canary = answers
        .into_iter()
        .filter(|answer| answer.as_deref().unwrap() == "sized_b")
        .count();
    canary as f64 / n as f64
}

#[tokio::test]
async fn routes_reload_under_load_without_a_failed_request() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config(&triton, &split(90, 10))).unwrap();
    let gateway = TestGateway::start_from_file(&path).await;
    let url = format!("{}/v2/models/ranker/infer", gateway.url());
    let client = reqwest::Client::new();
    // Both targets loaded before the load starts, so every answer below is a warm one.
    assert!(
        infer(
            &client,
            &format!("{}/v2/models/sized_a/infer", gateway.url())
        )
        .await
        .is_ok()
    );
    assert!(
        infer(
            &client,
            &format!("{}/v2/models/sized_b/infer", gateway.url())
        )
        .await
        .is_ok()
    );
    let (_, running) = admin(&gateway, reqwest::Method::GET, "/admin/config").await;
    let (first_hash, first_loaded) = (running["hash"].clone(), running["loaded_at_unix"].clone());

    // Continuous load from the load tool (HTTP, concurrency 32) while the config changes 50
    // times, plus one invalid file; the split is sampled after every reload.
    let load = tokio::spawn(load(gateway.url(), 32, Duration::from_secs(5), 5));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..50 {
        let (a, b) = if i % 2 == 0 { (10, 90) } else { (90, 10) };
        std::fs::write(&path, config(&triton, &split(a, b))).unwrap();
        let (status, body) = admin(&gateway, reqwest::Method::POST, "/admin/reload").await;
        assert_eq!(status, 200, "{body}");
        if i == 25 {
            // An invalid file: refused with its key, nothing changes.
            let good = std::fs::read_to_string(&path).unwrap();
            std::fs::write(
                &path,
                good.replace("weight = 90", "weight = 90, colour = \"red\""),
            )
            .unwrap();
            let (status, body) = admin(&gateway, reqwest::Method::POST, "/admin/reload").await;
            assert_eq!(status, 400, "{body}");
            assert!(body["error"].as_str().unwrap().contains("colour"), "{body}");
            std::fs::write(&path, good).unwrap();
        }
        let share = canary_share(&client, &url, 30).await;
        let expected = f64::from(b) / 100.0;
        assert!(
            (share - expected).abs() <= 0.25,
            "reload {i}: canary share {share}, expected {expected}"
        );
    }
    assert!(!load.is_finished(), "every reload ran under load");
    let summary = load.await.unwrap();
    assert_eq!(
        summary.errors, 0,
        "failed requests under reload: {:?}",
        summary.errors_by_kind
    );
    assert!(summary.ok > 500, "too little load: {summary:?}");
    eprintln!(
        "under 50 reloads: {} requests at concurrency 32, {:.0}/s, p99 {} µs, 0 failed",
        summary.requests, summary.throughput_rps, summary.latency_us.p99
    );

    // The split follows the last reload (90/10 after an odd count).
    let share = canary_share(&client, &url, 1000).await;
    assert!(
        (share - 0.10).abs() < 0.05,
        "canary share {share} after reloading 90/10"
    );
    // The running file is the same text as the first one again: same hash, a later load.
    let (_, running) = admin(&gateway, reqwest::Method::GET, "/admin/config").await;
    assert_eq!(running["hash"], first_hash);
    assert_ne!(running["loaded_at_unix"], first_loaded);

    // A key that cannot change while running is refused by name.
    let moved = config(&triton, &split(90, 10)).replace("scale_up_rps = 0.0", "scale_up_rps = 5.0");
    std::fs::write(&path, moved).unwrap();
    let (status, body) = admin(&gateway, reqwest::Method::POST, "/admin/reload").await;
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("placement: cannot change while running"),
        "{body}"
    );

    // The file watcher reloads on its own: promote the canary to 100%.
    std::fs::write(&path, config(&triton, &split(0, 100))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while canary_share(&client, &url, 20).await < 1.0 {
        assert!(Instant::now() < deadline, "file change never reloaded");
    }

    // Remove the old target: it is unloaded from Triton, its stub process with it.
    std::fs::write(
        &path,
        config(&triton, "{ model = \"sized_b\", weight = 1 }"),
    )
    .unwrap();
    let (status, body) = admin(&gateway, reqwest::Method::POST, "/admin/reload").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unloaded"], json!(["sized_a"]));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let loaded = triton.loaded_models().await.unwrap();
        if loaded == ["sized_b"] && triton.stub_count() == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sized_a left behind: {loaded:?}, {} stubs",
            triton.stub_count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = gateway.metrics_text("/metrics").await;
    assert!(
        metrics.contains("infergate_config_reload_total{result=\"failure\"}"),
        "{metrics}"
    );
}

/// Config text over these (name, Triton) backends.
fn pool(backends: &[(&str, &Triton)]) -> String {
    let mut text = String::from(
        "[listen]\nhttp = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\n\
         [upstream]\nhealth_interval = \"200ms\"\nhealth_timeout = \"3s\"\n",
    );
    for (name, triton) in backends {
        text.push_str(&format!(
            "[[backends]]\nname = \"{name}\"\nhttp = \"{}\"\ngrpc = \"{}\"\ncapacity = \"1GiB\"\n",
            triton.http_url(),
            triton.grpc_url(),
        ));
    }
    text
}

#[tokio::test]
async fn backends_join_and_leave_on_reload_without_a_failed_request() {
    let (one, two) = tokio::join!(
        Triton::start(TritonOptions::default()),
        Triton::start(TritonOptions::default())
    );
    let (one, two) = (one.unwrap(), two.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, pool(&[("joins-one", &one)])).unwrap();
    let gateway = TestGateway::start_from_file(&path).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v2/models/sized_a/infer", gateway.url());
    assert_eq!(infer(&client, &url).await.unwrap(), "sized_a");

    // A new backend joins after its first ready check.
    std::fs::write(&path, pool(&[("joins-one", &one), ("joins-two", &two)])).unwrap();
    let (status, body) = admin(&gateway, reqwest::Method::POST, "/admin/reload").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["added_backends"], json!(["joins-two"]));
    gateway.wait_for_ready_backends(2).await;

    // The first leaves while 8 clients keep calling a model only it has: requests on it
    // finish, new ones wait for a copy on the second, none fails.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match infer(&client, &url).await {
                        Ok(_) => ok += 1,
                        Err(error) => failed.push(error),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&path, pool(&[("joins-two", &two)])).unwrap();
    let (status, body) = admin(&gateway, reqwest::Method::POST, "/admin/reload").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["removed_backends"], json!(["joins-one"]));
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for client in clients {
        let (o, f) = client.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(ok > 50, "too little load: {ok}");
    assert!(
        two.loaded_models()
            .await
            .unwrap()
            .contains(&"sized_a".to_string())
    );
    let names: Vec<String> = gateway
        .admin_backends()
        .await
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["joins-two"]);
    let placement = gateway.placement().await;
    assert_eq!(
        placement["backends"].as_array().unwrap().len(),
        1,
        "{placement}"
    );
}
