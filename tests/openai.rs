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
    // Its context: 24 tokens by its tokenizer's file, 4 by [[models]], which wins.
    std::fs::write(
        plain.path().join("tokenizer_config.json"),
        r#"{"model_max_length": 24}"#,
    )
    .unwrap();
    let tables = format!(
        "[[models]]\nname = \"echo_words\"\ntokenizer = \"{}\"\ncontext_length = 4\n",
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
    assert!(stdout.contains("13 passed"), "{stdout}");
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
/// usage. `/v1/models` lists each tenant what its allow list admits.
async fn tokens_per_minute_is_a_quota(triton: &Triton) {
    const KEY: &str = "metered-key";
    const NARROW: &str = "narrow-key";
    const ADMIN: &str = "ops-key";
    let tables = format!(
        "[auth]\nmode = \"required\"\n\
         [[auth.api_keys]]\nname = \"ops\"\nsha256 = \"{}\"\nroles = [\"admin\"]\n\
         [[auth.api_keys]]\nname = \"metered\"\nsha256 = \"{}\"\n\
         [[auth.api_keys]]\nname = \"narrow\"\nsha256 = \"{}\"\n\
         [[auth.tenants]]\nname = \"metered\"\nmodels = [\"*\"]\ntokens_per_minute = 20\n\
         [[auth.tenants]]\nname = \"narrow\"\nmodels = [\"echo_*\"]\n",
        infergate::hash_key(ADMIN),
        infergate::hash_key(KEY),
        infergate::hash_key(NARROW)
    );
    let config = pool_config("openai-quota", &[triton], "1GiB", "", &tables);
    let gateway = TestGateway::start_with_admin_key(&config, ADMIN).await;
    let client = reqwest::Client::new();
    let listed = async |key: &str| -> Vec<String> {
        let models: serde_json::Value = client
            .get(format!("{}/v1/models", gateway.url()))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let data = models["data"].as_array().unwrap().iter();
        data.map(|m| m["id"].as_str().unwrap().to_owned()).collect()
    };
    let everything = listed(KEY).await;
    assert!(
        everything.contains(&"add_sub".to_owned()) && everything.contains(&"echo_words".to_owned()),
        "{everything:?}"
    );
    assert_eq!(listed(NARROW).await, ["echo_words"]);
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

/// A repository of copies of the echo model, each `(name, first_delay_ms)`, with no pause
/// between words (these tests count answers and first tokens, not the words' pace), and a
/// Triton serving it.
async fn echo_copies(models: &[(&str, u32)]) -> (tempfile::TempDir, Triton) {
    let repository = tempfile::tempdir().unwrap();
    let echo = support::model_repository().join("echo_words");
    for (name, first_delay_ms) in models {
        let dir = repository.path().join(name);
        support::copy_dir(&echo, &dir);
        let config = std::fs::read_to_string(dir.join("config.pbtxt")).unwrap();
        let config = config
            .replace("name: \"echo_words\"", &format!("name: \"{name}\""))
            .replace("string_value: \"150\"", "string_value: \"0\"")
            .replace(
                "key: \"first_delay_ms\" value { string_value: \"0\" }",
                &format!("key: \"first_delay_ms\" value {{ string_value: \"{first_delay_ms}\" }}"),
            );
        std::fs::write(dir.join("config.pbtxt"), config).unwrap();
    }
    let triton = Triton::start(TritonOptions {
        repository: Some(repository.path().to_path_buf()),
        ..Default::default()
    })
    .await
    .unwrap();
    (repository, triton)
}

/// A canary route over two copies of the echo model splits chat traffic by weight: each
/// target renders with its own template (from its own directory) and both serve, named in
/// `infergate-target`, while the answer keeps the route's name as its `model`.
#[tokio::test]
async fn a_canary_route_splits_chat_traffic_by_weight() {
    let (repository, triton) = echo_copies(&[("echo_words", 0), ("echo_words_b", 0)]).await;
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
        let target = support::served_target(&answer);
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

/// A guarded canary whose model takes 250 ms to its first token (its words then come at
/// once, as the stable model's do) is rolled back on time to first token
/// (`guard.latency = "first_token"`), and both targets' first tokens and time per token are
/// recorded per target.
#[tokio::test]
async fn a_canary_slow_to_its_first_token_is_rolled_back() {
    let (repository, triton) = echo_copies(&[("echo_words", 0), ("echo_slow", 250)]).await;
    let routes = "[[routes]]\nmodel = \"ttft\"\n\
        targets = [{ model = \"echo_words\", weight = 50 }, { model = \"echo_slow\", weight = 50 }]\n\
        guard = { max_p95_ratio = 3.0, latency = \"first_token\", window = \"60s\", min_requests = 4 }\n";
    let config = pool_config_in(
        repository.path(),
        "openai-ttft",
        &[&triton],
        "1GiB",
        "",
        routes,
    );
    let gateway = TestGateway::start(&config).await;
    let client = reqwest::Client::new();
    let complete = async || {
        let answer = client
            .post(format!("{}/v1/completions", gateway.url()))
            .json(&serde_json::json!({"model": "ttft", "prompt": "a b c", "stream": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        let target = support::served_target(&answer);
        let text = answer.text().await.unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        target
    };
    let mut slow = 0;
    for _ in 0..60 {
        if complete().await == "echo_slow" {
            slow += 1;
        }
        if !gateway.routes().await[0]["trips"]
            .as_array()
            .unwrap()
            .is_empty()
        {
            break;
        }
    }
    let routes = gateway.routes().await;
    let trip = &routes[0]["trips"][0];
    assert_eq!(trip["target"], "echo_slow", "{routes}");
    assert_eq!(trip["reason"], "p95_ratio", "{routes}");
    assert!(
        trip["message"]
            .as_str()
            .unwrap()
            .contains("time to first token"),
        "{trip}"
    );
    assert!(slow >= 4, "{slow}");
    for _ in 0..10 {
        assert_eq!(complete().await, "echo_words", "rolled back");
    }

    // Per target: the slow model's first tokens took 250 ms and more, the stable one's far
    // less; each answer of three words gave one time per token.
    let ttft = |model: &'static str| {
        let gateway = &gateway;
        async move {
            let labels = [format!("model=\"{model}\""), "route=\"ttft\"".to_owned()];
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            let sum = gateway
                .metric_sum("infergate_time_to_first_token_seconds_sum", &labels)
                .await;
            let count = gateway
                .metric_sum("infergate_time_to_first_token_seconds_count", &labels)
                .await;
            let per_token = gateway
                .metric_sum("infergate_time_per_output_token_seconds_count", &labels)
                .await;
            (sum / count, count, per_token)
        }
    };
    let (slow_mean, slow_count, slow_per_token) = ttft("echo_slow").await;
    let (stable_mean, stable_count, stable_per_token) = ttft("echo_words").await;
    assert_eq!(slow_count, f64::from(slow));
    assert!(slow_mean >= 0.25, "{slow_mean}");
    assert!(stable_mean < 0.1, "{stable_mean}");
    assert_eq!(
        (slow_per_token, stable_per_token),
        (slow_count, stable_count)
    );
}
