//! The official Python `tritonclient.http` talks to the gateway exactly as it would to Triton:
//! the same conformance suite (tests/python/test_http_client.py) that passes against a plain
//! Triton runs against infergate over two Tritons, started empty with Triton's default flags.

mod support;

use support::gateway::{TestGateway, config_for};
use support::{Triton, TritonOptions};

#[tokio::test]
async fn tritonclient_http_works_through_the_gateway() {
    // Started empty: the suite loads its models through the gateway's repository API.
    let (t0, t1) = tokio::join!(
        Triton::start(TritonOptions::default()),
        Triton::start(TritonOptions::default()),
    );
    let (t0, t1) = (t0.unwrap(), t1.unwrap());
    let gateway = TestGateway::start(&config_for("pyclient", &[&t0, &t1], "", "")).await;
    let suite = support::repo_root().join("tests/python/test_http_client.py");
    let suite = suite.to_str().unwrap();
    let url = gateway.http.to_string();
    // `python -m pytest FILE`: run_python's script argument is the `-m` flag here.
    let output = support::run_python(
        std::path::Path::new("-m"),
        &["pytest", "-q", "-p", "no:cacheprovider", "-rs", suite],
        &[("INFERGATE_URL", url.as_str())],
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "tritonclient suite failed through the gateway:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(" passed"), "{stdout}");
    assert!(!stdout.contains("skipped"), "a test was skipped:\n{stdout}");
}
