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
use support::gateway::{TestGateway, routes_config};
use support::{Triton, TritonOptions, eventually, eventually_every};

fn config(triton: &Triton, targets: &str) -> String {
    routes_config(
        "reload",
        &[triton],
        &format!("[[routes]]\nmodel = \"ranker\"\ntargets = [{targets}]\n"),
    )
}

fn split(a: u32, b: u32) -> String {
    format!("{{ model = \"sized_a\", weight = {a} }}, {{ model = \"sized_b\", weight = {b} }}")
}

/// One add-style infer: the model that answered, or the error.
async fn infer(client: &reqwest::Client, url: &str) -> Result<String, String> {
    let body = infer_body(client, url).await?;
    Ok(body["model_name"].as_str().unwrap_or_default().to_string())
}

/// One add-style infer: the whole answer, or the status and error body.
async fn infer_body(client: &reqwest::Client, url: &str) -> Result<Value, String> {
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
    Ok(body)
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
    let (_, running) = gateway
        .admin_call(reqwest::Method::GET, "/admin/config")
        .await;
    let (first_hash, first_loaded) = (running["hash"].clone(), running["loaded_at_unix"].clone());

    // Continuous load from the load tool (HTTP, concurrency 32) while the config changes 50
    // times, plus one invalid file; the split is sampled after every reload.
    let load = tokio::spawn(load(gateway.url(), 32, Duration::from_secs(5), 5));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..50 {
        let (a, b) = if i % 2 == 0 { (10, 90) } else { (90, 10) };
        std::fs::write(&path, config(&triton, &split(a, b))).unwrap();
        let (status, body) = gateway
            .admin_call(reqwest::Method::POST, "/admin/reload")
            .await;
        assert_eq!(status, 200, "{body}");
        if i == 25 {
            // Two invalid files, each with other weights (50/50) so that a partial apply
            // would show in the split: one that does not parse, one that parses but fails
            // validation. Each is refused with its key, and nothing changes.
            let good = std::fs::read_to_string(&path).unwrap();
            let (_, before) = gateway
                .admin_call(reqwest::Method::GET, "/admin/config")
                .await;
            let failures = || async {
                let metrics = gateway.metrics_text("/metrics").await;
                metrics
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("infergate_config_reload_total{result=\"failure\"} ")
                    })
                    .map_or(0.0, |n| n.parse::<f64>().unwrap())
            };
            let failed_before = failures().await;
            let even = config(&triton, &split(50, 50));
            let refused = [
                (
                    even.replace("weight = 50 }", "weight = 50, colour = \"red\" }"),
                    "routes[0].targets[0].colour",
                ),
                (
                    even.replace("targets = [", "sticky = \"cookie:x\"\ntargets = ["),
                    "routes[0].sticky",
                ),
            ];
            for (text, key) in refused {
                std::fs::write(&path, text).unwrap();
                let (status, body) = gateway
                    .admin_call(reqwest::Method::POST, "/admin/reload")
                    .await;
                assert_eq!(status, 400, "{body}");
                assert!(
                    body["error"].as_str().unwrap().contains(key),
                    "{key}: {body}"
                );
            }
            let (_, after) = gateway
                .admin_call(reqwest::Method::GET, "/admin/config")
                .await;
            assert_eq!(after, before, "a refused file changed the running config");
            assert_eq!(
                failures().await - failed_before,
                2.0,
                "each refusal is counted"
            );
            let share = canary_share(&client, &url, 30).await;
            assert!(
                (share - f64::from(b) / 100.0).abs() <= 0.25,
                "after refused files: canary share {share}, still {a}/{b}"
            );
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
    let (_, running) = gateway
        .admin_call(reqwest::Method::GET, "/admin/config")
        .await;
    assert_eq!(running["hash"], first_hash);
    assert_ne!(running["loaded_at_unix"], first_loaded);

    // A key that cannot change while running is refused by name.
    let moved = config(&triton, &split(90, 10)).replace("scale_up_rps = 0.0", "scale_up_rps = 5.0");
    std::fs::write(&path, moved).unwrap();
    let (status, body) = gateway
        .admin_call(reqwest::Method::POST, "/admin/reload")
        .await;
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
    let (status, body) = gateway
        .admin_call(reqwest::Method::POST, "/admin/reload")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unloaded"], json!(["sized_a"]));
    eventually_every(
        Duration::from_millis(100),
        Duration::from_secs(10),
        "sized_a unloaded, its stub gone",
        async || {
            let loaded = triton.loaded_models().await.unwrap();
            let stubs = triton.stub_count();
            if loaded == ["sized_b"] && stubs == 1 {
                Ok(())
            } else {
                Err((loaded, stubs))
            }
        },
    )
    .await;
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
    let (status, body) = gateway
        .admin_call(reqwest::Method::POST, "/admin/reload")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["added_backends"], json!(["joins-two"]));
    gateway.wait_for_ready_backends(2).await;

    // The first leaves while 8 clients keep calling a model only it has: requests on it
    // finish, new ones wait for a copy on the second, none fails.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = request_loop(8, &url, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&path, pool(&[("joins-two", &two)])).unwrap();
    let (status, body) = gateway
        .admin_call(reqwest::Method::POST, "/admin/reload")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["removed_backends"], json!(["joins-one"]));
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_loop(&stop, clients, 51).await;
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

/// Clients calling `url` in a loop until `stop`; each returns (answers, failures).
fn request_loop(
    clients: usize,
    url: &str,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(Vec<Value>, Vec<String>)>> {
    (0..clients)
        .map(|_| {
            let (client, url, stop) = (reqwest::Client::new(), url.to_string(), stop.clone());
            tokio::spawn(async move {
                let (mut answers, mut failed) = (Vec::new(), Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match infer_body(&client, &url).await {
                        Ok(body) => answers.push(body),
                        Err(error) => failed.push(error),
                    }
                }
                (answers, failed)
            })
        })
        .collect()
}

/// Stops the loop and returns every answer the clients got, after checking that none of
/// their requests failed and that they sent at least `least` (the load was real).
async fn stop_loop(
    stop: &Arc<std::sync::atomic::AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<(Vec<Value>, Vec<String>)>>,
    least: usize,
) -> Vec<Value> {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut answers, mut failed) = (Vec::new(), Vec::new());
    for client in clients {
        let (a, f) = client.await.unwrap();
        answers.extend(a);
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        failed.len() + answers.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(answers.len() >= least, "too little load: {}", answers.len());
    answers
}

/// An inference request pinned to a target whose client sends half its body, then the rest
/// when told: a request the gateway has routed that has not arrived whole, so it holds no
/// copy yet.
struct SlowRequest {
    stream: tokio::net::TcpStream,
    rest: Vec<u8>,
}

impl SlowRequest {
    /// Sends the head and half the body, and returns once the gateway is handling it.
    async fn start(gateway: &TestGateway, target: &str) -> Self {
        use tokio::io::AsyncWriteExt;
        let in_flight = async || {
            gateway
                .metric_sum("infergate_requests_in_flight", &["protocol=\"http\""])
                .await
        };
        let before = in_flight().await;
        let body = json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
            .to_string()
            .into_bytes();
        let head = format!(
            "POST /v2/models/ranker/infer HTTP/1.1\r\nhost: {}\r\ninfergate-target: {target}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            gateway.http,
            body.len()
        );
        let mut stream = tokio::net::TcpStream::connect(gateway.http).await.unwrap();
        let (first, rest) = body.split_at(body.len() / 2);
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(first).await.unwrap();
        eventually(
            Duration::from_secs(10),
            "the slow request in flight",
            async || {
                let now = in_flight().await;
                if now > before { Ok(()) } else { Err(now) }
            },
        )
        .await;
        Self {
            stream,
            rest: rest.to_vec(),
        }
    }

    /// Sends the rest of the body; returns the model that answered (panics on an error).
    async fn finish(mut self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.stream.write_all(&self.rest).await.unwrap();
        let mut answer = String::new();
        self.stream.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let body = answer.split("\r\n\r\n").nth(1).unwrap();
        let body: Value = serde_json::from_str(body).unwrap();
        body["model_name"].as_str().unwrap().to_string()
    }
}

/// Polls until `check` holds for Triton's state, for up to 10 s.
async fn until_triton(triton: &Triton, what: &str, check: impl Fn(&Triton, &[String]) -> bool) {
    eventually(Duration::from_secs(10), what, async || {
        let loaded = triton.loaded_models().await.unwrap();
        if check(triton, &loaded) {
            Ok(())
        } else {
            Err((loaded, triton.stub_count()))
        }
    })
    .await
}

#[tokio::test]
async fn a_removed_target_goes_once_its_requests_finish_unless_still_used() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let routes = |ranker: &str, pinned_route: bool| {
        let mut text = format!(
            "[[models]]\nname = \"sized_c\"\nmin_copies = 1\n\
             [[routes]]\nmodel = \"ranker\"\ntargets = [{ranker}]\n\
             [[routes]]\nmodel = \"other\"\ntargets = [{{ model = \"sized_b\", weight = 1 }}]\n"
        );
        if pinned_route {
            text.push_str(
                "[[routes]]\nmodel = \"pinned\"\ntargets = [{ model = \"sized_c\", weight = 1 }]\n",
            );
        }
        routes_config("leftovers", &[&triton], &text)
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, routes(&split(50, 50), true)).unwrap();
    let gateway = TestGateway::start_from_file(&path).await;
    let client = reqwest::Client::new();
    for model in ["sized_a", "sized_b", "sized_c"] {
        let url = format!("{}/v2/models/{model}/infer", gateway.url());
        assert!(infer(&client, &url).await.is_ok());
    }
    // A request pinned to sized_a whose client sends half its body and waits: routed on the
    // first config, it outlives two reloads before it arrives.
    let slow = SlowRequest::start(&gateway, "sized_a").await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = request_loop(
        16,
        &format!("{}/v2/models/ranker/infer", gateway.url()),
        &stop,
    );
    // sized_b leaves `ranker` but `other` still routes to it; the route to sized_c goes,
    // but [[models]] pins sized_c: neither is unloaded.
    std::fs::write(&path, routes("{ model = \"sized_a\", weight = 1 }", false)).unwrap();
    let (status, body) = gateway
        .admin_call(reqwest::Method::POST, "/admin/reload")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unloaded"], json!([]));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // sized_a leaves every route while 16 clients call `ranker`: the requests on it finish,
    // the rest go to sized_b, and then sized_a is unloaded, its stub with it.
    std::fs::write(&path, routes("{ model = \"sized_b\", weight = 1 }", false)).unwrap();
    let (status, body) = gateway
        .admin_call(reqwest::Method::POST, "/admin/reload")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unloaded"], json!(["sized_a"]));
    // The copy stays while a request routed to it before either reload has still to arrive;
    // it is then served there, and the copy goes after it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        triton
            .loaded_models()
            .await
            .unwrap()
            .contains(&"sized_a".to_string())
    );
    assert_eq!(slow.finish().await, "sized_a");
    until_triton(&triton, "sized_a never unloaded", |triton, loaded| {
        loaded == ["sized_b", "sized_c"] && triton.stub_count() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answers = stop_loop(&stop, clients, 101).await;
    assert_eq!(answers.last().unwrap()["model_name"], "sized_b");
    // No request on the old config loaded it again meanwhile.
    assert_eq!(
        triton.loaded_models().await.unwrap(),
        ["sized_b", "sized_c"]
    );
    assert_eq!(gateway.placed().await, [["sized_b", "sized_c"]]);
}

#[tokio::test]
async fn a_version_a_reload_drops_is_unloaded_while_the_other_keeps_serving() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let versions = |targets: &str| {
        routes_config(
            "versions",
            &[&triton],
            &format!("[[routes]]\nmodel = \"ranker\"\ntargets = [{targets}]\n"),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        versions("{ model = \"versioned\", version = \"1\", weight = 50 }, { model = \"versioned\", version = \"2\", weight = 50 }"),
    )
    .unwrap();
    let gateway = TestGateway::start_from_file(&path).await;
    let url = format!("{}/v2/models/ranker/infer", gateway.url());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = request_loop(8, &url, &stop);
    eventually(Duration::from_secs(20), "two versions ready", async || {
        let ready = triton.ready_versions().await.unwrap();
        if ready.len() >= 2 { Ok(()) } else { Err(ready) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    std::fs::write(
        &path,
        versions("{ model = \"versioned\", version = \"2\", weight = 1 }"),
    )
    .unwrap();
    let (status, body) = gateway
        .admin_call(reqwest::Method::POST, "/admin/reload")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unloaded"], json!(["versioned/1"]));
    eventually(
        Duration::from_secs(10),
        "version 1 unloaded, its stub gone",
        async || {
            let ready = triton.ready_versions().await.unwrap();
            let stubs = triton.stub_count();
            if ready == [("versioned".to_string(), 2)] && stubs == 1 {
                Ok(())
            } else {
                Err((ready, stubs))
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answers = stop_loop(&stop, clients, 1).await;
    let versions: std::collections::BTreeSet<&str> = answers
        .iter()
        .map(|a| a["model_version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["1", "2"].into(), "both served before the reload");
    assert_eq!(answers.last().unwrap()["model_version"], "2");
    assert_eq!(
        gateway.placed_versions().await,
        [[("versioned".to_string(), vec![2])]]
    );
}

#[tokio::test]
async fn sticky_keys_move_only_where_a_reload_sends_them() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let sticky = |a: u32, b: u32| {
        config(&triton, &split(a, b))
            .replace("targets = [", "sticky = \"header:x-user-id\"\ntargets = [")
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, sticky(90, 10)).unwrap();
    let gateway = TestGateway::start_from_file(&path).await;
    let url = format!("{}/v2/models/ranker/infer", gateway.url());
    let client = reqwest::Client::new();
    const USERS: usize = 400;
    let targets = || async {
        let calls = (0..USERS).map(|user| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let response = client
                    .post(&url)
                    .header("x-user-id", format!("user-{user}"))
                    .json(&json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                let body: Value = response.json().await.unwrap();
                body["model_name"].as_str().unwrap().to_string()
            }
        });
        futures_util::future::join_all(calls).await
    };
    let before = targets().await;
    assert_eq!(
        targets().await,
        before,
        "a key changed target without a reload"
    );
    let on_b = |t: &[String]| t.iter().filter(|m| *m == "sized_b").count();
    let share = on_b(&before) as f64 / USERS as f64;
    assert!(
        (share - 0.10).abs() < 0.06,
        "90/10: {share} of keys on sized_b"
    );

    std::fs::write(&path, sticky(50, 50)).unwrap();
    let (status, body) = gateway
        .admin_call(reqwest::Method::POST, "/admin/reload")
        .await;
    assert_eq!(status, 200, "{body}");
    let after = targets().await;
    // Only keys on sized_a may move, only to sized_b, and about 40% of all keys must.
    for (user, (was, is)) in before.iter().zip(&after).enumerate() {
        assert!(
            was == is || (was == "sized_a" && is == "sized_b"),
            "user-{user} moved from {was} to {is}"
        );
    }
    let moved = before
        .iter()
        .zip(&after)
        .filter(|(was, is)| was != is)
        .count();
    let moved = moved as f64 / USERS as f64;
    assert!(
        (moved - 0.40).abs() < 0.07,
        "{moved} of keys moved going 90/10 to 50/50"
    );
    assert_eq!(
        targets().await,
        after,
        "a key changed target after the reload"
    );
}
