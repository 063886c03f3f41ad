//! `fake-triton`: a minimal, fast stand-in for a Triton Inference Server.
//!
//! infergate's own overhead is tens of microseconds; a real Triton with a
//! Python model takes milliseconds per request and varies by more than that.
//! To measure the proxy and not the backend, benchmarks point infergate at
//! this server, which speaks enough of the KServe v2 HTTP protocol (health,
//! server and model metadata, model config, repository index, metrics, and
//! infer in JSON or binary form) and answers from precomputed bodies without
//! parsing tensors. `--delay` and `--fail-rate` add a known latency or error
//! rate to check the gateway's behaviour under them.
//!
//! Two model signatures: add_sub's (two FP32 [4] inputs and outputs), for
//! per-request overhead, and a dynamic one (`--dynamic-model`: one FP32 input
//! of any length), so body-size benchmarks (`infergate-load --body-size`) pass
//! the gateway's validation whatever size they send.
//!
//! It answers gRPC's `ModelInfer` too, on the same port (h2c, as a gateway's `grpc` backend
//! URL names it): the model's outputs as raw contents, zeros, the request's id echoed. The
//! release build's training (`scripts/release-build.sh`) goes through the gateway's gRPC
//! front-end with it.
//!
//! Loads and unloads (the repository extension) change what the index says
//! and what infer answers, as on Triton, so a gateway placing models on the
//! fake (evicting, loading on demand) sees its own decisions: `--unloaded`
//! starts with nothing loaded, and `--load-delay` gives a load a known cost.

use std::cell::RefCell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::WithTrailers;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Body;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use prost::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::net::TcpListener;

use crate::transport::grpc::{MODEL_INFER, pb};
use crate::transport::http::INFERENCE_HEADER_CONTENT_LENGTH;

/// Settings of the fake server (its command-line options).
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// Model names served (each with version "1" and add_sub's signature).
    pub models: Vec<String>,
    /// Model names served with the dynamic signature: INPUT0 FP32 [-1] ->
    /// OUTPUT0 FP32 [-1], `max_batch_size` 0. Their infer answer is fixed
    /// (OUTPUT0 shaped [1]) whatever the request's size.
    pub dynamic_models: Vec<String>,
    /// Fixed extra latency added to every infer response.
    pub delay: Duration,
    /// Fraction (0.0..=1.0) of infer requests answered with HTTP 500.
    pub fail_rate: f64,
    /// Time a repository load takes before it answers.
    pub load_delay: Duration,
    /// Start with no model loaded (each is UNAVAILABLE until a load).
    pub unloaded: bool,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            models: vec!["add_sub".to_string()],
            dynamic_models: Vec::new(),
            delay: Duration::ZERO,
            fail_rate: 0.0,
            load_delay: Duration::ZERO,
            unloaded: false,
        }
    }
}

/// The shape of a served model's signature.
#[derive(Debug, Clone, Copy)]
enum ModelKind {
    /// add_sub: INPUT0, INPUT1 -> OUTPUT0, OUTPUT1, all FP32 [4].
    AddSub,
    /// INPUT0 FP32 [-1] -> OUTPUT0 FP32 [-1]: any length passes validation.
    Dynamic,
}

impl ModelKind {
    fn inputs(self) -> &'static [&'static str] {
        match self {
            ModelKind::AddSub => &["INPUT0", "INPUT1"],
            ModelKind::Dynamic => &["INPUT0"],
        }
    }

    fn outputs(self) -> &'static [&'static str] {
        match self {
            ModelKind::AddSub => &["OUTPUT0", "OUTPUT1"],
            ModelKind::Dynamic => &["OUTPUT0"],
        }
    }

    /// The one dimension of every tensor in metadata and config.
    fn dim(self) -> i64 {
        match self {
            ModelKind::AddSub => 4,
            ModelKind::Dynamic => -1,
        }
    }

    /// Elements of each output in the (fixed) infer answer.
    fn answer_elements(self) -> usize {
        match self {
            ModelKind::AddSub => 4,
            ModelKind::Dynamic => 1,
        }
    }
}

/// Precomputed responses for one model, and whether it is loaded.
struct ModelBodies {
    loaded: AtomicBool,
    metadata: Bytes,
    config: Bytes,
    infer_json: Bytes,
    infer_binary: Bytes,
    infer_binary_header_len: HeaderValue,
    /// The outputs of a gRPC answer: their descriptions, and their raw contents.
    grpc_outputs: Vec<pb::model_infer_response::InferOutputTensor>,
    grpc_contents: Vec<Bytes>,
}

/// The fake server's state: every response body, built once at start-up so
/// that answering is a reference-count increment, not a serialization.
pub struct FakeTriton {
    models: HashMap<String, ModelBodies>,
    /// Served model names in the index's order.
    names: Vec<String>,
    server_metadata: Bytes,
    metrics: Bytes,
    injected_failure: Bytes,
    delay: Duration,
    fail_rate: f64,
    load_delay: Duration,
    infer_count: AtomicU64,
    body_bytes: AtomicU64,
}

const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");
const OCTET_STREAM: HeaderValue = HeaderValue::from_static("application/octet-stream");
const PROMETHEUS_TEXT: HeaderValue = HeaderValue::from_static("text/plain; version=0.0.4");

// Serialize structs rather than `json!`: field order must match what real
// Triton prints (serde_json's map would sort the keys).

#[derive(Serialize)]
struct TensorMeta<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: [i64; 1],
}

#[derive(Serialize)]
struct ModelMetadata<'a> {
    name: &'a str,
    versions: [&'static str; 1],
    platform: &'static str,
    inputs: Vec<TensorMeta<'a>>,
    outputs: Vec<TensorMeta<'a>>,
}

#[derive(Serialize)]
struct TensorConfig<'a> {
    name: &'a str,
    data_type: &'static str,
    dims: [i64; 1],
}

#[derive(Serialize)]
struct ModelConfig<'a> {
    name: &'a str,
    max_batch_size: u32,
    backend: &'static str,
    input: Vec<TensorConfig<'a>>,
    output: Vec<TensorConfig<'a>>,
    instance_group: [InstanceGroup; 1],
}

/// What the stand-in works on at once, as Triton serves a config's instance groups: it
/// answers every request as it comes (no queue of its own), so it declares many instances,
/// and the gateway's flow control, which takes its default slots from this, never queues in
/// front of it below the load tools' concurrency (a benchmark measures the proxy, not a
/// queue that a real model of one instance would need).
#[derive(Serialize)]
struct InstanceGroup {
    count: u32,
    kind: &'static str,
}

#[derive(Serialize)]
struct BinaryParams {
    binary_data_size: usize,
}

#[derive(Serialize)]
struct OutputTensor<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: [usize; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<BinaryParams>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Vec<f32>>,
}

#[derive(Serialize)]
struct InferResponse<'a> {
    model_name: &'a str,
    model_version: &'static str,
    outputs: Vec<OutputTensor<'a>>,
}

#[derive(Serialize)]
struct IndexEntry<'a> {
    name: &'a str,
    version: &'static str,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
}

#[derive(Serialize)]
struct ServerMetadata {
    name: &'static str,
    version: &'static str,
    extensions: &'static [&'static str],
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

fn model_bodies(name: &str, kind: ModelKind, loaded: bool) -> ModelBodies {
    let dim = kind.dim();
    let meta = |names: &'static [&'static str]| {
        names
            .iter()
            .map(|&name| TensorMeta {
                name,
                datatype: "FP32",
                shape: [dim],
            })
            .collect()
    };
    let config = |names: &'static [&'static str]| {
        names
            .iter()
            .map(|&name| TensorConfig {
                name,
                data_type: "TYPE_FP32",
                dims: [dim],
            })
            .collect()
    };
    let metadata = ModelMetadata {
        name,
        versions: ["1"],
        platform: "python",
        inputs: meta(kind.inputs()),
        outputs: meta(kind.outputs()),
    };
    let config = ModelConfig {
        name,
        max_batch_size: 0,
        backend: "python",
        input: config(kind.inputs()),
        output: config(kind.outputs()),
        instance_group: [InstanceGroup {
            count: 256,
            kind: "KIND_CPU",
        }],
    };
    let elements = kind.answer_elements();
    let infer = |binary: bool| InferResponse {
        model_name: name,
        model_version: "1",
        outputs: kind
            .outputs()
            .iter()
            .map(|&name| OutputTensor {
                name,
                datatype: "FP32",
                shape: [elements],
                parameters: binary.then_some(BinaryParams {
                    binary_data_size: elements * 4,
                }),
                data: (!binary).then(|| vec![0.0; elements]),
            })
            .collect(),
    };
    let mut binary = serde_json::to_vec(&infer(true)).expect("static JSON serializes");
    let header_len = binary.len();
    binary.resize(header_len + kind.outputs().len() * elements * 4, 0);
    ModelBodies {
        loaded: AtomicBool::new(loaded),
        metadata: to_bytes(&metadata),
        config: to_bytes(&config),
        infer_json: to_bytes(&infer(false)),
        infer_binary: binary.into(),
        infer_binary_header_len: HeaderValue::from(header_len),
        grpc_outputs: (kind.outputs().iter())
            .map(|&name| pb::model_infer_response::InferOutputTensor {
                name: name.into(),
                datatype: "FP32".into(),
                shape: vec![elements as i64],
                ..Default::default()
            })
            .collect(),
        grpc_contents: vec![Bytes::from(vec![0; elements * 4]); kind.outputs().len()],
    }
}

fn to_bytes<T: Serialize>(v: &T) -> Bytes {
    serde_json::to_vec(v)
        .expect("static JSON serializes")
        .into()
}

fn error_body(msg: &str) -> Bytes {
    to_bytes(&ErrorBody { error: msg })
}

thread_local! {
    static RNG: RefCell<SmallRng> = RefCell::new(SmallRng::seed_from_u64(seed()));
}

/// A different seed per thread, so `--fail-rate` draws are independent.
fn seed() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ NEXT
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn respond(
    status: StatusCode,
    content_type: Option<HeaderValue>,
    body: Bytes,
) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    if let Some(ct) = content_type {
        resp.headers_mut().insert(CONTENT_TYPE, ct);
    }
    resp
}

fn json_ok(body: &Bytes) -> Response<Full<Bytes>> {
    respond(StatusCode::OK, Some(APPLICATION_JSON), body.clone())
}

fn empty_ok() -> Response<Full<Bytes>> {
    respond(StatusCode::OK, None, Bytes::new())
}

fn not_found(msg: &str) -> Response<Full<Bytes>> {
    respond(
        StatusCode::NOT_FOUND,
        Some(APPLICATION_JSON),
        error_body(msg),
    )
}

fn method_not_allowed() -> Response<Full<Bytes>> {
    respond(
        StatusCode::METHOD_NOT_ALLOWED,
        Some(APPLICATION_JSON),
        error_body("method not allowed"),
    )
}

impl FakeTriton {
    /// Builds the server state and all its response bodies.
    pub fn new(cfg: &FakeConfig) -> Self {
        let served = || {
            let add_sub = cfg.models.iter().map(|m| (m, ModelKind::AddSub));
            add_sub.chain(cfg.dynamic_models.iter().map(|m| (m, ModelKind::Dynamic)))
        };
        let models: HashMap<String, ModelBodies> = served()
            .map(|(m, kind)| (m.clone(), model_bodies(m, kind, !cfg.unloaded)))
            .collect();
        let mut metrics = String::from(
            "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes\n\
             # TYPE nv_inference_request_success counter\n",
        );
        for (m, _) in served() {
            metrics.push_str(&format!(
                "nv_inference_request_success{{model=\"{m}\",version=\"1\"}} 0\n"
            ));
        }
        FakeTriton {
            models,
            names: served().map(|(m, _)| m.clone()).collect(),
            server_metadata: to_bytes(&ServerMetadata {
                name: "triton",
                version: "2.51.0",
                extensions: &[
                    "classification",
                    "sequence",
                    "model_repository",
                    "model_repository(unload_dependents)",
                    "schedule_policy",
                    "model_configuration",
                    "system_shared_memory",
                    "cuda_shared_memory",
                    "binary_tensor_data",
                    "parameters",
                    "statistics",
                    "trace",
                    "logging",
                ],
            }),
            metrics: metrics.into(),
            injected_failure: error_body("injected failure"),
            delay: cfg.delay,
            fail_rate: cfg.fail_rate,
            load_delay: cfg.load_delay,
            infer_count: AtomicU64::new(0),
            body_bytes: AtomicU64::new(0),
        }
    }

    /// The repository index as Triton words it: READY for a loaded model, UNAVAILABLE
    /// (reason "unloaded") otherwise.
    fn repository_index(&self) -> Bytes {
        let index: Vec<IndexEntry<'_>> = (self.names.iter())
            .map(|m| {
                let loaded = self.models[m].loaded.load(Ordering::Relaxed);
                IndexEntry {
                    name: m,
                    version: "1",
                    state: if loaded { "READY" } else { "UNAVAILABLE" },
                    reason: (!loaded).then_some("unloaded"),
                }
            })
            .collect();
        to_bytes(&index)
    }

    /// Number of infer requests received so far (answered or failed), for
    /// tests and for the shutdown summary.
    pub fn infer_count(&self) -> u64 {
        self.infer_count.load(Ordering::Relaxed)
    }

    /// Request body bytes read so far (all requests), so tests can see that
    /// bodies are read to the end.
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes.load(Ordering::Relaxed)
    }

    /// Answers one request. The body is always drained first, as a real
    /// server must before it can reuse the connection (and as Triton does
    /// before it answers): each frame is dropped as it arrives, so a large
    /// body costs the fake no memory.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<Full<Bytes>>
    where
        B: Body + Unpin,
    {
        let (parts, mut body) = req.into_parts();
        let mut read = 0u64;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        read += data.remaining() as u64;
                    }
                }
                Err(_) => {
                    return respond(
                        StatusCode::BAD_REQUEST,
                        Some(APPLICATION_JSON),
                        error_body("failed to read request body"),
                    );
                }
            }
        }
        self.body_bytes.fetch_add(read, Ordering::Relaxed);
        let path = parts.uri.path();
        if let Some(answer) = self.server_endpoint(path, &parts.method) {
            return answer;
        }
        if let Some(rest) = path.strip_prefix("/v2/repository/models/") {
            return self.repository_action(path, rest, &parts.method).await;
        }
        let Some(rest) = path.strip_prefix("/v2/models/") else {
            return not_found(&format!("unknown path {path}"));
        };
        self.model_endpoint(&parts, path, rest).await
    }

    /// The server's own endpoints (health, metadata, the repository index, metrics);
    /// `None` for any other path.
    fn server_endpoint(&self, path: &str, method: &Method) -> Option<Response<Full<Bytes>>> {
        let get = method == Method::GET;
        let post = method == Method::POST;
        Some(match path {
            "/v2/health/live" | "/v2/health/ready" => {
                if get {
                    empty_ok()
                } else {
                    method_not_allowed()
                }
            }
            "/v2" => {
                if get {
                    json_ok(&self.server_metadata)
                } else {
                    method_not_allowed()
                }
            }
            "/v2/repository/index" => {
                if post {
                    json_ok(&self.repository_index())
                } else {
                    method_not_allowed()
                }
            }
            "/metrics" => {
                if get {
                    respond(StatusCode::OK, Some(PROMETHEUS_TEXT), self.metrics.clone())
                } else {
                    method_not_allowed()
                }
            }
            _ => return None,
        })
    }

    /// `POST /v2/repository/models/{model}/load|unload` (`rest` is what follows the
    /// prefix): a load waits `load_delay`, as a real one takes time.
    async fn repository_action(
        &self,
        path: &str,
        rest: &str,
        method: &Method,
    ) -> Response<Full<Bytes>> {
        match rest.split_once('/') {
            Some((m, action @ ("load" | "unload"))) if self.models.contains_key(m) => {
                if method != Method::POST {
                    return method_not_allowed();
                }
                if action == "load" && !self.load_delay.is_zero() {
                    tokio::time::sleep(self.load_delay).await;
                }
                self.models[m]
                    .loaded
                    .store(action == "load", Ordering::Relaxed);
                empty_ok()
            }
            Some((m, "load" | "unload")) => {
                not_found(&format!("failed to load '{m}', no version is available"))
            }
            _ => not_found(&format!("unknown path {path}")),
        }
    }

    /// `/v2/models/{model}[/versions/1][/action]` (`rest` is what follows `/v2/models/`):
    /// the model must exist, be version 1 if one is named, and be loaded, refused in
    /// Triton's words otherwise.
    async fn model_endpoint(
        &self,
        parts: &http::request::Parts,
        path: &str,
        rest: &str,
    ) -> Response<Full<Bytes>> {
        let mut segs = rest.split('/');
        let model_name = segs.next().unwrap_or_default();
        let Some(model) = self.models.get(model_name) else {
            return not_found(&unknown_model(model_name));
        };
        let mut action = segs.next();
        if action == Some("versions") {
            match segs.next() {
                Some("1") => action = segs.next(),
                Some(v) => {
                    return not_found(&format!(
                        "Request for unknown model: '{model_name}' version {v} is not found"
                    ));
                }
                None => return not_found(&format!("unknown path {path}")),
            }
        }
        if segs.next().is_some() {
            return not_found(&format!("unknown path {path}"));
        }
        if !model.loaded.load(Ordering::Relaxed) {
            // Triton's words for a model it has not loaded (HTTP 400).
            return respond(
                StatusCode::BAD_REQUEST,
                Some(APPLICATION_JSON),
                error_body(&not_loaded(model_name)),
            );
        }
        let get = parts.method == Method::GET;
        match action {
            None | Some("") if get => json_ok(&model.metadata),
            Some("config") if get => json_ok(&model.config),
            Some("ready") if get => empty_ok(),
            None | Some("" | "config" | "ready") => method_not_allowed(),
            Some("infer") if parts.method == Method::POST => self.infer(model, parts).await,
            Some("infer") => method_not_allowed(),
            Some(_) => not_found(&format!("unknown path {path}")),
        }
    }

    /// An inference: counted, delayed by `delay`, failed at `fail_rate`, else the model's
    /// prepared answer, binary when the request asked for the binary extension.
    async fn infer(
        &self,
        model: &ModelBodies,
        parts: &http::request::Parts,
    ) -> Response<Full<Bytes>> {
        self.infer_count.fetch_add(1, Ordering::Relaxed);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.fail_rate > 0.0 && RNG.with(|r| r.borrow_mut().random::<f64>()) < self.fail_rate {
            return respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                Some(APPLICATION_JSON),
                self.injected_failure.clone(),
            );
        }
        if parts.headers.contains_key(INFERENCE_HEADER_CONTENT_LENGTH) {
            let mut resp = respond(
                StatusCode::OK,
                Some(OCTET_STREAM),
                model.infer_binary.clone(),
            );
            resp.headers_mut().insert(
                HeaderName::from_static(INFERENCE_HEADER_CONTENT_LENGTH),
                model.infer_binary_header_len.clone(),
            );
            resp
        } else {
            json_ok(&model.infer_json)
        }
    }
}

/// Triton's words for a model it does not have (HTTP 404, gRPC NOT_FOUND).
fn unknown_model(name: &str) -> String {
    format!("Request for unknown model: '{name}' is not found")
}

/// Triton's words for a model it has but has not loaded (HTTP 400, gRPC INVALID_ARGUMENT).
fn not_loaded(name: &str) -> String {
    format!("Request for unknown model: '{name}' has no available versions")
}

/// `message` as one gRPC message on the wire: uncompressed, behind its 4-byte length.
pub fn grpc_frame(message: &impl Message) -> Bytes {
    let length = message.encoded_len();
    let mut framed = Vec::with_capacity(5 + length);
    framed.push(0);
    framed.extend_from_slice(&(length as u32).to_be_bytes());
    message.encode(&mut framed).expect("a Vec grows");
    framed.into()
}

/// A gRPC answer: one message, then the trailers with its status.
pub type GrpcAnswer =
    WithTrailers<Full<Bytes>, std::future::Ready<Option<Result<http::HeaderMap, Infallible>>>>;

/// A gRPC answer of `message` (already framed, or empty) ending with `status` and its text.
fn grpc_answer(message: Bytes, status: u8, text: &str) -> Response<GrpcAnswer> {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(u16::from(status)));
    if let Ok(text) = HeaderValue::from_str(text)
        && !text.is_empty()
    {
        trailers.insert("grpc-message", text);
    }
    let body = Full::new(message).with_trailers(std::future::ready(Some(Ok(trailers))));
    let mut response = Response::new(body);
    (response.headers_mut()).insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

impl FakeTriton {
    /// gRPC's `ModelInfer`: counted and delayed as an HTTP inference (`--fail-rate` is
    /// HTTP's alone), the model's outputs (zeros) with the request's id; a model it does
    /// not have or has not loaded is refused in the words of its HTTP side.
    pub async fn grpc_infer<B>(&self, req: Request<B>) -> Response<GrpcAnswer>
    where
        B: Body,
        B::Error: std::fmt::Display,
    {
        let body = match req.into_body().collect().await {
            Ok(body) => body.to_bytes(),
            Err(e) => return grpc_answer(Bytes::new(), 13, &format!("reading the request: {e}")),
        };
        self.body_bytes
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        let Some(Ok(request)) = body.get(5..).map(pb::ModelInferRequest::decode) else {
            return grpc_answer(Bytes::new(), 3, "not one uncompressed ModelInferRequest");
        };
        // HTTP's 404 and 400 for these are gRPC's NOT_FOUND and INVALID_ARGUMENT.
        let name = &request.model_name;
        let Some(model) = self.models.get(name) else {
            return grpc_answer(Bytes::new(), 5, &unknown_model(name));
        };
        if !model.loaded.load(Ordering::Relaxed) {
            return grpc_answer(Bytes::new(), 3, &not_loaded(name));
        }
        self.infer_count.fetch_add(1, Ordering::Relaxed);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let answer = pb::ModelInferResponse {
            model_name: request.model_name,
            model_version: "1".into(),
            id: request.id,
            outputs: model.grpc_outputs.clone(),
            raw_output_contents: model.grpc_contents.clone(),
            ..Default::default()
        };
        grpc_answer(grpc_frame(&answer), 0, "")
    }
}

/// Accepts connections on `listener` forever, serving HTTP/1.1 with
/// keep-alive and HTTP/2 with prior knowledge (h2c) on the same port.
pub async fn serve(listener: TcpListener, state: Arc<FakeTriton>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Typically out of file descriptors: back off instead of spinning.
                eprintln!("fake-triton: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let state = state.clone();
                async move {
                    Ok::<_, Infallible>(if req.uri().path() == MODEL_INFER {
                        state.grpc_infer(req).await.map(Either::Right)
                    } else {
                        state.handle(req).await.map(Either::Left)
                    })
                }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    async fn call(
        s: &FakeTriton,
        method: Method,
        path: &str,
        binary: bool,
    ) -> (StatusCode, Response<Full<Bytes>>, Bytes) {
        let mut req = Request::builder().method(method).uri(path);
        if binary {
            req = req.header(INFERENCE_HEADER_CONTENT_LENGTH, "10");
        }
        let resp = s
            .handle(req.body(Full::new(Bytes::from_static(b"{}"))).unwrap())
            .await;
        let status = resp.status();
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (
            status,
            Response::from_parts(parts, Full::new(Bytes::new())),
            bytes,
        )
    }

    fn server() -> FakeTriton {
        FakeTriton::new(&FakeConfig::default())
    }

    /// A gRPC `ModelInfer` call to `s`: (grpc-status, the answer when there is one).
    async fn grpc(
        s: &FakeTriton,
        model: &str,
        id: &str,
    ) -> (String, Option<pb::ModelInferResponse>) {
        let request = pb::ModelInferRequest {
            model_name: model.into(),
            id: id.into(),
            ..Default::default()
        };
        let req = Request::post(MODEL_INFER)
            .body(Full::new(grpc_frame(&request)))
            .unwrap();
        let resp = s.grpc_infer(req).await;
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/grpc");
        let collected = resp.into_body().collect().await.unwrap();
        let status = collected.trailers().unwrap()["grpc-status"]
            .to_str()
            .unwrap()
            .to_owned();
        let message = collected.to_bytes();
        let answer = (!message.is_empty()).then(|| {
            let length = u32::from_be_bytes(message[1..5].try_into().unwrap()) as usize;
            assert_eq!(
                (message[0], message.len()),
                (0, 5 + length),
                "one uncompressed message"
            );
            pb::ModelInferResponse::decode(&message[5..]).unwrap()
        });
        (status, answer)
    }

    #[tokio::test]
    async fn grpc_model_infer_answers_the_outputs_with_the_id_and_refuses_a_model_not_served() {
        let s = server();
        let (status, answer) = grpc(&s, "add_sub", "req-7").await;
        let answer = answer.expect("an answer");
        assert_eq!(status, "0");
        assert_eq!(
            (answer.model_name.as_str(), answer.id.as_str()),
            ("add_sub", "req-7")
        );
        let outputs: Vec<_> = answer
            .outputs
            .iter()
            .map(|o| (o.name.as_str(), o.shape.clone()))
            .collect();
        assert_eq!(outputs, [("OUTPUT0", vec![4]), ("OUTPUT1", vec![4])]);
        assert_eq!(
            answer
                .raw_output_contents
                .iter()
                .map(Bytes::len)
                .collect::<Vec<_>>(),
            [16, 16]
        );
        assert_eq!(s.infer_count(), 1);
        let (status, answer) = grpc(&s, "nope", "").await;
        assert_eq!((status.as_str(), answer), ("5", None));
        assert_eq!(s.infer_count(), 1);
        let unloaded = FakeTriton::new(&FakeConfig {
            unloaded: true,
            ..FakeConfig::default()
        });
        let (status, answer) = grpc(&unloaded, "add_sub", "").await;
        assert_eq!((status.as_str(), answer), ("3", None));
        assert_eq!(unloaded.infer_count(), 0);
    }

    #[tokio::test]
    async fn health_and_server_metadata() {
        let s = server();
        for p in ["/v2/health/live", "/v2/health/ready"] {
            let (st, _, b) = call(&s, Method::GET, p, false).await;
            assert_eq!(st, 200);
            assert!(b.is_empty());
        }
        let (st, _, b) = call(&s, Method::GET, "/v2", false).await;
        assert_eq!(st, 200);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["name"], "triton");
    }

    #[tokio::test]
    async fn repository_index_lists_models() {
        let s = FakeTriton::new(&FakeConfig {
            models: vec!["add_sub".into(), "other".into()],
            ..Default::default()
        });
        let (st, _, b) = call(&s, Method::POST, "/v2/repository/index", false).await;
        assert_eq!(st, 200);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            v,
            json!([
                {"name": "add_sub", "version": "1", "state": "READY"},
                {"name": "other", "version": "1", "state": "READY"}
            ])
        );
    }

    #[tokio::test]
    async fn loads_and_unloads_change_the_index_and_infer() {
        let s = FakeTriton::new(&FakeConfig {
            unloaded: true,
            load_delay: Duration::from_millis(20),
            ..Default::default()
        });
        let index = || async {
            let (_, _, b) = call(&s, Method::POST, "/v2/repository/index", false).await;
            serde_json::from_slice::<Value>(&b).unwrap()[0].clone()
        };
        assert_eq!(
            index().await,
            json!({"name": "add_sub", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"})
        );
        let (st, _, b) = call(&s, Method::POST, "/v2/models/add_sub/infer", false).await;
        assert_eq!(st, 400);
        assert!(
            std::str::from_utf8(&b)
                .unwrap()
                .contains("Request for unknown model")
        );

        let t0 = std::time::Instant::now();
        let (st, _, _) = call(
            &s,
            Method::POST,
            "/v2/repository/models/add_sub/load",
            false,
        )
        .await;
        assert_eq!(st, 200);
        assert!(t0.elapsed() >= Duration::from_millis(20));
        assert_eq!(index().await["state"], "READY");
        let (st, _, _) = call(&s, Method::POST, "/v2/models/add_sub/infer", false).await;
        assert_eq!(st, 200);

        let (st, _, _) = call(
            &s,
            Method::POST,
            "/v2/repository/models/add_sub/unload",
            false,
        )
        .await;
        assert_eq!(st, 200);
        assert_eq!(index().await["state"], "UNAVAILABLE");
    }

    #[tokio::test]
    async fn model_metadata_config_and_ready() {
        let s = server();
        let (st, _, b) = call(&s, Method::GET, "/v2/models/add_sub", false).await;
        assert_eq!(st, 200);
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"name":"add_sub","versions":["1"],"platform":"python","inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4]},{"name":"INPUT1","datatype":"FP32","shape":[4]}],"outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[4]},{"name":"OUTPUT1","datatype":"FP32","shape":[4]}]}"#
        );
        let (st, _, b) = call(&s, Method::GET, "/v2/models/add_sub/config", false).await;
        assert_eq!(st, 200);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["max_batch_size"], 0);
        assert_eq!(
            v["input"][0],
            json!({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        );
        assert_eq!(v["output"][1]["name"], "OUTPUT1");
        let (st, _, _) = call(&s, Method::GET, "/v2/models/add_sub/ready", false).await;
        assert_eq!(st, 200);
        let (st, _, _) = call(
            &s,
            Method::GET,
            "/v2/models/add_sub/versions/1/ready",
            false,
        )
        .await;
        assert_eq!(st, 200);
    }

    #[tokio::test]
    async fn infer_json_and_binary() {
        let s = server();
        for path in [
            "/v2/models/add_sub/infer",
            "/v2/models/add_sub/versions/1/infer",
        ] {
            let (st, resp, b) = call(&s, Method::POST, path, false).await;
            assert_eq!(st, 200);
            assert_eq!(resp.headers()[CONTENT_TYPE], "application/json");
            let v: Value = serde_json::from_slice(&b).unwrap();
            assert_eq!(v["model_name"], "add_sub");
            assert_eq!(v["model_version"], "1");
            assert_eq!(v["outputs"][0]["name"], "OUTPUT0");
            assert_eq!(v["outputs"][1]["shape"], json!([4]));
            assert_eq!(crate::outcome::check_infer_response(&b, None), Ok(()));
        }
        let (st, resp, b) = call(&s, Method::POST, "/v2/models/add_sub/infer", true).await;
        assert_eq!(st, 200);
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/octet-stream");
        let hlen: usize = resp.headers()[INFERENCE_HEADER_CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(b.len(), hlen + 32);
        let header: Value = serde_json::from_slice(&b[..hlen]).unwrap();
        assert_eq!(header["outputs"][0]["parameters"]["binary_data_size"], 16);
        assert_eq!(
            crate::outcome::check_infer_response(&b, Some(Ok(hlen))),
            Ok(())
        );
        assert_eq!(s.infer_count(), 3);
    }

    fn dynamic_server() -> FakeTriton {
        FakeTriton::new(&FakeConfig {
            models: Vec::new(),
            dynamic_models: vec!["dyn".into()],
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn dynamic_model_signature_takes_any_length() {
        let s = dynamic_server();
        let (st, _, b) = call(&s, Method::POST, "/v2/repository/index", false).await;
        assert_eq!(st, 200);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            v,
            json!([{"name": "dyn", "version": "1", "state": "READY"}])
        );
        for path in ["/v2/models/dyn", "/v2/models/dyn/versions/1"] {
            let (st, _, b) = call(&s, Method::GET, path, false).await;
            assert_eq!(st, 200);
            assert_eq!(
                std::str::from_utf8(&b).unwrap(),
                r#"{"name":"dyn","versions":["1"],"platform":"python","inputs":[{"name":"INPUT0","datatype":"FP32","shape":[-1]}],"outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[-1]}]}"#
            );
        }
        let (st, _, b) = call(&s, Method::GET, "/v2/models/dyn/config", false).await;
        assert_eq!(st, 200);
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"name":"dyn","max_batch_size":0,"backend":"python","input":[{"name":"INPUT0","data_type":"TYPE_FP32","dims":[-1]}],"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[-1]}],"instance_group":[{"count":256,"kind":"KIND_CPU"}]}"#
        );
        let (st, _, b) = call(&s, Method::GET, "/metrics", false).await;
        assert_eq!(st, 200);
        assert!(
            std::str::from_utf8(&b)
                .unwrap()
                .contains("nv_inference_request_success{model=\"dyn\",version=\"1\"} 0\n")
        );
    }

    /// A body arriving in several frames, as a large request does.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
            std::task::Poll::Ready(self.0.pop_front().map(|c| Ok(hyper::body::Frame::data(c))))
        }
    }

    #[tokio::test]
    async fn dynamic_infer_reads_the_whole_body_and_answers_small() {
        let s = dynamic_server();
        // 4 MiB in 64 KiB frames: all of it is read, none of it is kept.
        let frames: std::collections::VecDeque<Bytes> =
            (0..64).map(|_| Bytes::from(vec![0u8; 64 * 1024])).collect();
        let req = Request::post("/v2/models/dyn/infer")
            .body(Chunks(frames))
            .unwrap();
        let resp = s.handle(req).await;
        assert_eq!(resp.status(), 200);
        let b = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"model_name":"dyn","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[1],"data":[0.0]}]}"#
        );
        assert_eq!(crate::outcome::check_infer_response(&b, None), Ok(()));
        assert_eq!(s.body_bytes(), 4 * 1024 * 1024);

        let (st, resp, b) = call(&s, Method::POST, "/v2/models/dyn/infer", true).await;
        assert_eq!(st, 200);
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/octet-stream");
        let hlen: usize = resp.headers()[INFERENCE_HEADER_CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(b.len(), hlen + 4);
        let header: Value = serde_json::from_slice(&b[..hlen]).unwrap();
        assert_eq!(
            header["outputs"],
            json!([{"name": "OUTPUT0", "datatype": "FP32", "shape": [1],
                    "parameters": {"binary_data_size": 4}}])
        );
        assert_eq!(s.infer_count(), 2);
        assert_eq!(s.body_bytes(), 4 * 1024 * 1024 + 2);
        // Only the models asked for are served.
        let (st, _, _) = call(&s, Method::GET, "/v2/models/add_sub", false).await;
        assert_eq!(st, 404);
    }

    #[tokio::test]
    async fn unknown_things_are_404_with_json_error() {
        let s = server();
        for p in [
            "/nope",
            "/v2/models/missing/infer",
            "/v2/models/add_sub/versions/2/infer",
            "/v2/models/add_sub/unknown",
            "/v2/models/add_sub/infer/extra",
        ] {
            let (st, _, b) = call(&s, Method::POST, p, false).await;
            assert_eq!(st, 404, "{p}");
            let v: Value = serde_json::from_slice(&b).unwrap();
            assert!(v["error"].is_string(), "{p}");
        }
        let (st, _, _) = call(&s, Method::GET, "/v2/models/add_sub/infer", false).await;
        assert_eq!(st, 405);
    }

    #[tokio::test]
    async fn metrics_text() {
        let s = server();
        let (st, resp, b) = call(&s, Method::GET, "/metrics", false).await;
        assert_eq!(st, 200);
        assert!(
            resp.headers()[CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        let text = std::str::from_utf8(&b).unwrap();
        assert!(text.contains("nv_inference_request_success{model=\"add_sub\",version=\"1\"} 0\n"));
    }

    #[tokio::test]
    async fn fail_rate_and_delay() {
        let s = FakeTriton::new(&FakeConfig {
            fail_rate: 1.0,
            delay: Duration::from_millis(20),
            ..Default::default()
        });
        let t0 = std::time::Instant::now();
        let (st, _, b) = call(&s, Method::POST, "/v2/models/add_sub/infer", false).await;
        assert!(t0.elapsed() >= Duration::from_millis(20));
        assert_eq!(st, 500);
        assert_eq!(&b[..], br#"{"error":"injected failure"}"#);
        // Non-infer endpoints are not affected.
        let (st, _, _) = call(&s, Method::GET, "/v2/health/ready", false).await;
        assert_eq!(st, 200);
    }
}
