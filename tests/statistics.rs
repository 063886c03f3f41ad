//! A model's statistics through the gateway cover every copy that serves it: against two
//! real Tritons each holding a copy, the gateway's numbers (HTTP, per version, every model,
//! and gRPC) are the sum of what each Triton reports, with the latest `last_inference`.

mod support;

use infergate::protocol::inference::ModelStatisticsRequest;
use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::{Value, json};
use support::gateway::{TestGateway, pool_config};
use support::{Triton, TritonOptions};

fn add_sub() -> Value {
    json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}
    ]})
}

async fn get(url: String) -> Value {
    let response = reqwest::get(&url).await.unwrap();
    assert_eq!(response.status(), 200, "{url}");
    response.json().await.unwrap()
}

/// The `add_sub` row of a statistics answer.
fn row(stats: &Value) -> &Value {
    stats["model_stats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "add_sub")
        .unwrap_or_else(|| panic!("no add_sub row in {stats}"))
}

#[tokio::test]
async fn statistics_are_summed_over_the_copies_that_serve_a_model() {
    let (t0, t1) = tokio::join!(
        Triton::start(TritonOptions::default()),
        Triton::start(TritonOptions::default())
    );
    let (t0, t1) = (t0.unwrap(), t1.unwrap());
    let gateway = TestGateway::start(&pool_config(
        "stats",
        &[&t0, &t1],
        "1GiB",
        "scale_up_rps = 0.0",
        "[[models]]\nname = \"add_sub\"\nmin_copies = 2\n",
    ))
    .await;
    // One copy on each backend (min_copies), loaded at start: ready in the books and in
    // each Triton's own index.
    let every = std::time::Duration::from_millis(100);
    let limit = std::time::Duration::from_secs(30);
    support::eventually_every(every, limit, "a ready copy on each backend", async || {
        let placement = gateway.placement().await;
        let ready_copies = placement["backends"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|b| b["models"].as_array().unwrap().clone())
            .filter(|m| m["name"] == "add_sub" && m["state"] == "ready")
            .count();
        let on = |loaded: Vec<String>| loaded.iter().any(|m| m == "add_sub");
        if ready_copies == 2
            && on(t0.loaded_models().await.unwrap())
            && on(t1.loaded_models().await.unwrap())
        {
            Ok(())
        } else {
            Err(placement)
        }
    })
    .await;
    let client = reqwest::Client::new();
    // Requests through the gateway, and some straight to each Triton, so that both copies
    // have counted something.
    for (url, count) in [
        (format!("{}/v2/models/add_sub/infer", gateway.url()), 5),
        (format!("{}/v2/models/add_sub/infer", t0.http_url()), 2),
        (format!("{}/v2/models/add_sub/infer", t1.http_url()), 3),
    ] {
        for _ in 0..count {
            let response = client.post(&url).json(&add_sub()).send().await.unwrap();
            let status = response.status();
            assert_eq!(status, 200, "{url}: {}", response.text().await.unwrap());
        }
    }
    let direct = [
        get(format!("{}/v2/models/add_sub/stats", t0.http_url())).await,
        get(format!("{}/v2/models/add_sub/stats", t1.http_url())).await,
    ];
    let (a, b) = (row(&direct[0]), row(&direct[1]));
    let sum = |path: &[&str]| {
        let at = |r: &Value| path.iter().fold(r, |v, k| &v[*k]).as_u64().unwrap();
        at(a) + at(b)
    };
    let through = get(format!("{}/v2/models/add_sub/stats", gateway.url())).await;
    let versioned = get(format!(
        "{}/v2/models/add_sub/versions/1/stats",
        gateway.url()
    ))
    .await;
    let everything = get(format!("{}/v2/models/stats", gateway.url())).await;
    for answer in [&through, &versioned, &everything] {
        let merged = row(answer);
        assert_eq!(merged["version"], "1");
        for path in [
            &["inference_count"][..],
            &["execution_count"],
            &["inference_stats", "success", "count"],
            &["inference_stats", "success", "ns"],
            &["inference_stats", "queue", "ns"],
            &["inference_stats", "compute_infer", "ns"],
        ] {
            let at = path.iter().fold(merged, |v, k| &v[*k]);
            assert_eq!(at.as_u64(), Some(sum(path)), "{path:?} in {merged}");
        }
        assert_eq!(
            merged["last_inference"].as_u64().unwrap(),
            a["last_inference"]
                .as_u64()
                .unwrap()
                .max(b["last_inference"].as_u64().unwrap())
        );
        let batches = merged["batch_stats"].as_array().unwrap();
        assert_eq!(batches.len(), 1, "{merged}");
        assert_eq!(batches[0]["batch_size"], 1);
        assert_eq!(
            batches[0]["compute_infer"]["count"].as_u64(),
            Some(sum(&["inference_count"]))
        );
    }
    // Each copy counts the requests it served: 5 through the gateway, 5 straight.
    assert_eq!(sum(&["inference_count"]), 10);
    assert!(
        a["inference_count"].as_u64().unwrap() >= 2 && b["inference_count"].as_u64().unwrap() >= 3
    );

    // gRPC reads the same sums.
    let mut grpc = GrpcInferenceServiceClient::connect(gateway.grpc_url())
        .await
        .unwrap();
    let answer = grpc
        .model_statistics(ModelStatisticsRequest {
            name: "add_sub".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let stats = &answer.model_stats[0];
    assert_eq!(stats.inference_count, sum(&["inference_count"]));
    assert_eq!(
        stats
            .inference_stats
            .as_ref()
            .unwrap()
            .success
            .as_ref()
            .unwrap()
            .ns,
        sum(&["inference_stats", "success", "ns"])
    );
}
