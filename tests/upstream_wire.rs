//! What the gateway puts on the wire to a backend, where real Triton cannot show it: Triton's
//! HTTP port speaks only HTTP/1.1 (so it cannot prove an `h2c://` backend gets HTTP/2), does
//! not report the headers it received, and cannot be made to drop connection attempts (a
//! blackholed host). A small in-test server that answers like Triton and records every
//! request it sees stands in for it here, and only here.

mod support;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::Version;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::gateway::TestGateway;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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

/// A gateway over one backend at `addr`, spoken to through `backend_url`, with `upstream`
/// keys. (The test gateway always has a gRPC listener, so the backend needs a gRPC URL;
/// nothing here calls it.)
fn gateway_config(backend_url: &str, addr: SocketAddr, upstream: &str) -> String {
    format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\n\
         [upstream]\n{upstream}\n\
         [validation]\nenabled = false\n\
         [[backends]]\nname = \"stub-0\"\nhttp = \"{backend_url}\"\ngrpc = \"http://{addr}\"\ncapacity = \"1GiB\"\n"
    )
}

fn infer_body() -> serde_json::Value {
    json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
}

/// One inference through `gateway` (`support::infer_post`), its whole answer.
async fn send_infer(gateway: &TestGateway) -> reqwest::Response {
    support::infer_post(
        &reqwest::Client::new(),
        &gateway.url(),
        "add_sub",
        &infer_body(),
    )
    .send()
    .await
    .unwrap()
}

#[tokio::test]
async fn an_h2c_backend_is_spoken_to_over_http2_and_gets_the_request_id() {
    let (addr, log) = start_h2_only_stub().await;
    // Waits until the backend's health check and index (over HTTP/2) have passed.
    let gateway = TestGateway::start(&gateway_config(
        &format!("h2c://{addr}"),
        addr,
        "health_interval = \"200ms\"",
    ))
    .await;
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
        seen.iter().any(|s| s.path == "/v2/health/live")
            && seen.iter().any(|s| s.path == "/v2/repository/index"),
        "{seen:?}"
    );
}

/// An HTTP/1.1 Triton-like stub that closes each connection after its answer (so the gateway
/// keeps none pooled) and can be wedged: its accept queue holds one connection (backlog 0).
struct WedgeableStub {
    addr: SocketAddr,
    stop: CancellationToken,
    accepting: tokio::task::JoinHandle<TcpListener>,
}

impl WedgeableStub {
    async fn start() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let service = Router::new()
            .fallback(triton_like)
            .with_state(Log::default());
        let stop = CancellationToken::new();
        let accepting = tokio::spawn({
            let stop = stop.clone();
            async move {
                loop {
                    let (tcp, _) = tokio::select! {
                        _ = stop.cancelled() => return listener,
                        accepted = listener.accept() => accepted.unwrap(),
                    };
                    let service = hyper_util::service::TowerToHyperService::new(service.clone());
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .keep_alive(false)
                            .serve_connection(hyper_util::rt::TokioIo::new(tcp), service),
                    );
                }
            }
        });
        Self {
            addr,
            stop,
            accepting,
        }
    }

    /// Stops accepting and fills the accept queue, so the kernel drops every new SYN: a
    /// connection attempt now hangs as it would to a blackholed host. Returns what keeps it
    /// so (the listener and the queued connection).
    async fn wedge(self) -> (TcpListener, Vec<std::net::TcpStream>) {
        self.stop.cancel();
        let listener = self.accepting.await.unwrap();
        let mut queued = Vec::new();
        loop {
            match std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)) {
                Ok(stream) => queued.push(stream),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break,
                Err(e) => panic!("connecting to the wedged stub: {e}"),
            }
            assert!(queued.len() < 8, "the accept queue never filled");
        }
        (listener, queued)
    }
}

#[tokio::test]
async fn a_backend_that_drops_connection_attempts_fails_within_connect_timeout() {
    let stub = WedgeableStub::start().await;
    let addr = stub.addr;
    // One health check at start, none after: the backend stays ready when it wedges, so the
    // request itself has to connect.
    let gateway = TestGateway::start(&gateway_config(
        &format!("http://{addr}"),
        addr,
        "health_interval = \"1h\"\nconnect_timeout = \"300ms\"\nrequest_timeout = \"20s\"",
    ))
    .await;
    let _wedged = stub.wedge().await;

    let sent = Instant::now();
    let response = send_infer(&gateway).await;
    let took = sent.elapsed();
    assert_eq!(response.status(), 502);
    let body: serde_json::Value = response.json().await.unwrap();
    let error = body["error"].as_str().unwrap();
    assert!(
        error
            == "backend 'stub-0' is unreachable: no connection within upstream.connect_timeout (300ms)",
        "{error}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "answered after {took:?}, connect_timeout is 300ms"
    );
}

/// How the failing stand-in (`start_failing_stub`) fails the first `count` infer requests.
#[derive(Clone, Copy, Default)]
struct Failing {
    /// How many infer requests fail.
    count: usize,
    /// Each connection is reset (closed with the request unread), not closed.
    reset: bool,
    /// Each is answered with Triton's python backend's 500 for a stub that did not answer
    /// in time, instead of dropping the connection.
    stub: bool,
    /// Once the last has failed, the stand-in stops listening and closes every
    /// connection: a Triton that dies as a request goes out, so the resend on a new
    /// connection is refused.
    then_dies: bool,
}

/// Serves `triton_like` over HTTP/1.1, but fails each of the first `count` infer requests
/// as `Failing` says; by default it closes the connection without a word (hyper's server
/// closes a connection whose service fails, writing nothing): what a backend does to a
/// keep-alive connection it times out as a request goes out on it, which Triton stalled
/// and resumed does now and then, but not on cue.
async fn start_dropping_stub(count: usize) -> (SocketAddr, Log) {
    start_failing_stub(Failing {
        count,
        ..Failing::default()
    })
    .await
}

/// `triton_like`, failing as `failing` says.
async fn start_failing_stub(failing: Failing) -> (SocketAddr, Log) {
    let Failing {
        count: drops,
        reset,
        stub,
        then_dies,
    } = failing;
    let log = Log::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let left = Arc::new(std::sync::atomic::AtomicUsize::new(drops));
    let router = Router::new().fallback(triton_like).with_state(log.clone());
    let died = CancellationToken::new();
    // Cancelled once the listener is closed: the connections close only then, so that the
    // gateway's new connection is refused, not accepted into a closing backlog.
    let closed = CancellationToken::new();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => Some(accepted.unwrap()),
                () = died.cancelled() => None,
            };
            let Some((tcp, _)) = accepted else {
                drop(listener);
                closed.cancel();
                return;
            };
            if reset {
                // A close with no lingering is a reset.
                socket2::SockRef::from(&tcp)
                    .set_linger(Some(Duration::ZERO))
                    .unwrap();
            }
            let (router, left, dies) = (router.clone(), left.clone(), died.clone());
            let (closed, closes) = (closed.clone(), closed.clone());
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let router = router.clone();
                    let drop_it = request.uri().path().ends_with("/infer")
                        && left
                            .fetch_update(
                                std::sync::atomic::Ordering::SeqCst,
                                std::sync::atomic::Ordering::SeqCst,
                                |n| n.checked_sub(1),
                            )
                            .is_ok();
                    let dying =
                        drop_it && then_dies && left.load(std::sync::atomic::Ordering::SeqCst) == 0;
                    if dying {
                        dies.cancel();
                    }
                    let closed = closed.clone();
                    async move {
                        if dying {
                            closed.cancelled().await;
                        }
                        if drop_it && stub {
                            let error =
                                json!({"error": "Stub process 'add_sub_0_0' is not healthy."});
                            let answer =
                                (http::StatusCode::INTERNAL_SERVER_ERROR, axum::Json(error));
                            return Ok(answer.into_response());
                        }
                        if drop_it {
                            return Err("dropped");
                        }
                        let request = request.map(axum::body::Body::new);
                        Ok(tower::ServiceExt::oneshot(router, request).await.unwrap())
                    }
                });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
            tokio::spawn(async move {
                tokio::select! {
                    _ = connection => {}
                    () = closes.cancelled() => {}
                }
            });
        }
    });
    (addr, log)
}

/// How many infer requests the stand-in's handler answered (a dropped or failed one never
/// reaches it).
fn answered(log: &Log) -> usize {
    log.lock()
        .unwrap()
        .iter()
        .filter(|s| s.path.ends_with("/infer"))
        .count()
}

/// A gateway over one `start_failing_stub`, which only its requests reach (no health
/// checks in the test's time), and the stub's log.
async fn gateway_over_failing(failing: Failing) -> (TestGateway, Log) {
    let (addr, log) = start_failing_stub(failing).await;
    let config = gateway_config(&format!("http://{addr}"), addr, "health_interval = \"1h\"");
    (TestGateway::start(&config).await, log)
}

/// A backend that dies as a request goes out (it closes the connection, then refuses the
/// new one the request is sent again on) has no copy left: the request is placed again on
/// the other backend's copy, and the client gets its answer, not a 502.
#[tokio::test]
async fn a_request_whose_backend_dies_as_it_goes_out_is_answered_by_the_other() {
    let (dying, _) = start_failing_stub(Failing {
        count: 1,
        then_dies: true,
        ..Failing::default()
    })
    .await;
    let (other, other_log) = start_dropping_stub(0).await;
    let config = format!(
        "{}[[backends]]\nname = \"stub-1\"\nhttp = \"http://{other}\"\ngrpc = \"http://{other}\"\ncapacity = \"1GiB\"\n",
        gateway_config(
            &format!("http://{dying}"),
            dying,
            "health_interval = \"1h\""
        )
    );
    let gateway = TestGateway::start(&config).await;
    gateway.wait_for_copies("add_sub", 2).await;
    let response = send_infer(&gateway).await;
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outputs"][0]["data"], json!([3.0]));
    assert_eq!(answered(&other_log), 1, "the other backend answered it");
    let backends = gateway.admin_backends().await;
    assert_eq!(
        backends[0]["ready"], false,
        "the dead backend is out: {backends:?}"
    );
}

/// A backend that closes or resets the connection before answering gets the request again
/// once, on a new connection, and the client its answer; closed twice, the client gets a
/// clear 503 with `Retry-After`, not a 502.
#[tokio::test]
async fn a_connection_closed_or_reset_before_the_answer_is_sent_on_once_more() {
    for (drops, status, reset) in [
        (1, 200, false),
        (2, 503, false),
        (1, 200, true),
        (2, 503, true),
    ] {
        let (gateway, log) = gateway_over_failing(Failing {
            count: drops,
            reset,
            ..Failing::default()
        })
        .await;
        let response = send_infer(&gateway).await;
        assert_eq!(response.status(), status, "{drops} dropped, reset: {reset}");
        if status == 503 {
            assert_eq!(response.headers()["retry-after"], "1");
            let body: serde_json::Value = response.json().await.unwrap();
            assert_eq!(
                body["error"],
                "backend 'stub-0' closed the connection before answering"
            );
        } else {
            let body: serde_json::Value = response.json().await.unwrap();
            assert_eq!(body["outputs"][0]["data"], json!([3.0]));
        }
        // The dropped sends never reach the stub's handler: only the one it answered does.
        assert_eq!(
            answered(&log),
            usize::from(status == 200),
            "{drops} dropped"
        );
    }
}

/// Triton's python backend answers 500 `Stub process '...' is not healthy.` when a model's
/// stub did not answer within a second (a stub starved of CPU). The request is not sent
/// again (it may have run, and that copy's next answer is not to be trusted): the client
/// gets a clear 503 with `Retry-After` naming the backend and Triton's words.
#[tokio::test]
async fn a_request_a_stalled_stub_failed_gets_a_503_to_retry() {
    let (gateway, _) = gateway_over_failing(Failing {
        count: 1,
        stub: true,
        ..Failing::default()
    })
    .await;
    let response = send_infer(&gateway).await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        body["error"],
        "backend 'stub-0' could not run the request: Stub process 'add_sub_0_0' is not healthy."
    );
    // The retry it asked for is answered.
    let response = send_infer(&gateway).await;
    assert_eq!(response.status(), 200);
}
