//! The monitoring kit against real parts: Debian's Prometheus with `docker/prometheus/`
//! (targets moved to this test's loopback ports, 1s scrapes), a real gateway over a real
//! Triton, and traffic of every kind the dashboard shows. Then every dashboard query and
//! every recording rule is evaluated through Prometheus' HTTP API and must return a series
//! with a value. Also the LRU-age gauge users scale on, and the `/metrics` merge switch.

mod support;

use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::gateway::{TestGateway, pool_config};
use support::{Triton, TritonOptions};

/// A Prometheus process on a free loopback port, with its data in a temporary directory;
/// killed on drop, failed tests included (and with the test process, by its death signal).
struct Prometheus {
    child: Child,
    url: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus on `docker/prometheus/prometheus.yml` with its scrape targets moved
    /// to `gateway_metrics` (job `infergate`) and to itself (job `prometheus`), scraping and
    /// evaluating rules every second, with `rules.yml` from the kit.
    async fn start(gateway_metrics: SocketAddr) -> Self {
        support::ensure_setup().expect("scripts/setup.sh");
        let kit = support::repo_root().join("docker/prometheus");
        let dir = tempfile::tempdir().unwrap();
        let [port] = support::free_ports::<1>().unwrap();
        let config = test_config(&kit, gateway_metrics, port);
        let config_path = dir.path().join("prometheus.yml");
        // JSON is YAML: Prometheus reads it as its config.
        std::fs::write(&config_path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = support::spawn_in_own_group(command)
            .expect("cannot start prometheus (scripts/setup.sh installs it)");
        let this = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = this
                .client
                .get(format!("{}/-/ready", this.url))
                .send()
                .await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return this;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus never became ready:\n{}",
                this.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query: the result vector, or Prometheus' error (a query that does not parse).
    async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let answer: Value = self
            .client
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if answer["status"] != "success" {
            return Err(format!("{}: {}", answer["errorType"], answer["error"]));
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// Values of a label among the series `selector` matches (what a dashboard variable lists).
    async fn label_values(&self, label: &str, selector: &str) -> Vec<String> {
        let answer: Value = self
            .client
            .get(format!("{}/api/v1/label/{label}/values", self.url))
            .query(&[("match[]", selector)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["status"], "success", "{answer}");
        answer["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- prometheus log:\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The kit's prometheus.yml with each job's targets replaced by this test's addresses (a job
/// the test does not know fails the test), intervals of 1s, and the kit's rule file.
fn test_config(kit: &Path, gateway_metrics: SocketAddr, own_port: u16) -> Value {
    let mut config = yaml(&kit.join("prometheus.yml"));
    config["global"]["scrape_interval"] = json!("1s");
    config["global"]["evaluation_interval"] = json!("1s");
    let rules: Vec<String> = config["rule_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| kit.join(f.as_str().unwrap()).display().to_string())
        .collect();
    config["rule_files"] = json!(rules);
    for job in config["scrape_configs"].as_array_mut().unwrap() {
        let target = match job["job_name"].as_str().unwrap() {
            "infergate" => gateway_metrics.to_string(),
            "prometheus" => format!("127.0.0.1:{own_port}"),
            other => panic!("prometheus.yml has a job {other} this test does not place"),
        };
        let job = job.as_object_mut().unwrap();
        job.retain(|key, _| !key.ends_with("_sd_configs") && key != "static_configs");
        job.insert("static_configs".into(), json!([{ "targets": [target] }]));
    }
    config
}

/// One YAML document as JSON (through the venv's PyYAML).
fn yaml(path: &Path) -> Value {
    let output = Command::new(support::venv_python())
        .arg(support::repo_root().join("tests/python/yaml_to_json.py"))
        .arg(path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let documents: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    documents.into_iter().next().unwrap()
}

const KEY: &str = "observer-key-5d1f";

fn infer_body(model: &str) -> Value {
    let input = |name: &str| json!({"name": name, "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]});
    match model {
        "add_sub" => json!({"inputs": [input("INPUT0"), input("INPUT1")]}),
        _ => json!({"inputs": [input("INPUT0")]}),
    }
}

/// POSTs an inference with the API key; returns the status (and the answer, for messages).
async fn infer(
    client: &reqwest::Client,
    gateway: &TestGateway,
    model: &str,
    body: &Value,
) -> (u16, String) {
    infer_with(client, gateway, model, body, Some(KEY)).await
}

async fn infer_with(
    client: &reqwest::Client,
    gateway: &TestGateway,
    model: &str,
    body: &Value,
    key: Option<&str>,
) -> (u16, String) {
    support::infer_with_key(client, &gateway.url(), model, body, key).await
}

/// `infer`, retried as a client would while the answer is 503 (a busy machine can fail a
/// health check, or make placement refuse for a while), following `Retry-After`, for 40s.
async fn infer_retrying(
    client: &reqwest::Client,
    gateway: &TestGateway,
    model: &str,
    body: &Value,
) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let answer = support::infer_post(client, &gateway.url(), model, body)
            .header("x-api-key", KEY)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let retry_after = answer
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(1);
        let text = answer.text().await.unwrap();
        if status != 503 || Instant::now() > deadline {
            return (status, text);
        }
        tokio::time::sleep(Duration::from_secs(retry_after.clamp(1, 5))).await;
    }
}

/// Asserts an answer's status, naming the answer when it is another.
#[track_caller]
fn expect(answer: (u16, String), status: u16) {
    assert_eq!(answer.0, status, "{}", answer.1);
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether a query result has a series with a number that is not NaN (a panel would draw it).
fn has_value(series: &[Value]) -> bool {
    series.iter().any(|s| {
        s["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|v| v.is_finite())
    })
}

/// Every panel's queries: (panel title, expression with the dashboard's variables filled in
/// as "All" would, and the rate interval as a window that spans the whole test).
fn dashboard_queries() -> Vec<(String, String)> {
    let path = support::repo_root().join("docker/grafana/dashboards/infergate.json");
    let dashboard: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "2m")
                .replace("$backend", ".*")
                .replace("$model", ".*");
            assert!(!expr.contains('$'), "unfilled variable in {expr}");
            queries.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    queries
}

/// The panels that read only GPU series: a Triton without GPUs exports no `nv_gpu_*`.
const GPU_PANELS: [&str; 3] = ["GPU utilisation", "GPU memory", "GPU power"];

#[tokio::test]
async fn every_dashboard_query_and_recording_rule_has_data_under_traffic() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let tables = format!(
        r#"
[auth]
mode = "required"
[[auth.api_keys]]
name = "observer"
sha256 = "{}"
roles = ["admin"]
[[routes]]
model = "canary"
targets = [{{ model = "sized_a", weight = 50 }}, {{ model = "error_model", weight = 50 }}]
guard = {{ max_error_rate = 0.2, window = "30s", min_requests = 10 }}
[[auth.tenants]]
name = "observer"
max_queued = 2
[[models]]
name = "slow_model"
max_in_flight = 1
"#,
        sha256_hex(KEY)
    );
    // Room for add_sub, error_model, sized_a and sized_b, not for sized_c beside them.
    let placement = "mem_buffer = \"0\"\nmin_churn_age = \"8s\"\nscale_up_rps = 0.0";
    let config = pool_config("obs", &[&triton], "8MiB", placement, &tables);
    let gateway = TestGateway::start_with_admin_key(&config, KEY).await;
    let prometheus = Prometheus::start(gateway.metrics).await;
    let client = reqwest::Client::new();

    // A cold load, then steady traffic to add_sub until the queries ran (irate and rates
    // over Triton's counters need requests between the last scrapes).
    expect(
        infer_retrying(&client, &gateway, "add_sub", &infer_body("add_sub")).await,
        200,
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let background = tokio::spawn({
        let (client, url, stop) = (client.clone(), gateway.url(), stop.clone());
        async move {
            let mut answered = 0;
            while !stop.is_cancelled() {
                // A busy machine can fail a health check: a 503 now and then is no failure
                // of this test, which needs the 200s.
                let answer = client
                    .post(format!("{url}/v2/models/add_sub/infer"))
                    .header("x-api-key", KEY)
                    .json(&infer_body("add_sub"))
                    .send()
                    .await
                    .unwrap();
                answered += usize::from(answer.status() == 200);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answered
        }
    });

    saturate_and_count_tokens(&client, &gateway).await;

    // Refused: a wrong shape (validation), no credential, an unknown model.
    let bad_shape = json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]});
    expect(infer(&client, &gateway, "add_sub", &bad_shape).await, 400);
    let open = infer_with(&client, &gateway, "add_sub", &infer_body("add_sub"), None).await;
    expect(open, 401);
    expect(
        infer(&client, &gateway, "no_such_model", &infer_body("x")).await,
        404,
    );
    // A model that fails to load.
    expect(
        infer(&client, &gateway, "failing_model", &infer_body("x")).await,
        503,
    );
    // A canary whose target fails every request: the guard rolls it back.
    let mut canary = Vec::new();
    for _ in 0..40 {
        canary.push(
            infer(&client, &gateway, "canary", &infer_body("sized_a"))
                .await
                .0,
        );
    }
    assert!(canary.iter().any(|s| *s >= 500), "{canary:?}");
    let canary_done = Instant::now();
    // sized_b fits; sized_c does not without evicting models used moments ago: refused.
    expect(
        infer_retrying(&client, &gateway, "sized_b", &infer_body("sized_b")).await,
        200,
    );
    let mut refused = infer(&client, &gateway, "sized_c", &infer_body("sized_c")).await;
    for _ in 0..10 {
        // Another 503 (a health check failed on a busy machine) is not the refusal asked for.
        if refused.0 != 503 || refused.1.contains("recently used") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        refused = infer(&client, &gateway, "sized_c", &infer_body("sized_c")).await;
    }
    assert!(
        refused.0 == 503 && refused.1.contains("recently used"),
        "{refused:?}"
    );
    // Once they are older than min_churn_age, sized_c evicts them.
    tokio::time::sleep(Duration::from_secs(9).saturating_sub(canary_done.elapsed())).await;
    expect(
        infer_retrying(&client, &gateway, "sized_c", &infer_body("sized_c")).await,
        200,
    );
    // Scrapes and rule evaluations after the last event. A scrape that misses the 1s
    // timeout on a busy machine leaves a gap, so wait for the data rather than a fixed time.
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let empty = without_data(&prometheus).await;
        if empty.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let scrapes = prometheus
                .query("scrape_duration_seconds{job=\"infergate\"}[1m]")
                .await
                .unwrap();
            panic!(
                "no data under traffic:\n{}\nthe gateway's last scrapes: {scrapes:?}",
                empty.join("\n")
            );
        }
    }
    for (label, selector) in [
        ("backend", "infergate_backend_up"),
        ("model", "infergate_requests_total{model!=\"\"}"),
    ] {
        let values = prometheus.label_values(label, selector).await;
        assert!(!values.is_empty(), "variable {label} lists nothing");
    }

    stop.cancel();
    assert!(
        background.await.unwrap() > 50,
        "the steady traffic was answered"
    );
}

/// Traffic for the flow control and token panels: `slow_model` takes one request at a time
/// and tenant `observer` may have 2 waiting, so 8 at once wait (queue depth, wait time,
/// admitted) or are shed (`tenant_full`), one asking for `critical` above its tenant's
/// band (capped); twice, 3 s apart, so that the wait histogram grows between scrapes. Then
/// one OpenAI completion of `echo_words` (tokens).
async fn saturate_and_count_tokens(client: &reqwest::Client, gateway: &TestGateway) {
    let slow = json!({"parameters": {"delay_ms": 100}, "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]});
    expect(
        infer_retrying(client, gateway, "slow_model", &slow).await,
        200,
    );
    let url = format!("{}/v2/models/slow_model/infer", gateway.url());
    for wave in 0..2 {
        if wave > 0 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let sent = (0..8).map(|i| {
            let request = client.post(&url).header("x-api-key", KEY).json(&slow);
            let request = match i {
                0 => request.header("x-infergate-priority", "critical"),
                _ => request,
            };
            async move { request.send().await.unwrap().status().as_u16() }
        });
        let statuses = futures_util::future::join_all(sent).await;
        assert!(statuses.contains(&200), "{statuses:?}");
        assert!(statuses.contains(&503), "{statuses:?}");
        assert!(
            statuses.iter().all(|s| [200, 503].contains(s)),
            "{statuses:?}"
        );
    }
    let completion = client
        .post(format!("{}/v1/completions", gateway.url()))
        .header("x-api-key", KEY)
        .json(&json!({"model": "echo_words", "prompt": "one two three", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(completion.status(), 200);
}

/// What has no data yet: the gateway target and Triton's series through it, each dashboard
/// query (the GPU panels only parse, and must be empty, on a Triton without GPUs), each
/// recording rule. A query that does not parse fails the test at once.
async fn without_data(prometheus: &Prometheus) -> Vec<String> {
    let mut empty = Vec::new();
    for check in [
        "up{job=\"infergate\"} == 1",
        "nv_inference_request_success{job=\"infergate\", backend=\"obs-0\", model=\"add_sub\"}",
    ] {
        if !has_value(&prometheus.query(check).await.unwrap()) {
            empty.push(format!(
                "{check}: one job covers the gateway and its Triton"
            ));
        }
    }
    let gpu = prometheus
        .query("count({__name__=~\"nv_gpu_.*\"})")
        .await
        .unwrap();
    let has_gpus = !gpu.is_empty();
    let mut exempt = BTreeSet::new();
    for (title, expr) in dashboard_queries() {
        let series = prometheus
            .query(&expr)
            .await
            .unwrap_or_else(|e| panic!("panel {title:?}: {expr} does not parse: {e}"));
        if expr.contains("nv_gpu_") && !has_gpus {
            assert!(series.is_empty(), "{title}: GPU series on a CPU Triton?");
            exempt.insert(title);
        } else if !has_value(&series) {
            empty.push(format!("panel {title:?}: {expr} -> {series:?}"));
        }
    }
    if !has_gpus {
        assert_eq!(exempt, BTreeSet::from(GPU_PANELS.map(String::from)));
    }
    let rules = yaml(&support::repo_root().join("docker/prometheus/rules.yml"));
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            if let Some(record) = rule["record"].as_str() {
                let series = prometheus.query(record).await.unwrap();
                if !has_value(&series) {
                    empty.push(format!("rule {record} -> {series:?}"));
                }
            }
        }
    }
    empty
}

/// `infergate_placement_lru_age_seconds{backend}` from the gateway's `/metrics`.
fn lru_ages(metrics: &str) -> Vec<(String, f64)> {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("infergate_placement_lru_age_seconds{backend=\""))
        .filter(|rest| rest.starts_with("lru-"))
        .map(|rest| {
            let (backend, value) = rest.split_once("\"} ").unwrap();
            (backend.to_owned(), value.parse().unwrap())
        })
        .collect()
}

async fn age_of(gateway: &TestGateway, backend: &str) -> f64 {
    let metrics = gateway.metrics_text("/metrics").await;
    lru_ages(&metrics)
        .into_iter()
        .find(|(b, _)| b == backend)
        .unwrap_or_else(|| panic!("no LRU age for {backend}:\n{metrics}"))
        .1
}

#[tokio::test]
async fn lru_age_is_per_backend_leaves_pinned_copies_out_and_follows_placement() {
    let (t0, t1) = tokio::join!(
        Triton::start(TritonOptions::default()),
        Triton::start(TritonOptions::default())
    );
    let (t0, t1) = (t0.unwrap(), t1.unwrap());
    let tables = "[[models]]\nname = \"sized_a\"\nmin_copies = 1\n\
                  [telemetry]\nmerge_backend_metrics = false\n";
    let config = pool_config("lru", &[&t0, &t1], "1GiB", "scale_up_rps = 0.0", tables);
    let gateway = TestGateway::start(&config).await;
    let placed = async {
        loop {
            let placed = gateway.placed().await;
            if placed
                .iter()
                .any(|models| models.contains(&"sized_a".to_string()))
            {
                return placed;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let placed = tokio::time::timeout(Duration::from_secs(30), placed)
        .await
        .expect("the pinned model loads at start");
    let pinned_on = if placed[0].is_empty() {
        "lru-1"
    } else {
        "lru-0"
    };
    let other = if pinned_on == "lru-0" {
        "lru-1"
    } else {
        "lru-0"
    };

    // Nothing evictable anywhere: 0 on both, however long the pinned copy idles.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(age_of(&gateway, pinned_on).await, 0.0);
    assert_eq!(age_of(&gateway, other).await, 0.0);

    // add_sub goes where there is most room: the other backend; its age grows from its use.
    let client = reqwest::Client::new();
    let url = format!("{}/v2/models/add_sub/infer", gateway.url());
    let send = || client.post(&url).json(&infer_body("add_sub")).send();
    assert_eq!(send().await.unwrap().status(), 200);
    assert_eq!(gateway.placed().await, {
        let mut expected = vec![vec!["sized_a".to_string()], vec!["add_sub".to_string()]];
        if pinned_on == "lru-1" {
            expected.reverse();
        }
        expected
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let aged = age_of(&gateway, other).await;
    assert!((1.4..10.0).contains(&aged), "{aged}");
    assert_eq!(age_of(&gateway, pinned_on).await, 0.0);
    // Used again: young again.
    assert_eq!(send().await.unwrap().status(), 200);
    assert!(age_of(&gateway, other).await < 1.0);
    // Unloaded: nothing left there to evict.
    let unload = client
        .post(format!(
            "http://{}/admin/models/add_sub/unload",
            gateway.admin
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(unload.status(), 200);
    assert_eq!(age_of(&gateway, other).await, 0.0);

    // With merge_backend_metrics off, Triton's series are only on /metrics/backends.
    let own = gateway.metrics_text("/metrics").await;
    assert!(!own.contains("nv_inference_count"), "{own}");
    let pool = gateway.metrics_text("/metrics/backends").await;
    assert!(pool.contains("nv_inference_count{backend=\"lru-"), "{pool}");
}
