//! TLS against real Triton, with certificates made here (rcgen): a CA, a server certificate
//! for 127.0.0.1/localhost, client certificates.
//!
//! - reqwest (rustls, trusting the test CA), the Python `tritonclient.http` (`ssl=True`) and a
//!   tonic client over TLS all infer through the gateway;
//! - mTLS: without a client certificate the handshake fails; with one signed by the CA it
//!   works and the gateway sees its subject (`/admin/whoami`, the request's `PeerIdentity`);
//! - rotation: new certificate files are served to new connections while an open connection
//!   keeps working; a bad replacement keeps the old certificate;
//! - config reload: new certificate paths in the file are served after `POST /admin/reload`,
//!   and a path that does not load refuses the reload by key;
//! - upstream TLS: a rustls terminator in front of Triton (HTTP and gRPC) is reached over
//!   https with the CA bundle, and refused without it.

mod support;

use infergate::config::ClientIdentity;
use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use infergate::protocol::inference::{ModelInferRequest, ServerLiveRequest};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use support::gateway::TestGateway;
use support::pki::{Issued, Pki};
use support::{Triton, TritonOptions, eventually_every};
use tokio::sync::OnceCell;

/// One Triton for the whole binary, started empty with default flags: each test starts its
/// own gateway in front of it, and the first to ask for a model loads it.
async fn triton() -> &'static Triton {
    static TRITON: OnceCell<Triton> = OnceCell::const_new();
    TRITON
        .get_or_init(|| async {
            Triton::start(TritonOptions::default())
                .await
                .expect("triton")
        })
        .await
}

/// Gateway config over the test Triton with `[listen.tls]` (plus `tls_extra` keys there).
fn tls_config(name: &str, triton: &Triton, pki: &Pki, tls_extra: &str) -> String {
    format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\n\
         [listen.tls]\ncert = \"{}\"\nkey = \"{}\"\n{tls_extra}\n\
         [upstream]\nhealth_interval = \"200ms\"\nhealth_timeout = \"3s\"\n\
         [[backends]]\nname = \"{name}-0\"\nhttp = \"{}\"\ngrpc = \"{}\"\ncapacity = \"1GiB\"\n",
        pki.path("server.crt").display(),
        pki.path("server.key").display(),
        triton.http_url(),
        triton.grpc_url(),
    )
}

/// A reqwest client trusting the test CA, optionally with a client certificate; one
/// connection per client (so a new client is a new handshake), with the TLS info kept.
fn https_client(pki: &Pki, identity: Option<&Issued>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem().as_bytes()).unwrap())
        .tls_info(true)
        .timeout(Duration::from_secs(30));
    if let Some(issued) = identity {
        let pem = format!("{}{}", issued.cert, issued.key);
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    builder.build().unwrap()
}

/// Starts a TLS gateway and waits (over https) until its backend is ready.
async fn start(config: &str, admin: reqwest::Client) -> TestGateway {
    let gateway = TestGateway::start_unready(config, Some(admin)).await;
    gateway.wait_for_ready_backends(1).await;
    gateway
}

/// One add_sub inference over https; returns OUTPUT0 and the server certificate's CN.
async fn infer(client: &reqwest::Client, addr: std::net::SocketAddr) -> (Vec<f64>, String) {
    let base = format!("https://{addr}");
    let response = support::infer_post(client, &base, "add_sub", &support::add_sub_request())
        .send()
        .await
        .expect("https inference");
    assert_eq!(response.status(), 200);
    let served_by = served_certificate(&response);
    let body: Value = response.json().await.unwrap();
    let output = body["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "OUTPUT0")
        .unwrap()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    (output, served_by)
}

/// The CN of the certificate the server presented on this response's connection.
fn served_certificate(response: &reqwest::Response) -> String {
    let info = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .expect("TLS info");
    let der = info.peer_certificate().expect("server certificate");
    infergate::internals::certificate_identity(der, ClientIdentity::Cn).unwrap()
}

/// A rustls client config trusting the test CA, with an optional client certificate.
fn rustls_client(pki: &Pki, identity: Option<&Issued>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca_pem().as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    match identity {
        Some(issued) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(issued.cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(issued.key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    }
}

/// A tonic client over TLS (rustls via hyper-rustls, ALPN h2) to `addr`.
async fn grpc_tls_client(
    pki: &Pki,
    identity: Option<&Issued>,
    addr: std::net::SocketAddr,
) -> Result<GrpcInferenceServiceClient<tonic::transport::Channel>, tonic::transport::Error> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(rustls_client(pki, identity))
        .https_only()
        .enable_http2()
        .build();
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .connect_with_connector(connector)
        .await?;
    Ok(GrpcInferenceServiceClient::new(channel))
}

fn grpc_add_sub() -> ModelInferRequest {
    support::grpc::fp32_infer(
        "add_sub",
        &[("INPUT0", [1.0, 2.0, 3.0, 4.0]), ("INPUT1", [1.0; 4])],
    )
}

/// OUTPUT0 of a gRPC add_sub answer.
fn grpc_output0(response: &infergate::protocol::inference::ModelInferResponse) -> Vec<f32> {
    let index = response
        .outputs
        .iter()
        .position(|o| o.name == "OUTPUT0")
        .unwrap();
    response.raw_output_contents[index]
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[tokio::test]
async fn rustls_python_and_grpc_clients_infer_over_tls() {
    let triton = triton().await;
    let pki = Pki::new("plain-tls");
    pki.install_server(&pki.server("gateway"));
    let client = https_client(&pki, None);
    let gateway = start(&tls_config("tlsclients", triton, &pki, ""), client.clone()).await;

    // reqwest over rustls, trusting only the test CA.
    let (output, served_by) = infer(&client, gateway.http).await;
    assert_eq!(output, [2.0, 3.0, 4.0, 5.0]);
    assert_eq!(served_by, "gateway");
    // Health endpoints answer as before, over TLS.
    let ready = client
        .get(format!("https://{}/v2/health/ready", gateway.http))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    // Plain HTTP to a TLS listener gets no answer; metrics stay plain.
    assert!(
        reqwest::get(format!("http://{}/v2/health/ready", gateway.http))
            .await
            .is_err()
    );
    assert!(
        gateway
            .metrics_text("/metrics")
            .await
            .contains("infergate_")
    );

    // A tonic client over TLS (h2 by ALPN).
    let mut grpc = grpc_tls_client(&pki, None, gateway.grpc).await.unwrap();
    assert!(
        grpc.server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    let answer = grpc.model_infer(grpc_add_sub()).await.unwrap().into_inner();
    assert_eq!(grpc_output0(&answer), [2.0, 3.0, 4.0, 5.0]);

    // The official Python tritonclient.http over https, its CA file given.
    let suite = support::repo_root().join("tests/python/test_http_client.py");
    let url = format!("localhost:{}", gateway.http.port());
    let ca = pki.path("ca.pem");
    let stdout = support::run_pytest(
        &suite,
        &[],
        &[
            ("INFERGATE_URL", url.as_str()),
            ("INFERGATE_CA", ca.to_str().unwrap()),
        ],
        "tritonclient.http over https failed",
    )
    .await;
    assert!(!stdout.contains("skipped"), "{stdout}");
}

/// Every log line of this test binary, as text: the access-log lines carry the peer.
fn captured_logs() -> Arc<std::sync::Mutex<Vec<u8>>> {
    static LOGS: std::sync::OnceLock<Arc<std::sync::Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter("info")
            .with_writer(move || LogSink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("first subscriber");
        logs
    })
    .clone()
}

struct LogSink(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn mtls_refuses_clients_without_a_certificate_and_names_those_with_one() {
    let logs = captured_logs();
    let triton = triton().await;
    let pki = Pki::new("mtls");
    pki.install_server(&pki.server("gateway"));
    let alice = pki.client("alice");
    let admin = https_client(&pki, Some(&alice));
    let config = tls_config(
        "tlsmtls",
        triton,
        &pki,
        &format!("client_ca = \"{}\"", pki.path("ca.pem").display()),
    );
    let gateway = start(&config, admin.clone()).await;

    // No certificate: the handshake fails, nothing is answered.
    let anonymous = https_client(&pki, None);
    let refused = anonymous
        .post(format!("https://{}/v2/models/add_sub/infer", gateway.http))
        .json(&support::add_sub_request())
        .send()
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(grpc_refused(&pki, gateway.grpc).await);

    // A certificate from another CA is refused too.
    let other = Pki::new("other");
    let mallory = other.client("mallory");
    let stranger = https_client(&pki, Some(&mallory));
    assert!(
        stranger
            .get(format!("https://{}/v2/health/live", gateway.http))
            .send()
            .await
            .is_err()
    );

    // With a certificate signed by the CA: inference works and the gateway knows who it is.
    let (output, _) = infer(&admin, gateway.http).await;
    assert_eq!(output, [2.0, 3.0, 4.0, 5.0]);
    let whoami: Value = admin
        .get(format!("https://{}/admin/whoami", gateway.admin))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(whoami, json!({"peer": "alice"}));
    let mut grpc = grpc_tls_client(&pki, Some(&alice), gateway.grpc)
        .await
        .unwrap();
    let answer = grpc.model_infer(grpc_add_sub()).await.unwrap().into_inner();
    assert_eq!(grpc_output0(&answer), [2.0, 3.0, 4.0, 5.0]);

    // Both access-log lines name the peer: the PeerIdentity reached the HTTP handler and the
    // tonic service alike.
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains("peer=\"alice\"") && l.contains(needle))
            .unwrap_or_else(|| panic!("no access-log line with peer=alice and {needle}:\n{text}"))
            .to_string()
    };
    assert!(line("/v2/models/add_sub/infer").contains("status=200"));
    assert!(line("rpc=\"ModelInfer\"").contains("code=\"Ok\""));
}

/// Whether a gRPC client without a certificate is refused by an mTLS listener: with TLS 1.3
/// the client may finish its side of the handshake before the server refuses, so the
/// refusal shows either at connect or at the first call.
async fn grpc_refused(pki: &Pki, addr: std::net::SocketAddr) -> bool {
    match grpc_tls_client(pki, None, addr).await {
        Err(_) => true,
        Ok(mut client) => client.server_live(ServerLiveRequest {}).await.is_err(),
    }
}

/// `infergate_tls_reloads_total{result="failure"}`.
async fn failed_reloads(gateway: &TestGateway) -> u64 {
    gateway
        .metric_sum("infergate_tls_reloads_total", &["result=\"failure\""])
        .await as u64
}

/// Waits until the gateway has tried `what` and counted it as a failed reload.
async fn await_failed_reload(gateway: &TestGateway, before: u64, what: &str) {
    eventually_every(
        Duration::from_millis(200),
        Duration::from_secs(15),
        &format!("{what} tried"),
        async || failed_reloads(gateway).await != before,
    )
    .await;
}

#[tokio::test]
async fn rotated_certificates_reach_new_connections_and_bad_ones_are_refused() {
    let triton = triton().await;
    let pki = Pki::new("rotation");
    pki.install_server(&pki.server("first"));
    let client = https_client(&pki, None);
    let gateway = start(&tls_config("tlsrotate", triton, &pki, ""), client.clone()).await;
    // An open keep-alive connection, made with the first certificate.
    let kept = https_client(&pki, None);
    assert_eq!(infer(&kept, gateway.http).await.1, "first");

    // Rotate: new files; the watcher picks them up within a few seconds.
    pki.install_server(&pki.server("second"));
    eventually_every(
        Duration::from_millis(200),
        Duration::from_secs(15),
        "the new certificate served",
        async || {
            let fresh = https_client(&pki, None);
            infer(&fresh, gateway.http).await.1 == "second"
        },
    )
    .await;
    // The connection opened before the rotation still works, on its own session.
    let (output, served_by) = infer(&kept, gateway.http).await;
    assert_eq!(output, [2.0, 3.0, 4.0, 5.0]);
    assert_eq!(served_by, "first");

    // A bad replacement: a key that does not go with the certificate. Refused and counted;
    // new connections keep getting the second certificate.
    let failures_before = failed_reloads(&gateway).await;
    let third = pki.server("third");
    let unrelated = pki.server("unrelated");
    pki.write("server.crt", &third.cert);
    pki.write("server.key", &unrelated.key);
    await_failed_reload(&gateway, failures_before, "the bad certificate").await;
    assert_eq!(
        infer(&https_client(&pki, None), gateway.http).await.1,
        "second"
    );
    // Garbage instead of PEM: the same.
    let failures_before = failed_reloads(&gateway).await;
    pki.write("server.crt", "not a certificate");
    await_failed_reload(&gateway, failures_before, "the garbage certificate").await;
    assert_eq!(
        infer(&https_client(&pki, None), gateway.http).await.1,
        "second"
    );
    // gRPC listeners share the certificate.
    let mut grpc = grpc_tls_client(&pki, None, gateway.grpc).await.unwrap();
    assert!(grpc.server_live(ServerLiveRequest {}).await.is_ok());
}

#[tokio::test]
async fn a_config_reload_reads_new_certificate_paths_or_refuses_by_key() {
    let triton = triton().await;
    let pki = Pki::new("reload");
    pki.install_server(&pki.server("first"));
    let config = tls_config("tlsreload", triton, &pki, "");
    let path = pki.write("gateway.toml", &config);
    let client = https_client(&pki, None);
    let gateway = TestGateway::start_from_file_unready(&path, Some(client.clone())).await;
    gateway.wait_for_ready_backends(1).await;
    assert_eq!(infer(&client, gateway.http).await.1, "first");
    let reload = || async {
        let response = https_client(&pki, None)
            .post(format!("https://{}/admin/reload", gateway.admin))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    };

    // Other files, named in the config: served after the reload.
    let second = pki.server("second");
    pki.write("second.crt", &second.cert);
    pki.write("second.key", &second.key);
    let moved = config
        .replace("server.crt", "second.crt")
        .replace("server.key", "second.key");
    std::fs::write(&path, &moved).unwrap();
    let (status, body) = reload().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        infer(&https_client(&pki, None), gateway.http).await.1,
        "second"
    );

    // A certificate path that does not exist: the reload is refused by key, nothing changes.
    std::fs::write(&path, moved.replace("second.crt", "missing.crt")).unwrap();
    let (status, body) = reload().await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("listen.tls.cert") && body.contains("missing.crt"),
        "{body}"
    );
    assert_eq!(
        infer(&https_client(&pki, None), gateway.http).await.1,
        "second"
    );
}

/// A TLS terminator in front of a plain TCP service: each connection is handshaken with
/// `config` and piped to `target`.
async fn terminator(config: rustls::ServerConfig, target: String) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, target) = (acceptor.clone(), target.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    addr
}

fn terminator_config(pki: &Pki, alpn: &[u8]) -> rustls::ServerConfig {
    let issued = pki.server("triton-behind-tls");
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from_pem_slice(issued.cert.as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(issued.key.as_bytes()).unwrap(),
    )
    .unwrap();
    config.alpn_protocols = vec![alpn.to_vec()];
    config
}

#[tokio::test]
async fn backends_over_https_are_verified_with_the_ca_bundle() {
    let triton = triton().await;
    let pki = Pki::new("upstream");
    let strip = |url: String| url.trim_start_matches("http://").to_string();
    let http = terminator(
        terminator_config(&pki, b"http/1.1"),
        strip(triton.http_url()),
    )
    .await;
    let grpc = terminator(terminator_config(&pki, b"h2"), strip(triton.grpc_url())).await;
    let config = |name: &str, upstream: &str| {
        format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\n\
             [upstream]\nhealth_interval = \"200ms\"\nhealth_timeout = \"3s\"\n{upstream}\n\
             [[backends]]\nname = \"{name}-0\"\nhttp = \"https://127.0.0.1:{}\"\ngrpc = \"https://localhost:{}\"\ncapacity = \"1GiB\"\n",
            http.port(),
            grpc.port(),
        )
    };

    // With the CA bundle: the backend is healthy and serves HTTP and gRPC through TLS.
    let trusted = TestGateway::start(&config(
        "tlsup",
        &format!("tls_ca = \"{}\"", pki.path("ca.pem").display()),
    ))
    .await;
    let answer: Value = reqwest::Client::new()
        .post(format!("{}/v2/models/add_sub/infer", trusted.url()))
        .json(&support::add_sub_request())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["model_name"], "add_sub", "{answer}");
    let mut client = GrpcInferenceServiceClient::connect(trusted.grpc_url())
        .await
        .unwrap();
    let answer = client
        .model_infer(grpc_add_sub())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_output0(&answer), [2.0, 3.0, 4.0, 5.0]);

    // Without it (the system's roots do not know the test CA): never healthy, and the
    // reason names the certificate.
    let untrusted = TestGateway::start_unready(&config("tlsupno", ""), None).await;
    let backend = eventually_every(
        Duration::from_millis(100),
        Duration::from_secs(10),
        "the backend's last error",
        async || {
            let backends = untrusted.admin_backends().await;
            if backends[0]["last_error"].is_string() {
                Ok(backends[0].clone())
            } else {
                Err(backends)
            }
        },
    )
    .await;
    assert_eq!(backend["ready"], false);
    let reason = backend["last_error"].as_str().unwrap();
    assert!(
        reason.contains("certificate") || reason.contains("UnknownIssuer"),
        "{reason}"
    );
    let refused = reqwest::Client::new()
        .post(format!("{}/v2/models/add_sub/infer", untrusted.url()))
        .json(&support::add_sub_request())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
}

#[tokio::test]
async fn a_client_certificate_names_the_tenant_when_auth_is_on() {
    let triton = triton().await;
    let pki = Pki::new("mtls-tenant");
    pki.install_server(&pki.server("gateway"));
    let alice = pki.client("alice");
    // The admin API needs the admin role: the test's own client adds an admin API key.
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-api-key", "ops-key".parse().unwrap());
    let admin = {
        let pem = format!("{}{}", alice.cert, alice.key);
        reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem().as_bytes()).unwrap())
            .identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap())
            .default_headers(headers)
            .build()
            .unwrap()
    };
    let config = format!(
        "{}\n[auth]\nmode = \"required\"\nclient_certificates = true\n\
         [[auth.api_keys]]\nname = \"ops\"\nsha256 = \"{}\"\nroles = [\"admin\"]\n\
         [[auth.tenants]]\nname = \"alice\"\nmodels = [\"add_sub\"]\n",
        tls_config(
            "tlstenant",
            triton,
            &pki,
            &format!("client_ca = \"{}\"", pki.path("ca.pem").display()),
        ),
        infergate::hash_key("ops-key"),
    );
    let gateway = start(&config, admin).await;

    // Alice's certificate is her credential: her tenant may call add_sub, nothing else.
    let client = https_client(&pki, Some(&alice));
    let (output, _) = infer(&client, gateway.http).await;
    assert_eq!(output, [2.0, 3.0, 4.0, 5.0]);
    let forbidden = client
        .post(format!("https://{}/v2/models/sized_a/infer", gateway.http))
        .json(&support::add_sub_request())
        .send()
        .await
        .unwrap();
    assert_eq!(forbidden.status(), 403);
    let body: Value = forbidden.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("sized_a"),
        "{body}"
    );
    // No admin role comes with a certificate.
    let admin_api = client
        .get(format!("https://{}/admin/backends", gateway.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(admin_api.status(), 403);
    // gRPC alike.
    let mut grpc = grpc_tls_client(&pki, Some(&alice), gateway.grpc)
        .await
        .unwrap();
    assert!(grpc.model_infer(grpc_add_sub()).await.is_ok());
    let mut other = grpc_add_sub();
    other.model_name = "sized_a".into();
    let refused = grpc.model_infer(other).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
}
