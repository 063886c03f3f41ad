//! The KServe v2 gRPC front-end against real Triton: the official Python `tritonclient.grpc`
//! suite (tests/python/test_grpc_client.py) through the gateway over two Tritons, a Rust
//! tonic client, and a backend killed under the gateway.

mod support;

use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use infergate::protocol::inference::{
    ModelInferRequest, ModelInferResponse, ModelReadyRequest, ServerLiveRequest,
};
use std::time::{Duration, Instant};
use support::gateway::{TestGateway, config_for};
use support::{Triton, TritonOptions};
use tonic::transport::Channel;

const LOADED: [&str; 4] = ["add_sub", "string_echo", "batched_double", "slow_model"];

/// Runs the Python suite against the gateway's gRPC listener; `extra` are more pytest args.
async fn pytest(gateway: &TestGateway, env: &[(&str, &str)], extra: &[&str]) -> String {
    let suite = support::repo_root().join("tests/python/test_grpc_client.py");
    let url = gateway.grpc.to_string();
    let mut envs = vec![("INFERGATE_GRPC_URL", url.as_str())];
    envs.extend_from_slice(env);
    let mut args = vec![
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rs",
        suite.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    // `python -m pytest FILE`: run_python's script argument is the `-m` flag here.
    let output = support::run_python(std::path::Path::new("-m"), &args, &envs).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "tritonclient.grpc suite failed through the gateway:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(" passed"), "{stdout}");
    stdout
}

#[tokio::test]
async fn tritonclient_grpc_works_through_the_gateway() {
    let (t0, t1) = tokio::join!(
        Triton::start(TritonOptions::with_models(&LOADED)),
        Triton::start(TritonOptions::with_models(&LOADED)),
    );
    let (t0, t1) = (t0.unwrap(), t1.unwrap());
    let gateway = TestGateway::start(&config_for(
        "pygrpc",
        &[&t0, &t1],
        "",
        "max_grpc_message_size = \"1MiB\"",
    ))
    .await;
    let stdout = pytest(&gateway, &[], &[]).await;
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
    let t0 = Triton::start(TritonOptions::with_models(&["add_sub", "slow_model"]))
        .await
        .unwrap();
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

    // The deadline is checked on both sides of the gateway: tonic's client enforces its own
    // grpc-timeout, so here only "not a hang" is visible (the gateway's own DEADLINE_EXCEEDED
    // is pinned by unit tests in frontend::grpc::call and upstream::grpc).
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

/// A slow_model request that takes `delay_ms` on the backend.
fn slow_request(delay_ms: i64) -> tonic::Request<ModelInferRequest> {
    let mut slow = support::grpc::slow(delay_ms);
    slow.id = "slow".into();
    tonic::Request::new(slow)
}

#[tokio::test]
async fn a_killed_backend_gives_unavailable_not_a_hang() {
    let mut t0 = Triton::start(TritonOptions::with_models(&["add_sub", "slow_model"]))
        .await
        .unwrap();
    let gateway = TestGateway::start(&config_for("killed", &[&t0], "", "")).await;
    let mut client = client(&gateway).await;
    client
        .model_infer(add_sub_request([1.0; 4], [1.0; 4]))
        .await
        .unwrap();

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

    // And the official client sees the same.
    pytest(
        &gateway,
        &[("INFERGATE_KILLED", "1")],
        &["-k", "killed_backend"],
    )
    .await;
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
    let gateway = TestGateway::start(&support::gateway::pool_config(
        "grpcroutes",
        &[&triton],
        "1GiB",
        "scale_up_rps = 0.0",
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
