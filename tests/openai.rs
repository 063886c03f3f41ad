//! The OpenAI endpoints through the gateway, with the official `openai` Python package
//! (tests/python/test_openai.py) over a real Triton started empty with its default flags:
//! chat and completions, streamed and not, `usage` by the model's tokenizer, chunks as the
//! model sends them, and OpenAI-shaped refusals. The model (tests/models/echo_words) is a
//! decoupled python model that echoes its prompt's words; its tokenizer and chat template
//! are files in its directory of the repository, which the gateway reads from
//! `placement.model_repository`. A canary route splits chat traffic by weight, and a
//! tenant's `tokens_per_minute` is a quota.

mod support;

use support::gateway::{TestGateway, pool_config, pool_config_in};
use support::{Triton, TritonOptions};

#[tokio::test]
async fn openai_clients_work_through_the_gateway() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&pool_config("openai", &[&triton], "1GiB", "", "")).await;
    // The same model with a tokenizer but no chat template ([[models]].tokenizer): chat is
    // refused, completions work.
    let plain = tempfile::tempdir().unwrap();
    let model_dir = support::model_repository().join("echo_words");
    std::fs::copy(
        model_dir.join("tokenizer.json"),
        plain.path().join("tokenizer.json"),
    )
    .unwrap();
    let tables = format!(
        "[[models]]\nname = \"echo_words\"\ntokenizer = \"{}\"\n",
        plain.path().display()
    );
    let plain_gateway = TestGateway::start(&pool_config(
        "openai-plain",
        &[&triton],
        "1GiB",
        "",
        &tables,
    ))
    .await;

    // Placed on its first chat request.
    assert!(!loaded(&triton).await, "Triton started empty");
    let chat = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gateway.url()))
        .json(&serde_json::json!({
            "model": "echo_words",
            "messages": [{"role": "user", "content": "hello world"}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    let chat: serde_json::Value = chat.json().await.unwrap();
    assert_eq!(
        chat["choices"][0]["message"]["content"],
        "user: hello world assistant:"
    );
    assert!(loaded(&triton).await, "the first chat placed the model");

    let url = format!("{}/v1", gateway.url());
    let plain_url = format!("{}/v1", plain_gateway.url());
    let tokenizer = model_dir.join("tokenizer.json");
    let suite = support::repo_root().join("tests/python/test_openai.py");
    let stdout = support::run_pytest(
        &suite,
        &[],
        &[
            ("INFERGATE_OPENAI_URL", url.as_str()),
            ("INFERGATE_PLAIN_URL", plain_url.as_str()),
            ("ECHO_TOKENIZER", tokenizer.to_str().unwrap()),
        ],
        "the openai package's suite failed through the gateway",
    )
    .await;
    assert!(stdout.contains("12 passed"), "{stdout}");
    assert!(!stdout.contains("skipped"), "{stdout}");

    // The pipeline's metrics count them as the generate requests they became.
    let served = gateway
        .metric_sum("infergate_requests_total", &["model=\"echo_words\""])
        .await;
    assert!(served >= 5.0, "{served}");

    // Tokens are counted per tenant and model as the answers' usage says, streamed or not.
    let tokens = async |kind: &str| {
        let kind = format!("kind=\"{kind}\"");
        gateway
            .metric_sum("infergate_tokens_total", &["model=\"echo_words\"", &kind])
            .await
    };
    let before = (tokens("prompt").await, tokens("completion").await);
    let client = reqwest::Client::new();
    let mut usage = (0.0, 0.0);
    for stream in [false, true] {
        let answer = client
            .post(format!("{}/v1/completions", gateway.url()))
            .json(&serde_json::json!({
                "model": "echo_words", "prompt": "one two three", "max_tokens": 2,
                "stream": stream,
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        let text = answer.text().await.unwrap();
        if stream {
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            usage.0 += 3.0;
            usage.1 += 2.0;
        } else {
            let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
            usage.0 += answer["usage"]["prompt_tokens"].as_f64().unwrap();
            usage.1 += answer["usage"]["completion_tokens"].as_f64().unwrap();
        }
    }
    let after = (tokens("prompt").await, tokens("completion").await);
    assert_eq!((after.0 - before.0, after.1 - before.1), usage);

    a_client_leaving_mid_stream_frees_the_copy(&gateway).await;
    tokens_per_minute_is_a_quota(&triton).await;
}

/// A client that leaves a stream after two chunks of twenty (the model would take 3 s
/// more) lets go of the copy's lease at once, and the tokens sent so far are counted.
async fn a_client_leaving_mid_stream_frees_the_copy(gateway: &TestGateway) {
    let in_flight = async || {
        let placement = gateway.placement().await;
        placement["backends"][0]["models"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["name"] == "echo_words")
            .map(|m| m["in_flight"].as_u64().unwrap())
            .sum::<u64>()
    };
    let prompt_tokens = async || {
        gateway
            .metric_sum(
                "infergate_tokens_total",
                &["model=\"echo_words\"", "kind=\"prompt\""],
            )
            .await
    };
    let before = prompt_tokens().await;
    let prompt = "one two three four five six a b c d one two three four five six a b c d";
    let mut stream = reqwest::Client::new()
        .post(format!("{}/v1/completions", gateway.url()))
        .json(&serde_json::json!({"model": "echo_words", "prompt": prompt, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut text = String::new();
    while text.matches("\n\n").count() < 2 {
        let chunk = stream.chunk().await.unwrap().expect("the stream goes on");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert_eq!(in_flight().await, 1, "the stream holds the copy");
    let left = std::time::Instant::now();
    drop(stream);
    support::eventually(
        std::time::Duration::from_secs(2),
        "the lease let go",
        async || in_flight().await == 0,
    )
    .await;
    assert!(left.elapsed() < std::time::Duration::from_secs(2));
    let counted = support::eventually(
        std::time::Duration::from_secs(2),
        "the prompt counted",
        async || {
            let now = prompt_tokens().await;
            (now > before).then_some(now - before)
        },
    )
    .await;
    assert_eq!(counted, 20.0);

    // The backend's stream ended too: the model (one instance) takes the next request at
    // once, not after the 2.7 s the left stream's words would have taken.
    let next = std::time::Instant::now();
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/completions", gateway.url()))
        .json(&serde_json::json!({"model": "echo_words", "prompt": "a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert!(
        next.elapsed() < std::time::Duration::from_millis(1500),
        "the left stream kept the model busy: {:?}",
        next.elapsed()
    );
}

/// A tenant with `tokens_per_minute = 20`: four completions of 3 + 2 tokens spend the
/// minute (each admitted against its prompt plus `max_tokens`), the fifth gets 429 in
/// OpenAI's shape with `Retry-After`, and the tenant's token counter holds the answers'
/// usage.
async fn tokens_per_minute_is_a_quota(triton: &Triton) {
    const KEY: &str = "metered-key";
    const ADMIN: &str = "ops-key";
    let tables = format!(
        "[auth]\nmode = \"required\"\n\
         [[auth.api_keys]]\nname = \"ops\"\nsha256 = \"{}\"\nroles = [\"admin\"]\n\
         [[auth.api_keys]]\nname = \"metered\"\nsha256 = \"{}\"\n\
         [[auth.tenants]]\nname = \"metered\"\nmodels = [\"*\"]\ntokens_per_minute = 20\n",
        infergate::hash_key(ADMIN),
        infergate::hash_key(KEY)
    );
    let config = pool_config("openai-quota", &[triton], "1GiB", "", &tables);
    let gateway = TestGateway::start_with_admin_key(&config, ADMIN).await;
    let client = reqwest::Client::new();
    let complete = async || {
        client
            .post(format!("{}/v1/completions", gateway.url()))
            .bearer_auth(KEY)
            .json(&serde_json::json!({
                "model": "echo_words", "prompt": "one two three", "max_tokens": 2,
            }))
            .send()
            .await
            .unwrap()
    };
    let mut used = 0;
    for _ in 0..4 {
        let answer = complete().await;
        assert_eq!(answer.status(), 200);
        let answer: serde_json::Value = answer.json().await.unwrap();
        used += answer["usage"]["total_tokens"].as_u64().unwrap();
    }
    assert_eq!(used, 20);
    let refused = complete().await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let refused: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(refused["error"]["type"], "rate_limit_exceeded", "{refused}");
    assert_eq!(refused["error"]["code"], "rate_limit_exceeded", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("20 tokens per minute"),
        "{refused}"
    );
    let counted = gateway
        .metric_sum("infergate_tokens_total", &["tenant=\"metered\""])
        .await;
    assert_eq!(counted, 20.0);
}

async fn loaded(triton: &Triton) -> bool {
    let models = triton.loaded_models().await.unwrap();
    models.iter().any(|m| m == "echo_words")
}

/// A canary route over two copies of the echo model splits chat traffic by weight: each
/// target renders with its own template (from its own directory) and both serve, named in
/// `infergate-target`, while the answer keeps the route's name as its `model`.
#[tokio::test]
async fn a_canary_route_splits_chat_traffic_by_weight() {
    let repository = tempfile::tempdir().unwrap();
    let echo = support::model_repository().join("echo_words");
    for name in ["echo_words", "echo_words_b"] {
        let dir = repository.path().join(name);
        support::copy_dir(&echo, &dir);
        let config = std::fs::read_to_string(dir.join("config.pbtxt")).unwrap();
        let config = config.replace("name: \"echo_words\"", &format!("name: \"{name}\""));
        // No pause between words: this test counts answers, not their timing.
        let config = config.replace("string_value: \"150\"", "string_value: \"0\"");
        std::fs::write(dir.join("config.pbtxt"), config).unwrap();
    }
    let triton = Triton::start(TritonOptions {
        repository: Some(repository.path().to_path_buf()),
        ..Default::default()
    })
    .await
    .unwrap();
    let routes = "[[routes]]\nmodel = \"chat\"\n\
        targets = [{ model = \"echo_words\", weight = 50 }, { model = \"echo_words_b\", weight = 50 }]\n";
    let config = pool_config_in(
        repository.path(),
        "openai-canary",
        &[&triton],
        "1GiB",
        "",
        routes,
    );
    let gateway = TestGateway::start(&config).await;
    let client = reqwest::Client::new();
    let mut served = std::collections::BTreeMap::<String, u32>::new();
    for _ in 0..30 {
        let answer = client
            .post(format!("{}/v1/chat/completions", gateway.url()))
            .json(&serde_json::json!({
                "model": "chat", "messages": [{"role": "user", "content": "a b"}],
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        let target = answer.headers()["infergate-target"]
            .to_str()
            .unwrap()
            .to_owned();
        let answer: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(answer["model"], "chat");
        assert_eq!(
            answer["choices"][0]["message"]["content"],
            "user: a b assistant:"
        );
        *served.entry(target).or_default() += 1;
    }
    let targets: Vec<&String> = served.keys().collect();
    assert_eq!(targets, ["echo_words", "echo_words_b"], "{served:?}");
    assert!(served.values().all(|&n| n >= 5), "{served:?}");
}
