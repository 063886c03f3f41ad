//! The official Triton client examples' behaviours, through the gateway as against Triton.
//!
//! tests/python/test_examples.py does what each example in triton-inference-server/client
//! (src/python/examples) does, in the example's own order, and checks what it checks, on
//! models with the examples' names and signatures (tests/example_models). It runs against
//! tritonserver as the examples' READMEs run it, which proves the suite itself: with its
//! default flags (every model of the repository loaded at start), and the model-control
//! examples against one in explicit mode, the mode they document, started empty. Then it
//! runs through infergate over two Tritons started empty, with Triton's default flags but
//! explicit model control, where each test meets its models cold (the suite unloads them
//! through the admin API first): most examples ask for metadata, config or readiness before
//! their first inference.
//!
//! Beside it, in Rust: model metadata and config through the gateway for a model loaded
//! nowhere equal Triton's own for the loaded model (HTTP and gRPC); unknown models and
//! versions get Triton's own refusal without a load; a burst of cold metadata calls loads once.

mod support;

use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use infergate::protocol::inference::{ModelConfigRequest, ModelMetadataRequest};
use serde_json::Value;
use support::gateway::{TestGateway, pool_config_in};
use support::{Triton, TritonOptions};
use tonic::transport::Channel;

fn example_models() -> std::path::PathBuf {
    support::repo_root().join("tests").join("example_models")
}

async fn empty_triton() -> Triton {
    triton_with(false).await
}

/// A Triton over tests/example_models in explicit mode, started empty, as the gateway's
/// pool runs; `verbose` logs every HTTP request it gets (how load calls are counted).
async fn triton_with(verbose: bool) -> Triton {
    Triton::start(TritonOptions {
        repository: Some(example_models()),
        verbose,
        ..Default::default()
    })
    .await
    .expect("tritonserver")
}

/// Triton as the examples' READMEs start it, alone over tests/example_models with its
/// default flags: every model loaded at start. The reference a gateway's answers are
/// compared with.
async fn standalone_triton() -> Triton {
    Triton::start(TritonOptions::standalone(example_models()))
        .await
        .expect("tritonserver")
}

/// How many times `model` was loaded through this Triton's repository API (a verbose Triton).
fn load_calls(triton: &Triton, model: &str) -> usize {
    triton
        .log()
        .matches(&format!(
            "HTTP request: 2 /v2/repository/models/{model}/load"
        ))
        .count()
}

/// Runs the suite (or the tests pytest's `-k` expression `select` names) against `http` and
/// `grpc` (host:port) and fails the test on any failure or skip, with pytest's output. With
/// `admin` (the gateway's admin API), each test's models are unloaded there before it, so it
/// starts cold.
async fn run_suite(
    http: &str,
    grpc: &str,
    admin: Option<&str>,
    select: Option<&str>,
    against: &str,
) {
    let suite = support::repo_root().join("tests/python/test_examples.py");
    let select: Vec<&str> = select.map(|k| vec!["-k", k]).unwrap_or_default();
    let stdout = support::run_pytest(
        &suite,
        &select,
        &[
            ("EXAMPLES_HTTP", http),
            ("EXAMPLES_GRPC", grpc),
            ("EXAMPLES_ADMIN", admin.unwrap_or("")),
        ],
        &format!("the examples' suite failed against {against}"),
    )
    .await;
    assert!(!stdout.contains("skipped"), "a test was skipped:\n{stdout}");
}

#[tokio::test]
async fn the_official_examples_pass_against_triton_and_through_the_gateway() {
    // The reference run: Triton itself, so a check the gateway fails is one Triton passes,
    // started as the examples' READMEs start it. Every example but the model-control ones
    // runs against Triton's defaults, which load the whole repository at start; those
    // document `--model-control-mode=explicit` and load what they use, so they run against
    // such a Triton, started empty. The examples' order against models nothing loaded is
    // the gateway's case below, where the Tritons start empty.
    {
        let host = |port: u16| format!("127.0.0.1:{port}");
        let (standalone, explicit) = tokio::join!(standalone_triton(), empty_triton());
        for (triton, select) in [
            (&standalone, "not model_control"),
            (&explicit, "model_control"),
        ] {
            run_suite(
                &host(triton.http_port),
                &host(triton.grpc_port),
                None,
                Some(select),
                &format!("Triton ({select})"),
            )
            .await;
        }
    }
    let (t0, t1) = tokio::join!(empty_triton(), empty_triton());
    let config = pool_config_in(&example_models(), "examples", &[&t0, &t1], "1GiB", "", "");
    let gateway = TestGateway::start(&config).await;
    run_suite(
        &gateway.http.to_string(),
        &gateway.grpc.to_string(),
        Some(&format!("http://{}", gateway.admin)),
        None,
        "the gateway",
    )
    .await;
    // What the Tritons hold is exactly what the gateway's books say: every copy was placed
    // (or unloaded) by the gateway, and none was left behind or forgotten.
    let placed = gateway.placed().await;
    let mut loaded = t0.loaded_models().await.unwrap();
    loaded.extend(t1.loaded_models().await.unwrap());
    loaded.sort();
    let mut booked: Vec<String> = placed.into_iter().flatten().collect();
    booked.sort();
    assert_eq!(loaded, booked, "Triton's indexes and the gateway's books");
}

/// The models whose metadata and config are compared: plain, batched, strings, sequence,
/// decoupled, a classifier with reshapes and labels, an ensemble and one of its steps.
const COMPARED: &[&str] = &[
    "simple",
    "simple_string",
    "simple_sequence",
    "repeat_int32",
    "densenet_onnx",
    "preprocess_inception_ensemble",
    "inception_graphdef",
];

async fn get_json(url: &str) -> (u16, Value) {
    let response = reqwest::get(url).await.expect(url);
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

async fn grpc_client(url: String) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(url)
        .await
        .expect("gRPC listener")
}

/// `Ok(answer)` or `Err((code, message))` of one gRPC call, comparable across servers.
type Answer<T> = Result<T, (tonic::Code, String)>;

fn answer<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Answer<T> {
    result
        .map(tonic::Response::into_inner)
        .map_err(|status| (status.code(), status.message().to_string()))
}

async fn grpc_metadata(
    client: &mut GrpcInferenceServiceClient<Channel>,
    model: &str,
    version: &str,
) -> Answer<infergate::protocol::inference::ModelMetadataResponse> {
    answer(
        client
            .model_metadata(ModelMetadataRequest {
                name: model.into(),
                version: version.into(),
            })
            .await,
    )
}

async fn grpc_config(
    client: &mut GrpcInferenceServiceClient<Channel>,
    model: &str,
    version: &str,
) -> Answer<infergate::protocol::inference::ModelConfigResponse> {
    answer(
        client
            .model_config(ModelConfigRequest {
                name: model.into(),
                version: version.into(),
            })
            .await,
    )
}

/// The paths of a model's metadata and config, latest and version 1.
fn http_paths(model: &str) -> [String; 4] {
    [
        format!("/v2/models/{model}"),
        format!("/v2/models/{model}/config"),
        format!("/v2/models/{model}/versions/1"),
        format!("/v2/models/{model}/versions/1/config"),
    ]
}

/// Answers the gateway gave that differ from Triton's, each named, so one run reports them
/// all.
#[derive(Default)]
struct Differences(Vec<String>);

impl Differences {
    fn note<T: PartialEq + std::fmt::Debug>(&mut self, what: String, expected: &T, got: &T) {
        if got != expected {
            self.0.push(format!(
                "{what}:\n  Triton  {expected:?}\n  gateway {got:?}"
            ));
        }
    }

    fn assert_none(self) {
        assert!(
            self.0.is_empty(),
            "{} answers differ:\n{}",
            self.0.len(),
            self.0.join("\n")
        );
    }
}

/// The differential check: what the examples ask first (metadata and config)
/// answered through the gateway for models loaded nowhere is what Triton answers for them
/// loaded, over HTTP (parsed JSON) and gRPC (decoded messages).
#[tokio::test]
async fn cold_metadata_and_config_through_the_gateway_equal_tritons_own() {
    // The reference is Triton alone with its defaults, which load every model at start (it
    // describes loaded models only); the gateway's Tritons start empty.
    let (reference, t0, t1) = tokio::join!(standalone_triton(), empty_triton(), empty_triton());
    let config = pool_config_in(
        &example_models(),
        "differential",
        &[&t0, &t1],
        "1GiB",
        "",
        "",
    );
    let gateway = TestGateway::start(&config).await;
    assert!(
        gateway.placed().await.concat().is_empty(),
        "nothing placed before a request"
    );
    let mut triton_grpc = grpc_client(reference.grpc_url()).await;
    let mut gateway_grpc = grpc_client(gateway.grpc_url()).await;
    let mut differences = Differences::default();
    // gRPC first for half of the models, HTTP first for the others: either may be the call
    // that meets the model cold.
    for (n, model) in COMPARED.iter().enumerate() {
        for round in 0..2 {
            if (n + round) % 2 == 0 {
                for path in http_paths(model) {
                    let expected = get_json(&format!("{}{path}", reference.http_url())).await;
                    assert_eq!(expected.0, 200, "Triton's {path}: {:?}", expected.1);
                    let got = get_json(&format!("{}{path}", gateway.url())).await;
                    differences.note(format!("HTTP {path}"), &expected, &got);
                }
            } else {
                for version in ["", "1"] {
                    let expected = grpc_metadata(&mut triton_grpc, model, version).await;
                    assert!(
                        expected.is_ok(),
                        "Triton's ModelMetadata {model}: {expected:?}"
                    );
                    let got = grpc_metadata(&mut gateway_grpc, model, version).await;
                    differences.note(
                        format!("gRPC ModelMetadata {model} '{version}'"),
                        &expected,
                        &got,
                    );
                    let expected = grpc_config(&mut triton_grpc, model, version).await;
                    assert!(
                        expected.is_ok(),
                        "Triton's ModelConfig {model}: {expected:?}"
                    );
                    let got = grpc_config(&mut gateway_grpc, model, version).await;
                    differences.note(
                        format!("gRPC ModelConfig {model} '{version}'"),
                        &expected,
                        &got,
                    );
                }
            }
        }
    }
    differences.assert_none();
}

/// Unknown models and versions: the gateway answers with Triton's own status and words,
/// and loads nothing to find out.
#[tokio::test]
async fn unknown_models_and_versions_get_tritons_refusal_without_a_load() {
    // The reference is Triton alone with its defaults, so `simple` is loaded: an unknown
    // version of a loaded model is what it refuses. The gateway's Tritons start empty.
    let (reference, t0, t1) =
        tokio::join!(standalone_triton(), triton_with(true), triton_with(true));
    let config = pool_config_in(&example_models(), "unknown", &[&t0, &t1], "1GiB", "", "");
    let gateway = TestGateway::start(&config).await;
    let mut differences = Differences::default();
    for path in [
        "/v2/models/wrong_model_name",
        "/v2/models/wrong_model_name/config",
        "/v2/models/wrong_model_name/versions/1",
        "/v2/models/simple/versions/7",
        "/v2/models/simple/versions/7/config",
    ] {
        let expected = get_json(&format!("{}{path}", reference.http_url())).await;
        assert_eq!(expected.0, 404, "Triton's {path}: {:?}", expected.1);
        let got = get_json(&format!("{}{path}", gateway.url())).await;
        differences.note(format!("HTTP {path}"), &expected, &got);
    }
    let mut triton_grpc = grpc_client(reference.grpc_url()).await;
    let mut gateway_grpc = grpc_client(gateway.grpc_url()).await;
    for (model, version) in [
        ("wrong_model_name", ""),
        ("wrong_model_name", "1"),
        ("simple", "7"),
    ] {
        let expected = grpc_metadata(&mut triton_grpc, model, version)
            .await
            .map(|_| ());
        assert!(
            matches!(&expected, Err((tonic::Code::NotFound, _))),
            "Triton's ModelMetadata {model} '{version}': {expected:?}"
        );
        let got = grpc_metadata(&mut gateway_grpc, model, version)
            .await
            .map(|_| ());
        differences.note(
            format!("gRPC ModelMetadata {model} '{version}'"),
            &expected,
            &got,
        );
        let expected = grpc_config(&mut triton_grpc, model, version)
            .await
            .map(|_| ());
        let got = grpc_config(&mut gateway_grpc, model, version)
            .await
            .map(|_| ());
        differences.note(
            format!("gRPC ModelConfig {model} '{version}'"),
            &expected,
            &got,
        );
    }
    differences.assert_none();
    for model in ["wrong_model_name", "simple"] {
        assert_eq!(
            load_calls(&t0, model) + load_calls(&t1, model),
            0,
            "{model} loaded"
        );
    }
    assert!(
        gateway.placed().await.concat().is_empty(),
        "{:?}",
        gateway.placed().await
    );
}

/// Eight clients asking for a cold model's metadata at once (HTTP and gRPC, metadata and
/// config, as eight examples started together): one load, and all get the same answers.
#[tokio::test]
async fn concurrent_cold_metadata_calls_load_the_model_once() {
    let (t0, t1) = tokio::join!(triton_with(true), triton_with(true));
    let config = pool_config_in(
        &example_models(),
        "burst",
        &[&t0, &t1],
        "1GiB",
        "scale_up_rps = 0.0",
        "",
    );
    let gateway = TestGateway::start(&config).await;
    let model = "densenet_onnx";
    let http = (0..4).map(|n| {
        let url = format!("{}{}", gateway.url(), http_paths(model)[n % 2]);
        async move { get_json(&url).await }
    });
    let grpc = (0..4).map(|n| {
        let url = gateway.grpc_url();
        async move {
            let mut client = grpc_client(url).await;
            if n % 2 == 0 {
                grpc_metadata(&mut client, model, "")
                    .await
                    .map(|m| format!("{m:?}"))
            } else {
                grpc_config(&mut client, model, "")
                    .await
                    .map(|c| format!("{c:?}"))
            }
        }
    });
    let (http, grpc) = tokio::join!(
        futures_util::future::join_all(http),
        futures_util::future::join_all(grpc)
    );
    for (status, body) in &http {
        assert_eq!(*status, 200, "{body}");
    }
    assert_eq!(http[0], http[2]);
    assert_eq!(http[1], http[3]);
    assert!(grpc.iter().all(Result::is_ok), "{grpc:?}");
    assert_eq!(grpc[0], grpc[2]);
    assert_eq!(grpc[1], grpc[3]);
    assert_eq!(
        load_calls(&t0, model) + load_calls(&t1, model),
        1,
        "loads of {model}"
    );
    assert_eq!(gateway.placed().await.concat(), [model]);
}

/// An ensemble's first request (here metadata, as ensemble_image_client.py sends it) places
/// the ensemble and the two models it runs on one backend, booked as Triton holds them; a
/// direct request to one of its steps is served by the copy already there, with no load.
#[tokio::test]
async fn an_ensemble_is_placed_with_its_steps_on_one_backend() {
    let (t0, t1) = tokio::join!(empty_triton(), empty_triton());
    let config = pool_config_in(&example_models(), "group", &[&t0, &t1], "1GiB", "", "");
    let gateway = TestGateway::start(&config).await;
    let get = |path: &str| reqwest::get(format!("{}{path}", gateway.url()));
    let answer = get("/v2/models/preprocess_inception_ensemble")
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
    let group = [
        "image_preprocess_inception",
        "inception_graphdef",
        "preprocess_inception_ensemble",
    ];
    let booked = |placed: Vec<Vec<String>>| {
        placed
            .into_iter()
            .map(|mut names| {
                names.sort();
                names
            })
            .collect::<Vec<_>>()
    };
    let placed = booked(gateway.placed().await);
    let holder = placed
        .iter()
        .position(|names| !names.is_empty())
        .expect("placed");
    assert_eq!(placed[holder], group, "the group, on one backend");
    assert!(placed[1 - holder].is_empty(), "{placed:?}");
    let tritons = [&t0, &t1];
    let mut loaded = tritons[holder].loaded_models().await.unwrap();
    loaded.sort();
    assert_eq!(loaded, group, "the books are what Triton holds");

    // A step asked for directly: served where the ensemble runs it, nothing else loaded.
    let answer = get("/v2/models/inception_graphdef/config").await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(booked(gateway.placed().await), placed);
    assert!(
        tritons[1 - holder]
            .loaded_models()
            .await
            .unwrap()
            .is_empty()
    );
}
