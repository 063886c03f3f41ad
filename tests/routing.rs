//! Canary routes against real Triton: a route name split 90/10 across two models, sticky keys
//! that never change target, a pinned target, the target named in the response, and a route
//! split between two versions of one model, told apart in the metrics.

mod support;

use serde_json::{Value, json};
use std::time::Duration;
use support::gateway::{TestGateway, routes_config};
use support::wire::{Wire, WireClient};
use support::{Triton, TritonOptions, eventually_every, identity_request};

const ROUTES: &str = r#"
[[routes]]
model = "ranker"
targets = [{ model = "sized_a", weight = 90 }, { model = "sized_b", version = "1", weight = 10 }]

[[routes]]
model = "sticky_ranker"
sticky = "header:x-user-id"
targets = [{ model = "sized_a", weight = 50 }, { model = "sized_b", weight = 50 }]
"#;

/// Sends one infer and returns (served model, infergate-target header or ""). A target that
/// names a version must have been answered by that version.
async fn call(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> (String, String) {
    let mut builder = client.post(url).json(&identity_request());
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = builder.send().await.unwrap();
    assert_eq!(response.status(), 200);
    let target = response
        .headers()
        .get("infergate-target")
        .map_or("", |v| v.to_str().unwrap())
        .to_string();
    let body: Value = response.json().await.unwrap();
    if let Some((_, version)) = target.split_once('/') {
        assert_eq!(body["model_version"], version, "{body}");
    }
    (body["model_name"].as_str().unwrap().to_string(), target)
}

#[tokio::test]
async fn a_route_splits_by_weight_sticks_by_key_and_names_its_target() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&routes_config("routes", &[&triton], ROUTES)).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v2/models/ranker/infer", gateway.url());

    // 10,000 requests at 90/10, 16 at a time.
    let mut canary = 0;
    for _ in 0..625 {
        let batch = (0..16).map(|_| call(&client, &url, &[]));
        for (model, target) in futures_util::future::join_all(batch).await {
            match model.as_str() {
                "sized_b" => {
                    assert_eq!(target, "sized_b/1");
                    canary += 1;
                }
                "sized_a" => assert_eq!(target, "sized_a"),
                other => panic!("served by {other}"),
            }
        }
    }
    let share = canary as f64 / 10_000.0;
    assert!((share - 0.10).abs() <= 0.015, "canary share {share}");

    // Sticky: one user, one target, across 1,000 requests; users spread over both.
    let sticky = format!("{}/v2/models/sticky_ranker/infer", gateway.url());
    let (first, _) = call(&client, &sticky, &[("x-user-id", "user-7")]).await;
    for _ in 0..1000 {
        assert_eq!(
            call(&client, &sticky, &[("x-user-id", "user-7")]).await.0,
            first
        );
    }
    let mut seen = std::collections::HashSet::new();
    for user in 0..40 {
        seen.insert(
            call(&client, &sticky, &[("x-user-id", &format!("u{user}"))])
                .await
                .0,
        );
    }
    assert_eq!(seen.len(), 2, "40 users all landed on one target");

    // A pinned target, and a wrong pin named in the error.
    let (model, target) = call(&client, &url, &[("infergate-target", "sized_b/1")]).await;
    assert_eq!((model.as_str(), target.as_str()), ("sized_b", "sized_b/1"));
    let response = client
        .post(&url)
        .header("infergate-target", "nope")
        .json(&identity_request())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["error"],
        "infergate-target 'nope' is not a target of route 'ranker'"
    );

    // Metadata through the route, and the plain model names still work directly.
    let metadata: Value = client
        .get(format!("{}/v2/models/ranker", gateway.url()))
        .header("infergate-target", "sized_a")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(metadata["name"], "sized_a");
    assert_eq!(
        call(
            &client,
            &format!("{}/v2/models/sized_b/infer", gateway.url()),
            &[]
        )
        .await
        .0,
        "sized_b"
    );

    // Dashboards compare targets of a route.
    let metrics = gateway.metrics_text("/metrics").await;
    let count = |model: &str| -> f64 {
        let model = format!("model=\"{model}\"");
        let filters = ["route=\"ranker\"", &model, "backend=\"routes-0\""];
        support::metric_sum(&metrics, "infergate_requests_total", &filters)
    };
    assert_eq!(count("sized_a") + count("sized_b"), 10_002.0, "{metrics}");
}

/// Sends one infer; returns the status and the model that answered (or the error).
async fn infer_status(client: &reqwest::Client, url: &str) -> (u16, String) {
    infer_status_of(client, url, &identity_request()).await
}

/// `infer_status` with a body of the caller's.
async fn infer_status_of(client: &reqwest::Client, url: &str, body: &Value) -> (u16, String) {
    let response = client.post(url).json(body).send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    let said = body["model_name"].as_str().or(body["error"].as_str());
    (status, said.unwrap_or_default().to_string())
}

async fn admin_routes(gateway: &TestGateway) -> Value {
    reqwest::get(format!("http://{}/admin/routes", gateway.admin))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A 50/50 route whose canary fails every request, guarded by its error rate.
const GUARDED_CANARY: &str = r#"
[[routes]]
model = "guarded"
targets = [{ model = "sized_a", weight = 50 }, { model = "error_model", weight = 50 }]
guard = { max_error_rate = 0.2, window = "30s", min_requests = 10 }
"#;

#[tokio::test]
async fn a_guard_switches_off_a_failing_canary_and_traffic_returns_to_stable() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let routes = GUARDED_CANARY;
    let gateway = TestGateway::start(&routes_config("guards", &[&triton], routes)).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v2/models/guarded/infer", gateway.url());
    let mut answers = Vec::new();
    for _ in 0..120 {
        answers.push(infer_status(&client, &url).await);
    }
    let failures: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    // The canary fails every request; it is switched off once it has answered
    // min_requests of them, all failed.
    assert_eq!(failures.len(), 10, "{failures:?}");
    assert!(
        failures[0].0 >= 500 && failures[0].1.contains("injected failure"),
        "{failures:?}"
    );
    let last = answers
        .iter()
        .rposition(|(status, _)| *status != 200)
        .unwrap();
    assert!(
        answers[last + 1..]
            .iter()
            .all(|(_, model)| model == "sized_a"),
        "after the trip every request goes to the stable target"
    );
    assert!(last < 60, "tripped late: last failure at request {last}");

    let view = admin_routes(&gateway).await;
    let route = &view[0];
    assert_eq!(route["route"], "guarded");
    assert_eq!(route["targets"][1]["target"], "error_model");
    assert_eq!(route["targets"][1]["weight"], 50);
    assert_eq!(route["targets"][1]["current_weight"], 0);
    assert_eq!(route["targets"][1]["window"]["failures"], 10);
    assert_eq!(route["trips"][0]["reason"], "error_rate");
    assert!(
        route["trips"][0]["message"]
            .as_str()
            .unwrap()
            .contains("10 of 10 requests"),
        "{route}"
    );
    let metrics = gateway.metrics_text("/metrics").await;
    assert!(
        metrics.contains(
            "infergate_route_rollbacks_total{route=\"guarded\",target=\"error_model\",reason=\"error_rate\"} 1"
        ),
        "{metrics}"
    );
}

/// A route's guard counts what comes back on a gRPC stream too: each request on the stream
/// is routed by itself, the canary's failed answers (`error_message`) trip the guard, and
/// the stream's later requests go to the stable target.
#[tokio::test]
async fn a_streams_failures_reach_the_canary_guard() {
    use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let routes = GUARDED_CANARY;
    let gateway = TestGateway::start(&routes_config("streamguard", &[&triton], routes)).await;
    let mut client = GrpcInferenceServiceClient::connect(gateway.grpc_url())
        .await
        .unwrap();
    let (requests, queue) = tokio::sync::mpsc::channel(1);
    let mut answers = client
        .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(queue))
        .await
        .unwrap()
        .into_inner();
    let mut served = Vec::new();
    for i in 0..120 {
        let mut request = support::grpc::fp32_infer("guarded", &[("INPUT0", [1.0, 2.0, 3.0, 4.0])]);
        request.id = format!("r{i}");
        requests.send(request).await.unwrap();
        let answer = answers
            .message()
            .await
            .unwrap()
            .expect("an answer per request");
        let model = answer
            .infer_response
            .map(|r| r.model_name)
            .unwrap_or_default();
        served.push((answer.error_message, model));
    }
    drop(requests);
    let failed: Vec<_> = served
        .iter()
        .filter(|(error, _)| !error.is_empty())
        .collect();
    assert_eq!(failed.len(), 10, "{failed:?}");
    assert!(failed[0].0.contains("injected failure"), "{failed:?}");
    let last = served
        .iter()
        .rposition(|(error, _)| !error.is_empty())
        .unwrap();
    assert!(
        served[last + 1..]
            .iter()
            .all(|(_, model)| model == "sized_a"),
        "after the trip every request on the stream goes to the stable target"
    );
    let view = admin_routes(&gateway).await;
    assert_eq!(view[0]["targets"][1]["current_weight"], 0, "{view}");
    assert_eq!(view[0]["trips"][0]["reason"], "error_rate", "{view}");
}

/// How the mirror test runs on one wire: the share of copies `sized_b` draws, how many calls
/// the client makes, and how many of them `sized_b` may get (a 50% draw varies).
struct MirrorCase {
    wire: Wire,
    percent: u32,
    calls: u32,
    copies: std::ops::RangeInclusive<f64>,
}

/// A request's count in Triton's statistics of `model`, over the given outcomes.
async fn stats_count(triton: &Triton, model: &str, outcomes: &[&str]) -> f64 {
    let stats = triton.model_stats(model).await;
    let inference = &stats["model_stats"][0]["inference_stats"];
    outcomes
        .iter()
        .filter_map(|k| inference[k]["count"].as_f64())
        .sum()
}

/// Mirrors get copies of a route's requests, a failing mirror included, and the client only
/// ever sees the primary's answer: the same rule over HTTP, gRPC calls and gRPC streams.
#[tokio::test]
async fn a_mirror_gets_copies_and_the_client_only_sees_the_primary() {
    let cases = [
        MirrorCase {
            wire: Wire::Http,
            percent: 50,
            calls: 200,
            copies: 70.0..=130.0,
        },
        MirrorCase {
            wire: Wire::Grpc,
            percent: 100,
            calls: 40,
            copies: 40.0..=40.0,
        },
        // Each message of a stream is copied as one `ModelInfer`.
        MirrorCase {
            wire: Wire::GrpcStream,
            percent: 100,
            calls: 40,
            copies: 40.0..=40.0,
        },
    ];
    for case in cases {
        let wire = case.wire.name();
        // Metrics are the process's: each wire has a route (and Triton) of its own.
        let route = format!("shadowed_{wire}");
        let triton = Triton::start(TritonOptions::default()).await.unwrap();
        let routes = format!(
            r#"
[[routes]]
model = "{route}"
targets = [
  {{ model = "sized_a", weight = 1 }},
  {{ model = "sized_b", mirror = true, percent = {percent} }},
  {{ model = "error_model", mirror = true, percent = 100 }},
]
"#,
            percent = case.percent
        );
        let config = routes_config(&format!("mirrors-{wire}"), &[&triton], &routes);
        let gateway = TestGateway::start(&config).await;
        let mut client = WireClient::connect(case.wire, &gateway).await;
        // The mirrors are loaded first: while a cold mirror loads, copies beyond the in-flight
        // cap are dropped by design, and this test counts the copies that are drawn.
        for model in ["sized_b", "error_model"] {
            let _ = client.identity(model, 0.0).await;
        }
        for i in 0..case.calls {
            let x = i as f32;
            // The client's answer is the primary's (an identity model), even though one
            // mirror (error_model) fails every copy.
            assert_eq!(
                client.identity(&route, x).await,
                Ok(("sized_a".to_string(), vec![x; 4])),
                "{wire}"
            );
        }
        // The copies reach Triton on their own time, and each is counted by the gateway as
        // sent (sized_b) or failed (error_model).
        let calls = f64::from(case.calls);
        let route_label = format!("route=\"{route}\"");
        let mirrored = |metrics: &str, target: &str, outcome: &str| {
            let (target, outcome) = (
                format!("target=\"{target}\""),
                format!("outcome=\"{outcome}\""),
            );
            let filters = [route_label.as_str(), &target, &outcome];
            support::metric_sum(metrics, "infergate_mirror_requests_total", &filters)
        };
        // Waited for, not asserted after: the wait fails with the last counts it saw.
        eventually_every(
            Duration::from_millis(100),
            Duration::from_secs(30),
            &format!("{wire}: every mirror copy answered and counted"),
            async || {
                // Less the warm-up request.
                let copies = stats_count(&triton, "sized_b", &["success"]).await - 1.0;
                let metrics = gateway.metrics_text("/metrics").await;
                let (sent, failed) = (
                    mirrored(&metrics, "sized_b", "sent"),
                    mirrored(&metrics, "error_model", "failed"),
                );
                // sized_b's copies within the draw's range, each counted as sent; every
                // copy to error_model counted as failed.
                if sent == copies && failed == calls && case.copies.contains(&copies) {
                    Ok(())
                } else {
                    Err((copies, sent, failed))
                }
            },
        )
        .await;
        // Requests error_model answered (Triton files a python model's error response under
        // success or fail depending on its version: both are counted), less the warm-up.
        assert_eq!(
            stats_count(&triton, "error_model", &["success", "fail"]).await - 1.0,
            calls,
            "{wire}: error_model was sent every copy"
        );
        // The primary served exactly the client's calls.
        assert_eq!(
            triton
                .metric_sum("nv_inference_request_success", &["model=\"sized_a\""])
                .await,
            calls,
            "{wire}"
        );
    }
}

/// Value of the one line of `family` whose labels include every `labels` pair.
fn series(metrics: &str, family: &str, labels: &[(&str, &str)]) -> f64 {
    let lines: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with(&format!("{family}{{"))
                && labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .collect();
    assert_eq!(lines.len(), 1, "{family} {labels:?}:\n{metrics}");
    lines[0].rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_route_splits_between_versions_of_one_model_and_the_metrics_tell_them_apart() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let routes = r#"
[[routes]]
model = "versions"
targets = [{ model = "versioned", version = "1", weight = 50 }, { model = "versioned", version = "2", weight = 50 }]
"#;
    let gateway = TestGateway::start(&routes_config("versions", &[&triton], routes)).await;
    let client = reqwest::Client::new();
    let base = gateway.url();
    let mut answered = std::collections::BTreeMap::<String, u32>::new();
    for _ in 0..25 {
        let batch = (0..16).map(|_| async {
            let response = support::infer_post(&client, &base, "versions", &identity_request())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            let target = support::served_target(&response);
            (target, response.json::<Value>().await.unwrap())
        });
        for (target, body) in futures_util::future::join_all(batch).await {
            // Each version answers as itself: its name and version in the body, and its
            // own output (INPUT0 + 100 x version).
            let version = body["model_version"].as_str().unwrap().to_string();
            assert_eq!(target, format!("versioned/{version}"), "{body}");
            assert_eq!(body["model_name"], "versioned");
            let offset = 100.0 * version.parse::<f64>().unwrap();
            assert_eq!(
                body["outputs"][0]["data"],
                json!([1.0 + offset, 2.0 + offset, 3.0 + offset, 4.0 + offset])
            );
            *answered.entry(version).or_default() += 1;
        }
    }
    let (one, two) = (answered["1"], answered["2"]);
    assert_eq!(one + two, 400);
    assert!(
        (160..=240).contains(&one),
        "version 1 answered {one} of 400 at 50%"
    );

    // A request the gateway refuses (a wrong shape, pinned to version 2) is counted for
    // that target too.
    let wrong_shape = json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]});
    let response = support::infer_post(&client, &base, "versions", &wrong_shape)
        .header("infergate-target", "versioned/2")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);

    // Latency per version of the route: a version canary compares with its stable version.
    let metrics = gateway.metrics_text("/metrics").await;
    for (version, count) in [("1", one), ("2", two + 1)] {
        let labels = [
            ("route", "versions"),
            ("model", "versioned"),
            ("version", version),
        ];
        assert_eq!(
            series(
                &metrics,
                "infergate_request_duration_seconds_count",
                &labels
            ),
            f64::from(count),
            "version {version}"
        );
    }
    let labels = [
        ("kind", "invalid_input"),
        ("route", "versions"),
        ("model", "versioned"),
        ("version", "2"),
    ];
    assert_eq!(series(&metrics, "infergate_errors_total", &labels), 1.0);
}

#[tokio::test]
async fn a_cold_canary_is_not_switched_off_for_its_load_time() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    // The canary (sized_b) is faster than the stable target (slow_model, told to sleep
    // 20 ms), but its first request waits about 1.5 s for its load: counted as latency, that
    // alone is the canary's p95 until it has 20 answers, over 70 times the stable target's.
    // Its first answer after the load is slower than the rest (the python stub warms up:
    // about 20 ms, several times that on a busy machine), which a ratio of 20 allows. The
    // stable target sleeps so that the ratio's denominator is not a 1 ms figure that machine
    // load moves tenfold: this test once tripped on a busy machine with the canary's first
    // answer at 94 ms against the stable target's 0.93 ms.
    let routes = r#"
[[routes]]
model = "cold"
targets = [{ model = "slow_model", weight = 50 }, { model = "sized_b", weight = 50 }]
guard = { max_p95_ratio = 20.0, window = "60s", min_requests = 10 }
"#;
    let gateway = TestGateway::start(&routes_config("cold", &[&triton], routes)).await;
    let client = reqwest::Client::new();
    let body = json!({
        "parameters": {"delay_ms": 20},
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}],
    });
    let stable = format!("{}/v2/models/slow_model/infer", gateway.url());
    assert_eq!(infer_status_of(&client, &stable, &body).await.0, 200);
    let url = format!("{}/v2/models/cold/infer", gateway.url());
    let mut canary = 0;
    for sent in 0.. {
        if canary == 30 {
            break;
        }
        assert!(sent < 1000, "{}", admin_routes(&gateway).await);
        let (status, model) = infer_status_of(&client, &url, &body).await;
        assert_eq!(status, 200, "{model}");
        canary += usize::from(model == "sized_b");
    }
    let view = admin_routes(&gateway).await;
    let route = &view[0];
    assert_eq!(route["trips"], json!([]), "{route}");
    assert_eq!(route["targets"][1]["current_weight"], 50, "{route}");
    assert_eq!(route["targets"][1]["window"]["requests"], 30, "{route}");
}
