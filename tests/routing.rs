//! Canary routes against real Triton: a route name split 90/10 across two models, sticky keys
//! that never change target, a pinned target, and the target named in the response.

mod support;

use serde_json::{Value, json};
use support::gateway::{TestGateway, pool_config};
use support::{Triton, TritonOptions};

const ROUTES: &str = r#"
[[routes]]
model = "ranker"
targets = [{ model = "sized_a", weight = 90 }, { model = "sized_b", version = "1", weight = 10 }]

[[routes]]
model = "sticky_ranker"
sticky = "header:x-user-id"
targets = [{ model = "sized_a", weight = 50 }, { model = "sized_b", weight = 50 }]
"#;

fn request() -> Value {
    json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
}

/// Sends one infer and returns (served model, infergate-target header or "").
async fn call(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> (String, String) {
    let mut builder = client.post(url).json(&request());
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
    (body["model_name"].as_str().unwrap().to_string(), target)
}

#[tokio::test]
async fn a_route_splits_by_weight_sticks_by_key_and_names_its_target() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&pool_config(
        "routes",
        &[&triton],
        "1GiB",
        "scale_up_rps = 0.0",
        ROUTES,
    ))
    .await;
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
        .json(&request())
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
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("infergate_requests_total{")
                    && l.contains("route=\"ranker\"")
                    && l.contains(&format!("model=\"{model}\""))
                    && l.contains("backend=\"routes-0\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert_eq!(count("sized_a") + count("sized_b"), 10_002.0, "{metrics}");
}
