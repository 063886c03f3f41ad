//! W3C trace context through the gateway binary to a real Triton, over HTTP and gRPC.
//!
//! Triton runs with its own OpenTelemetry tracing (`--trace-config mode=opentelemetry`) and
//! exports its spans over OTLP/HTTP; the gateway exports its own over OTLP/gRPC
//! (`telemetry.otlp_endpoint`). Both go to one small stand-in collector in this test (no
//! OpenTelemetry collector runs here): what Triton files under which parent is what shows
//! that the `traceparent` reached it. The access-log line must name the same trace id.

mod support;

use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Triton, TritonOptions, eventually, eventually_every};

/// A span as the collector received it; ids in lowercase hex (empty: none).
#[derive(Clone, Debug)]
struct Received {
    from_gateway: bool,
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    attributes: BTreeMap<String, String>,
}

/// The stand-in collector: OTLP/gRPC (the gateway) and OTLP/HTTP JSON (Triton) on one port.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let mut spans = self.0.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let attributes = span
                        .attributes
                        .iter()
                        .map(|kv| {
                            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                Some(any_value::Value::StringValue(s)) => s.clone(),
                                Some(any_value::Value::IntValue(i)) => i.to_string(),
                                other => format!("{other:?}"),
                            };
                            (kv.key.clone(), value)
                        })
                        .collect();
                    spans.push(Received {
                        from_gateway: true,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent: hex(&span.parent_span_id),
                        name: span.name,
                        attributes,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Triton's exporter posts OTLP JSON to `/v1/traces`.
    fn add_json(&self, body: &Value) {
        let mut spans = self.0.lock().unwrap();
        for resource in body["resourceSpans"].as_array().into_iter().flatten() {
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    let text = |key: &str| span[key].as_str().unwrap_or_default().to_owned();
                    spans.push(Received {
                        from_gateway: false,
                        trace_id: text("traceId"),
                        span_id: text("spanId"),
                        parent: text("parentSpanId"),
                        name: text("name"),
                        attributes: BTreeMap::new(),
                    });
                }
            }
        }
    }

    async fn start() -> (Self, std::net::SocketAddr) {
        let collector = Collector::default();
        let json_sink = collector.clone();
        let router = tonic::service::Routes::new(TraceServiceServer::new(collector.clone()))
            .into_axum_router()
            .route(
                "/v1/traces",
                axum::routing::post(move |body: axum::Json<Value>| async move {
                    json_sink.add_json(&body.0);
                    axum::Json(json!({}))
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        (collector, addr)
    }

    fn spans(&self) -> Vec<Received> {
        self.0.lock().unwrap().clone()
    }

    /// Waits until the collector has the gateway's span and Triton's request span of the
    /// trace; returns (gateway's, Triton's).
    async fn trace(&self, trace_id: &str) -> (Option<Received>, Received) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans: Vec<Received> = self
                .spans()
                .into_iter()
                .filter(|s| s.trace_id == trace_id)
                .collect();
            let gateway = spans.iter().find(|s| s.from_gateway).cloned();
            let triton = spans
                .iter()
                .find(|s| !s.from_gateway && s.name == "InferRequest")
                .cloned();
            if let Some(triton) = triton
                && gateway.is_some()
            {
                return (gateway, triton);
            }
            if Instant::now() >= deadline {
                // Which traces Triton did export, to tell a lost export from a wrong id.
                let triton: Vec<(String, String, String)> = self
                    .spans()
                    .into_iter()
                    .filter(|s| !s.from_gateway)
                    .map(|s| (s.trace_id, s.parent, s.name))
                    .collect();
                panic!("trace {trace_id} incomplete: {spans:?}; Triton's spans: {triton:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until Triton has exported `count` request spans, so every request so far is
    /// done there before the gateway stops; a failure here says which spans did come.
    async fn wait_for_triton_spans(&self, count: usize) {
        eventually_every(
            Duration::from_millis(100),
            Duration::from_secs(20),
            &format!("Triton exported {count} request spans"),
            async || {
                let triton = self.triton_requests();
                if triton.len() >= count {
                    Ok(())
                } else {
                    Err(triton)
                }
            },
        )
        .await
    }

    /// Triton's request spans so far.
    fn triton_requests(&self) -> Vec<Received> {
        self.spans()
            .into_iter()
            .filter(|s| !s.from_gateway && s.name == "InferRequest")
            .collect()
    }

    /// The gateway's `ModelInfer` spans so far.
    fn gateway_infers(&self) -> Vec<Received> {
        self.spans()
            .into_iter()
            .filter(|s| s.from_gateway && s.name == "inference.GRPCInferenceService/ModelInfer")
            .collect()
    }

    /// Triton's request span of the trace, once it came.
    async fn triton_span(&self, trace_id: &str) -> Received {
        eventually_every(
            Duration::from_millis(100),
            Duration::from_secs(20),
            &format!("Triton exported {trace_id}"),
            async || {
                self.spans()
                    .into_iter()
                    .find(|s| s.trace_id == trace_id && !s.from_gateway && s.name == "InferRequest")
            },
        )
        .await
    }
}

/// The gateway binary with `--log-format json`; SIGKILLed on drop unless stopped.
struct Gateway {
    child: Option<Child>,
    http: String,
    grpc: String,
    _config: tempfile::NamedTempFile,
}

impl Gateway {
    async fn start(triton: &Triton, telemetry: &str) -> Self {
        let [http, grpc] = support::free_ports::<2>().unwrap();
        let mut config = tempfile::NamedTempFile::new().unwrap();
        use std::io::Write;
        write!(
            config,
            "[listen]\nhttp = \"127.0.0.1:{http}\"\ngrpc = \"127.0.0.1:{grpc}\"\n\
             [upstream]\nhealth_interval = \"200ms\"\n[telemetry]\n{telemetry}\n\
             [[backends]]\nname = \"traced\"\nhttp = \"{}\"\ngrpc = \"{}\"\n",
            triton.http_url(),
            triton.grpc_url()
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["--log-format", "json", "--config"])
            .arg(config.path())
            // The SDK's batch delay (default 5s): spans reach the collector quickly.
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let this = Self {
            child: Some(child),
            http: format!("http://127.0.0.1:{http}"),
            grpc: format!("http://127.0.0.1:{grpc}"),
            _config: config,
        };
        eventually(Duration::from_secs(30), "the gateway ready", async || {
            let ready = reqwest::get(format!("{}/v2/health/ready", this.http)).await;
            ready.is_ok_and(|r| r.status() == 200)
        })
        .await;
        this
    }

    /// Stops it with SIGTERM (which also sends the last spans) and returns its log lines.
    async fn stop(mut self) -> Vec<Value> {
        let child = self.child.take().unwrap();
        let pid = child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let output = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn add_sub_json() -> Value {
    json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}]})
}

/// An HTTP inference with this request id and, when given, this `traceparent`.
async fn http_infer(gateway: &Gateway, id: &str, traceparent: Option<&str>) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/v2/models/add_sub/infer", gateway.http))
        .header("x-request-id", id)
        .json(&add_sub_json());
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    assert_eq!(request.send().await.unwrap().status(), 200);
}

async fn grpc_infer(gateway: &Gateway, id: &str, traceparent: Option<&str>) {
    let mut client = GrpcInferenceServiceClient::connect(gateway.grpc.clone())
        .await
        .unwrap();
    let message = support::grpc::fp32_infer(
        "add_sub",
        &[("INPUT0", [1.0, 2.0, 3.0, 4.0]), ("INPUT1", [1.0; 4])],
    );
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("x-request-id", id.parse().unwrap());
    if let Some(traceparent) = traceparent {
        request
            .metadata_mut()
            .insert("traceparent", traceparent.parse().unwrap());
    }
    client.model_infer(request).await.unwrap();
}

/// A gRPC inference through the gateway whose span Triton filed under the gateway's, and
/// what it took: (request id, the gateway's span, Triton's span). Triton 2.51 now and then
/// files a gRPC call under a new root trace of its own, although the call carried a valid
/// `traceparent`: seen with tonic calling Triton directly too (2 calls in 48, gRPC only,
/// never over HTTP). So a call whose span Triton did not join is made again, as a new
/// request with `traceparent(attempt)`, up to four times.
async fn grpc_joined(
    gateway: &Gateway,
    collector: &Collector,
    id: &str,
    traceparent: impl Fn(usize) -> String,
) -> (String, Received, Received) {
    let mut rootless = Vec::new();
    for attempt in 0..4 {
        let request_id = format!("{id}-{attempt}");
        let seen = collector.gateway_infers().len();
        let triton_seen = collector.triton_requests().len();
        grpc_infer(gateway, &request_id, Some(&traceparent(attempt))).await;
        let (ours, theirs) = eventually(
            Duration::from_secs(20),
            &format!("spans for {request_id} (the gateway's, Triton's)"),
            async || {
                let ours = collector.gateway_infers();
                let theirs = collector.triton_requests();
                if ours.len() > seen && theirs.len() > triton_seen {
                    Ok((ours[seen].clone(), theirs[triton_seen..].to_vec()))
                } else {
                    Err((ours, theirs))
                }
            },
        )
        .await;
        if let Some(joined) = theirs.iter().find(|s| s.trace_id == ours.trace_id) {
            return (request_id, ours, joined.clone());
        }
        rootless.push(theirs);
    }
    panic!("Triton joined none of four gRPC calls' traces: it filed them as {rootless:?}");
}

/// The trace id on the access-log line (the one with the latency) of the request with this id.
fn logged_trace_id(logs: &[Value], request_id: &str) -> String {
    logs.iter()
        .find(|l| l["span"]["request_id"] == request_id && l["latency_ms"].is_number())
        .unwrap_or_else(|| panic!("no access-log line for {request_id}: {logs:?}"))["span"]
        ["trace_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn the_trace_reaches_triton_the_log_and_the_collector_over_http_and_grpc() {
    let (collector, addr) = Collector::start().await;
    let triton = Triton::start(TritonOptions {
        args: [
            "mode=opentelemetry",
            "rate=1",
            "level=TIMESTAMPS",
            &format!("opentelemetry,url=http://{addr}/v1/traces"),
            "opentelemetry,bsp_schedule_delay=100",
        ]
        .iter()
        .map(|setting| format!("--trace-config={setting}"))
        .collect(),
        ..Default::default()
    })
    .await
    .unwrap();
    let gateway = Gateway::start(&triton, &format!("otlp_endpoint = \"http://{addr}\"")).await;

    let http_parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    http_infer(&gateway, "http-joined", Some(&http_parent)).await;
    http_infer(&gateway, "http-new", None).await;
    // Their spans first, so that the next span from Triton is the gRPC call's.
    collector.wait_for_triton_spans(2).await;
    // Joined: a client's trace (a new one for each try).
    let grpc_trace = |attempt: usize| format!("0af7651916cd43dd8448eb211c8031{attempt:02x}");
    let grpc_parent = "b7ad6b7169203331";
    let joined = grpc_joined(&gateway, &collector, "grpc-joined", |attempt| {
        format!("00-{}-{grpc_parent}-01", grpc_trace(attempt))
    })
    .await;
    // Started here: the client's traceparent is not valid.
    let new = grpc_joined(&gateway, &collector, "grpc-new", |_| {
        "00-not-a-valid-traceparent-01".into()
    })
    .await;
    let logs = gateway.stop().await;

    // Joined: the gateway's span is the client's child, and Triton's the gateway's.
    let (gateway_span, triton_span) = collector.trace(CLIENT_TRACE).await;
    let gateway_span = gateway_span.unwrap();
    assert_eq!(logged_trace_id(&logs, "http-joined"), CLIENT_TRACE);
    assert_eq!(gateway_span.parent, CLIENT_SPAN, "{gateway_span:?}");
    assert_eq!(gateway_span.name, "POST /v2/models/{model}/infer");
    assert_eq!(gateway_span.attributes["infergate.model"], "add_sub");
    assert_eq!(gateway_span.attributes["infergate.backend"], "traced");
    assert_eq!(triton_span.parent, gateway_span.span_id, "{triton_span:?}");
    let (request_id, gateway_span, triton_span) = &joined;
    assert_eq!(&logged_trace_id(&logs, request_id), &gateway_span.trace_id);
    assert!(
        gateway_span
            .trace_id
            .starts_with("0af7651916cd43dd8448eb211c8031")
    );
    assert_eq!(gateway_span.parent, grpc_parent, "{gateway_span:?}");
    assert_eq!(gateway_span.attributes["infergate.model"], "add_sub");
    assert_eq!(gateway_span.attributes["infergate.backend"], "traced");
    assert_eq!(triton_span.parent, gateway_span.span_id, "{triton_span:?}");

    // Started here (none, or an invalid one): the log names the new trace, Triton joined it.
    let trace = logged_trace_id(&logs, "http-new");
    assert_eq!(trace.len(), 32);
    assert_ne!(trace, "0".repeat(32));
    let (gateway_span, triton_span) = collector.trace(&trace).await;
    let gateway_span = gateway_span.unwrap();
    assert_eq!(gateway_span.parent, "", "a root span: {gateway_span:?}");
    assert_eq!(triton_span.parent, gateway_span.span_id);
    let (request_id, gateway_span, triton_span) = &new;
    assert_eq!(&logged_trace_id(&logs, request_id), &gateway_span.trace_id);
    assert_ne!(gateway_span.trace_id, "0".repeat(32));
    assert_eq!(gateway_span.parent, "", "a root span: {gateway_span:?}");
    assert_eq!(triton_span.parent, gateway_span.span_id);
    let http_status = &collector
        .spans()
        .into_iter()
        .find(|s| s.from_gateway && s.trace_id == CLIENT_TRACE)
        .unwrap()
        .attributes["http.response.status_code"];
    assert_eq!(http_status, "200");

    // Without an exporter the context still travels: Triton files its span under the
    // gateway's (unrecorded) span in the client's trace, and the log names it.
    let triton_spans = collector.triton_requests().len();
    let quiet = Gateway::start(&triton, "").await;
    let trace = "c0ffee0000000000000000000000beef";
    http_infer(
        &quiet,
        "quiet",
        Some(&format!("00-{trace}-{CLIENT_SPAN}-01")),
    )
    .await;
    // A trace begun there (none came, or a malformed one) is recorded nowhere: Triton gets
    // no traceparent, and its spans of those requests are roots of its own traces.
    http_infer(&quiet, "quiet-untraced", None).await;
    grpc_infer(
        &quiet,
        "quiet-untraced-grpc",
        Some("00-not-a-valid-traceparent-01"),
    )
    .await;
    collector.wait_for_triton_spans(triton_spans + 3).await;
    let logs = quiet.stop().await;
    let roots = |spans: &[Received]| spans.iter().filter(|s| s.parent.is_empty()).count();
    let spans = collector.triton_requests();
    let (before, after) = spans.split_at(triton_spans);
    assert_eq!(roots(after), 2, "{after:?}");
    for id in ["quiet-untraced", "quiet-untraced-grpc"] {
        let logged = logged_trace_id(&logs, id);
        assert_eq!(logged.len(), 32, "the log names the trace begun there");
        assert!(
            (before.iter().chain(after)).all(|s| s.trace_id != logged),
            "{id}: Triton joined {logged}: {after:?}"
        );
    }
    assert_eq!(logged_trace_id(&logs, "quiet"), trace);
    let triton_span = collector.triton_span(trace).await;
    assert_eq!(triton_span.parent.len(), 16);
    assert_ne!(
        triton_span.parent, CLIENT_SPAN,
        "the gateway is a hop of its own"
    );
    assert!(
        !collector
            .spans()
            .iter()
            .any(|s| s.from_gateway && s.trace_id == trace),
        "nothing is exported without telemetry.otlp_endpoint"
    );
}
