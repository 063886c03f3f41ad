//! End to end: the HTTP transport and the runner against an in-process
//! fake-triton on a loopback port. Each run is bounded (well under a second
//! of load) and only talks to 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use infergate_load::cli::{Args, Plan};
use infergate_load::fake::{FakeConfig, FakeTriton, serve};
use infergate_load::report::Report;
use infergate_load::runner::{Progress, run_step};
use infergate_load::stats::StepSummary;
use infergate_load::transport::http::{HttpOptions, HttpTransport};

async fn start_fake(cfg: FakeConfig) -> (String, Arc<FakeTriton>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(FakeTriton::new(&cfg));
    tokio::spawn(serve(listener, state.clone()));
    (format!("http://{addr}"), state)
}

/// Short, bounded timing unless the test sets its own.
fn plan(url: &str, extra: &[&str]) -> Plan {
    let mut args = vec!["infergate-load", "--url", url, "--quiet"];
    for (flag, default) in [
        ("--warmup", "100ms"),
        ("--duration", "250ms"),
        ("--windows", "2"),
        ("--timeout", "2s"),
    ] {
        if !extra.contains(&flag) {
            args.extend([flag, default]);
        }
    }
    args.extend_from_slice(extra);
    Args::try_parse_from(args).unwrap().into_plan().unwrap()
}

async fn run(plan: &Plan) -> Vec<StepSummary> {
    let mut out = Vec::new();
    for step in &plan.steps {
        let t = HttpTransport::new(
            &plan.endpoint,
            &plan.bodies,
            HttpOptions {
                connections: step.connections,
                http2: plan.http2,
                check: plan.check,
            },
        )
        .unwrap();
        let r = run_step(
            Arc::new(t),
            *step,
            plan.timing,
            Progress {
                enabled: false,
                prefix: String::new(),
            },
        )
        .await;
        out.push(StepSummary::from_result(&r, plan.stability));
    }
    out
}

const ADD_SUB: [&str; 4] = ["-i", "INPUT0:FP32:4", "-i", "INPUT1:FP32:4"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_closed_loop_with_check() {
    let (url, fake) = start_fake(FakeConfig::default()).await;
    let mut a = ADD_SUB.to_vec();
    a.extend(["--check", "-c", "1,4"]);
    let p = plan(&url, &a);
    let steps = run(&p).await;
    for s in &steps {
        assert!(s.ok > 20, "{}: ok {}", s.label, s.ok);
        assert_eq!(s.errors, 0, "{}: {:?}", s.label, s.errors_by_kind);
        assert!(s.latency_us.p50 > 0);
        assert_eq!(s.windows.len(), 2);
    }
    assert!(fake.infer_count() >= steps.iter().map(|s| s.ok).sum::<u64>());
    let report = Report::new(&p, steps);
    let v = serde_json::to_value(&report).unwrap();
    assert_eq!(v["config"]["encoding"], "json");
    assert!(v["max_rps_at_p95_target"]["throughput_rps"].is_number());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_closed_loop_with_check_and_h2c() {
    let (url, _fake) = start_fake(FakeConfig::default()).await;
    for extra in [&["--binary"][..], &["--binary", "--http2"][..]] {
        let mut a = ADD_SUB.to_vec();
        a.extend(["--check", "-c", "2"]);
        a.extend_from_slice(extra);
        let steps = run(&plan(&url, &a)).await;
        assert!(steps[0].ok > 20, "{extra:?}: ok {}", steps[0].ok);
        assert_eq!(
            steps[0].errors, 0,
            "{extra:?}: {:?}",
            steps[0].errors_by_kind
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_size_runs_against_a_dynamic_model() {
    // What loadtest/validation.sh does, small: any length is this model's shape, and its
    // fixed answer passes --check.
    let (url, fake) = start_fake(FakeConfig {
        models: Vec::new(),
        dynamic_models: vec!["dyn".into()],
        ..Default::default()
    })
    .await;
    for extra in [&[][..], &["--binary"][..]] {
        let mut a = vec!["-m", "dyn", "--body-size", "64KB", "--check", "-c", "2"];
        a.extend_from_slice(extra);
        let p = plan(&url, &a);
        let before = fake.body_bytes();
        let steps = run(&p).await;
        let ok = steps[0].ok;
        assert!(ok > 5, "{extra:?}: ok {ok}");
        assert_eq!(
            steps[0].errors, 0,
            "{extra:?}: {:?}",
            steps[0].errors_by_kind
        );
        let v = serde_json::to_value(Report::new(&p, steps)).unwrap();
        let body = v["config"]["body_bytes"].as_u64().unwrap();
        assert!((63_000..=64_000).contains(&body), "{extra:?}: {body}");
        // Every answered body was read to the end (requests cut off when the run ends
        // add a part of one).
        assert!(fake.body_bytes() - before >= ok * body, "{extra:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_sends_at_the_rate() {
    let (url, _fake) = start_fake(FakeConfig::default()).await;
    let mut a = ADD_SUB.to_vec();
    a.extend(["--check", "--rate", "200"]);
    let steps = run(&plan(&url, &a)).await;
    let s = &steps[0];
    // 200/s over 2 × 250 ms = 100 requests scheduled in the windows.
    assert_eq!(s.requests, 100, "{s:?}");
    assert_eq!(s.errors, 0, "{:?}", s.errors_by_kind);
    assert!((s.throughput_rps - 200.0).abs() < 1.0);
    assert!(s.send_lag_us.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_failures_and_wrong_model_are_counted_by_status() {
    let (url, _fake) = start_fake(FakeConfig {
        fail_rate: 1.0,
        ..Default::default()
    })
    .await;
    let mut a = ADD_SUB.to_vec();
    a.extend(["-c", "2"]);
    let s = &run(&plan(&url, &a)).await[0];
    assert_eq!(s.ok, 0);
    assert!(s.errors_by_kind["http_500"] > 10);

    let (url, _fake) = start_fake(FakeConfig::default()).await;
    let mut a = ADD_SUB.to_vec();
    a.extend(["-c", "1", "--model", "nope"]);
    let s = &run(&plan(&url, &a)).await[0];
    assert_eq!(s.ok, 0);
    assert!(s.errors_by_kind["http_404"] > 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_shows_up_in_latency() {
    let (url, _fake) = start_fake(FakeConfig {
        delay: Duration::from_millis(20),
        ..Default::default()
    })
    .await;
    let mut a = ADD_SUB.to_vec();
    a.extend(["-c", "2", "--p95-target", "10ms"]);
    let p = plan(&url, &a);
    let steps = run(&p).await;
    assert!(
        steps[0].latency_us.p50 >= 20_000,
        "{:?}",
        steps[0].latency_us
    );
    // 20 ms per request cannot meet a 10 ms p95 target.
    let report = Report::new(&p, steps);
    assert!(report.max_rps_at_p95_target.throughput_rps.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_connect_errors() {
    // Bind then drop a listener to get a port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let mut a = ADD_SUB.to_vec();
    a.extend([
        "-c",
        "1",
        "--duration",
        "50ms",
        "--windows",
        "1",
        "--warmup",
        "0s",
    ]);
    let s = &run(&plan(&url, &a)).await[0];
    assert_eq!(s.ok, 0);
    assert!(s.errors_by_kind["connect"] > 0, "{:?}", s.errors_by_kind);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_flags_responses_without_outputs() {
    // A server that answers 200 with a JSON body lacking "outputs".
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        bytes::Bytes::from_static(br#"{"model_name":"add_sub"}"#),
                    )))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let url = format!("http://{addr}");
    let mut a = ADD_SUB.to_vec();
    a.extend(["-c", "1", "--check"]);
    let s = &run(&plan(&url, &a)).await[0];
    assert_eq!(s.ok, 0);
    assert!(s.errors_by_kind["check_no_outputs"] > 10);
    // Without --check the same responses count as successes.
    let mut a = ADD_SUB.to_vec();
    a.extend(["-c", "1"]);
    let s = &run(&plan(&url, &a)).await[0];
    assert!(s.ok > 10 && s.errors == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_custom_headers_reach_the_server() {
    // A server that answers 200 only when every expected header is present (--tenant's key
    // in the header --tenant-header names, --priority's band).
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let h = req.headers();
                    let ok = h.get("authorization").is_some_and(|v| v == "Bearer tok")
                        && h.get("x-api-key").is_some_and(|v| v == "key")
                        && h.get("x-user-id").is_some_and(|v| v == "alice")
                        && h.get("x-tenant-key").is_some_and(|v| v == "tkey")
                        && h.get("x-infergate-priority")
                            .is_some_and(|v| v == "critical")
                        && h.get("content-type")
                            .is_some_and(|v| v == "application/json");
                    let mut resp = hyper::Response::new(Full::new(bytes::Bytes::from_static(
                        br#"{"outputs":[]}"#,
                    )));
                    if !ok {
                        *resp.status_mut() = hyper::StatusCode::UNAUTHORIZED;
                    }
                    Ok::<_, std::convert::Infallible>(resp)
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let url = format!("http://{addr}");
    let mut a = ADD_SUB.to_vec();
    a.extend([
        "-c",
        "1",
        "--check",
        "--bearer",
        "tok",
        "--api-key",
        "key",
        "-H",
        "x-user-id:alice",
        "--tenant",
        "alice=tkey",
        "--tenant-header",
        "x-tenant-key",
        "--priority",
        "critical",
    ]);
    let s = &run(&plan(&url, &a)).await[0];
    assert!(s.ok > 10 && s.errors == 0, "{:?}", s.errors_by_kind);
    let mut a = ADD_SUB.to_vec();
    a.extend(["-c", "1", "--bearer", "wrong"]);
    let s = &run(&plan(&url, &a)).await[0];
    assert_eq!(s.ok, 0);
    assert!(s.errors_by_kind["http_401"] > 10);
}

/// The floor proxy (`hyper-floor`, compare.sh's stage `floor`) relays every request to its
/// backend and every answer back: the load tool's check passes through it, and the backend
/// counts each request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_proxy_relays_requests_and_answers() {
    let (backend, fake) = start_fake(FakeConfig::default()).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut floor = std::process::Command::new(env!("CARGO_BIN_EXE_hyper-floor"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--workers", "2"])
        .args(["--backend", backend.trim_start_matches("http://")])
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "hyper-floor did not listen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut a = ADD_SUB.to_vec();
    a.extend(["--check", "-c", "4"]);
    let steps = run(&plan(&url, &a)).await;
    floor.kill().unwrap();
    floor.wait().unwrap();
    let step = &steps[0];
    assert!(step.ok > 20, "ok {}", step.ok);
    assert_eq!(step.errors, 0, "{:?}", step.errors_by_kind);
    assert!(fake.infer_count() >= step.ok);
}
