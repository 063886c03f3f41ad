//! Hostile clients against a gateway over real Triton, with real sockets: a slowloris
//! trickling header lines, bodies trickled a byte at a time, and more connections than
//! `server.max_connections`. Each attack is bounded by its key, and a well-behaved client
//! keeps getting quick answers while it runs.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::gateway::{TestGateway, config_for};
use support::{Triton, TritonOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const INFER: &str = "/v2/models/add_sub/infer";

fn add_sub_body() -> String {
    serde_json::json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1.0, 1.0, 1.0, 1.0]}]})
    .to_string()
}

/// A gateway over one Triton (default flags, nothing preloaded) with these `[server]` keys,
/// add_sub loaded by a first request.
async fn gateway(name: &str, server: &str) -> (Triton, TestGateway) {
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = TestGateway::start(&config_for(name, &[&triton], "", server)).await;
    let answer = reqwest::Client::new()
        .post(format!("{}{INFER}", gateway.url()))
        .body(add_sub_body())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
    (triton, gateway)
}

/// A client that behaves: one keep-alive connection, one add_sub request after another,
/// every answer checked, until `stop`. Returns each request's latency.
fn well_behaved(url: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Duration>> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut latencies = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let answer = client
                .post(format!("{url}{INFER}"))
                .header("content-type", "application/json")
                .body(add_sub_body())
                .send()
                .await
                .expect("the well-behaved client is answered");
            assert_eq!(answer.status(), 200);
            let body: serde_json::Value = answer.json().await.unwrap();
            assert_eq!(
                body["outputs"][0]["data"],
                serde_json::json!([2.0, 3.0, 4.0, 5.0])
            );
            latencies.push(started.elapsed());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        latencies
    })
}

/// The well-behaved client's requests all succeeded, quickly, while the attack ran.
fn assert_quick(mut latencies: Vec<Duration>, attack: &str) {
    assert!(
        latencies.len() >= 10,
        "only {} requests during the {attack}",
        latencies.len()
    );
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    let worst = *latencies.last().unwrap();
    assert!(
        median < Duration::from_millis(100) && worst < Duration::from_secs(1),
        "during the {attack}: median {median:?}, worst {worst:?}"
    );
}

/// One hostile client: it connects, sends `head`, then `lines` one by one, `every` apart.
struct Trickle {
    head: String,
    lines: Box<dyn Iterator<Item = Vec<u8>> + Send>,
    every: Duration,
}

impl Trickle {
    /// A client that connects and sends nothing.
    fn silent() -> Self {
        Self {
            head: String::new(),
            lines: Box::new(std::iter::empty()),
            every: Duration::ZERO,
        }
    }

    /// Runs the client until the server closes the connection; returns when it did, counted
    /// from the connection's start, or `None` if it never did within `give_up`.
    async fn run(self, to: std::net::SocketAddr, give_up: Duration) -> Option<Duration> {
        let mut stream = TcpStream::connect(to).await.unwrap();
        let started = Instant::now();
        let (mut read, mut write) = stream.split();
        let mut read_buf = [0u8; 4096];
        let closed = async {
            // The server may answer (an error status) before it closes: read until EOF.
            loop {
                match read.read(&mut read_buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        let send = async {
            if write.write_all(self.head.as_bytes()).await.is_err() {
                return;
            }
            for line in self.lines {
                tokio::time::sleep(self.every).await;
                if write.write_all(&line).await.is_err() {
                    return;
                }
            }
            std::future::pending::<()>().await
        };
        tokio::select! {
            _ = closed => Some(started.elapsed()),
            _ = send => Some(started.elapsed()),
            _ = tokio::time::sleep(give_up) => None,
        }
    }
}

/// Runs these hostile clients all at once, with the well-behaved one beside them, whose
/// answers must stay quick; returns when each hostile one was closed (`None`: it was not
/// within `give_up`).
async fn attack(
    gateway: &TestGateway,
    name: &str,
    clients: Vec<Trickle>,
    give_up: Duration,
) -> Vec<Option<Duration>> {
    let stop = Arc::new(AtomicBool::new(false));
    let client = well_behaved(gateway.url(), stop.clone());
    let attackers: Vec<_> = clients
        .into_iter()
        .map(|trickle| tokio::spawn(trickle.run(gateway.http, give_up)))
        .collect();
    let mut closed_after = Vec::new();
    for attacker in attackers {
        closed_after.push(attacker.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    assert_quick(client.await.unwrap(), name);
    closed_after
}

/// `infergate_client_timeouts_total` for this phase, over every listener.
async fn timeouts_counted(gateway: &TestGateway, phase: &str) -> f64 {
    let metrics = gateway.metrics_text("/metrics").await;
    let filter = format!("phase=\"{phase}\"");
    support::metric_sum(&metrics, "infergate_client_timeouts_total", &[&filter])
}

/// Sends `request` and a part of its body, then nothing: what the gateway answers before it
/// closes the connection.
async fn answer_to_stalled(gateway: &TestGateway, request: &str, part: &[u8]) -> String {
    let mut stream = TcpStream::connect(gateway.http).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.write_all(part).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("the connection is closed")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn a_slowloris_is_closed_after_header_read_timeout_while_others_are_served() {
    let (_triton, gateway) = gateway("slowloris", "header_read_timeout = \"1s\"").await;
    // 300 connections each sending a header line every 200 ms, forever if let, 80 of them
    // after a first request answered on the same connection (the timer of a kept
    // connection's next head); and 20 that send nothing at all.
    let trickled = |first: &str| Trickle {
        head: format!("{first}POST {INFER} HTTP/1.1\r\nhost: gateway\r\n"),
        lines: Box::new((0..).map(|n| format!("x-pad-{n}: slow\r\n").into_bytes())),
        every: Duration::from_millis(200),
    };
    let clients = (0..320)
        .map(|i| match i % 16 {
            0 => Trickle::silent(),
            1..=4 => trickled("GET /v2/health/ready HTTP/1.1\r\nhost: gateway\r\n\r\n"),
            _ => trickled(""),
        })
        .collect();
    let closed_after = attack(&gateway, "slowloris", clients, Duration::from_secs(6)).await;
    let still_open = closed_after.iter().filter(|c| c.is_none()).count();
    assert_eq!(still_open, 0, "connections still open after 6 s");
    let closed: Vec<Duration> = closed_after.into_iter().flatten().collect();
    let (first, last) = (closed.iter().min().unwrap(), closed.iter().max().unwrap());
    assert!(
        *first >= Duration::from_millis(900) && *last < Duration::from_secs(4),
        "closed between {first:?} and {last:?}, header_read_timeout is 1s"
    );
    let timeouts = timeouts_counted(&gateway, "header").await;
    assert!(timeouts >= 320.0, "{timeouts} header timeouts counted");
}

/// The head of a JSON inference request whose body is `length` bytes.
fn json_head(length: usize) -> String {
    format!(
        "POST {INFER} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
         content-length: {length}\r\n\r\n"
    )
}

#[tokio::test]
async fn a_body_trickled_at_a_byte_a_second_is_cut_after_body_read_timeout() {
    let (_triton, gateway) = gateway("trickle", "body_read_timeout = \"500ms\"").await;
    let body = add_sub_body();
    let head = json_head(body.len());
    let clients = (0..20)
        .map(|_| Trickle {
            head: head.clone(),
            lines: Box::new(body.clone().into_bytes().into_iter().map(|b| vec![b])),
            every: Duration::from_secs(1),
        })
        .collect();
    let closed_after = attack(&gateway, "trickled bodies", clients, Duration::from_secs(8)).await;
    // The first byte comes after 1 s, the next wait passes 500 ms: cut by about 1.5 s, while
    // the whole body would take minutes.
    for closed in &closed_after {
        let closed = closed.expect("a trickled body still open after 8 s");
        assert!(closed < Duration::from_secs(4), "cut after {closed:?}");
    }
    let timeouts = timeouts_counted(&gateway, "body").await;
    assert!(timeouts >= 20.0, "{timeouts} body timeouts counted");
}

/// What a trickled body's client is told: an error naming the key, then the connection
/// closes.
#[tokio::test]
async fn a_stalled_body_is_answered_with_an_error_naming_body_read_timeout() {
    let (_triton, gateway) = gateway("stalled", "body_read_timeout = \"300ms\"").await;
    let body = add_sub_body();
    let request = json_head(body.len());
    let answer = answer_to_stalled(&gateway, &request, &body.as_bytes()[..10]).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "answer: {answer}");
    assert!(
        answer.contains("server.body_read_timeout"),
        "answer: {answer}"
    );
}

#[tokio::test]
async fn connections_past_max_connections_are_shed_and_counted() {
    // One worker, so the limit is the gateway's.
    let (_triton, gateway) = gateway("shed", "max_connections = 21\nworkers = 1").await;
    let stop = Arc::new(AtomicBool::new(false));
    let client = well_behaved(gateway.url(), stop.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = support::metric_sum(
        &gateway.metrics_text("/metrics").await,
        "infergate_connections_shed_total",
        &["listener=\"http\""],
    );
    // 20 connections that hold their slot (the well-behaved client has the 21st).
    let mut held = Vec::new();
    for _ in 0..20 {
        let mut stream = TcpStream::connect(gateway.http).await.unwrap();
        stream.write_all(b"GET /v2 HTTP/1.1\r\n").await.unwrap();
        held.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let metrics = gateway.metrics_text("/metrics").await;
    let open = support::metric_sum(
        &metrics,
        "infergate_connections_open",
        &["listener=\"http\""],
    );
    assert!(open >= 21.0, "{open} connections open");
    // Past the limit: closed at once, without a byte sent.
    let mut shed = Vec::new();
    for _ in 0..10 {
        let client = Trickle::silent();
        shed.push(tokio::spawn(
            client.run(gateway.http, Duration::from_secs(3)),
        ));
    }
    for closed in shed {
        let closed = closed
            .await
            .unwrap()
            .expect("a connection past the limit stayed open");
        assert!(closed < Duration::from_secs(1), "shed after {closed:?}");
    }
    let after = support::metric_sum(
        &gateway.metrics_text("/metrics").await,
        "infergate_connections_shed_total",
        &["listener=\"http\""],
    );
    assert_eq!(after - before, 10.0);
    // The held connections were not disturbed, and one freed slot takes a new client.
    for stream in &mut held {
        stream.write_all(b"host: gateway\r\n\r\n").await.unwrap();
        let mut answer = [0u8; 12];
        stream.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HTTP/1.1 200");
    }
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = reqwest::Client::new()
        .get(format!("{}/v2/health/ready", gateway.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    stop.store(true, Ordering::Relaxed);
    assert_quick(client.await.unwrap(), "connection flood");
}

/// A binary request stalled mid-body (its JSON header sent, its tensors not): that is the
/// client's fault, so the backend is not counted as failing (three failures in a row would
/// eject it). The body is read whole before the request goes on (docs/flow.md), so the
/// stall is seen at the gateway, before any of it is sent to Triton.
#[tokio::test]
async fn a_body_stalled_mid_stream_does_not_count_against_the_backend() {
    let (_triton, gateway) = gateway("midstream", "body_read_timeout = \"300ms\"").await;
    let header = serde_json::json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}}]})
    .to_string();
    for _ in 0..4 {
        let request = format!(
            "POST {INFER} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/octet-stream\r\n\
             inference-header-content-length: {}\r\ncontent-length: {}\r\n\r\n{header}",
            header.len(),
            header.len() + 32
        );
        let answer = answer_to_stalled(&gateway, &request, &[0u8; 4]).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "answer: {answer}");
        assert!(
            answer.contains("server.body_read_timeout"),
            "answer: {answer}"
        );
    }
    let backends = gateway.admin_backends().await;
    assert_eq!(backends[0]["ready"], true, "{backends:?}");
    let answer = reqwest::Client::new()
        .post(format!("{}{INFER}", gateway.url()))
        .body(add_sub_body())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
}

/// Sends `head`, then `body` in `chunk`-byte pieces, one every `every`, while reading what
/// the gateway answers: the answer, and when the connection closed after the head was sent
/// (`None`: still open after `give_up`).
async fn send_paced(
    gateway: &TestGateway,
    head: &str,
    body: &[u8],
    chunk: usize,
    every: Duration,
    give_up: Duration,
) -> (String, Option<Duration>) {
    let mut stream = TcpStream::connect(gateway.http).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let (mut read, mut write) = stream.split();
    let mut answer = Vec::new();
    let send = async {
        for piece in body.chunks(chunk) {
            tokio::time::sleep(every).await;
            if write.write_all(piece).await.is_err() {
                break;
            }
        }
        std::future::pending::<()>().await
    };
    let closed = tokio::select! {
        // EOF once the gateway closes; a reset counts as closed too.
        _ = read.read_to_end(&mut answer) => Some(started.elapsed()),
        () = send => None,
        () = tokio::time::sleep(give_up) => None,
    };
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

/// add_sub's body padded with spaces (JSON allows them) to `length` bytes.
fn padded_add_sub_body(length: usize) -> Vec<u8> {
    let mut body = add_sub_body().into_bytes();
    body.resize(length, b' ');
    body
}

/// The slow POST: a byte every 200 ms never pauses past `body_read_timeout` (60 s here), but
/// averages far under `min_body_rate` (240 B/s): cut with 408 once the grace is spent, while
/// the well-behaved client is served throughout.
#[tokio::test]
async fn a_body_trickled_under_the_minimum_rate_gets_408_and_its_connection_closed() {
    let (_triton, gateway) = gateway("slowpost", "min_body_rate_grace = \"1s\"").await;
    let before = timeouts_counted(&gateway, "body_rate").await;
    let stop = Arc::new(AtomicBool::new(false));
    let client = well_behaved(gateway.url(), stop.clone());
    let body = padded_add_sub_body(400);
    let head = json_head(body.len());
    let trickles = (0..10).map(|_| {
        send_paced(
            &gateway,
            &head,
            &body,
            1,
            Duration::from_millis(200),
            Duration::from_secs(8),
        )
    });
    for (answer, closed) in futures_util::future::join_all(trickles).await {
        let closed = closed.expect("a trickled body still open after 8 s");
        // Cut when its waits pass the 1 s grace: a little after, never the minutes the body
        // would take.
        assert!(
            closed >= Duration::from_millis(900) && closed < Duration::from_secs(4),
            "closed after {closed:?}"
        );
        assert!(answer.starts_with("HTTP/1.1 408"), "answer: {answer}");
        assert!(answer.contains("server.min_body_rate"), "answer: {answer}");
        assert!(answer.contains("connection: close"), "answer: {answer}");
    }
    stop.store(true, Ordering::Relaxed);
    assert_quick(client.await.unwrap(), "slow POST");
    let counted = timeouts_counted(&gateway, "body_rate").await - before;
    assert!(counted >= 10.0, "{counted} body_rate timeouts counted");
}

/// A slow link is not an attack: 100 bytes every 250 ms (400 B/s, above the 240 B/s
/// minimum) for 5 s, well past the grace, is served.
#[tokio::test]
async fn a_slow_but_steady_body_above_the_minimum_rate_is_served() {
    let (_triton, gateway) = gateway("steady", "min_body_rate_grace = \"1s\"").await;
    let body = padded_add_sub_body(2000);
    let head = json_head(body.len()).replace("host: gateway", "host: gateway\r\nconnection: close");
    let (answer, closed) = send_paced(
        &gateway,
        &head,
        &body,
        100,
        Duration::from_millis(250),
        Duration::from_secs(15),
    )
    .await;
    assert!(closed.is_some(), "no answer: {answer}");
    assert!(answer.starts_with("HTTP/1.1 200"), "answer: {answer}");
    assert!(answer.contains("[2.0,3.0,4.0,5.0]"), "answer: {answer}");
}

/// The slow POST over gRPC: a ModelInfer message trickled a byte every 200 ms. A stream may
/// rest between its messages as long as it likes, but a message once begun must come at
/// `min_body_rate`: the call fails with the error table's status naming the key once the
/// grace is spent, the connection gets a GOAWAY, it is counted, and others are served.
#[tokio::test]
async fn a_grpc_message_trickled_under_the_minimum_rate_fails_with_a_status() {
    use http_body_util::BodyExt;
    let (_triton, gateway) = gateway("slowgrpc", "min_body_rate_grace = \"1s\"").await;
    let before = timeouts_counted(&gateway, "body_rate").await;
    let stop = Arc::new(AtomicBool::new(false));
    let client = well_behaved(gateway.url(), stop.clone());
    let mut message = support::grpc::fp32_infer(
        "add_sub",
        &[("INPUT0", [1.0, 2.0, 3.0, 4.0]), ("INPUT1", [1.0; 4])],
    );
    message.id = "slow".repeat(100);
    let encoded = prost::Message::encode_to_vec(&message);
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    framed.extend_from_slice(&encoded);

    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(1);
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(chunk)),
            rx,
        ))
    });
    let body = http_body_util::StreamBody::new(Box::pin(chunks));
    let stream = TcpStream::connect(gateway.grpc).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let mut connection = tokio::spawn(connection);
    let feeder = tokio::spawn(async move {
        for byte in framed.chunks(1) {
            if tx.send(bytes::Bytes::copy_from_slice(byte)).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let request = http::Request::post(format!(
        "{}/inference.GRPCInferenceService/ModelInfer",
        gateway.grpc_url()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(body)
    .unwrap();
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(8), sender.send_request(request))
        .await
        .expect("no answer to a trickled message within 8 s")
        .unwrap();
    let (parts, body) = response.into_parts();
    let trailers = body.collect().await.unwrap().trailers().cloned();
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(4),
        "answered after {elapsed:?}"
    );
    let status = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .or(parts.headers.get("grpc-status"))
        .expect("a grpc-status");
    assert_eq!(status, "4", "{parts:?} {trailers:?}");
    let text = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-message"))
        .or(parts.headers.get("grpc-message"))
        .map(|m| m.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert!(text.contains("server.min_body_rate"), "{text}");
    tokio::time::timeout(Duration::from_secs(3), &mut connection)
        .await
        .expect("the connection is closed after the slow message")
        .unwrap()
        .unwrap();
    feeder.abort();
    stop.store(true, Ordering::Relaxed);
    assert_quick(client.await.unwrap(), "slow gRPC message");
    let counted = timeouts_counted(&gateway, "body_rate").await - before;
    assert!(counted >= 1.0, "{counted} body_rate timeouts counted");
}
