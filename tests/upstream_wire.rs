//! What the gateway puts on the wire to a backend, where real Triton cannot show it: Triton's
//! HTTP port speaks only HTTP/1.1 (so it cannot prove an `h2c://` backend gets HTTP/2) and
//! does not report the headers it received. A small in-test server that answers like Triton
//! and records every request it sees stands in for it here, and only here.

mod support;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::Version;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use support::gateway::TestGateway;

/// One request as the stub backend received it.
#[derive(Clone, Debug)]
struct Seen {
    version: Version,
    path: String,
    request_id: Option<String>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Answers the health probe, the repository index (add_sub READY) and add_sub's infer with
/// fixed bodies, recording the HTTP version, path and `x-request-id` of each request.
async fn triton_like(State(log): State<Log>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    log.lock().unwrap().push(Seen {
        version: request.version(),
        path: path.clone(),
        request_id: request
            .headers()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap().to_owned()),
    });
    match path.as_str() {
        "/v2/health/ready" | "/v2/health/live" => "".into_response(),
        "/v2/repository/index" => {
            axum::Json(json!([{"name": "add_sub", "version": "1", "state": "READY"}]))
                .into_response()
        }
        "/v2/models/add_sub/infer" => axum::Json(json!({
            "model_name": "add_sub", "model_version": "1",
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1], "data": [3.0]}]
        }))
        .into_response(),
        _ => (http::StatusCode::NOT_FOUND, "{}").into_response(),
    }
}

/// Serves `triton_like` on a free loopback port with HTTP/2 only: hyper's server answers a
/// request without the HTTP/2 connection preface with a protocol error, so the gateway's
/// health checks pass only if they speak HTTP/2 too.
async fn start_h2_only_stub() -> (SocketAddr, Log) {
    let log = Log::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = Router::new().fallback(triton_like).with_state(log.clone());
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let service = hyper_util::service::TowerToHyperService::new(service.clone());
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service),
            );
        }
    });
    (addr, log)
}

/// A gateway over one backend at `addr`, spoken to through `backend_url`. (The test gateway
/// always has a gRPC listener, so the backend needs a gRPC URL; nothing here calls it.)
fn gateway_config(backend_url: &str, addr: SocketAddr) -> String {
    format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\n\
         [upstream]\nhealth_interval = \"200ms\"\n\
         [validation]\nenabled = false\n\
         [[backends]]\nname = \"stub-0\"\nhttp = \"{backend_url}\"\ngrpc = \"http://{addr}\"\ncapacity = \"1GiB\"\n"
    )
}

fn infer_body() -> serde_json::Value {
    json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
}

#[tokio::test]
async fn an_h2c_backend_is_spoken_to_over_http2_and_gets_the_request_id() {
    let (addr, log) = start_h2_only_stub().await;
    // Waits until the backend's health check and index (over HTTP/2) have passed.
    let gateway = TestGateway::start(&gateway_config(&format!("h2c://{addr}"), addr)).await;
    let url = format!("{}/v2/models/add_sub/infer", gateway.url());
    let client = reqwest::Client::new();

    // A client's own request id reaches the backend unchanged.
    let response = client
        .post(&url)
        .header("x-request-id", "client-chosen-42")
        .json(&infer_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["outputs"][0]["data"], json!([3.0]));

    // Without one, the id the gateway made is the one the backend sees and the client gets.
    let response = client.post(&url).json(&infer_body()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let generated = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(generated.len(), 36, "{generated}");

    let seen = log.lock().unwrap().clone();
    let infers: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.path == "/v2/models/add_sub/infer")
        .collect();
    assert_eq!(infers.len(), 2, "{seen:?}");
    assert_eq!(infers[0].request_id.as_deref(), Some("client-chosen-42"));
    assert_eq!(infers[1].request_id.as_deref(), Some(generated.as_str()));
    assert!(
        seen.iter().all(|s| s.version == Version::HTTP_2),
        "a request reached the backend over another version: {seen:?}"
    );
    assert!(
        seen.iter().any(|s| s.path == "/v2/health/ready")
            && seen.iter().any(|s| s.path == "/v2/repository/index"),
        "{seen:?}"
    );
}
