//! Model control as Triton does it, through the gateway, against real Triton: the official
//! examples' flow (load, config override, unload, a model that does not exist, model files)
//! gets the same answers from the gateway over two backends as from one Triton; an override
//! reaches every copy the gateway loads, on any backend and for chosen versions; an explicit
//! unload holds until the next load; readiness and statistics never load, while metadata and
//! config load a model the gateway has never seen answer them.

mod support;

use serde_json::{Value, json};
use std::time::Duration;
use support::gateway::{TestGateway, pool_config};
use support::{Triton, TritonOptions};

async fn empty_triton() -> Triton {
    Triton::start(TritonOptions::default())
        .await
        .expect("triton starts")
}

/// tests/python/model_control.py against one server: its transcript.
async fn transcript(protocol: &str, url: &str, model: &str) -> Vec<Value> {
    let script = support::repo_root().join("tests/python/model_control.py");
    let output = support::run_python(&script, &[protocol, url, model], &[]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "model_control.py {protocol} {url} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

async fn post(url: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn get(url: &str) -> (u16, Value) {
    let response = reqwest::get(url).await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// `config.pbtxt` of batched_double with another max_batch_size, as the JSON an override is.
fn batched_double_override(max_batch_size: u32) -> String {
    json!({
        "name": "batched_double", "backend": "python", "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": [{"kind": "KIND_CPU"}],
    })
    .to_string()
}

fn batch(rows: usize) -> Value {
    json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 4],
        "data": vec![1.0; rows * 4]}]})
}

/// The backend (index) whose books hold `model`, if any.
async fn holder(gateway: &TestGateway, model: &str) -> Option<usize> {
    gateway
        .placed()
        .await
        .iter()
        .position(|names| names.iter().any(|n| n == model))
}

#[tokio::test]
async fn the_examples_model_control_flow_answers_as_triton_does() {
    let (reference, t0, t1) = tokio::join!(empty_triton(), empty_triton(), empty_triton());
    let gateway = TestGateway::start(&pool_config(
        "control",
        &[&t0, &t1],
        "1GiB",
        "scale_up_rps = 0.0",
        "",
    ))
    .await;
    for protocol in ["http", "grpc"] {
        let (direct, through) = match protocol {
            "http" => (
                format!("127.0.0.1:{}", reference.http_port),
                gateway.http.to_string(),
            ),
            _ => (
                format!("127.0.0.1:{}", reference.grpc_port),
                gateway.grpc.to_string(),
            ),
        };
        let mut expected = transcript(protocol, &direct, "batched_double").await;
        // The one deliberate difference: a model of the repository that nothing has loaded
        // is ready through the gateway, which loads it on the next request (docs/drop-in.md).
        // After the first transcript's explicit unload, it is not, as on Triton.
        assert_eq!(expected[0], json!(["ready before any load", false]));
        if protocol == "http" {
            expected[0] = json!(["ready before any load", true]);
        }
        let answered = transcript(protocol, &through, "batched_double").await;
        for (want, got) in expected.iter().zip(&answered) {
            assert_eq!(got, want, "{protocol}: the gateway differs from Triton");
        }
        assert_eq!(answered.len(), expected.len());
    }
    // Nothing of it is left loaded anywhere.
    assert!(t0.loaded_models().await.unwrap().is_empty());
    assert!(t1.loaded_models().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_override_reaches_every_copy_and_readiness_and_statistics_never_load() {
    let (t0, t1) = tokio::join!(empty_triton(), empty_triton());
    let tritons = [&t0, &t1];
    let gateway = TestGateway::start(&pool_config(
        "override",
        &tritons,
        "1GiB",
        "scale_up_rps = 0.0",
        "",
    ))
    .await;
    let base = gateway.url();
    let admin = format!("http://{}", gateway.admin);

    // Readiness and statistics of a model loaded nowhere load nothing: it is ready (the
    // next request would load it), and has no statistics, as Triton answers a model it has
    // not loaded. A version the repository lacks is not ready.
    for (path, status) in [
        ("/ready", 200),
        ("/stats", 400),
        ("/versions/1/ready", 200),
        ("/versions/7/ready", 400),
    ] {
        let (got, body) = get(&format!("{base}/v2/models/batched_double{path}")).await;
        assert_eq!(got, status, "{path}: {body}");
    }
    assert_eq!(gateway.placed().await, [Vec::<String>::new(), vec![]]);
    assert!(t0.loaded_models().await.unwrap().is_empty());

    // A load with an override: the copy serves it.
    let override4 = batched_double_override(4);
    let load = format!("{base}/v2/repository/models/batched_double/load");
    let (status, body) = post(&load, json!({"parameters": {"config": override4}})).await;
    assert_eq!(status, 200, "{body}");
    let first = holder(&gateway, "batched_double").await.expect("loaded");
    let (_, config) = get(&format!(
        "{}/v2/models/batched_double/config",
        tritons[first].http_url()
    ))
    .await;
    assert_eq!(config["max_batch_size"], 4);

    // Evicted (here: unloaded by the admin API, which requests may undo) while its backend
    // drains: the next request loads it on the other backend, with the override.
    let (status, _) = post(
        &format!("{admin}/admin/backends/override-{first}/drain"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &format!("{admin}/admin/models/batched_double/unload"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = post(&format!("{base}/v2/models/batched_double/infer"), batch(4)).await;
    assert_eq!(status, 200, "{body}");
    let second = holder(&gateway, "batched_double")
        .await
        .expect("loaded again");
    assert_ne!(second, first, "the draining backend took it");
    let (_, config) = get(&format!(
        "{}/v2/models/batched_double/config",
        tritons[second].http_url()
    ))
    .await;
    assert_eq!(
        config["max_batch_size"], 4,
        "the override reached the new copy"
    );
    let (status, body) = post(&format!("{base}/v2/models/batched_double/infer"), batch(6)).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("batch-size must be <= 4"),
        "{body}"
    );

    // A plain load puts the repository's config back on the loaded copy (Triton itself
    // would keep an override in force through a plain load).
    let (status, body) = post(&load, json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (_, config) = get(&format!(
        "{}/v2/models/batched_double/config",
        tritons[second].http_url()
    ))
    .await;
    assert_eq!(config["max_batch_size"], 8);
    let (status, body) = post(&format!("{base}/v2/models/batched_double/infer"), batch(6)).await;
    assert_eq!(status, 200, "{body}");
    post(
        &format!("{admin}/admin/backends/override-{first}/undrain"),
        json!({}),
    )
    .await;

    // Chosen versions are loaded with the override too: `versioned` with a parameter of
    // its own, then version 1 asked for by number (a reload with a specific version policy).
    let versioned = json!({
        "name": "versioned", "backend": "python", "max_batch_size": 0,
        "parameters": {"origin": {"string_value": "override"}},
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": [{"kind": "KIND_CPU"}],
    })
    .to_string();
    let (status, body) = post(
        &format!("{base}/v2/repository/models/versioned/load"),
        json!({"parameters": {"config": versioned}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let request = json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4],
        "data": [1, 2, 3, 4]}]});
    let (status, body) = post(
        &format!("{base}/v2/models/versioned/versions/1/infer"),
        request,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["outputs"][0]["data"],
        json!([101.0, 102.0, 103.0, 104.0])
    );
    // (Version 1 went to the backend without the model, as its own copy; each copy's config
    // is read through the gateway, from the copy that serves that version.)
    for version in [1, 2] {
        let (status, config) = get(&format!(
            "{base}/v2/models/versioned/versions/{version}/config"
        ))
        .await;
        assert_eq!(status, 200, "version {version}: {config}");
        assert_eq!(
            config["parameters"]["origin"]["string_value"], "override",
            "version {version}: {config}"
        );
    }

    // An explicit unload holds: no inference loads the model again, on any protocol, until
    // a load says so.
    let (status, _) = post(
        &format!("{base}/v2/repository/models/versioned/unload"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = post(
        &format!("{base}/v2/models/versioned/infer"),
        json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str().unwrap_or_default()),
        (
            404,
            "Request for unknown model: 'versioned' has no available versions"
        )
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(holder(&gateway, "versioned").await.is_none());
    let (status, _) = post(
        &format!("{base}/v2/repository/models/versioned/load"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    let (_, config) = get(&format!("{base}/v2/models/versioned/config")).await;
    assert_eq!(
        config["parameters"],
        json!({}),
        "the unload dropped the override"
    );
}

/// Metadata and config are most clients' first request: for a model loaded nowhere they
/// place it, as a cold inference does, and are answered by the copy. Once the gateway has
/// seen a copy's answers, a model unloaded since (evicted) is described without a load, on
/// both protocols, in the words Triton uses; it is ready all along.
#[tokio::test]
async fn metadata_places_a_cold_model_and_a_described_one_is_answered_without_a_load() {
    use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use infergate::protocol::inference::{ModelConfigRequest, ModelMetadataRequest};
    use infergate::protocol::inference::{ModelReadyRequest, ModelReadyResponse};

    let (t0, t1) = tokio::join!(empty_triton(), empty_triton());
    let tritons = [&t0, &t1];
    let gateway = TestGateway::start(&pool_config(
        "described",
        &tritons,
        "1GiB",
        "scale_up_rps = 0.0",
        "",
    ))
    .await;
    let (base, admin) = (gateway.url(), format!("http://{}", gateway.admin));
    let mut grpc = GrpcInferenceServiceClient::connect(gateway.grpc_url())
        .await
        .unwrap();
    let ready = |name: &str| ModelReadyRequest {
        name: name.into(),
        version: String::new(),
    };
    assert!(
        grpc.model_ready(ready("add_sub"))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    assert_eq!(get(&format!("{base}/v2/models/add_sub/ready")).await.0, 200);
    assert_eq!(gateway.placed().await, [Vec::<String>::new(), vec![]]);

    // The first request is metadata: it loads the model, and the copy answers.
    let (status, metadata) = get(&format!("{base}/v2/models/add_sub")).await;
    assert_eq!(status, 200, "{metadata}");
    let holder = holder(&gateway, "add_sub").await.expect("placed");
    let direct = tritons[holder].http_url();
    assert_eq!(
        metadata,
        get(&format!("{direct}/v2/models/add_sub")).await.1
    );
    let (_, config) = get(&format!("{direct}/v2/models/add_sub/config")).await;
    let mut direct_grpc = GrpcInferenceServiceClient::connect(tritons[holder].grpc_url())
        .await
        .unwrap();
    let metadata_request = ModelMetadataRequest {
        name: "add_sub".into(),
        version: String::new(),
    };
    let config_request = ModelConfigRequest {
        name: "add_sub".into(),
        version: String::new(),
    };
    let grpc_metadata = direct_grpc
        .model_metadata(metadata_request.clone())
        .await
        .unwrap()
        .into_inner();
    let grpc_config = direct_grpc
        .model_config(config_request.clone())
        .await
        .unwrap()
        .into_inner();

    // An inference (validated: the gateway reads the copy's metadata and config), then the
    // copy goes (as an eviction takes it).
    let request = json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}]});
    let (status, body) = post(&format!("{base}/v2/models/add_sub/infer"), request).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = post(&format!("{admin}/admin/models/add_sub/unload"), json!({})).await;
    assert_eq!(status, 200);
    assert!(t0.loaded_models().await.unwrap().is_empty());
    assert!(t1.loaded_models().await.unwrap().is_empty());

    // Described from what the copy said: equal answers, and nothing loaded.
    assert_eq!(
        get(&format!("{base}/v2/models/add_sub")).await,
        (200, metadata)
    );
    assert_eq!(
        get(&format!("{base}/v2/models/add_sub/config")).await,
        (200, config)
    );
    let answered = grpc.model_metadata(metadata_request).await.unwrap();
    assert_eq!(answered.into_inner(), grpc_metadata);
    let answered = grpc.model_config(config_request).await.unwrap();
    assert_eq!(answered.into_inner(), grpc_config);
    assert_eq!(
        grpc.model_ready(ready("add_sub"))
            .await
            .unwrap()
            .into_inner(),
        ModelReadyResponse { ready: true }
    );
    assert_eq!(gateway.placed().await, [Vec::<String>::new(), vec![]]);
    assert!(t0.loaded_models().await.unwrap().is_empty());
    assert!(t1.loaded_models().await.unwrap().is_empty());

    // A model whose load fails: the load's error, with Retry-After, as a cold inference
    // gets it.
    let answer = reqwest::get(format!("{base}/v2/models/failing_model/config"))
        .await
        .unwrap();
    assert_eq!(answer.status(), 503);
    assert!(answer.headers().contains_key("retry-after"));
    let body: Value = answer.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("failing_model"),
        "{body}"
    );

    // A model no repository has is Triton's 404 / ready false, with nothing loaded.
    let (status, body) = get(&format!("{base}/v2/models/nope")).await;
    assert_eq!(
        (status, body["error"].as_str().unwrap_or_default()),
        (404, "Request for unknown model: 'nope' is not found")
    );
    assert!(
        !grpc
            .model_ready(ready("nope"))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
}
