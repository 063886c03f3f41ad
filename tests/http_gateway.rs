//! The KServe v2 HTTP gateway against two real Triton servers: every endpoint, JSON and binary
//! tensors, BYTES, batching, errors in Triton's shape, a backend dying, metrics and admin.

mod support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::gateway::{TestGateway, config_for, min_copies};
use support::{Triton, TritonOptions};

/// A Triton as users run one: default flags, nothing loaded (the gateway loads each model on
/// its first request).
async fn triton() -> Triton {
    Triton::start(TritonOptions::default())
        .await
        .expect("triton starts")
}

fn add_sub_request() -> Value {
    json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [10.0, 20.0, 30.0, 40.0]}
        ]
    })
}

fn output<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .find(|o| o["name"] == name)
        .unwrap_or_else(|| panic!("no output {name} in {body}"))
}

async fn post_json(url: &str, body: &Value) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn infers_json_binary_bytes_and_batched_through_two_tritons() {
    let (t0, t1) = tokio::join!(triton(), triton());
    let gateway = TestGateway::start(&config_for("infer", &[&t0, &t1], "", "")).await;
    let base = gateway.url();
    let client = reqwest::Client::new();

    // JSON tensors, with a client request id echoed back (the first request loads add_sub).
    let response = client
        .post(format!("{base}/v2/models/add_sub/infer"))
        .header("x-request-id", "test-id-1")
        .json(&add_sub_request())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-request-id"], "test-id-1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        output(&body, "OUTPUT0")["data"],
        json!([11.0, 22.0, 33.0, 44.0])
    );
    assert_eq!(
        output(&body, "OUTPUT1")["data"],
        json!([-9.0, -18.0, -27.0, -36.0])
    );

    // Without one, the gateway makes one.
    let response = client
        .post(format!("{base}/v2/models/add_sub/versions/1/infer"))
        .json(&add_sub_request())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-request-id"].len(), 36);

    // Binary tensors in and out: the bytes Triton sends are the bytes the client gets.
    let header = json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}}
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": true}},
            {"name": "OUTPUT1", "parameters": {"binary_data": true}}
        ]
    })
    .to_string();
    let mut body = header.clone().into_bytes();
    for v in [1f32, 2., 3., 4., 10., 20., 30., 40.] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    let send_binary = |url: String| {
        let body = body.clone();
        let client = client.clone();
        let header_len = header.len();
        async move {
            client
                .post(url)
                .header("Inference-Header-Content-Length", header_len)
                .header("content-type", "application/octet-stream")
                .body(body)
                .send()
                .await
                .unwrap()
        }
    };
    let via_gateway = send_binary(format!("{base}/v2/models/add_sub/infer")).await;
    // Compared with the Triton the gateway loaded add_sub on.
    let direct_to = [&t0, &t1][gateway.holder("add_sub").await];
    let direct = send_binary(format!("{}/v2/models/add_sub/infer", direct_to.http_url())).await;
    assert_eq!(via_gateway.status(), 200);
    let header_len: usize = via_gateway.headers()["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        header_len.to_string(),
        direct.headers()["inference-header-content-length"]
            .to_str()
            .unwrap()
    );
    let gateway_bytes = via_gateway.bytes().await.unwrap();
    assert_eq!(gateway_bytes, direct.bytes().await.unwrap());
    let tensors = &gateway_bytes[header_len..];
    let sums: Vec<f32> = tensors[..16]
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(sums, [11.0, 22.0, 33.0, 44.0]);

    // BYTES tensors.
    let (status, body) = post_json(
        &format!("{base}/v2/models/string_echo/infer"),
        &json!({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2], "data": ["héllo", "world"]}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "OUTPUT0")["data"], json!(["héllo", "world"]));

    // A batched model with a batch of 3.
    let (status, body) = post_json(
        &format!("{base}/v2/models/batched_double/infer"),
        &json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3, 4],
                 "data": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "OUTPUT0")["shape"], json!([3, 4]));
    assert_eq!(output(&body, "OUTPUT0")["data"][11], json!(24.0));

    // string_echo, loaded on one backend by its first request: 20 more all succeed.
    for _ in 0..20 {
        let (status, _) = post_json(
            &format!("{base}/v2/models/string_echo/infer"),
            &json!({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}),
        )
        .await;
        assert_eq!(status, 200);
    }
}

#[tokio::test]
async fn serves_every_metadata_health_and_repository_endpoint() {
    let (t0, t1) = tokio::join!(triton(), triton());
    let gateway = TestGateway::start(&config_for("endpoints", &[&t0, &t1], "", "")).await;
    let base = gateway.url();
    // The first inference of each model loads it, both at once (metadata, config and
    // statistics never load a model, as on Triton).
    let int_request = json!({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [4], "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [4], "data": [1, 1, 1, 1]}]});
    let (add_sub_url, int_url, add_sub_body) = (
        format!("{base}/v2/models/add_sub/infer"),
        format!("{base}/v2/models/add_sub_int/infer"),
        add_sub_request(),
    );
    let (add_sub, add_sub_int) = tokio::join!(
        post_json(&add_sub_url, &add_sub_body),
        post_json(&int_url, &int_request),
    );
    assert_eq!(add_sub.0, 200, "{}", add_sub.1);
    assert_eq!(add_sub_int.0, 200, "{}", add_sub_int.1);
    let get = |path: &str| {
        let url = format!("{base}{path}");
        async move {
            let response = reqwest::get(url).await.unwrap();
            let status = response.status();
            let text = response.text().await.unwrap();
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
            )
        }
    };

    let (status, body) = get("/v2").await;
    assert_eq!(status, 200);
    assert_eq!(body["name"], "triton", "the backends' own name");
    assert!(
        body["extensions"]
            .as_array()
            .unwrap()
            .contains(&json!("binary_tensor_data"))
    );
    assert_eq!(get("/v2/health/live").await.0, 200);
    assert_eq!(get("/v2/health/ready").await.0, 200);

    let (status, body) = get("/v2/models/add_sub").await;
    assert_eq!(status, 200);
    assert_eq!(body["name"], "add_sub");
    assert_eq!(body["inputs"][0]["shape"], json!([4]));
    let (status, body) = get("/v2/models/add_sub_int/versions/1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["inputs"][0]["datatype"], "INT32");
    assert_eq!(get("/v2/models/add_sub/ready").await.0, 200);
    assert_eq!(get("/v2/models/add_sub/versions/1/ready").await.0, 200);
    let (status, body) = get("/v2/models/add_sub/config").await;
    assert_eq!(status, 200);
    assert_eq!(body["backend"], "python");
    let (status, body) = get("/v2/models/add_sub/stats").await;
    assert_eq!(status, 200);
    assert_eq!(body["model_stats"][0]["name"], "add_sub");
    let (status, body) = get("/v2/models/stats").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = body["model_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"add_sub") && names.contains(&"add_sub_int"),
        "{names:?}"
    );

    // The pool's index: both backends' models, READY.
    let (status, index) = post_json(&format!("{base}/v2/repository/index"), &json!({})).await;
    assert_eq!(status, 200);
    let state = |index: &Value, name: &str| {
        index
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == name)
            .map(|e| e["state"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(state(&index, "add_sub"), ["READY"]);
    assert_eq!(state(&index, "add_sub_int"), ["READY"]);
    assert!(state(&index, "string_echo").iter().all(|s| s != "READY"));

    // Load through the gateway: it lands on one backend and is served at once.
    let (status, body) = post_json(
        &format!("{base}/v2/repository/models/string_echo/load"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let stubs_before = t0.stub_count() + t1.stub_count();
    assert_eq!(stubs_before, 3, "one stub per loaded model");
    let (status, _) = post_json(
        &format!("{base}/v2/models/string_echo/infer"),
        &json!({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}),
    )
    .await;
    assert_eq!(status, 200);
    // Unload: gone from Triton, its stub process with it.
    let (status, body) = post_json(
        &format!("{base}/v2/repository/models/string_echo/unload"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    support::eventually_every(
        Duration::from_millis(100),
        Duration::from_secs(10),
        "the unloaded model's stub process gone",
        async || t0.stub_count() + t1.stub_count() == 2,
    )
    .await;
    let echo =
        json!({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]});
    let (status, body) = post_json(&format!("{base}/v2/models/string_echo/infer"), &echo).await;
    // Unloaded on purpose: no request loads it again, as on Triton, until a load.
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        body["error"],
        "Request for unknown model: 'string_echo' has no available versions"
    );
    assert_eq!(t0.stub_count() + t1.stub_count(), 2);
    let (status, body) = post_json(
        &format!("{base}/v2/repository/models/string_echo/load"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post_json(&format!("{base}/v2/models/string_echo/infer"), &echo).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(t0.stub_count() + t1.stub_count(), 3);

    // A load Triton refuses is answered 503 with Triton's own error.
    let (status, body) = post_json(
        &format!("{base}/v2/repository/models/failing_model/load"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("failing_model"),
        "{body}"
    );

    // The admin API shows each backend and its models.
    let backends = gateway.admin_backends().await;
    assert_eq!(backends.len(), 2);
    assert_eq!(backends[0]["name"], "endpoints-0");
    assert_eq!(backends[0]["ready"], true);
    let models = |b: &Value| -> Vec<String> {
        b["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (m0, m1) = (models(&backends[0]), models(&backends[1]));
    // add_sub and add_sub_int, each on the backend whose Triton loaded it.
    for model in ["add_sub", "add_sub_int"] {
        let on: Vec<usize> = [&m0, &m1]
            .iter()
            .enumerate()
            .filter(|(_, models)| models.iter().any(|m| m == model))
            .map(|(b, _)| b)
            .collect();
        assert_eq!(on.len(), 1, "{model}: {m0:?} {m1:?}");
        let loaded = [&t0, &t1][on[0]].loaded_models().await.unwrap();
        assert!(loaded.iter().any(|m| m == model), "{model}: {loaded:?}");
    }
    let echo_copies = m0.iter().chain(&m1).filter(|m| *m == "string_echo").count();
    assert_eq!(
        echo_copies, 1,
        "string_echo is loaded exactly once: {m0:?} {m1:?}"
    );
}

#[tokio::test]
async fn bad_requests_get_tritons_error_shape_and_the_gateway_keeps_serving() {
    let t0 = triton().await;
    let gateway = TestGateway::start(&config_for(
        "badreq",
        &[&t0],
        "request_timeout = \"1500ms\"",
        "max_body_size = \"1KiB\"",
    ))
    .await;
    let base = gateway.url();
    let client = reqwest::Client::new();
    let error_of = |response: reqwest::Response| async move {
        let status = response.status();
        let body: Value = response.json().await.expect("JSON error body");
        (
            status,
            body["error"].as_str().expect("error field").to_string(),
        )
    };

    let (status, error) = error_of(
        client
            .post(format!("{base}/v2/models/nope/infer"))
            .json(&add_sub_request())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(error, "Request for unknown model: 'nope' is not found");

    let (status, error) = error_of(
        client
            .get(format!("{base}/v2/models/add_sub/infer"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 405);
    assert!(
        error.contains("GET") && error.contains("/v2/models/add_sub/infer"),
        "{error}"
    );

    let (status, error) = error_of(
        client
            .get(format!("{base}/v2/nothing/here"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    assert!(error.contains("/v2/nothing/here"), "{error}");

    let (status, error) = error_of(
        client
            .get(format!("{base}/v2/models/add_sub/frobnicate"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404, "{error}");

    let (status, error) = error_of(
        client
            .get(format!("{base}/v2/models/%FF%FE"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    assert!(error.contains("malformed URL"), "{error}");

    // Over the body limit, declared...
    let (status, error) = error_of(
        client
            .post(format!("{base}/v2/models/add_sub/infer"))
            .body(vec![b' '; 4096])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(error, "request body is larger than the limit of 1024 bytes");
    // ...and streamed without a length.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..8).map(|_| Ok(vec![b' '; 512])).collect();
    let (status, error) = error_of(
        client
            .post(format!("{base}/v2/models/add_sub/infer"))
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                chunks,
            )))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 413, "{error}");

    // A backend slower than request_timeout: 504, without waiting for it. (slow_model's
    // first request loads it, so the timed one measures the backend alone.)
    let (status, body) = post_json(
        &format!("{base}/v2/models/slow_model/infer"),
        &json!({"parameters": {"delay_ms": 0},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let started = Instant::now();
    let (status, error) = error_of(
        client
            .post(format!("{base}/v2/models/slow_model/infer"))
            .json(&json!({"parameters": {"delay_ms": 5000},
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 504);
    assert_eq!(error, "backend 'badreq-0' did not answer within 1500ms");
    assert!(started.elapsed() < Duration::from_secs(4));

    // Triton's own 400 for a bad shape passes through as Triton wrote it.
    let (status, error) = error_of(
        client
            .post(format!("{base}/v2/models/add_sub/infer"))
            .json(&json!({"inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]},
                {"name": "INPUT1", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        error.contains("unexpected shape for input 'INPUT")
            && error.contains("Expected [4], got [3]"),
        "{error}"
    );

    // Still serving.
    let (status, body) = post_json(
        &format!("{base}/v2/models/add_sub/infer"),
        &add_sub_request(),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Refusals are counted by kind.
    let metrics = gateway.metrics_text("/metrics").await;
    for kind in [
        "unknown_model",
        "method_not_allowed",
        "not_found",
        "body_too_large",
        "upstream_timeout",
    ] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("infergate_errors_total")
                    && l.contains(&format!("kind=\"{kind}\""))),
            "no {kind} in metrics:\n{metrics}"
        );
    }
}

/// A Triton that dies is routed around at once: a request placed on it finds its
/// connection refused, which means it never reached the backend and the copy is gone, so
/// it is placed again on the other (which loads add_sub). No client sees the dead backend,
/// and none waits long.
#[tokio::test]
async fn a_killed_backends_requests_go_to_the_other() {
    let (t0, t1) = tokio::join!(triton(), triton());
    let gateway = TestGateway::start(&config_for(
        "killed",
        &[&t0, &t1],
        "connect_timeout = \"500ms\"",
        "",
    ))
    .await;
    let url = format!("{}/v2/models/add_sub/infer", gateway.url());
    for _ in 0..10 {
        assert_eq!(post_json(&url, &add_sub_request()).await.0, 200);
    }

    // The backend the first request loaded add_sub on dies.
    let mut tritons = [t0, t1];
    let dead = gateway.holder("add_sub").await;
    let alive = 1 - dead;
    tritons[dead].kill();
    let started = Instant::now();
    for _ in 0..40 {
        let sent = Instant::now();
        let (status, body) = post_json(&url, &add_sub_request()).await;
        assert!(sent.elapsed() < Duration::from_secs(2), "a request hung");
        assert_eq!(status, 200, "{body}");
    }
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(gateway.holder("add_sub").await, alive);

    gateway.wait_for_ready_backends(1).await;
    let backends = gateway.admin_backends().await;
    assert_eq!(backends[dead]["ready"], false);
    assert!(backends[dead]["last_error"].as_str().is_some());
    for _ in 0..10 {
        assert_eq!(post_json(&url, &add_sub_request()).await.0, 200);
    }
    let metrics = gateway.metrics_text("/metrics").await;
    assert!(
        metrics.contains(&format!(
            "infergate_backend_up{{backend=\"killed-{dead}\"}} 0"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "infergate_backend_up{{backend=\"killed-{alive}\"}} 1"
        )),
        "{metrics}"
    );
}

/// A model's python stub that stalls (starved of CPU, or paused with its host) makes Triton
/// give up on it after a second, `500 Stub process 'add_sub_0_0' is not healthy.`, and this
/// Triton aborts soon after the stub runs again, closing the connections of the requests it
/// was serving. The stalled request gets a clear 503 with `Retry-After`, naming the stub;
/// the requests the abort caught go again on a new connection, and to the other Triton
/// once the dead one refuses. Only a request whose second connection the dying Triton also
/// took and closed gets a 503 with `Retry-After`; nothing else but a 200.
#[tokio::test]
async fn a_stalled_stub_gets_a_clear_503_and_its_tritons_abort_fails_no_request() {
    let (t0, t1) = tokio::join!(triton(), triton());
    let gateway = TestGateway::start(&config_for("stub", &[&t0, &t1], "", "")).await;
    let url = format!("{}/v2/models/add_sub/infer", gateway.url());
    assert_eq!(post_json(&url, &add_sub_request()).await.0, 200);
    let mut tritons = [t0, t1];
    let holder = gateway.holder("add_sub").await;

    let stub = tritons[holder].pause_stub("add_sub_0_0");
    let client = reqwest::Client::new();
    let send = || async {
        let answer = client.post(&url).json(&add_sub_request()).send().await;
        let answer = answer.expect("an answer");
        let retry = answer.headers().contains_key("retry-after");
        let status = answer.status();
        (status, retry, answer.json::<Value>().await.unwrap())
    };
    let (status, retry, stalled) = send().await;
    assert_eq!(status, 503, "{stalled}");
    assert!(retry, "no Retry-After: {stalled}");
    let words = stalled["error"].as_str().unwrap();
    assert!(
        words.contains("could not run the request: Stub process 'add_sub_0_0' is not healthy"),
        "{words}"
    );
    stub.resume();

    // Clients at once until well after the abort.
    let clients = (0..4).map(|_| async {
        let (started, mut answers) = (Instant::now(), Vec::new());
        while started.elapsed() < Duration::from_secs(4) {
            answers.push(send().await);
        }
        answers
    });
    let answers: Vec<_> = futures_util::future::join_all(clients)
        .await
        .into_iter()
        .flatten()
        .collect();
    for (status, retry, body) in &answers {
        match status.as_u16() {
            // Each output there is right (this Triton was seen to leave one out of its
            // first answer after such a stall: its own answer, passed on).
            200 => {
                for output in body["outputs"].as_array().unwrap() {
                    let right = match output["name"].as_str() {
                        Some("OUTPUT0") => json!([11.0, 22.0, 33.0, 44.0]),
                        _ => json!([-9.0, -18.0, -27.0, -36.0]),
                    };
                    assert_eq!(output["data"], right, "{body}");
                }
            }
            503 => assert!(*retry, "a 503 without Retry-After: {body}"),
            _ => panic!("{status}: {body}"),
        }
    }
    let ok = answers.iter().filter(|a| a.0 == 200).count();
    assert!(ok * 10 >= answers.len() * 9, "{ok} of {}", answers.len());
    eprintln!(
        "{ok} of {} requests after the stall answered 200; the stalled stub's Triton is {}",
        answers.len(),
        if tritons[holder].is_running() {
            "running"
        } else {
            "gone"
        }
    );
}

#[tokio::test]
async fn no_ready_backend_means_not_ready_and_503() {
    let mut t0 = triton().await;
    let gateway = TestGateway::start(&config_for("noready", &[&t0], "", "")).await;
    t0.kill();
    gateway.wait_for_ready_backends(0).await;
    let response = reqwest::get(format!("{}/v2/health/ready", gateway.url()))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        reqwest::get(format!("{}/v2/health/live", gateway.url()))
            .await
            .unwrap()
            .status(),
        200
    );
    let (status, body) = post_json(
        &format!("{}/v2/models/add_sub/infer", gateway.url()),
        &add_sub_request(),
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(body["error"], "no backend is ready to serve requests");
}

#[tokio::test]
async fn metrics_cover_requests_and_reexport_each_backends_series() {
    let (t0, t1) = tokio::join!(triton(), triton());
    // A copy on each backend, so both report add_sub's series.
    let config = config_for("metrics", &[&t0, &t1], "", "") + &min_copies("add_sub", 2);
    let gateway = TestGateway::start(&config).await;
    gateway.wait_for_copies("add_sub", 2).await;
    let url = format!("{}/v2/models/add_sub/infer", gateway.url());
    for _ in 0..5 {
        assert_eq!(post_json(&url, &add_sub_request()).await.0, 200);
    }
    let versioned = format!("{}/v2/models/add_sub/versions/1/infer", gateway.url());
    assert_eq!(post_json(&versioned, &add_sub_request()).await.0, 200);
    let own = gateway.metrics_text("/metrics").await;
    // Each series names the backend that served it; only the versioned request has a version.
    let served = |version: &str| -> f64 {
        let version = format!("version=\"{version}\"");
        let on = |backend: &str| {
            let filters = [
                "model=\"add_sub\"",
                &version,
                "status=\"2xx\"",
                "protocol=\"http\"",
                backend,
            ];
            support::metric_sum(&own, "infergate_requests_total", &filters)
        };
        on("backend=\"metrics-0\"") + on("backend=\"metrics-1\"")
    };
    assert_eq!(served(""), 5.0, "{own}");
    assert_eq!(served("1"), 1.0, "{own}");
    for name in [
        "infergate_request_duration_seconds_bucket",
        "infergate_upstream_duration_seconds_bucket{backend=\"metrics-",
        "infergate_requests_in_flight",
    ] {
        assert!(own.contains(name), "missing {name}:\n{own}");
    }

    // Both backends' Triton series, labelled; one HELP/TYPE per family.
    let pool = gateway.metrics_text("/metrics/backends").await;
    let successes: Vec<&str> = pool
        .lines()
        .filter(|l| {
            l.starts_with("nv_inference_request_success{") && l.contains("model=\"add_sub\"")
        })
        .collect();
    assert_eq!(successes.len(), 2, "{pool}");
    assert!(
        successes
            .iter()
            .any(|l| l.contains("backend=\"metrics-0\""))
    );
    assert!(
        successes
            .iter()
            .any(|l| l.contains("backend=\"metrics-1\""))
    );
    let total = support::metric_sum(
        &pool,
        "nv_inference_request_success",
        &["model=\"add_sub\""],
    );
    assert_eq!(total, 6.0);
    assert_eq!(
        pool.matches("# TYPE nv_inference_request_success ").count(),
        1
    );
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let t0 = triton().await;
    let mut gateway = TestGateway::start(&config_for(
        "drain",
        &[&t0],
        "",
        "drain_timeout = \"10s\"\nshutdown_delay = \"0s\"",
    ))
    .await;
    let url = format!("{}/v2/models/slow_model/infer", gateway.url());
    let request = json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]});
    let in_flight = tokio::spawn({
        let url = url.clone();
        async move { post_json(&url, &request).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stopped = gateway.begin_shutdown();
    let (status, body) = in_flight.await.unwrap();
    assert_eq!(status, 200, "in-flight request was cut: {body}");
    tokio::time::timeout(Duration::from_secs(5), stopped)
        .await
        .expect("gateway stops after draining")
        .unwrap()
        .unwrap();
    assert!(
        reqwest::get(format!("{}/v2/health/live", gateway.url()))
            .await
            .is_err(),
        "still accepting"
    );
}

// A load balancer keeps idle connections to a replica and may send on one at any moment, so
// a replica that is stopping must not close one under it: from the start of shutdown each
// HTTP/1 answer says `connection: close` (the client opens its next connection elsewhere),
// an HTTP/2 connection gets a GOAWAY at once, and an idle HTTP/1 connection is still served
// during `server.shutdown_delay`.
#[tokio::test]
async fn shutdown_moves_keep_alive_connections_away_before_closing_any() {
    let t0 = triton().await;
    let mut gateway = TestGateway::start(&config_for(
        "goaway",
        &[&t0],
        "",
        "shutdown_delay = \"3s\"\ndrain_timeout = \"5s\"",
    ))
    .await;
    let infer = |uri: &str| {
        let body = serde_json::to_vec(&add_sub_request()).unwrap();
        http::Request::post(format!("{uri}/v2/models/add_sub/infer"))
            .header("content-type", "application/json")
            .header("host", "gateway")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap()
    };
    let uri = gateway.url();
    let connect = || async {
        let stream = tokio::net::TcpStream::connect(gateway.http).await.unwrap();
        hyper_util::rt::TokioIo::new(stream)
    };
    let (mut http1, http1_conn) = hyper::client::conn::http1::handshake(connect().await)
        .await
        .unwrap();
    let mut http1_conn = tokio::spawn(http1_conn);
    let (mut http2, http2_conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        connect().await,
    )
    .await
    .unwrap();
    let mut http2_conn = tokio::spawn(http2_conn);
    let first = http1.send_request(infer(&uri)).await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(
        first.headers().get("connection").is_none(),
        "{:?}",
        first.headers()
    );
    assert_eq!(http2.send_request(infer(&uri)).await.unwrap().status(), 200);

    let signalled = Instant::now();
    let stopped = gateway.begin_shutdown();
    tokio::time::timeout(Duration::from_secs(1), &mut http2_conn)
        .await
        .expect("an HTTP/2 connection is sent a GOAWAY when shutdown begins")
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !http1_conn.is_finished(),
        "an idle HTTP/1 connection was closed"
    );
    http1.ready().await.unwrap();
    let answer = http1.send_request(infer(&uri)).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["connection"], "close");
    tokio::time::timeout(Duration::from_secs(1), &mut http1_conn)
        .await
        .expect("the HTTP/1 connection closes after its answer")
        .unwrap()
        .unwrap();
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "answered after the delay"
    );
    tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .expect("the gateway stops")
        .unwrap()
        .unwrap();
}

// Rolling restarts behind a load balancer: on SIGTERM readiness (HTTP and gRPC health) turns
// false at once, new connections are still served for `server.shutdown_delay`, then refused.
#[tokio::test]
async fn after_shutdown_readiness_is_false_and_new_connections_are_served_for_shutdown_delay() {
    let t0 = Triton::start(TritonOptions::default()).await.unwrap();
    let delay = Duration::from_millis(1500);
    let mut gateway = TestGateway::start(&config_for(
        "delay",
        &[&t0],
        "",
        "shutdown_delay = \"1500ms\"\ndrain_timeout = \"5s\"",
    ))
    .await;
    let url = format!("{}/v2/models/add_sub/infer", gateway.url());
    assert_eq!(post_json(&url, &add_sub_request()).await.0, 200);
    let channel = tonic::transport::Channel::from_shared(gateway.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(channel);
    let grpc_status = |mut health: tonic_health::pb::health_client::HealthClient<
        tonic::transport::Channel,
    >| async move {
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .status()
    };
    use tonic_health::pb::health_check_response::ServingStatus;
    assert_eq!(grpc_status(health.clone()).await, ServingStatus::Serving);

    let signalled = Instant::now();
    let stopped = gateway.begin_shutdown();
    let ready = format!("{}/v2/health/ready", gateway.url());
    // Each check on a new connection (a fresh client), as a load balancer's probe or a new
    // client would make it.
    let ready_status = || async { reqwest::get(&ready).await.map(|r| r.status()) };
    while ready_status().await.unwrap() == 200 {
        assert!(
            signalled.elapsed() < Duration::from_millis(300),
            "still ready"
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(grpc_status(health.clone()).await, ServingStatus::NotServing);
    let mut served = 0;
    while signalled.elapsed() < delay - Duration::from_millis(400) {
        assert_eq!(ready_status().await.unwrap(), 503);
        let (status, body) = post_json(&url, &add_sub_request()).await;
        assert_eq!(status, 200, "{body}");
        served += 1;
    }
    assert!(served >= 3, "{served} requests during the delay");
    tokio::time::timeout(Duration::from_secs(5), stopped)
        .await
        .expect("the gateway stops after the delay")
        .unwrap()
        .unwrap();
    assert!(signalled.elapsed() >= delay, "stopped before the delay");
    let refused = std::net::TcpStream::connect(gateway.http);
    assert!(
        refused.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
        "still accepting after the delay"
    );
}

/// `nv_inference_request_success` for add_sub, read from the Triton itself.
async fn add_sub_successes(triton: &Triton) -> f64 {
    triton
        .metric_sum("nv_inference_request_success", &["model=\"add_sub\""])
        .await
}

#[tokio::test]
async fn a_backend_that_stops_answering_is_marked_down_and_readmitted_when_it_recovers() {
    let (t0, t1) = tokio::join!(triton(), triton());
    // A copy of add_sub on each backend: the readmitted one has one to be given traffic on.
    let config = config_for("readmit", &[&t0, &t1], "", "")
        .replace("health_timeout = \"3s\"", "health_timeout = \"500ms\"")
        + &min_copies("add_sub", 2);
    let gateway = TestGateway::start(&config).await;
    gateway.wait_for_copies("add_sub", 2).await;
    let url = format!("{}/v2/models/add_sub/infer", gateway.url());

    // Wedged, not dead: its sockets stay open, nothing answers.
    t0.pause();
    gateway.wait_for_ready_backends(1).await;
    let backends = gateway.admin_backends().await;
    assert_eq!(backends[0]["ready"], false, "{backends:?}");
    assert_eq!(backends[1]["ready"], true, "{backends:?}");
    let metrics = gateway.metrics_text("/metrics").await;
    assert!(
        metrics.contains("infergate_backend_up{backend=\"readmit-0\"} 0"),
        "{metrics}"
    );
    for _ in 0..3 {
        assert_eq!(post_json(&url, &add_sub_request()).await.0, 200);
    }

    // Back: readmitted by the health checks alone, and given traffic again.
    t0.resume();
    gateway.wait_for_ready_backends(2).await;
    let metrics = gateway.metrics_text("/metrics").await;
    assert!(
        metrics.contains("infergate_backend_up{backend=\"readmit-0\"} 1"),
        "{metrics}"
    );
    let before = add_sub_successes(&t0).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while add_sub_successes(&t0).await == before {
        assert!(
            Instant::now() < deadline,
            "readmit-0 is ready again but gets no requests"
        );
        assert_eq!(post_json(&url, &add_sub_request()).await.0, 200);
    }
}
