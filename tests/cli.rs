//! The `infergate` binary as an operator uses it: `check` on good and bad configs, a run
//! over real Triton with JSON logs, request ids, and a clean exit on SIGTERM, and the drain
//! on SIGTERM/SIGINT with a request in flight (finished, or cut at `server.drain_timeout`).

mod support;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{Triton, TritonOptions, eventually, eventually_every};

fn infergate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infergate"))
}

/// `infergate check --config PATH`, as an operator runs it before a deploy.
fn check(path: &std::path::Path) -> std::process::Output {
    infergate()
        .args(["check", "--config"])
        .arg(path)
        .output()
        .unwrap()
}

fn write_config(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

#[test]
fn check_accepts_the_example_and_names_every_error() {
    let example = support::repo_root().join("config/gateway.toml");
    let output = check(&example);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let bad = write_config(
        r#"
        [listen]
        http = "127.0.0.1:8000"
        [server]
        max_body_size = "64 furlongs"
        [[backends]]
        name = "a"
        http = "http://127.0.0.1:1"
        "#,
    );
    let output = check(bad.path());
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("server.max_body_size: unknown size unit"),
        "{stderr}"
    );

    let bad = write_config(
        r#"
        [listen]
        http = "127.0.0.1:8000"
        [[backends]]
        name = "a"
        http = "http://127.0.0.1:1"
        [[backends]]
        name = "a"
        http = "gopher://x"
        "#,
    );
    let output = infergate()
        .arg("check")
        .env("INFERGATE_CONFIG", bad.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("backends[1].name: duplicate backend name \"a\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("backends[1].http: unsupported URL"),
        "{stderr}"
    );

    // Errors serde finds (an unknown key, bad sizes) and the checks across keys (a duplicate
    // name) in one file: every one is printed, in file order, each with its key.
    let bad = write_config(
        r#"[listen]
http = "127.0.0.1:8000"
colour = "blue"
[server]
max_body_size = "64 furlongs"
[[backends]]
name = "a"
http = "http://127.0.0.1:1"
capacity = "2 parsecs"
[[backends]]
name = "a"
http = "http://127.0.0.1:2"
"#,
    );
    let output = check(bad.path());
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    let file = bad.path().display().to_string();
    let expected = [
        format!("{file}: listen.colour: unknown field `colour`"),
        format!("{file}: server.max_body_size: unknown size unit"),
        format!("{file}: backends[0].capacity: unknown size unit"),
        format!("{file}: backends[1].name: duplicate backend name \"a\""),
    ];
    assert_eq!(lines.len(), expected.len(), "{stderr}");
    for (line, expected) in lines.iter().zip(&expected) {
        assert!(line.starts_with(expected.as_str()), "{stderr}");
    }
    assert!(lines[0].ends_with("(line 3, column 1)"), "{stderr}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn runs_logs_json_with_request_ids_and_exits_cleanly_on_sigterm() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    // Tokio's multi-thread scheduler by default; the current-thread one with one worker.
    for workers in [None, Some("1")] {
        serve_one_request_and_stop(&triton, workers).await;
    }
    access_lines_in_the_text_format(&triton).await;
}

/// The default text log: an HTTP and a gRPC inference each get one access-log line, inside
/// their request's span, with the fields docs/observability.md lists (the line is written
/// without `tracing`'s event machinery, so here is where its form is checked end to end).
async fn access_lines_in_the_text_format(triton: &Triton) {
    let (http, grpc) = (free_port(), free_port());
    let config = write_config(&format!(
        "[listen]\nhttp = \"127.0.0.1:{http}\"\ngrpc = \"127.0.0.1:{grpc}\"\n\
         [[backends]]\nname = \"t0\"\nhttp = \"{}\"\ngrpc = \"{}\"\n",
        triton.http_url(),
        triton.grpc_url()
    ));
    let child = infergate()
        .arg("--config")
        .arg(config.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{http}");
    let client = reqwest::Client::new();
    wait_until_ready(&client, &base).await;
    let answer = support::infer_post(&client, &base, "add_sub", &support::add_sub_request())
        .header("x-request-id", "text-http-1")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let refused = support::infer_post(&client, &base, "add_sub", &serde_json::json!({"inputs": 1}))
        .header("x-request-id", "text-http-2")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let mut grpc_client = infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await.unwrap();
    let mut request = tonic::Request::new(support::grpc::fp32_infer(
        "add_sub",
        &[("INPUT0", [1.0; 4]), ("INPUT1", [2.0; 4])],
    ));
    request
        .metadata_mut()
        .insert("x-request-id", "text-grpc-1".parse().unwrap());
    grpc_client.model_infer(request).await.unwrap();

    signal(&child, "TERM");
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let logs = String::from_utf8_lossy(&output.stdout).to_string();
    let line = |id: &str| {
        logs.lines()
            .find(|l| l.contains(&format!("request_id={id} ")) && l.contains("latency_ms="))
            .unwrap_or_else(|| panic!("no access-log line for {id} in:\n{logs}"))
            .to_owned()
    };
    for (id, fields) in [
        (
            "text-http-1",
            "request method=POST path=\"/v2/models/add_sub/infer\" model=\"add_sub\" \
             version=\"\" backend=\"t0\" route=\"\" tenant=\"\" status=200 latency_ms=",
        ),
        (
            "text-grpc-1",
            "request rpc=\"ModelInfer\" model=\"add_sub\" version=\"\" tenant=\"\" \
             backend=\"t0\" code=\"Ok\" latency_ms=",
        ),
    ] {
        let line = line(id);
        // 2026-12-05T21:40:00.123456Z  INFO request{request_id=ID trace_id=<32 hex>}: request ...
        let (time, rest) = line.split_once(' ').unwrap();
        assert!(time.len() == 27 && time.ends_with('Z'), "{line}");
        let rest = rest.strip_prefix(" INFO request{request_id=").expect(&line);
        let rest = rest.strip_prefix(id).expect(&line);
        let (trace, rest) = rest.strip_prefix(" trace_id=").expect(&line).split_at(32);
        assert!(trace.bytes().all(|b| b.is_ascii_hexdigit()), "{line}");
        assert!(rest.starts_with(&format!("}}: {fields}")), "{line}");
    }
    assert!(line("text-grpc-1").ends_with(" counts=\"\" reason=\"\""));
    // A refusal: the same line, with what went wrong.
    let refused = line("text-http-2");
    assert!(
        refused.contains(" INFO request{request_id=text-http-2 trace_id=")
            && refused.contains(
                "}: request refused method=POST path=\"/v2/models/add_sub/infer\" model=\"add_sub\""
            )
            && refused.contains(" status=400 latency_ms=")
            && refused.contains(" error=\"")
            && refused.contains(" reason=\""),
        "{refused}"
    );
}

async fn serve_one_request_and_stop(triton: &Triton, workers: Option<&str>) {
    let port = free_port();
    let config = write_config(&format!(
        "[listen]\nhttp = \"127.0.0.1:{port}\"\n[upstream]\nhealth_interval = \"200ms\"\n\
         [[backends]]\nname = \"t0\"\nhttp = \"{}\"\n",
        triton.http_url()
    ));
    let mut command = infergate();
    if let Some(workers) = workers {
        command.env("TOKIO_WORKER_THREADS", workers);
    }
    let child = spawn_gateway(command, &config);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    wait_until_ready(&client, &base).await;
    let response = client
        .post(format!("{base}/v2/models/add_sub/infer"))
        .header("x-request-id", "cli-test-7")
        .header("authorization", "Bearer secret-token-value")
        .json(&serde_json::json!({"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [98765.25, 2.5, 3.5, 4.5]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    signal(&child, "TERM");
    let status = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(status.status.success(), "exit status {:?}", status.status);
    let logs = String::from_utf8_lossy(&status.stdout).to_string()
        + &String::from_utf8_lossy(&status.stderr);
    let line = logs
        .lines()
        .find(|l| l.contains("/v2/models/add_sub/infer"))
        .unwrap_or_else(|| panic!("no access log line in:\n{logs}"));
    let entry: serde_json::Value = serde_json::from_str(line).expect("JSON log line");
    assert_eq!(entry["span"]["request_id"], "cli-test-7", "{line}");
    assert_eq!(entry["model"], "add_sub");
    assert_eq!(entry["backend"], "t0");
    assert_eq!(entry["status"], 200);
    assert!(entry["latency_ms"].as_f64().is_some());
    assert!(
        !logs.contains("secret-token-value"),
        "a credential reached the log"
    );
    assert!(!logs.contains("98765"), "a tensor value reached the log");
    assert!(logs.contains("SIGTERM received"));
}

#[test]
fn hash_key_prints_the_sha256_of_a_key_from_an_argument_or_standard_input() {
    // The FIPS 180-2 test vector for "abc".
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    let output = infergate().args(["hash-key", "abc"]).output().unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), ABC);

    let piped = |input: &str| {
        let mut child = infergate()
            .arg("hash-key")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let output = piped("abc\n");
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), ABC);
    let output = piped("\n");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("the key is empty"));
}

/// An `infergate` process serving a config until `stop`.
struct Running {
    child: Child,
    base: String,
    /// Kept until the process stops: it reads the file on reload.
    config: tempfile::NamedTempFile,
}

impl Running {
    /// Starts `infergate --log-format json` on `config` (its `{port}` replaced by a free
    /// port, which `base` then names) and waits until it answers `/v2/health/live`.
    async fn start(config: &str, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let config = write_config(&config.replace("{port}", &port.to_string()));
        let mut command = infergate();
        command.envs(env.iter().copied());
        let child = spawn_gateway(command, &config);
        let base = format!("http://127.0.0.1:{port}");
        eventually(Duration::from_secs(20), "the gateway up", async || {
            reqwest::get(format!("{base}/v2/health/live")).await.is_ok()
        })
        .await;
        Self {
            child,
            base,
            config,
        }
    }

    /// Stops the process with SIGTERM; returns everything it logged.
    async fn stop(self) -> String {
        signal(&self.child, "TERM");
        let output = tokio::task::spawn_blocking(move || self.child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(output.status.success(), "exit status {:?}", output.status);
        String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr)
    }
}

#[tokio::test]
async fn an_open_gateway_beyond_loopback_says_so_at_start_and_after_a_reload() {
    const WARNING: &str = "listening beyond loopback with auth.mode = \\\"none\\\"";
    let backend = "[[backends]]\nname = \"t0\"\nhttp = \"http://127.0.0.1:1\"\n";
    let open = Running::start(
        &format!("[listen]\nhttp = \"0.0.0.0:{{port}}\"\n{backend}"),
        &[],
    )
    .await;
    let logs = open.stop().await;
    assert!(
        logs.contains(WARNING) && logs.contains("0.0.0.0:"),
        "{logs}"
    );

    let local = Running::start(
        &format!("[listen]\nhttp = \"127.0.0.1:{{port}}\"\n{backend}"),
        &[],
    )
    .await;
    let logs = local.stop().await;
    assert!(!logs.contains("listening beyond loopback"), "{logs}");

    // Closed at start, opened by a reload: said after the reload.
    let closed = format!(
        "[listen]\nhttp = \"0.0.0.0:{{port}}\"\n{backend}[auth]\nmode = \"required\"\n\
         [[auth.api_keys]]\nname = \"k\"\nsha256 = \"{}\"\n",
        "0".repeat(64)
    );
    let reopened = Running::start(&closed, &[]).await;
    let text = std::fs::read_to_string(reopened.config.path()).unwrap();
    let open = text.replace("mode = \"required\"", "mode = \"none\"");
    std::fs::write(reopened.config.path(), open).unwrap();
    signal(&reopened.child, "HUP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let logs = reopened.stop().await;
    let reloaded = logs.find("config reloaded").expect(&logs);
    assert!(
        !logs[..reloaded].contains("listening beyond loopback"),
        "{logs}"
    );
    assert!(logs[reloaded..].contains(WARNING), "{logs}");
}

#[tokio::test]
async fn access_logs_name_the_tenant_and_never_a_credential() {
    const SECRET: &str = "a-cli-test-hmac-secret-of-32-bytes!!";
    const API_KEY: &str = "cli-batch-key-0123456789";
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let config = format!(
        r#"
[listen]
http = "127.0.0.1:{{port}}"
[upstream]
health_interval = "200ms"
[[backends]]
name = "t0"
http = "{triton}"
[auth]
mode = "required"
[[auth.jwt_keys]]
id = "hmac"
algorithms = ["HS256"]
secret_env = "INFERGATE_CLI_SECRET"
[[auth.api_keys]]
name = "batch"
tenant = "globex"
sha256 = "{hash}"
"#,
        triton = triton.http_url(),
        hash = infergate::hash_key(API_KEY),
    );
    let gateway = Running::start(&config, &[("INFERGATE_CLI_SECRET", SECRET)]).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({"tenant": "acme", "exp": now + 600});
    let sign = |secret: &str| {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("hmac".into());
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap();
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    };
    let good = sign(SECRET);
    let forged = sign("not-the-secret-not-the-secret-not!!");
    let client = reqwest::Client::new();
    let call = async |id: &str, header: (&str, String)| {
        client
            .post(format!("{}/v2/models/add_sub/infer", gateway.base))
            .header("x-request-id", id)
            .header(header.0, header.1)
            .json(&serde_json::json!({"inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
                {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}]}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    // Until the backend's first ready check, the gateway answers 503.
    eventually(Duration::from_secs(20), "the backend ready", async || {
        call("warm-up", ("x-api-key", API_KEY.into())).await == 200
    })
    .await;
    assert_eq!(
        call("jwt-ok", ("authorization", format!("Bearer {good}"))).await,
        200
    );
    assert_eq!(
        call("jwt-forged", ("authorization", format!("Bearer {forged}"))).await,
        401
    );
    assert_eq!(call("key-ok", ("x-api-key", API_KEY.into())).await, 200);
    assert_eq!(
        call("key-bad", ("x-api-key", format!("{API_KEY}x"))).await,
        401
    );
    let logs = gateway.stop().await;

    let entry = |id: &str| -> serde_json::Value {
        let line = logs
            .lines()
            .find(|l| l.contains(&format!("\"request_id\":\"{id}\"")) && l.contains("\"status\""))
            .unwrap_or_else(|| panic!("no access log line for {id} in:\n{logs}"));
        serde_json::from_str(line).unwrap()
    };
    assert_eq!(
        (
            entry("jwt-ok")["tenant"].as_str(),
            entry("jwt-ok")["status"].as_u64()
        ),
        (Some("acme"), Some(200))
    );
    assert_eq!(
        (
            entry("key-ok")["tenant"].as_str(),
            entry("key-ok")["status"].as_u64()
        ),
        (Some("globex"), Some(200))
    );
    assert_eq!(entry("jwt-forged")["status"], 401);
    assert_eq!(entry("key-bad")["status"], 401);
    let signature = |token: &str| token.rsplit('.').next().unwrap().to_owned();
    for secret in [
        good.as_str(),
        &signature(&good),
        &signature(&forged),
        API_KEY,
        SECRET,
    ] {
        assert!(
            !logs.contains(secret),
            "a credential reached the log: {secret}"
        );
    }
}

/// Runs the gateway binary with `--log-format json --config <config>`, logs piped.
fn spawn_gateway(mut command: Command, config: &tempfile::NamedTempFile) -> Child {
    command
        .args(["--log-format", "json", "--config"])
        .arg(config.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

async fn wait_until_ready(client: &reqwest::Client, base: &str) {
    eventually(Duration::from_secs(20), "the gateway ready", async || {
        let ready = client.get(format!("{base}/v2/health/ready")).send().await;
        ready.is_ok_and(|r| r.status() == 200)
    })
    .await
}

/// Sends `kill -<name>` to the process, as an operator (or an orchestrator) would.
fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// A gateway binary over one Triton, with a metrics listener, and a slow_model request sent
/// through it that is in flight (the gateway's gauge says so) when this returns: waiting for
/// slow_model's load on the first gateway over a Triton, at the backend after that.
struct SlowRequestInFlight {
    child: Child,
    http_port: u16,
    metrics_url: String,
    response: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
    _config: tempfile::NamedTempFile,
}

async fn slow_request_in_flight(
    triton: &Triton,
    drain_timeout: &str,
    delay_ms: u64,
) -> SlowRequestInFlight {
    let (http_port, metrics_port) = (free_port(), free_port());
    let config = write_config(&format!(
        "[listen]\nhttp = \"127.0.0.1:{http_port}\"\nmetrics = \"127.0.0.1:{metrics_port}\"\n\
         [server]\ndrain_timeout = \"{drain_timeout}\"\nshutdown_delay = \"0s\"\n\
         [upstream]\nhealth_interval = \"200ms\"\nrequest_timeout = \"30s\"\n\
         [[backends]]\nname = \"t0\"\nhttp = \"{}\"\n",
        triton.http_url()
    ));
    let child = spawn_gateway(infergate(), &config);
    let base = format!("http://127.0.0.1:{http_port}");
    let client = reqwest::Client::new();
    wait_until_ready(&client, &base).await;
    let response = tokio::spawn(
        client
            .post(format!("{base}/v2/models/slow_model/infer"))
            .json(&serde_json::json!({"parameters": {"delay_ms": delay_ms},
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}))
            .send(),
    );
    let metrics_url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = client
            .get(&metrics_url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains("infergate_requests_in_flight{protocol=\"http\"} 1") {
            break;
        }
        assert!(!response.is_finished(), "the slow request ended early");
        assert!(
            Instant::now() < deadline,
            "the request never got in flight:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    SlowRequestInFlight {
        child,
        http_port,
        metrics_url,
        response,
        _config: config,
    }
}

/// Whether a new TCP connection to the port is refused.
fn refuses_connections(port: u16) -> bool {
    matches!(
        std::net::TcpStream::connect(("127.0.0.1", port)),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

// In its own process: the gauge is process-wide, and the in-process tests run in parallel.
#[tokio::test]
async fn the_in_flight_gauge_counts_a_slow_request_until_it_is_answered() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    // Returns once the gauge reads 1.
    let run = slow_request_in_flight(&triton, "30s", 500).await;
    let response = run.response.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    let text = reqwest::get(&run.metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("infergate_requests_in_flight{protocol=\"http\"} 0\n"),
        "{text}"
    );
    let mut child = run.child;
    signal(&child, "TERM");
    assert!(child.wait().unwrap().success());
}

#[tokio::test]
async fn sigterm_and_sigint_let_the_request_in_flight_finish_and_exit_0() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    for name in ["TERM", "INT"] {
        let run = slow_request_in_flight(&triton, "30s", 1500).await;
        signal(&run.child, name);

        // The listener closes while the request is still being answered.
        eventually_every(
            Duration::from_millis(20),
            Duration::from_secs(5),
            &format!("SIG{name}: the listener closed"),
            async || refuses_connections(run.http_port),
        )
        .await;
        assert!(
            !run.response.is_finished(),
            "SIG{name}: the request ended before the listener closed; the drain is untested"
        );

        let response = run
            .response
            .await
            .unwrap()
            .expect("in-flight request answered");
        assert_eq!(response.status(), 200, "SIG{name}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(
            body["outputs"][0]["data"],
            serde_json::json!([1.0, 2.0, 3.0, 4.0])
        );

        let child = run.child;
        let output = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let logs = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "SIG{name}:\n{logs}");
        assert!(logs.contains(&format!("SIG{name} received")), "{logs}");
    }
}

#[tokio::test]
async fn a_request_longer_than_drain_timeout_is_cut_and_the_process_exits() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let mut run = slow_request_in_flight(&triton, "300ms", 10_000).await;
    let signalled = Instant::now();
    signal(&run.child, "TERM");

    let exit = loop {
        if let Some(status) = run.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(3),
            "still running {:?} after SIGTERM with drain_timeout 300ms",
            signalled.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = signalled.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "exited before the drain timeout: {took:?}"
    );
    assert_eq!(exit.code(), Some(0));

    // The client sees its connection closed at once, not a hang until its 10 s answer.
    let answer = tokio::time::timeout(Duration::from_secs(2), run.response)
        .await
        .expect("the client is left hanging")
        .unwrap();
    let error = answer.expect_err("a request cut by shutdown cannot succeed");
    assert!(error.is_request() || error.is_connect(), "{error:?}");
}

#[tokio::test]
async fn sighup_reloads_the_config_file() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let port = free_port();
    let config_for = |target: &str| {
        format!(
            "[listen]\nhttp = \"127.0.0.1:{port}\"\n[upstream]\nhealth_interval = \"200ms\"\n\
             [[backends]]\nname = \"t0\"\nhttp = \"{}\"\n\
             [[routes]]\nmodel = \"ranker\"\ntargets = [{{ model = \"{target}\", weight = 1 }}]\n",
            triton.http_url()
        )
    };
    let config = write_config(&config_for("sized_a"));
    let child = spawn_gateway(infergate(), &config);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    wait_until_ready(&client, &base).await;
    let served = || async {
        let body: serde_json::Value = client
            .post(format!("{base}/v2/models/ranker/infer"))
            .json(
                &serde_json::json!({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                "shape": [4], "data": [1, 2, 3, 4]}]}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["model_name"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(served().await, "sized_a");

    // New text under the old modification time: the file watcher (which polls the time
    // every second) does not see it, so only the signal can reload it.
    let mtime = std::fs::metadata(config.path())
        .unwrap()
        .modified()
        .unwrap();
    std::fs::write(config.path(), config_for("sized_b")).unwrap();
    std::fs::File::options()
        .write(true)
        .open(config.path())
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(served().await, "sized_a", "reloaded without a signal");

    signal(&child, "HUP");
    eventually(
        Duration::from_secs(5),
        "SIGHUP reloaded the file",
        async || served().await == "sized_b",
    )
    .await;
    signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    let logs = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{logs}");
    assert!(logs.contains("SIGHUP received: reloading config"), "{logs}");
    assert!(logs.contains("config reloaded"), "{logs}");
}

/// A base port `p` with `p..p+3` and `p+10..p+13` free: two Tritons as scripts/triton.sh
/// lays them out (http, grpc, metrics).
fn free_triton_base() -> u16 {
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    (0..200)
        .map(|i| 30_000 + ((std::process::id() as u16 % 500) + i) * 50)
        .find(|&p| (0..3).all(|k| free(p + k) && free(p + 10 + k)))
        .expect("free ports for two Tritons")
}

/// `scripts/demo.sh --once`, the quick start's main job, with the test's own binary and
/// ports: the first request waits for a load (and says where it went), the second is warm,
/// and the books show the copy; everything it started is stopped when it exits.
#[test]
fn the_demo_shows_a_cold_load_then_a_warm_request_and_the_books() {
    let base = free_triton_base();
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let example =
        std::fs::read_to_string(support::repo_root().join("config/gateway.toml")).unwrap();
    let mut config = example;
    for (k, port) in ports.iter().enumerate() {
        config = config.replace(&format!("127.0.0.1:800{k}"), &format!("127.0.0.1:{port}"));
    }
    for (i, triton) in [19000, 19010].iter().enumerate() {
        for k in 0..3 {
            config = config.replace(
                &format!("127.0.0.1:{}", triton + k),
                &format!("127.0.0.1:{}", base + 10 * i as u16 + k as u16),
            );
        }
    }
    let config = write_config(&config);
    let output = Command::new("bash")
        .arg(support::repo_root().join("scripts/demo.sh"))
        .arg("--once")
        .env("INFERGATE_BIN", env!("CARGO_BIN_EXE_infergate"))
        .env("DEMO_CONFIG", config.path())
        .env("DEMO_TRITON_PORT", base.to_string())
        .env("DEMO_HTTP", format!("127.0.0.1:{}", ports[0]))
        .env("DEMO_ADMIN", format!("127.0.0.1:{}", ports[3]))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The "HTTP 200 after N ms" line that follows the step announced by `step`.
    let took = |step: &str| -> u64 {
        let mut lines = stdout.lines().skip_while(|l| !l.contains(step)).skip(1);
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("no step '{step}' in:\n{stdout}"));
        let ms = line
            .trim_start()
            .strip_prefix("HTTP 200 after ")
            .expect(line);
        ms.split(' ').next().unwrap().parse().unwrap()
    };
    let cold = took("== first request");
    let warm = took("== second request");
    assert!(cold > warm, "cold {cold} ms, warm {warm} ms:\n{stdout}");
    assert!(
        stdout.contains("placed: add_sub loaded on triton-"),
        "{stdout}"
    );
    let books = &stdout[stdout.find("/admin/placement").expect(&stdout)..];
    let json: serde_json::Value =
        serde_json::from_str(&books[books.find('{').unwrap()..]).expect(books);
    let copies: Vec<&serde_json::Value> = json["backends"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["models"].as_array().unwrap())
        .collect();
    assert_eq!(copies.len(), 1, "{json}");
    assert_eq!(
        (&copies[0]["name"], &copies[0]["state"]),
        (&"add_sub".into(), &"ready".into())
    );
    // Both Tritons are gone.
    for port in [base, base + 10] {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "a Triton still listens on {port}"
        );
    }
}

#[test]
fn check_loads_the_etcd_tls_files_and_names_the_one_that_does_not_load() {
    let dir = tempfile::tempdir().unwrap();
    let config = |ca: &std::path::Path| {
        write_config(&format!(
            "[listen]\nhttp = \"127.0.0.1:8000\"\n[[backends]]\nname = \"a\"\nhttp = \"http://127.0.0.1:1\"\n\
             [cluster]\netcd = [\"https://127.0.0.1:2379\"]\n[cluster.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            ca.display(),
            dir.path().join("missing.crt").display(),
            dir.path().join("missing.key").display(),
        ))
    };
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let stderr = |file: &tempfile::NamedTempFile| {
        let output = check(file.path());
        assert_eq!(output.status.code(), Some(1));
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let text = stderr(&config(&not_pem));
    assert!(text.contains("cluster.tls.ca: "), "{text}");
    assert!(
        text.contains("no certificate (BEGIN CERTIFICATE)"),
        "{text}"
    );

    let ca = rcgen::generate_simple_self_signed(vec!["etcd".into()]).unwrap();
    let ca_path = dir.path().join("real-ca.pem");
    std::fs::write(&ca_path, ca.cert.pem()).unwrap();
    let text = stderr(&config(&ca_path));
    assert!(text.contains("cluster.tls.cert: cannot read"), "{text}");
}
