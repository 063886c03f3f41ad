//! What a Triton client sees of the server itself, through the gateway and from a real
//! Triton side by side: gRPC compression, the server's name and version, the answers to
//! malformed and missing model versions, and shared memory (which cannot cross a gateway).
//! Each Triton starts empty, with default flags; the gateway loads what the test asks for.

mod support;

use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use infergate::protocol::inference::infer_parameter::ParameterChoice;
use infergate::protocol::inference::model_infer_request::InferRequestedOutputTensor;
use infergate::protocol::inference::{
    InferParameter, ModelInferRequest, ModelMetadataRequest, ModelReadyRequest, ServerLiveRequest,
    ServerMetadataRequest, SystemSharedMemoryStatusRequest,
};
use support::gateway::{TestGateway, config_for};
use support::{Triton, TritonOptions};
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;

async fn channel(url: String) -> Channel {
    Channel::from_shared(url).unwrap().connect().await.unwrap()
}

fn add_sub(a: [f32; 4], b: [f32; 4]) -> ModelInferRequest {
    support::grpc::fp32_infer("add_sub", &[("INPUT0", a), ("INPUT1", b)])
}

fn floats(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The `grpc-encoding` an answer came in (absent: uncompressed).
fn encoding<T>(response: &tonic::Response<T>) -> Option<String> {
    response
        .metadata()
        .get("grpc-encoding")
        .map(|v| v.to_str().unwrap().to_owned())
}

/// A client whose requests are compressed with `encoding` and who accepts answers in it,
/// as `grpc.default_compression_algorithm` or tonic's `send_compressed` make one.
fn compressing(
    channel: Channel,
    encoding: CompressionEncoding,
) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::new(channel)
        .send_compressed(encoding)
        .accept_compressed(encoding)
}

/// gzip and deflate requests, as Triton takes them, on every service of the listener
/// (inference, health); a compressed request gets a compressed answer when the client reads
/// that encoding, every other call a plain one. A tonic client, beside the same calls to
/// Triton, then the official tritonclient.grpc (`compression_algorithm` on infer, a channel
/// that compresses every call) and tritonclient.http (request and response compression).
#[tokio::test]
async fn grpc_requests_may_be_compressed_and_answers_are_when_asked() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for("compress", &[&triton], "", "")).await;
    let via = channel(gateway.grpc_url()).await;
    let direct = channel(triton.grpc_url()).await;
    for algorithm in [CompressionEncoding::Gzip, CompressionEncoding::Deflate] {
        let name = match algorithm {
            CompressionEncoding::Gzip => "gzip",
            _ => "deflate",
        };
        for (who, channel) in [("gateway", &via), ("triton", &direct)] {
            let mut client = compressing(channel.clone(), algorithm);
            let live = client.server_live(ServerLiveRequest {}).await;
            let live = live.unwrap_or_else(|s| panic!("{who} {name} ServerLive: {s:?}"));
            assert!(live.get_ref().live);
            let answer = client
                .model_infer(add_sub([1.0, 2.0, 3.0, 4.0], [0.5; 4]))
                .await
                .unwrap_or_else(|s| panic!("{who} {name} ModelInfer: {s:?}"));
            assert_eq!(
                floats(&answer.get_ref().raw_output_contents[0]),
                [1.5, 2.5, 3.5, 4.5],
                "{who} {name}"
            );
            if who == "gateway" {
                assert_eq!(encoding(&live).as_deref(), Some(name), "ServerLive");
                assert_eq!(encoding(&answer).as_deref(), Some(name), "ModelInfer");
            }
        }
        // A stream's messages, both ways.
        let mut client = compressing(via.clone(), algorithm);
        let requests = tokio_stream::iter([add_sub([2.0; 4], [1.0; 4])]);
        let mut answers = client.model_stream_infer(requests).await.unwrap();
        assert_eq!(
            encoding(&answers).as_deref(),
            Some(name),
            "ModelStreamInfer"
        );
        let answer = answers.get_mut().message().await.unwrap().unwrap();
        assert_eq!(answer.error_message, "", "{name}");
        let answer = answer.infer_response.unwrap();
        assert_eq!(floats(&answer.raw_output_contents[0]), [3.0; 4], "{name}");
        // A compressed request from a client that takes only plain answers gets a plain one;
        // so does a plain request from a client that could read a compressed answer (as
        // every grpc-core client says it can): Triton answers it plain too.
        for (who, channel) in [("gateway", &via), ("triton", &direct)] {
            let mut sends =
                GrpcInferenceServiceClient::new(channel.clone()).send_compressed(algorithm);
            let answer = sends
                .model_infer(add_sub([1.0; 4], [1.0; 4]))
                .await
                .unwrap();
            assert_eq!(encoding(&answer), None, "{who} {name}");
            let mut reads =
                GrpcInferenceServiceClient::new(channel.clone()).accept_compressed(algorithm);
            let answer = reads
                .model_infer(add_sub([1.0; 4], [1.0; 4]))
                .await
                .unwrap();
            assert_eq!(encoding(&answer), None, "{who} {name}");
        }
        // grpc.health.v1 too: load balancers may compress their probes.
        let mut health = tonic_health::pb::health_client::HealthClient::new(via.clone())
            .send_compressed(algorithm)
            .accept_compressed(algorithm);
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap_or_else(|s| panic!("health {name}: {s:?}"));
        assert_eq!(encoding(&answer).as_deref(), Some(name), "health");
    }

    let script = support::repo_root().join("tests/python/compressed_grpc.py");
    let (grpc, http) = (gateway.grpc.to_string(), gateway.http.to_string());
    let output = support::run_python(&script, &[&grpc, &http], &[]).await;
    assert!(
        output.status.success(),
        "tritonclient.grpc with compression:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The names of a gRPC answer's metadata (headers and trailers), sorted.
fn metadata_names<T>(answer: &tonic::Response<T>) -> Vec<String> {
    let mut names: Vec<String> = (answer.metadata().as_ref().keys())
        .map(|name| name.as_str().to_owned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A gRPC answer through the gateway carries no metadata Triton's own does not, but the
/// gateway's `server` and the request's `x-request-id`: no `date`, which no gRPC server
/// sends and which HTTP/2 would encode into every answer for no reader. (Triton also lists
/// the encodings it accepts, `grpc-accept-encoding`; the gateway, as tonic, only on a
/// refusal.) REST answers keep their `date`, which RFC 9110 asks of a server with a clock
/// (Triton's REST answers have none).
#[tokio::test]
async fn grpc_answers_carry_no_metadata_of_the_gateways_own_but_its_name_and_request_id() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for("answer-metadata", &[&triton], "", "")).await;
    let mut via = GrpcInferenceServiceClient::new(channel(gateway.grpc_url()).await);
    let mut direct = GrpcInferenceServiceClient::new(channel(triton.grpc_url()).await);
    let gateways_own = |ours: Vec<String>, tritons: Vec<String>| -> Vec<String> {
        ours.into_iter().filter(|n| !tritons.contains(n)).collect()
    };
    let infer = || add_sub([1.0; 4], [2.0; 4]);
    let ours = metadata_names(&via.model_infer(infer()).await.unwrap());
    let tritons = metadata_names(&direct.model_infer(infer()).await.unwrap());
    assert_eq!(
        gateways_own(ours, tritons),
        ["server", "x-request-id"],
        "ModelInfer"
    );
    let ours = metadata_names(&via.server_live(ServerLiveRequest {}).await.unwrap());
    let tritons = metadata_names(&direct.server_live(ServerLiveRequest {}).await.unwrap());
    assert_eq!(
        gateways_own(ours, tritons),
        ["server", "x-request-id"],
        "ServerLive"
    );

    let ready = reqwest::get(format!("{}/v2/health/ready", gateway.url()))
        .await
        .unwrap();
    assert!(ready.headers().contains_key("date"), "a REST answer");
}

/// `GET /v2` as JSON, with its `server` header.
async fn server_metadata(base: &str) -> (serde_json::Value, Option<String>) {
    let response = reqwest::get(format!("{base}/v2")).await.unwrap();
    assert_eq!(response.status(), 200);
    let server = response
        .headers()
        .get("server")
        .map(|v| v.to_str().unwrap().to_owned());
    (response.json().await.unwrap(), server)
}

/// The official health and metadata examples check that the server is `triton`: through
/// the gateway, `GET /v2` and `ServerMetadata` give the backends' own name and version, and
/// of Triton's extensions those that work through a gateway (no shared memory, trace or log
/// settings, whose state is per server). The gateway names itself in the `server` header
/// and on the admin API; `server.name` overrides the name reported.
#[tokio::test]
async fn server_metadata_is_the_backends_and_the_gateway_names_itself_apart() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for("identity", &[&triton], "", "")).await;
    let own = format!("infergate/{}", env!("CARGO_PKG_VERSION"));

    let (tritons, _) = server_metadata(&triton.http_url()).await;
    let (ours, server) = server_metadata(&gateway.url()).await;
    assert_eq!(ours["name"], "triton");
    assert_eq!(ours["name"], tritons["name"]);
    assert_eq!(ours["version"], tritons["version"]);
    let extensions = |v: &serde_json::Value| -> Vec<String> {
        v["extensions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_owned())
            .collect()
    };
    let (theirs, reported) = (extensions(&tritons), extensions(&ours));
    let through: Vec<String> = theirs
        .iter()
        .filter(|e| {
            ![
                "system_shared_memory",
                "cuda_shared_memory",
                "trace",
                "logging",
            ]
            .contains(&e.as_str())
                && !e.starts_with("model_repository(")
        })
        .cloned()
        .collect();
    assert_eq!(reported, through, "Triton's {theirs:?}");
    assert!(reported.contains(&"binary_tensor_data".to_owned()));
    assert_eq!(server.as_deref(), Some(own.as_str()), "the server header");
    // Every answer of the listener names the gateway, a forwarded one too.
    let ready = reqwest::get(format!("{}/v2/health/ready", gateway.url()))
        .await
        .unwrap();
    assert_eq!(ready.headers()["server"], own.as_str());

    let mut via = GrpcInferenceServiceClient::new(channel(gateway.grpc_url()).await);
    let mut direct = GrpcInferenceServiceClient::new(channel(triton.grpc_url()).await);
    let answer = via.server_metadata(ServerMetadataRequest {}).await.unwrap();
    assert_eq!(answer.metadata().get("server").unwrap(), own.as_str());
    let answer = answer.into_inner();
    let tritons = direct
        .server_metadata(ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (answer.name.as_str(), answer.version.as_str()),
        (tritons.name.as_str(), tritons.version.as_str())
    );
    assert_eq!(answer.extensions, reported, "the same on both protocols");

    let admin: serde_json::Value = reqwest::get(format!("http://{}/admin/server", gateway.admin))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(admin["name"], "infergate");
    assert_eq!(admin["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(admin["reported"]["name"], "triton");
    assert_eq!(admin["reported"]["version"], tritons.version);

    // The official example's own check, with the official client.
    let script = support::repo_root().join("tests/python/server_identity.py");
    let (grpc, http) = (gateway.grpc.to_string(), gateway.http.to_string());
    let output = support::run_python(&script, &[&grpc, &http, "triton"], &[]).await;
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    let renamed = TestGateway::start(&config_for(
        "renamed",
        &[&triton],
        "",
        "name = \"model-serving\"",
    ))
    .await;
    let (metadata, _) = server_metadata(&renamed.url()).await;
    assert_eq!(metadata["name"], "model-serving");
    assert_eq!(metadata["version"], tritons.version);
}

/// A version request's answer, HTTP or gRPC, as far as a client tells answers apart.
#[derive(Debug, PartialEq)]
struct Answered {
    /// HTTP status, or the gRPC code's name.
    status: String,
    /// The error message (empty on success).
    message: String,
    retry_after: bool,
}

async fn http_answer(client: &reqwest::Client, base: &str, path: &str) -> Answered {
    let request = if path.ends_with("/infer") {
        client.post(format!("{base}{path}")).body(
            r#"{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}"#,
        )
    } else {
        client.get(format!("{base}{path}"))
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16().to_string();
    let retry_after = response.headers().contains_key("retry-after");
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    Answered {
        status,
        message: body["error"].as_str().unwrap_or_default().to_owned(),
        retry_after,
    }
}

fn grpc_answer<T>(answer: Result<tonic::Response<T>, tonic::Status>) -> Answered {
    match answer {
        Ok(_) => Answered {
            status: "Ok".into(),
            message: String::new(),
            retry_after: false,
        },
        Err(status) => Answered {
            status: format!("{:?}", status.code()),
            message: status.message().to_owned(),
            retry_after: status.metadata().contains_key("retry-after"),
        },
    }
}

/// The same version requests to Triton and through the gateway get the same status and
/// message, on HTTP and gRPC: a version string Triton cannot read as a number is refused
/// (gRPC INVALID_ARGUMENT in Triton's words; over HTTP, where Triton's URL pattern only
/// takes digits, 404, or 400 for digits past 64 bits), and a version that does not exist is
/// NOT_FOUND, never 503 with `Retry-After` (a client that honours it would retry forever).
#[tokio::test]
async fn version_errors_are_tritons() {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&support::gateway::pool_config(
        "versions",
        &[&triton],
        "1GiB",
        "scale_up_rps = 0.0",
        "",
    ))
    .await;
    let client = reqwest::Client::new();
    // The gateway loads add_sub on its first request; Triton gets it loaded the same way.
    let warm = http_answer(&client, &gateway.url(), "/v2/models/add_sub/infer").await;
    assert_eq!(warm.status, "200", "{warm:?}");

    let mut differ = Vec::new();
    for version in [
        "wrong_specification",
        "99",
        "0",
        "99999999999999999999",
        "01",
    ] {
        for action in ["/infer", "", "/config"] {
            let path = format!("/v2/models/add_sub/versions/{version}{action}");
            let direct = http_answer(&client, &triton.http_url(), &path).await;
            let via = http_answer(&client, &gateway.url(), &path).await;
            // Triton's own unknown-path words are not the gateway's; the status is.
            let same = if direct.message == "Not Found" {
                via.status == direct.status && !via.retry_after
            } else {
                via == direct
            };
            if !same {
                differ.push(format!("HTTP {path}: triton {direct:?}, gateway {via:?}"));
            }
        }
    }

    let mut via = GrpcInferenceServiceClient::new(channel(gateway.grpc_url()).await);
    let mut direct = GrpcInferenceServiceClient::new(channel(triton.grpc_url()).await);
    for version in [
        "wrong_specification",
        "99",
        "0",
        "-1",
        " 1",
        "1x",
        "",
        "99999999999999999999",
    ] {
        let mut infer = add_sub([1.0; 4], [1.0; 4]);
        infer.model_version = version.into();
        let metadata = ModelMetadataRequest {
            name: "add_sub".into(),
            version: version.into(),
        };
        let ready = ModelReadyRequest {
            name: "add_sub".into(),
            version: version.into(),
        };
        let pairs = [
            (
                "ModelInfer",
                grpc_answer(direct.model_infer(infer.clone()).await),
                grpc_answer(via.model_infer(infer).await),
            ),
            (
                "ModelMetadata",
                grpc_answer(direct.model_metadata(metadata.clone()).await),
                grpc_answer(via.model_metadata(metadata).await),
            ),
            (
                "ModelReady",
                grpc_answer(direct.model_ready(ready.clone()).await),
                grpc_answer(via.model_ready(ready).await),
            ),
        ];
        for (rpc, direct, via) in pairs {
            if direct != via {
                differ.push(format!(
                    "gRPC {rpc} {version:?}: triton {direct:?}, gateway {via:?}"
                ));
            }
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// Shared memory names a region on one host, and the gateway and its backends are not one
/// host: the extension's HTTP endpoints (status, register, unregister; system and CUDA) get
/// the error gRPC gives (501, UNIMPLEMENTED there), and an inference whose input or output
/// names a region is refused before any backend sees it, with the same message, on both
/// protocols (Triton would only say it knows no such region).
#[tokio::test]
async fn shared_memory_gets_one_clear_error_everywhere() {
    let triton = Triton::start(TritonOptions {
        verbose: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let gateway = TestGateway::start(&config_for("shm", &[&triton], "", "")).await;
    let mut grpc = GrpcInferenceServiceClient::new(channel(gateway.grpc_url()).await);
    let status = grpc
        .system_shared_memory_status(SystemSharedMemoryStatusRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    let message = status.message().to_owned();
    assert!(
        message.starts_with("shared memory cannot cross a gateway"),
        "{message}"
    );

    let client = reqwest::Client::new();
    let register = serde_json::json!({"key": "/k", "offset": 0, "byte_size": 64});
    for kind in ["systemsharedmemory", "cudasharedmemory"] {
        for (post, path) in [
            (false, "status"),
            (false, "region/r/status"),
            (true, "region/r/register"),
            (true, "unregister"),
            (true, "region/r/unregister"),
        ] {
            let url = format!("{}/v2/{kind}/{path}", gateway.url());
            let request = if post {
                client.post(url).json(&register)
            } else {
                client.get(url)
            };
            let response = request.send().await.unwrap();
            let status = response.status();
            let body: serde_json::Value = response.json().await.unwrap();
            assert_eq!(
                (status.as_u16(), body["error"].as_str()),
                (501, Some(message.as_str())),
                "{kind}/{path}"
            );
        }
    }

    let arrivals = || {
        triton
            .log()
            .lines()
            .filter(|l| l.contains("/v2/models/add_sub/infer") || l.contains("ModelInfer"))
            .count()
    };
    let before = arrivals();
    let input1 = serde_json::json!({"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]});
    let in_region = serde_json::json!({"name": "INPUT0", "shape": [4], "datatype": "FP32",
        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}});
    let plain = serde_json::json!({"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]});
    let out_region = serde_json::json!([{"name": "OUTPUT0",
        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}]);
    for body in [
        serde_json::json!({"inputs": [in_region, input1]}),
        serde_json::json!({"inputs": [plain, input1], "outputs": out_region}),
    ] {
        let response = client
            .post(format!("{}/v2/models/add_sub/infer", gateway.url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let answer: serde_json::Value = response.json().await.unwrap();
        assert_eq!(
            (status.as_u16(), answer["error"].as_str()),
            (400, Some(message.as_str())),
            "{body}"
        );
    }
    let region = |name: &str| {
        let mut parameters = std::collections::HashMap::new();
        parameters.insert(
            "shared_memory_region".to_owned(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam(name.into())),
            },
        );
        parameters
    };
    let mut in_shared = add_sub([1.0; 4], [1.0; 4]);
    in_shared.inputs[0].parameters = region("r");
    in_shared.raw_input_contents.remove(0);
    let mut out_shared = add_sub([1.0; 4], [1.0; 4]);
    out_shared.outputs = vec![InferRequestedOutputTensor {
        name: "OUTPUT0".into(),
        parameters: region("r"),
    }];
    for request in [in_shared, out_shared] {
        let status = grpc.model_infer(request).await.unwrap_err();
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::InvalidArgument, message.as_str())
        );
    }
    assert_eq!(arrivals(), before, "no refused request reached Triton");
}
