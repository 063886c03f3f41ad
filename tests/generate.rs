//! Triton's generate extension through the gateway, against real Triton: every body of a
//! corpus gets the same answer from the gateway as from Triton itself (the gateway refusing
//! what Triton refuses before Triton sees it, and nothing else), and `generate_stream`'s
//! server-sent events from a decoupled model reach the client one by one, as the model
//! sends them.

mod support;

use std::time::{Duration, Instant};
use support::gateway::{TestGateway, config_for};
use support::{Triton, TritonOptions};

/// (model/action, body as a client sends it).
const CORPUS: &[(&str, &str)] = &[
    ("text_stream/generate_stream", r#"{"text_input": "a b c"}"#),
    (
        "text_stream/generate_stream",
        r#"{"text_input": "a b c", "max_tokens": 2}"#,
    ),
    (
        "text_stream/generate_stream",
        r#"{"text_input": "x y", "parameters": {"stream": true, "temperature": 0}}"#,
    ),
    (
        "text_stream/generate_stream",
        r#"{"text_input": "a b", "id": "req-7"}"#,
    ),
    ("text_stream/generate_stream", "{}"),
    ("text_stream/generate_stream", r#"{"text_input": 5}"#),
    (
        "text_stream/generate_stream",
        r#"{"text_input": "a", "max_tokens": "2"}"#,
    ),
    (
        "text_stream/generate_stream",
        r#"{"text_input": ["a", "b"]}"#,
    ),
    ("text_stream/generate_stream", "not json"),
    ("text_stream/generate_stream", "[1]"),
    ("text_stream/generate", r#"{"text_input": "hello"}"#),
    ("text_stream/generate", r#"{"text_input": "more than one"}"#),
    (
        "decoupled_repeat/generate_stream",
        r#"{"INPUT0": [1, 2, 3, 4], "REPEAT": 3}"#,
    ),
    (
        "decoupled_repeat/generate_stream",
        r#"{"INPUT0": [1, 2, 3, 4]}"#,
    ),
    (
        "add_sub/generate",
        r#"{"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}"#,
    ),
    (
        "add_sub/versions/1/generate",
        r#"{"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}"#,
    ),
    (
        "add_sub/generate",
        r#"{"INPUT0": [1, 2, 3], "INPUT1": [1, 1, 1, 1]}"#,
    ),
    ("add_sub/generate", r#"{"INPUT0": [1, 2, 3, 4]}"#),
    (
        "add_sub/generate",
        r#"{"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "INPUT1": [2, 2, 2, 2]}"#,
    ),
    (
        "add_sub/generate",
        r#"{"INPUT0": [1, 2, 3, 4], "parameters": {"INPUT1": [1, 1, 1, 1]}}"#,
    ),
    (
        "add_sub/generate",
        r#"{"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "parameters": {"INPUT1": 3}}"#,
    ),
    (
        "add_sub/generate",
        r#"{"INPUT0": null, "INPUT1": [1, 1, 1, 1]}"#,
    ),
    (
        "add_sub/generate",
        r#"{"INPUT0": [[1, 2], [3, 4], [5, 6], [7, 8]], "INPUT1": [1, 1, 1, 1]}"#,
    ),
    (
        "add_sub/generate",
        r#"{"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, "x"]}"#,
    ),
    (
        "add_sub/generate",
        r#"{"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "x": [1]}"#,
    ),
    (
        "add_sub/generate",
        r#"{"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "id": 5}"#,
    ),
    (
        "add_sub/generate",
        r#"{"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "parameters": 5}"#,
    ),
    (
        "batched_double/generate",
        r#"{"INPUT0": [1, 2, 3, 4, 5, 6, 7, 8]}"#,
    ),
    ("batched_double/generate", r#"{"INPUT0": [1, 2, 3]}"#),
    ("batched_double/generate", r#"{"INPUT0": [[1, 2, 3, 4]]}"#),
    ("batched_double/generate", r#"{"INPUT0": []}"#),
    ("batched_double/generate", r#"{"INPUT0": 5}"#),
    (
        "batched_var/generate",
        r#"{"INPUT0": [1, 2], "INPUT1": [1, 2, 3]}"#,
    ),
    (
        "batched_var/generate",
        r#"{"INPUT0": [1, 2, 3], "INPUT1": [1, 2, 3]}"#,
    ),
    (
        "batched_var/generate",
        r#"{"INPUT0": [1, 2], "INPUT1": [1, 2, 3, 4, 5, 6]}"#,
    ),
    ("string_echo/generate", r#"{"INPUT0": ["a", "b"]}"#),
    ("string_echo/generate", r#"{"INPUT0": "a"}"#),
    ("string_echo/generate", r#"{"INPUT0": [["a"], ["b"]]}"#),
    ("string_echo/generate", r#"{"INPUT0": [["a", "c"], ["b"]]}"#),
];

/// The corpus, and nine rows of four: one row over batched_double's max_batch_size of 8.
fn corpus() -> Vec<(&'static str, String)> {
    let mut corpus: Vec<(&str, String)> =
        CORPUS.iter().map(|(p, b)| (*p, (*b).to_string())).collect();
    corpus.push((
        "batched_double/generate",
        format!(r#"{{"INPUT0": {:?}}}"#, vec![1; 36]),
    ));
    corpus
}

async fn send(client: &reqwest::Client, url: String, body: &str) -> (u16, String, String) {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, content_type, response.text().await.unwrap())
}

fn rejections(metrics: &str) -> f64 {
    support::metric_sum(metrics, "infergate_validation_rejections_total", &[])
}

#[tokio::test]
async fn generate_and_generate_stream_answer_as_triton_does() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for("generate", &[&triton], "", "")).await;
    let client = reqwest::Client::new();
    let mut refused = 0;
    for (path, body) in &corpus() {
        // Through the gateway first: its first request for a model loads it there.
        let through = send(&client, format!("{}/v2/models/{path}", gateway.url()), body).await;
        let direct = send(
            &client,
            format!("{}/v2/models/{path}", triton.http_url()),
            body,
        )
        .await;
        assert_eq!(through, direct, "{path} {body}");
        refused += usize::from(through.0 == 400);
    }
    // The gateway refused some of them itself (they never cost Triton a request).
    let by_gateway = rejections(&gateway.metrics_text("/metrics").await);
    assert!(by_gateway >= 8.0, "{by_gateway} of {refused} refusals");

    // Bodies as clients format them: compact and pretty-printed JSON alike.
    let pretty = "{\n  \"text_input\": \"a b\",\n  \"parameters\": {\n    \"stream\": true\n  }\n}";
    let (status, _, events) = send(
        &client,
        format!("{}/v2/models/text_stream/generate_stream", gateway.url()),
        pretty,
    )
    .await;
    assert_eq!(status, 200, "{events}");
    assert_eq!(events.matches("data: ").count(), 2, "{events}");
}

#[tokio::test]
async fn generate_stream_events_arrive_as_the_model_sends_them() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for("sse", &[&triton], "", "")).await;
    let url = format!("{}/v2/models/text_stream/generate_stream", gateway.url());
    let client = reqwest::Client::new();
    // Warm: the first request loads the model.
    let (status, _, _) = send(&client, url.clone(), r#"{"text_input": "warm"}"#).await;
    assert_eq!(status, 200);

    // Four words, 400 ms apart: each event must reach the client when the model sends it.
    let started = Instant::now();
    let response = client
        .post(&url)
        .json(&serde_json::json!({"text_input": "one two three four", "delay_ms": 400}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream; charset=utf-8"
    );
    let mut arrivals = Vec::new();
    let mut text = String::new();
    let mut response = response;
    while let Some(chunk) = response.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while arrivals.len() < text.matches("\n\n").count() {
            arrivals.push(started.elapsed());
        }
    }
    let words: Vec<String> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let event: serde_json::Value =
                serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap();
            event["text_output"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(words, ["one", "two", "three", "four"]);
    assert_eq!(arrivals.len(), 4, "{text}");
    for pair in arrivals.windows(2) {
        assert!(
            pair[1] - pair[0] > Duration::from_millis(250),
            "events were held back and sent together: {arrivals:?}"
        );
    }
    assert!(arrivals[0] < Duration::from_millis(1000), "{arrivals:?}");
}
