//! Smoke test of tests/support: two real Tritons side by side, one started empty in explicit
//! mode (as every gateway test starts them) and given add_sub by `load_model`, one standalone
//! (Triton's default model control, as a reference Triton runs) over a repository of add_sub
//! alone, which it loads at start; one inference each, one python stub per loaded model, and
//! a model whose load fails with a clear error.
mod support;

use serde_json::{Value, json};
use support::{Triton, TritonOptions};

async fn infer_add_sub(client: &reqwest::Client, triton: &Triton) -> anyhow::Result<Value> {
    let body = json!({
        "inputs": [
            {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]},
            {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [10.0, 20.0, 30.0, 40.0]}
        ]
    });
    let resp = support::infer_post(client, &triton.http_url(), "add_sub", &body)
        .send()
        .await?;
    anyhow::ensure!(resp.status() == 200, "infer: {}", resp.status());
    Ok(resp.json().await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tritons_infer_and_failing_load() -> anyhow::Result<()> {
    let repository = tempfile::tempdir()?;
    support::copy_dir(
        &support::model_repository().join("add_sub"),
        &repository.path().join("add_sub"),
    );
    let (a, b) = tokio::join!(
        Triton::start(TritonOptions::default()),
        // This tests the support's `standalone` option itself.
        Triton::start(TritonOptions::standalone(repository.path().to_path_buf())),
    );
    let (mut a, b) = (a?, b?);
    assert_ne!(a.http_port, b.http_port);
    let client = reqwest::Client::new();

    // Default options load nothing, which the gateway tests rely on.
    assert_eq!(a.loaded_models().await?, Vec::<String>::new());
    assert_eq!(a.stub_count(), 0, "no python stub before a load");
    a.load_model("add_sub").await?;

    for triton in [&a, &b] {
        let out = infer_add_sub(&client, triton).await?;
        assert_eq!(out["model_name"], "add_sub");
        let outputs = out["outputs"].as_array().unwrap();
        let by_name = |n: &str| outputs.iter().find(|o| o["name"] == n).unwrap()["data"].clone();
        assert_eq!(by_name("OUTPUT0"), json!([11.0, 22.0, 33.0, 44.0]));
        assert_eq!(by_name("OUTPUT1"), json!([-9.0, -18.0, -27.0, -36.0]));
        assert_eq!(triton.stub_count(), 1, "one python stub for add_sub");
        assert_eq!(triton.loaded_models().await?, vec!["add_sub".to_string()]);
        let metrics = client
            .get(triton.metrics_url())
            .send()
            .await?
            .text()
            .await?;
        assert!(metrics.contains("nv_inference_request_success"));
    }

    // A standalone Triton has no load API: it serves what it loaded at start.
    let url = format!("{}/v2/repository/models/add_sub/load", b.http_url());
    let resp = client.post(url).send().await?;
    let status = resp.status();
    let body: Value = resp.json().await?;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["error"],
        "explicit model load / unload is not allowed if polling is enabled"
    );

    // failing_model's initialize() raises: the load is refused with Triton's message.
    let url = format!("{}/v2/repository/models/failing_model/load", a.http_url());
    let resp = client.post(url).send().await?;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await?;
    let msg = body["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains("load failed for model 'failing_model'")
            && msg.contains("initialize always fails"),
        "unexpected error: {body}"
    );
    assert_eq!(a.stub_count(), 1, "the failed model leaves no stub behind");
    assert!(a.log().contains("failed to load 'failing_model'"));

    // kill() takes the stubs with it and is idempotent.
    let pid = a.pid();
    a.kill();
    a.kill();
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    Ok(())
}
