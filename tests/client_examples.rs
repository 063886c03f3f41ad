//! The official Triton client examples' behaviours, through the gateway as against Triton.
//!
//! tests/python/test_examples.py does what each example in triton-inference-server/client
//! (src/python/examples) does and checks what it checks, on models with the examples' names
//! and signatures (tests/example_models). It runs twice: against a plain tritonserver, which
//! proves the suite itself, then through infergate over two Tritons started empty, with
//! Triton's default flags, where every model is placed by the gateway.

mod support;

use support::gateway::{TestGateway, pool_config_in};
use support::{Triton, TritonOptions};

fn example_models() -> std::path::PathBuf {
    support::repo_root().join("tests").join("example_models")
}

async fn empty_triton() -> Triton {
    Triton::start(TritonOptions {
        repository: Some(example_models()),
        ..Default::default()
    })
    .await
    .expect("tritonserver")
}

/// Runs the suite against `http` and `grpc` (host:port) and fails the test on any failure or
/// skip, with pytest's output.
async fn run_suite(http: &str, grpc: &str, against: &str) {
    let suite = support::repo_root().join("tests/python/test_examples.py");
    let output = support::run_python(
        std::path::Path::new("-m"),
        &[
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
            suite.to_str().unwrap(),
        ],
        &[("EXAMPLES_HTTP", http), ("EXAMPLES_GRPC", grpc)],
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the examples' suite failed against {against}:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(" passed"), "{stdout}");
    assert!(!stdout.contains("skipped"), "a test was skipped:\n{stdout}");
}

#[tokio::test]
async fn the_official_examples_pass_against_triton_and_through_the_gateway() {
    // The reference run: Triton itself, so a check the gateway fails is one Triton passes.
    {
        let triton = empty_triton().await;
        let host = |port: u16| format!("127.0.0.1:{port}");
        run_suite(&host(triton.http_port), &host(triton.grpc_port), "Triton").await;
    }
    let (t0, t1) = tokio::join!(empty_triton(), empty_triton());
    let config = pool_config_in(&example_models(), "examples", &[&t0, &t1], "1GiB", "", "");
    let gateway = TestGateway::start(&config).await;
    run_suite(
        &gateway.http.to_string(),
        &gateway.grpc.to_string(),
        "the gateway",
    )
    .await;
    // What the Tritons hold is exactly what the gateway's books say: every copy was placed
    // (or unloaded) by the gateway, and none was left behind or forgotten.
    let placed = gateway.placed().await;
    let mut loaded = t0.loaded_models().await.unwrap();
    loaded.extend(t1.loaded_models().await.unwrap());
    loaded.sort();
    let mut booked: Vec<String> = placed.into_iter().flatten().collect();
    booked.sort();
    assert_eq!(loaded, booked, "Triton's indexes and the gateway's books");
}
