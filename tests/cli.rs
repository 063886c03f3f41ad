//! The `infergate` binary as an operator uses it: `check` on good and bad configs, and a run
//! over real Triton with JSON logs, request ids, and a clean exit on SIGTERM.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{Triton, TritonOptions};

fn infergate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infergate"))
}

fn write_config(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

#[test]
fn check_accepts_the_example_and_names_every_error() {
    let example = support::repo_root().join("config/gateway.toml");
    let output = infergate()
        .args(["check", "--config"])
        .arg(&example)
        .output()
        .unwrap();
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
    let output = infergate()
        .args(["check", "--config"])
        .arg(bad.path())
        .output()
        .unwrap();
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
    let triton = Triton::start(TritonOptions::with_models(&["add_sub"]))
        .await
        .unwrap();
    // Tokio's multi-thread scheduler by default; the current-thread one with one worker.
    for workers in [None, Some("1")] {
        serve_one_request_and_stop(&triton, workers).await;
    }
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
    let child = command
        .args(["--log-format", "json", "--config"])
        .arg(config.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = client.get(format!("{base}/v2/health/ready")).send().await
            && r.status() == 200
        {
            break;
        }
        assert!(Instant::now() < deadline, "gateway never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
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
