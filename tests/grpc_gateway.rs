//! The KServe v2 gRPC front-end against real Triton: the official Python `tritonclient.grpc`
//! suite (tests/python/test_grpc_client.py) through the gateway over two Tritons, a Rust
//! tonic client, and a backend killed under the gateway.

mod support;

use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use infergate::protocol::inference::{
    ModelInferRequest, ModelInferResponse, ModelReadyRequest, ModelStreamInferResponse,
    ServerLiveRequest,
};
use std::time::{Duration, Instant};
use support::gateway::{TestGateway, config_for, min_copies};
use support::{Triton, TritonOptions};
use tonic::transport::Channel;

/// The metrics recorder is this test binary's, shared by every gateway in it. A test that
/// asserts an exact change of a counter holds this while it runs, and so does the Python
/// suite, which moves the same counters (bad shapes, oversized messages).
static COUNTERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The streaming models (decoupled, sequence), kept by the gateway on every backend of the
/// Python suite's pool (`min_copies`) so that a stream split across backends would show.
const STREAMING: [&str; 2] = ["decoupled_repeat", "sequence_sum"];

/// Runs the Python suite against the gateway's gRPC listener; `extra` are more pytest args.
async fn pytest(gateway: &TestGateway, env: &[(&str, &str)], extra: &[&str]) -> String {
    let suite = support::repo_root().join("tests/python/test_grpc_client.py");
    let url = gateway.grpc.to_string();
    let mut envs = vec![("INFERGATE_GRPC_URL", url.as_str())];
    envs.extend_from_slice(env);
    support::run_pytest(
        &suite,
        extra,
        &envs,
        "tritonclient.grpc suite failed through the gateway",
    )
    .await
}

#[tokio::test]
async fn tritonclient_grpc_works_through_the_gateway() {
    let _counters = COUNTERS.lock().await;
    let (t0, t1) = tokio::join!(
        Triton::start(TritonOptions::default()),
        Triton::start(TritonOptions::default()),
    );
    let (t0, t1) = (t0.unwrap(), t1.unwrap());
    let mut config = config_for(
        "pygrpc",
        &[&t0, &t1],
        "",
        "max_grpc_message_size = \"1MiB\"",
    );
    for model in STREAMING {
        config.push_str(&min_copies(model, 2));
    }
    let gateway = TestGateway::start(&config).await;
    for model in STREAMING {
        gateway.wait_for_copies(model, 2).await;
    }
    let descriptors = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(descriptors.path(), reflected_descriptors(&gateway).await).unwrap();
    let tritons = format!("127.0.0.1:{},127.0.0.1:{}", t0.grpc_port, t1.grpc_port);
    let stdout = pytest(
        &gateway,
        &[
            ("INFERGATE_TRITON_GRPC_URLS", tritons.as_str()),
            (
                "INFERGATE_DESCRIPTORS",
                descriptors.path().to_str().unwrap(),
            ),
        ],
        &[],
    )
    .await;
    // Only the killed-backend check is left for its own run.
    assert!(
        stdout.contains(" 1 skipped") && stdout.contains("after killing the pool's backend"),
        "{stdout}"
    );

    // Every RPC was counted under protocol="grpc", beside HTTP's series.
    let metrics = gateway.metrics_text("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("infergate_requests_total{")
                && l.contains("protocol=\"grpc\"")
                && l.contains("model=\"add_sub\"")
                && l.contains("status=\"2xx\"")),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("infergate_errors_total{")
                && l.contains("kind=\"body_too_large\"")),
        "{metrics}"
    );
    // The bad shapes were refused by the gateway's validation, before any backend.
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("infergate_validation_rejections_total{")
                && l.contains("model=\"add_sub\"")
                && l.contains("reason=\"shape\"")),
        "{metrics}"
    );
}

/// The .proto files the gateway serves by reflection (the inference service's file and what
/// it imports), as a serialized `FileDescriptorSet` for the Python suite to compare with
/// tritonclient's.
async fn reflected_descriptors(gateway: &TestGateway) -> Vec<u8> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let channel = Channel::from_shared(gateway.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut reflection = ServerReflectionClient::new(channel);
    let asks = ["inference.GRPCInferenceService", "inference.ModelConfig"].map(|symbol| {
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(symbol.into())),
        }
    });
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(asks))
        .await
        .unwrap()
        .into_inner();
    let mut files = std::collections::BTreeSet::new();
    while let Some(answer) = answers.message().await.unwrap() {
        let Some(MessageResponse::FileDescriptorResponse(found)) = answer.message_response else {
            panic!("unexpected reflection answer {answer:?}");
        };
        files.extend(found.file_descriptor_proto);
    }
    // FileDescriptorSet { repeated FileDescriptorProto file = 1; }
    let mut set = Vec::new();
    for file in files {
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut set);
        prost::encoding::encode_varint(file.len() as u64, &mut set);
        set.extend_from_slice(&file);
    }
    set
}

async fn client(gateway: &TestGateway) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(gateway.grpc_url())
        .await
        .expect("gateway gRPC listener")
}

fn add_sub_request(a: [f32; 4], b: [f32; 4]) -> ModelInferRequest {
    support::grpc::fp32_infer("add_sub", &[("INPUT0", a), ("INPUT1", b)])
}

fn floats(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn sum(response: &ModelInferResponse) -> Vec<f32> {
    floats(&response.raw_output_contents[0])
}

#[tokio::test]
async fn a_tonic_client_gets_answers_request_ids_health_and_reflection() {
    let _counters = COUNTERS.lock().await;
    let t0 = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for("tonic", &[&t0], "", "")).await;
    let mut client = client(&gateway).await;

    assert!(
        client
            .server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );

    let mut request = tonic::Request::new(add_sub_request([1.0, 2.0, 3.0, 4.0], [0.5; 4]));
    request
        .metadata_mut()
        .insert("x-request-id", "tonic-1".parse().unwrap());
    let response = client.model_infer(request).await.unwrap();
    assert_eq!(
        response.metadata().get("x-request-id").unwrap(),
        "tonic-1",
        "the client's request id comes back"
    );
    assert_eq!(sum(response.get_ref()), [1.5, 2.5, 3.5, 4.5]);

    // A request id that could break a log line is replaced by a fresh one.
    let mut request = tonic::Request::new(ModelReadyRequest {
        name: "add_sub".into(),
        version: String::new(),
    });
    request
        .metadata_mut()
        .insert("x-request-id", "has space".parse().unwrap());
    let response = client.model_ready(request).await.unwrap();
    let id = response.metadata().get("x-request-id").unwrap();
    assert_ne!(id, "has space");
    assert_eq!(id.to_str().unwrap().len(), 36);
    assert!(response.into_inner().ready);

    // 50 calls at once share one HTTP/2 connection to the backend's gRPC port.
    let calls = (0..50).map(|i| {
        let mut client = client.clone();
        async move {
            let a = [i as f32; 4];
            let answer = client
                .model_infer(add_sub_request(a, [1.0; 4]))
                .await
                .unwrap();
            assert_eq!(sum(answer.get_ref()), a.map(|x| x + 1.0));
        }
    });
    futures_util::future::join_all(calls).await;
    assert_eq!(
        connections_to(t0.grpc_port),
        1,
        "one channel to the backend"
    );

    // A wrong shape on one unary call is refused by the gateway's validation: its rejection
    // counter rises by exactly one for this one call (Triton would refuse it in the same
    // words, so the answer alone does not show who refused it).
    let rejections = |metrics: &str| {
        support::metric_sum(
            metrics,
            "infergate_validation_rejections_total",
            &["model=\"add_sub\"", "reason=\"shape\""],
        )
    };
    let before = rejections(&gateway.metrics_text("/metrics").await);
    let mut bad = add_sub_request([1.0; 4], [1.0; 4]);
    bad.inputs[1].shape = vec![3];
    bad.raw_input_contents[1].truncate(12);
    let status = client.model_infer(bad).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("Expected [4], got [3]"),
        "{status:?}"
    );
    let after = rejections(&gateway.metrics_text("/metrics").await);
    assert_eq!(after - before, 1.0, "refused by the gateway, not by Triton");

    // Model files in a load request are refused on HTTP too, naming the parameter.
    let response = reqwest::Client::new()
        .post(format!(
            "{}/v2/repository/models/add_sub/load",
            gateway.url()
        ))
        .json(&serde_json::json!({"parameters": {"config": "{}", "file:1/model.py": "cGFzcw=="}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        body["error"],
        "failed to load 'add_sub': model files in the load request ('file:1/model.py') are not \
         supported through infergate: each copy is loaded from its backend's model repository; \
         put the files there"
    );

    // tonic's client enforces its own grpc-timeout, so here only "not a hang" is visible (the
    // gateway's own DEADLINE_EXCEEDED is the_gateway_honours_the_clients_deadline_...).
    let mut slow = slow_request(5_000);
    slow.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    client.model_infer(slow).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));

    // grpc.health.v1, for load balancers: the whole server and the inference service.
    let channel = Channel::from_shared(gateway.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "inference.GRPCInferenceService"] {
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            answer.status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            "{service:?}"
        );
    }

    // Server reflection lists the inference service, so grpcurl works without .proto files.
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel);
    let asks = tokio_stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }]);
    let mut answers = reflection
        .server_reflection_info(asks)
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("unexpected reflection answer {answer:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"inference.GRPCInferenceService"),
        "{names:?}"
    );
}

/// ESTABLISHED TCP connections from this process (the in-process gateway) to a loopback
/// `port`, from /proc/net/tcp and this process's socket descriptors.
fn connections_to(port: u16) -> usize {
    let ours: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let remote = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        // local_address rem_address st ... inode (field 9)
        .filter(|f| f.len() > 9 && f[2].ends_with(&remote) && f[3] == "01" && ours.contains(f[9]))
        .count()
}

/// A slow_model request that takes `delay_ms` on the backend.
fn slow_request(delay_ms: i64) -> tonic::Request<ModelInferRequest> {
    let mut slow = support::grpc::slow(delay_ms);
    slow.id = "slow".into();
    tonic::Request::new(slow)
}

#[tokio::test]
async fn a_killed_backend_gives_unavailable_not_a_hang() {
    let mut t0 = Triton::start(TritonOptions::default()).await.unwrap();
    // Once no backend is ready, a request is held for `server.ready_wait` in case one comes
    // back (tests/hold.rs); here 1s, so the client's UNAVAILABLE comes within its bound.
    let config = config_for("killed", &[&t0], "", "ready_wait = \"1s\"");
    let gateway = TestGateway::start(&config).await;
    let mut client = client(&gateway).await;
    // The first requests load add_sub and slow_model (at once), so that the stream's request
    // below is at the backend, not waiting for a load, when the backend dies.
    let (mut first, mut second) = (client.clone(), client.clone());
    let (add_sub, slow) = tokio::join!(
        first.model_infer(add_sub_request([1.0; 4], [1.0; 4])),
        second.model_infer(slow_request(0)),
    );
    add_sub.unwrap();
    slow.unwrap();

    // A stream with a request in flight on the backend when it dies.
    let (requests, queue) = tokio::sync::mpsc::channel(4);
    requests
        .send(slow_request(10_000).into_inner())
        .await
        .unwrap();
    let mut answers = client
        .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(queue))
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(Duration::from_millis(500)).await;

    t0.kill();
    let started = Instant::now();
    let health_channel = Channel::from_shared(gateway.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .expect("the stream must end, not hang");
    let status = ended.expect_err("the stream ends with an error");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(requests);

    let started = Instant::now();
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        client.model_infer(add_sub_request([1.0; 4], [1.0; 4])),
    )
    .await
    .expect("unary calls must not hang")
    .expect_err("the only backend is gone");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // grpc.health.v1 tells load balancers that nothing can be served: NOT_SERVING for the
    // whole server and the inference service, within a few health intervals.
    let mut health = tonic_health::pb::health_client::HealthClient::new(health_channel);
    for service in ["", "inference.GRPCInferenceService"] {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let answer = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner();
            if answer.status() == tonic_health::pb::health_check_response::ServingStatus::NotServing
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{service:?} still {:?} with no backend ready",
                answer.status()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // And the official client sees the same.
    pytest(
        &gateway,
        &[("INFERGATE_KILLED", "1")],
        &["-k", "killed_backend"],
    )
    .await;
}

/// Eight clients, each on a connection of its own, all calling at once; every answer checked.
async fn eight_clients_infer(clients: &[GrpcInferenceServiceClient<Channel>]) -> Vec<tonic::Code> {
    let calls = clients.iter().enumerate().map(|(i, client)| {
        let mut client = client.clone();
        async move {
            let a = [i as f32; 4];
            match client.model_infer(add_sub_request(a, [2.0; 4])).await {
                Ok(answer) => {
                    assert_eq!(sum(answer.get_ref()), a.map(|x| x + 2.0));
                    tonic::Code::Ok
                }
                Err(status) => status.code(),
            }
        }
    });
    futures_util::future::join_all(calls).await
}

/// Over gRPC too, a Triton that dies is routed around at once: eight clients calling at
/// once find the holder's connection refused, and each call is placed again on the other
/// Triton (which loads add_sub). Every call is answered, and correctly.
#[tokio::test]
async fn a_killed_backends_calls_go_to_the_other() {
    let (t0, t1) = tokio::join!(
        Triton::start(TritonOptions::default()),
        Triton::start(TritonOptions::default()),
    );
    let mut tritons = [t0.unwrap(), t1.unwrap()];
    let config = config_for("grpckilled", &[&tritons[0], &tritons[1]], "", "");
    let gateway = TestGateway::start(&config).await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client(&gateway).await);
    }
    assert_eq!(eight_clients_infer(&clients).await, [tonic::Code::Ok; 8]);
    let dead = gateway.holder("add_sub").await;
    tritons[dead].kill();
    for _ in 0..5 {
        let started = Instant::now();
        assert_eq!(eight_clients_infer(&clients).await, [tonic::Code::Ok; 8]);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
    assert_eq!(gateway.holder("add_sub").await, 1 - dead);
}

/// Over gRPC too, a call that a stalled python stub failed (Triton's INTERNAL `Stub process
/// 'add_sub_0_0' is not healthy.`, after a second) is the backend's passing trouble, not the
/// model's failure: UNAVAILABLE, naming the stub, which a client retries.
#[tokio::test]
async fn a_call_a_stalled_stub_failed_is_unavailable() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for("grpcstub", &[&triton], "", "")).await;
    let mut client = client(&gateway).await;
    let warm = client.model_infer(add_sub_request([1.0; 4], [2.0; 4]));
    assert_eq!(sum(warm.await.unwrap().get_ref()), [3.0; 4]);

    let stub = triton.pause_stub("add_sub_0_0");
    let failed = client
        .model_infer(add_sub_request([5.0; 4], [2.0; 4]))
        .await
        .expect_err("the stub is stopped");
    stub.resume();
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");
    assert_eq!(
        failed.message(),
        "backend 'grpcstub-0' could not run the request: Stub process 'add_sub_0_0' is not healthy."
    );
}

#[tokio::test]
async fn each_worker_multiplexes_its_calls_and_a_restarted_backend_is_reached_again() {
    let mut triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for("restarted", &[&triton], "", "workers = 2")).await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client(&gateway).await);
    }
    assert_eq!(eight_clients_infer(&clients).await, [tonic::Code::Ok; 8]);
    // However many clients, a worker's calls share its one HTTP/2 connection to the backend.
    let open = connections_to(triton.grpc_port);
    assert!((1..=2).contains(&open), "{open} connections for 2 workers");

    // The backend comes back at its address, empty, as a restarted pod does. The gateway's
    // connections to the old one are dead: each worker makes a new one, and the model is
    // loaded again on the first request for it.
    triton.restart(TritonOptions::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let codes = eight_clients_infer(&clients).await;
        for code in &codes {
            assert!(
                matches!(code, tonic::Code::Ok | tonic::Code::Unavailable),
                "only answers or a clear UNAVAILABLE while the backend is back: {codes:?}"
            );
        }
        if codes == [tonic::Code::Ok; 8] {
            break;
        }
        assert!(Instant::now() < deadline, "still {codes:?} after 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let open = connections_to(triton.grpc_port);
    assert!((1..=2).contains(&open), "{open} connections for 2 workers");
}

#[tokio::test]
async fn a_route_name_is_resolved_and_its_target_named_in_metadata() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let routes = r#"
[[routes]]
model = "ranker"
sticky = "header:x-user-id"
targets = [{ model = "sized_a", weight = 50 }, { model = "sized_b", weight = 50 }]
"#;
    let gateway = TestGateway::start(&support::gateway::routes_config(
        "grpcroutes",
        &[&triton],
        routes,
    ))
    .await;
    let mut client = client(&gateway).await;
    let ranker = |user: &str| {
        let mut request =
            tonic::Request::new(support::grpc::fp32_infer("ranker", &[("INPUT0", [0.0; 4])]));
        request
            .metadata_mut()
            .insert("x-user-id", user.parse().unwrap());
        request
    };
    let mut seen = std::collections::BTreeSet::new();
    for user in 0..12 {
        let user = format!("user-{user}");
        let mut first = None;
        for _ in 0..3 {
            let response = client.model_infer(ranker(&user)).await.unwrap();
            let target = response.metadata().get("infergate-target").unwrap().clone();
            let served = response.into_inner().model_name;
            assert_eq!(
                target,
                served.as_str(),
                "the target named is the one that answered"
            );
            assert!(served == "sized_a" || served == "sized_b", "{served}");
            // Sticky: one user, one target.
            assert_eq!(first.get_or_insert_with(|| served.clone()), &served);
        }
        seen.insert(first.unwrap());
    }
    assert_eq!(
        seen.len(),
        2,
        "12 users split across both targets: {seen:?}"
    );

    // Other model RPCs resolve the route too.
    let ready = client
        .model_ready(ModelReadyRequest {
            name: "ranker".into(),
            version: String::new(),
        })
        .await
        .unwrap();
    assert!(ready.metadata().get("infergate-target").is_some());
    assert!(ready.into_inner().ready);
}

/// A `grpc-timeout` value as a duration (digits and a unit).
fn grpc_timeout(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let amount: u64 = digits.parse().unwrap();
    match unit {
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        other => panic!("unexpected grpc-timeout unit {other:?} in {value:?}"),
    }
}

/// A gRPC relay in front of one Triton that records the headers of every call it relays:
/// the backend's side of the gateway, which a real Triton does not show.
struct RecordingRelay {
    url: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, http::HeaderMap)>>>,
}

impl RecordingRelay {
    async fn start(triton: &Triton) -> Self {
        type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, http::HeaderMap)>>>;
        let seen: Seen = Default::default();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(true)
                .build_http::<axum::body::Body>();
        let upstream = triton.grpc_url();
        let record = seen.clone();
        let relay = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let (client, upstream, record) = (client.clone(), upstream.clone(), record.clone());
            async move {
                let (mut parts, body) = request.into_parts();
                let path = parts.uri.path().to_owned();
                record
                    .lock()
                    .unwrap()
                    .push((path.clone(), parts.headers.clone()));
                parts.uri = format!("{upstream}{path}").parse().unwrap();
                let answer = client
                    .request(http::Request::from_parts(parts, body))
                    .await
                    .expect("Triton answers the relay");
                answer.map(axum::body::Body::new)
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, relay).await });
        Self { url, seen }
    }

    /// Headers of the calls relayed for `method` (e.g. `/inference.GRPCInferenceService/ModelInfer`).
    fn calls(&self, method: &str) -> Vec<http::HeaderMap> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(path, _)| path == method)
            .map(|(_, headers)| headers.clone())
            .collect()
    }
}

const KEY: &str = "deadline-key-0123456789";

#[tokio::test]
async fn the_gateway_honours_the_clients_deadline_and_passes_it_on() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let relay = RecordingRelay::start(&triton).await;
    let mut config =
        config_for("deadline", &[&triton], "", "").replace(&triton.grpc_url(), &relay.url);
    config.push_str(&format!(
        "[auth]\nmode = \"required\"\n\
         [[auth.api_keys]]\nname = \"ops\"\ntenant = \"everyone\"\nsha256 = \"{}\"\nroles = [\"admin\"]\n\
         [[auth.tenants]]\nname = \"everyone\"\nmodels = [\"*\"]\n\
         [[routes]]\nmodel = \"deadline_route\"\ntargets = [{{ model = \"slow_model\", weight = 1 }}]\n",
        infergate::hash_key(KEY)
    ));
    let gateway = TestGateway::start_with_admin_key(&config, KEY).await;
    // The metrics are the process's, and other tests here run out of their deadlines on
    // slow_model too: this one calls it through a route of its own, and counts that route.
    let deadline_errors = |metrics: &str| {
        support::metric_sum(
            metrics,
            "infergate_errors_total",
            &["kind=\"deadline_exceeded\"", "route=\"deadline_route\""],
        )
    };
    let mut slow = support::grpc::slow(3_000);
    slow.model_name = "deadline_route".into();
    let call = async |id: &str| {
        let headers = [
            ("grpc-timeout", "400m"),
            ("x-request-id", id),
            ("x-api-key", KEY),
        ];
        support::grpc::raw_unary(gateway.grpc, "ModelInfer", &slow, &headers).await
    };

    // slow_model is not loaded: the 400 ms pass while the first call waits for its load,
    // and the gateway ends the call then, before any backend saw it.
    let started = Instant::now();
    let answer = call("deadline-0").await;
    assert_eq!(answer.status, "4", "DEADLINE_EXCEEDED: {}", answer.message);
    assert!(
        answer.message.contains("passed in the gateway"),
        "{}",
        answer.message
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(380) && took < Duration::from_millis(1_500),
        "answered after {took:?}"
    );
    assert!(
        relay
            .calls("/inference.GRPCInferenceService/ModelInfer")
            .is_empty()
    );
    // The load goes on without it (an HTTP call, which the relay does not see, waits for it).
    let loaded = reqwest::Client::new()
        .post(format!("{}/v2/models/deadline_route/infer", gateway.url()))
        .header("x-api-key", KEY)
        .json(&serde_json::json!({"parameters": {"delay_ms": 0},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(loaded.status(), 200);

    let before = deadline_errors(&gateway.metrics_text("/metrics").await);
    // 400 ms given, 3 s needed: the gateway itself ends the call, about when the time is up.
    let started = Instant::now();
    let answer = call("deadline-1").await;
    let took = started.elapsed();
    assert_eq!(answer.status, "4", "DEADLINE_EXCEEDED: {}", answer.message);
    assert!(
        answer.message.contains("passed in the gateway"),
        "{}",
        answer.message
    );
    assert!(
        took >= Duration::from_millis(380) && took < Duration::from_millis(1_500),
        "answered after {took:?}"
    );
    let after = deadline_errors(&gateway.metrics_text("/metrics").await);
    assert_eq!(after - before, 1.0, "one deadline_exceeded counted");

    // The backend was given what was left of the 400 ms and the gateway's grace of 500 ms
    // (the gateway, not the backend, ends the call), the client's request id, and no
    // credential.
    let calls = relay.calls("/inference.GRPCInferenceService/ModelInfer");
    assert_eq!(calls.len(), 1, "{calls:?}");
    let sent = &calls[0];
    let passed_on = grpc_timeout(sent["grpc-timeout"].to_str().unwrap());
    assert!(
        passed_on > Duration::from_millis(600) && passed_on <= Duration::from_millis(900),
        "grpc-timeout to the backend: {passed_on:?}"
    );
    assert_eq!(sent["x-request-id"], "deadline-1");
    assert!(
        sent.get("x-api-key").is_none() && sent.get("authorization").is_none(),
        "credentials reached the backend: {sent:?}"
    );
}

/// One step of the load tool, `--protocol grpc`, against `url` for `model` (add_sub's
/// inputs, `--check`), as its CLI runs it.
async fn load_step(url: &str, model: &str) -> infergate_load::stats::StepSummary {
    use infergate_load::transport::grpc::{GrpcOptions, GrpcTransport};
    let args = [
        "infergate-load",
        "--url",
        url,
        "--protocol",
        "grpc",
        "--quiet",
        "--model",
        model,
        "-i",
        "INPUT0:FP32:4",
        "-i",
        "INPUT1:FP32:4",
        "--check",
        "-c",
        "2",
        "--warmup",
        "100ms",
        "--duration",
        "2s",
        "--windows",
        "1",
        "--timeout",
        "5s",
    ];
    let plan = <infergate_load::cli::Args as clap::Parser>::try_parse_from(args)
        .unwrap()
        .into_plan()
        .unwrap();
    let step = plan.steps[0];
    let transport = GrpcTransport::new(
        &plan.url,
        &plan.model,
        plan.model_version.as_deref(),
        &plan.bodies,
        &plan.endpoint.headers,
        GrpcOptions {
            connections: step.connections,
            check: plan.check,
        },
    )
    .unwrap();
    let progress = infergate_load::runner::Progress {
        enabled: false,
        prefix: String::new(),
    };
    let result = infergate_load::runner::run_step(
        std::sync::Arc::new(transport),
        step,
        plan.timing,
        progress,
    )
    .await;
    infergate_load::stats::StepSummary::from_result(&result, plan.stability)
}

/// Triton's count of successful add_sub requests, from its metrics.
async fn triton_successes(triton: &Triton) -> f64 {
    triton
        .metric_sum("nv_inference_request_success", &["model=\"add_sub\""])
        .await
}

#[tokio::test]
async fn the_load_tools_grpc_mode_checks_answers_and_counts_errors_by_code() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for("loadgrpc", &[&triton], "", "")).await;

    // Every answer through the gateway has its outputs (--check), and Triton served at least
    // as many as the tool counted (the warm-up's too).
    let before = triton_successes(&triton).await;
    let step = load_step(&gateway.grpc_url(), "add_sub").await;
    assert!(step.ok > 10, "ok {}", step.ok);
    assert_eq!(step.errors, 0, "{:?}", step.errors_by_kind);
    let served = triton_successes(&triton).await - before;
    assert!(
        served >= step.ok as f64,
        "Triton served {served}, the tool counted {}",
        step.ok
    );

    // Errors are counted by gRPC status code: an unknown model is NOT_FOUND (5).
    let step = load_step(&gateway.grpc_url(), "no_such_model").await;
    assert_eq!(step.ok, 0);
    assert!(step.errors > 10, "{:?}", step.errors_by_kind);
    assert_eq!(
        step.errors_by_kind["grpc_5"], step.errors,
        "{:?}",
        step.errors_by_kind
    );
}

/// One client stream on `ModelStreamInfer`: requests go in with `send`, answers come out of
/// `answers`; `metadata` is the stream's response metadata (sent once, when it opens).
struct ClientStream {
    requests: tokio::sync::mpsc::Sender<ModelInferRequest>,
    answers: tonic::Streaming<ModelStreamInferResponse>,
    metadata: tonic::metadata::MetadataMap,
}

impl ClientStream {
    /// Opens a stream with `metadata` (name, value) on it.
    async fn open(gateway: &TestGateway, metadata: &[(&'static str, &str)]) -> Self {
        let (requests, queue) = tokio::sync::mpsc::channel(8);
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(queue));
        for (name, value) in metadata {
            request.metadata_mut().insert(*name, value.parse().unwrap());
        }
        let response = client(gateway)
            .await
            .model_stream_infer(request)
            .await
            .expect("the stream opens");
        let metadata = response.metadata().clone();
        Self {
            requests,
            answers: response.into_inner(),
            metadata,
        }
    }

    /// Sends one request and waits for the next answer, which must be a success.
    async fn ask(&mut self, request: ModelInferRequest) -> ModelInferResponse {
        self.requests.send(request).await.unwrap();
        self.next().await
    }

    /// The next answer, which must be a success.
    async fn next(&mut self) -> ModelInferResponse {
        let answer = tokio::time::timeout(Duration::from_secs(30), self.answers.message())
            .await
            .expect("an answer within 30 s")
            .expect("the stream goes on")
            .expect("the stream is not over");
        assert_eq!(answer.error_message, "", "{answer:?}");
        answer.infer_response.expect("a response")
    }
}

#[tokio::test]
async fn a_stream_carries_its_request_id_and_a_message_over_the_limit_ends_it() {
    let _counters = COUNTERS.lock().await;
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let relay = RecordingRelay::start(&triton).await;
    let config = config_for(
        "streamid",
        &[&triton],
        "",
        "max_grpc_message_size = \"1MiB\"",
    )
    .replace(&triton.grpc_url(), &relay.url);
    let gateway = TestGateway::start(&config).await;
    let streams_seen = || relay.calls("/inference.GRPCInferenceService/ModelStreamInfer");

    // The client's request id comes back in the stream's metadata and reaches the backend.
    let mut stream = ClientStream::open(&gateway, &[("x-request-id", "stream-id-1")]).await;
    assert_eq!(stream.metadata.get("x-request-id").unwrap(), "stream-id-1");
    let answer = stream.ask(add_sub_request([1.0; 4], [2.0; 4])).await;
    assert_eq!(sum(&answer), [3.0; 4]);
    drop(stream);
    let seen = streams_seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["x-request-id"], "stream-id-1");

    // Without one, the gateway makes one, returns it and sends that same one to the backend.
    let mut stream = ClientStream::open(&gateway, &[]).await;
    let made = stream
        .metadata
        .get("x-request-id")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    uuid::Uuid::parse_str(&made).expect("a UUID");
    stream.ask(add_sub_request([1.0; 4], [1.0; 4])).await;
    drop(stream);
    let seen = streams_seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1]["x-request-id"], made.as_str());

    // A message over server.max_grpc_message_size on an open stream: the stream ends with
    // RESOURCE_EXHAUSTED naming the key (as Triton ends a stream whose message is over its
    // own limit), after the answers to what came before it.
    let too_large = |metrics: &str| {
        support::metric_sum(
            metrics,
            "infergate_errors_total",
            &["kind=\"body_too_large\""],
        )
    };
    let before = too_large(&gateway.metrics_text("/metrics").await);
    let mut stream = ClientStream::open(&gateway, &[("x-request-id", "stream-big")]).await;
    let answer = stream.ask(add_sub_request([2.0; 4], [2.0; 4])).await;
    assert_eq!(sum(&answer), [4.0; 4]);
    let mut big = add_sub_request([0.0; 4], [0.0; 4]);
    for (input, raw) in big.inputs.iter_mut().zip(&mut big.raw_input_contents) {
        input.shape = vec![300_000];
        *raw = vec![0; 1_200_000].into();
    }
    stream.requests.send(big).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), stream.answers.message())
        .await
        .expect("the stream must end, not hang")
        .expect_err("the stream ends with an error");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("server.max_grpc_message_size"),
        "{status:?}"
    );
    assert_eq!(status.metadata().get("x-request-id").unwrap(), "stream-big");
    let after = too_large(&gateway.metrics_text("/metrics").await);
    assert_eq!(after - before, 1.0, "one body_too_large counted");

    // The gateway goes on serving: a new stream and a unary call.
    let mut stream = ClientStream::open(&gateway, &[]).await;
    assert_eq!(
        sum(&stream.ask(add_sub_request([1.0; 4], [0.0; 4])).await),
        [1.0; 4]
    );
    let answer = client(&gateway)
        .await
        .model_infer(add_sub_request([5.0; 4], [1.0; 4]))
        .await
        .unwrap();
    assert_eq!(sum(answer.get_ref()), [6.0; 4]);
}

/// A `versioned` request (OUTPUT0 = INPUT0 + 100 x the version that served it) for `model`.
fn versioned_request(model: &str, id: &str, x: f32) -> ModelInferRequest {
    let mut request = support::grpc::fp32_infer(model, &[("INPUT0", [x; 4])]);
    request.id = id.into();
    request
}

/// The version that really computed a `versioned` answer to input `x`, from its output.
fn computed_by(answer: &ModelInferResponse, x: f32) -> String {
    let out = sum(answer)[0];
    format!("{}", ((out - x) / 100.0).round())
}

#[tokio::test]
async fn a_routed_stream_names_the_target_of_each_answer() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let routes = r#"
[[routes]]
model = "canary"
sticky = "header:x-user-id"
targets = [
  { model = "versioned", version = "1", weight = 50 },
  { model = "versioned", version = "2", weight = 50 },
]
"#;
    let gateway = TestGateway::start(&support::gateway::routes_config(
        "grpcstreamroutes",
        &[&triton],
        routes,
    ))
    .await;
    let mut client = client(&gateway).await;

    // Unary: `infergate-target` names the target, and the body's model_name/model_version
    // (Triton's) name the same one, which is the one that computed the answer. Pinning each
    // target also loads both versions before the streams.
    for label in ["versioned/1", "versioned/2"] {
        let mut request = tonic::Request::new(versioned_request("canary", "pinned", 1.0));
        request
            .metadata_mut()
            .insert("infergate-target", label.parse().unwrap());
        let response = client.model_infer(request).await.unwrap();
        assert_eq!(response.metadata().get("infergate-target").unwrap(), label);
        let answer = response.into_inner();
        assert_eq!(
            format!("{}/{}", answer.model_name, answer.model_version),
            label
        );
        assert_eq!(format!("versioned/{}", computed_by(&answer, 1.0)), label);
    }

    // A stream's metadata goes out once, before any request, so it cannot name each
    // request's target: each answer does, in model_name/model_version. Without a sticky key,
    // each request on one stream is routed on its own.
    let mut stream = ClientStream::open(&gateway, &[]).await;
    assert!(stream.metadata.get("infergate-target").is_none());
    let mut served = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..24 {
        let x = i as f32;
        let answer = stream
            .ask(versioned_request("canary", &format!("s-{i}"), x))
            .await;
        assert_eq!(answer.id, format!("s-{i}"));
        assert_eq!(answer.model_name, "versioned", "{answer:?}");
        assert_eq!(
            answer.model_version,
            computed_by(&answer, x),
            "the version named is the one that computed the answer"
        );
        *served.entry(answer.model_version).or_default() += 1;
    }
    assert_eq!(served.len(), 2, "24 requests over both targets: {served:?}");
    drop(stream);

    // With a sticky key on the stream, every request on it goes to the target a unary call
    // with the same key gets, and each answer names it as `infergate-target` does.
    for user in ["user-1", "user-2", "user-3", "user-4"] {
        let mut request = tonic::Request::new(versioned_request("canary", "unary", 0.0));
        request
            .metadata_mut()
            .insert("x-user-id", user.parse().unwrap());
        let response = client.model_infer(request).await.unwrap();
        let label = response.metadata().get("infergate-target").unwrap().clone();
        let mut stream = ClientStream::open(&gateway, &[("x-user-id", user)]).await;
        for i in 0..3 {
            let answer = stream
                .ask(versioned_request("canary", &format!("{user}-{i}"), 0.5))
                .await;
            assert_eq!(
                format!("{}/{}", answer.model_name, answer.model_version),
                label.to_str().unwrap(),
                "{user}"
            );
            assert_eq!(answer.model_version, computed_by(&answer, 0.5));
        }
    }
}

/// Triton answers a call whose `grpc-timeout` has run out with its trailers several times over
/// (seen here: HEADERS, RST_STREAM, HEADERS, RST_STREAM, HEADERS on one stream), which an
/// HTTP/2 client may take as a protocol error of the whole connection. The gateway shares one
/// connection per worker among all its calls to a backend, so a client's deadline must end
/// that client's call and nothing else: every other call on the connection is answered.
#[tokio::test]
async fn a_clients_deadline_ends_its_own_call_and_no_other() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for("deadlines", &[&triton], "", "")).await;
    // One client connection: its calls are served by one worker, over that worker's one
    // connection to Triton.
    let channel = client(&gateway).await;
    let mut warm = channel.clone();
    warm.model_infer(support::grpc::slow(0)).await.unwrap();
    warm.model_infer(add_sub_request([1.0; 4], [1.0; 4]))
        .await
        .unwrap();

    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fast = (0..4).map(|_| {
        let (mut client, done) = (channel.clone(), done.clone());
        tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut answered = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                match client
                    .model_infer(add_sub_request([1.0; 4], [2.0; 4]))
                    .await
                {
                    Ok(answer) => {
                        assert_eq!(sum(answer.get_ref()), [3.0; 4]);
                        answered += 1;
                    }
                    Err(status) => {
                        failures.push(format!("{:?}: {}", status.code(), status.message()))
                    }
                }
            }
            (answered, failures)
        })
    });
    let fast: Vec<_> = fast.collect();
    let mut slow_codes = Vec::new();
    for _ in 0..30 {
        let mut request = tonic::Request::new(support::grpc::slow(150));
        request.set_timeout(Duration::from_millis(100));
        let code = match channel.clone().model_infer(request).await {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        slow_codes.push(code);
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answered = 0;
    for task in fast {
        let (count, failures) = task.await.unwrap();
        assert!(
            failures.is_empty(),
            "calls beside the deadlines failed: {failures:?}"
        );
        answered += count;
    }
    assert!(answered > 30, "only {answered} calls beside the deadlines");
    assert!(
        slow_codes
            .iter()
            .all(|code| matches!(code, tonic::Code::DeadlineExceeded | tonic::Code::Cancelled)),
        "the slow calls ended with {slow_codes:?}"
    );
}
