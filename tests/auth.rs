//! Authentication, tenants and limits through the gateway to a real Triton, on HTTP and gRPC.
//!
//! Keys are generated when the test runs, by the `openssl` command (RSA 2048, EC P-256 and
//! P-384, Ed25519, in a temporary directory): the jsonwebtoken crate signs and verifies but
//! does not generate keys, and generating RSA keys with a pure-Rust crate in a debug build
//! takes seconds per key. Tokens are signed in the test with jsonwebtoken.

mod support;

use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use infergate::protocol::inference::{
    ModelInferRequest, RepositoryIndexRequest, ServerLiveRequest, ServerMetadataRequest,
};
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::gateway::{TestGateway, config_for};
use support::{Triton, TritonOptions};
use tonic::Code;
use tonic::transport::Channel;

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "infergate";
const OPS_KEY: &str = "ops-key-0123456789";
const ACME_KEY: &str = "acme-key-0123456789";
const SLOW_KEY: &str = "slow-key-0123456789";
const HMAC_SECRET: &str = "an-hmac-secret-of-32-bytes-or-more!!";

/// Keys made for one test run.
struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    fn generate() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let keys = Self { dir };
        for (name, args) in [
            (
                "rsa",
                &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"][..],
            ),
            (
                "rsa_other",
                &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
            ),
            (
                "ec256",
                &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            ),
            (
                "ec384",
                &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
            ),
            ("ed", &["-algorithm", "ed25519"]),
            (
                "j1",
                &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            ),
            (
                "j2",
                &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            ),
        ] {
            let private = keys.path(name);
            openssl(&[&["genpkey"][..], args, &["-out", private.to_str().unwrap()]].concat());
            openssl(&[
                "pkey",
                "-in",
                private.to_str().unwrap(),
                "-pubout",
                "-out",
                keys.public(name).to_str().unwrap(),
            ]);
        }
        keys
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.pem"))
    }

    fn public(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.pub.pem"))
    }

    fn encoding(&self, name: &str) -> EncodingKey {
        let pem = std::fs::read(self.path(name)).unwrap();
        if name.starts_with("rsa") {
            EncodingKey::from_rsa_pem(&pem).unwrap()
        } else if name == "ed" {
            EncodingKey::from_ed_pem(&pem).unwrap()
        } else {
            EncodingKey::from_ec_pem(&pem).unwrap()
        }
    }

    /// A JWKS document with the public halves of ES256 keys `kids`.
    fn jwks(&self, kids: &[&str]) -> String {
        let keys: Vec<_> = kids.iter().map(|kid| (*kid, Algorithm::ES256)).collect();
        self.jwks_of(&keys)
    }

    /// A JWKS document with the public halves of keys `(kid, alg)`, each naming its `alg`.
    fn jwks_of(&self, keys: &[(&str, Algorithm)]) -> String {
        let keys = keys
            .iter()
            .map(|(kid, alg)| {
                let mut jwk = Jwk::from_encoding_key(&self.encoding(kid), *alg).unwrap();
                jwk.common.key_id = Some((*kid).into());
                jwk
            })
            .collect();
        serde_json::to_string(&JwkSet { keys }).unwrap()
    }
}

fn openssl(args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .expect("the openssl command generates the test keys");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Good claims for tenant acme; `extra` overrides (null removes).
fn claims(extra: Value) -> Value {
    let mut claims = json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "tenant": "acme",
        "exp": now() + 600, "nbf": now() - 10, "iat": now(),
    });
    for (k, v) in extra.as_object().unwrap() {
        if v.is_null() {
            claims.as_object_mut().unwrap().remove(k);
        } else {
            claims[k] = v.clone();
        }
    }
    claims
}

fn sign(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The config for the token matrix: one key per kind, a JWKS file, API keys, tenants.
fn auth_config(keys: &Keys, jwks: &Path, extra: &str) -> String {
    format!(
        r#"
[auth]
mode = "required"
issuers = ["{ISSUER}"]
audiences = ["{AUDIENCE}"]
leeway = "5s"
jwks_refresh_interval = "1h"
jwks_min_refresh_interval = "0s"

[[auth.jwt_keys]]
id = "rsa"
algorithms = ["RS256", "RS384", "RS512", "PS256"]
pem_file = "{rsa}"

[[auth.jwt_keys]]
id = "ec256"
algorithms = ["ES256"]
pem_file = "{ec256}"

[[auth.jwt_keys]]
id = "ec384"
algorithms = ["ES384"]
pem_file = "{ec384}"

[[auth.jwt_keys]]
id = "ed"
algorithms = ["EdDSA"]
pem_file = "{ed}"

[[auth.jwt_keys]]
id = "hmac"
algorithms = ["HS256", "HS384", "HS512"]
secret_env = "INFERGATE_TEST_JWT_SECRET"

[[auth.jwt_keys]]
jwks_file = "{jwks}"

[[auth.api_keys]]
name = "ops"
sha256 = "{ops}"
roles = ["admin"]

[[auth.api_keys]]
name = "acme-batch"
tenant = "acme"
sha256 = "{acme}"

[[auth.api_keys]]
name = "slowpoke"
sha256 = "{slow}"

[[auth.tenants]]
name = "acme"
models = ["add_sub*", "sticky_ranker"]

[[auth.tenants]]
name = "slowpoke"
models = ["add_sub", "slow_model"]
requests_per_second = 1.0
burst = 3
max_concurrent = 1

[[routes]]
model = "sticky_ranker"
sticky = "claim:sub"
targets = [{{ model = "sized_a", weight = 50 }}, {{ model = "sized_b", weight = 50 }}]
{extra}
"#,
        rsa = keys.public("rsa").display(),
        ec256 = keys.public("ec256").display(),
        ec384 = keys.public("ec384").display(),
        ed = keys.public("ed").display(),
        jwks = jwks.display(),
        ops = infergate::hash_key(OPS_KEY),
        acme = infergate::hash_key(ACME_KEY),
        slow = infergate::hash_key(SLOW_KEY),
    )
}

fn set_secret() {
    // SAFETY: set before any gateway reads it, to the same value by every test of this
    // binary; nothing in this process reads the environment concurrently with a change
    // of this variable's value.
    unsafe { std::env::set_var("INFERGATE_TEST_JWT_SECRET", HMAC_SECRET) };
}

/// What a gateway answered: status, the error or "", the WWW-Authenticate header or "".
async fn infer_http(
    gateway: &TestGateway,
    model: &str,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let mut request = support::infer_post(
        &reqwest::Client::new(),
        &gateway.url(),
        model,
        &support::add_sub_request(),
    );
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map_or(String::new(), |v| v.to_str().unwrap().to_owned());
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let error = body["error"].as_str().unwrap_or("").to_owned();
    (status, error, challenge)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn grpc_client(gateway: &TestGateway) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(gateway.grpc_url())
        .await
        .unwrap()
}

fn add_sub_grpc(
    model: &str,
    metadata: &[(&'static str, &str)],
) -> tonic::Request<ModelInferRequest> {
    let mut request = tonic::Request::new(support::grpc::fp32_infer(
        model,
        &[("INPUT0", [1.0, 2.0, 3.0, 4.0]), ("INPUT1", [1.0; 4])],
    ));
    for (name, value) in metadata {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    request
}

/// The gRPC answer's code and message.
async fn infer_grpc(
    client: &mut GrpcInferenceServiceClient<Channel>,
    model: &str,
    metadata: &[(&'static str, &str)],
) -> (Code, String) {
    match client.model_infer(add_sub_grpc(model, metadata)).await {
        Ok(_) => (Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_owned()),
    }
}

async fn start(keys: &Keys, jwks: &Path, triton: &Triton, name: &str, extra: &str) -> TestGateway {
    set_secret();
    let mut config = config_for(name, &[triton], "", "");
    config.push_str(&auth_config(keys, jwks, extra));
    TestGateway::start_with_admin_key(&config, OPS_KEY).await
}

/// What most tests start from: fresh keys, a JWKS file with kid `j1`, a Triton started empty
/// (the gateway loads each model on its first request), and a gateway named `name` with the
/// full auth config in front of it.
struct Setup {
    keys: Keys,
    jwks: PathBuf,
    /// Kept so the server lives as long as the test.
    _triton: Triton,
    gateway: TestGateway,
}

async fn setup(name: &str) -> Setup {
    let keys = Keys::generate();
    let jwks = keys.dir.path().join("jwks.json");
    std::fs::write(&jwks, keys.jwks(&["j1"])).unwrap();
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let gateway = start(&keys, &jwks, &triton, name, "").await;
    Setup {
        keys,
        jwks,
        _triton: triton,
        gateway,
    }
}

#[tokio::test]
async fn the_token_matrix_is_decided_alike_on_http_and_grpc() {
    let Setup {
        keys,
        jwks,
        _triton,
        gateway,
    } = setup("authmatrix").await;
    let mut grpc = grpc_client(&gateway).await;
    let good = claims(json!({}));
    let hmac = EncodingKey::from_secret(HMAC_SECRET.as_bytes()).unwrap();

    // Every algorithm, each with its key, is accepted through to Triton.
    let accepted = [
        (
            "RS256",
            sign(Algorithm::RS256, Some("rsa"), &keys.encoding("rsa"), &good),
        ),
        (
            "RS384",
            sign(Algorithm::RS384, Some("rsa"), &keys.encoding("rsa"), &good),
        ),
        (
            "RS512",
            sign(Algorithm::RS512, Some("rsa"), &keys.encoding("rsa"), &good),
        ),
        (
            "PS256",
            sign(Algorithm::PS256, Some("rsa"), &keys.encoding("rsa"), &good),
        ),
        (
            "ES256",
            sign(
                Algorithm::ES256,
                Some("ec256"),
                &keys.encoding("ec256"),
                &good,
            ),
        ),
        (
            "ES384",
            sign(
                Algorithm::ES384,
                Some("ec384"),
                &keys.encoding("ec384"),
                &good,
            ),
        ),
        (
            "EdDSA",
            sign(Algorithm::EdDSA, Some("ed"), &keys.encoding("ed"), &good),
        ),
        ("HS256", sign(Algorithm::HS256, Some("hmac"), &hmac, &good)),
        ("HS384", sign(Algorithm::HS384, Some("hmac"), &hmac, &good)),
        ("HS512", sign(Algorithm::HS512, Some("hmac"), &hmac, &good)),
        (
            "JWKS ES256",
            sign(Algorithm::ES256, Some("j1"), &keys.encoding("j1"), &good),
        ),
        (
            "expired 2 s ago, inside the 5 s leeway",
            sign(
                Algorithm::RS256,
                Some("rsa"),
                &keys.encoding("rsa"),
                &claims(json!({"exp": now() - 2})),
            ),
        ),
        (
            "valid in 2 s, inside the 5 s leeway",
            sign(
                Algorithm::RS256,
                Some("rsa"),
                &keys.encoding("rsa"),
                &claims(json!({"nbf": now() + 2})),
            ),
        ),
    ];
    for (what, token) in &accepted {
        let (status, error, _) =
            infer_http(&gateway, "add_sub", &[("authorization", &bearer(token))]).await;
        assert_eq!((status, error.as_str()), (200, ""), "{what}");
        let (code, message) =
            infer_grpc(&mut grpc, "add_sub", &[("authorization", &bearer(token))]).await;
        assert_eq!(code, Code::Ok, "{what} over gRPC: {message}");
    }

    // Each refusal: 401, the reason in the body, the challenge and the gRPC status, and
    // never the token itself.
    let rsa = keys.encoding("rsa");
    let rsa_public_pem = std::fs::read(keys.public("rsa")).unwrap();
    let none_token = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT"}"#),
        b64(good.to_string().as_bytes())
    );
    let refused = [
        ("no credentials", String::new(), "no credentials"),
        (
            "expired",
            sign(
                Algorithm::RS256,
                Some("rsa"),
                &rsa,
                &claims(json!({"exp": now() - 60})),
            ),
            "token expired",
        ),
        (
            "not yet valid",
            sign(
                Algorithm::RS256,
                Some("rsa"),
                &rsa,
                &claims(json!({"nbf": now() + 600})),
            ),
            "token not valid yet",
        ),
        (
            "wrong issuer",
            sign(
                Algorithm::RS256,
                Some("rsa"),
                &rsa,
                &claims(json!({"iss": "https://evil.test"})),
            ),
            "wrong issuer",
        ),
        (
            "no issuer while issuers are configured",
            sign(
                Algorithm::RS256,
                Some("rsa"),
                &rsa,
                &claims(json!({"iss": null})),
            ),
            "token has no 'iss' claim",
        ),
        (
            "no audience while audiences are configured",
            sign(
                Algorithm::RS256,
                Some("rsa"),
                &rsa,
                &claims(json!({"aud": null})),
            ),
            "token has no 'aud' claim",
        ),
        (
            "expired 30 s ago, past the 5 s leeway",
            sign(
                Algorithm::RS256,
                Some("rsa"),
                &rsa,
                &claims(json!({"exp": now() - 30})),
            ),
            "token expired",
        ),
        (
            "wrong audience",
            sign(
                Algorithm::ES256,
                Some("ec256"),
                &keys.encoding("ec256"),
                &claims(json!({"aud": "someone-else"})),
            ),
            "wrong audience",
        ),
        (
            "bad signature",
            sign(
                Algorithm::RS256,
                Some("rsa"),
                &keys.encoding("rsa_other"),
                &good,
            ),
            "bad signature",
        ),
        ("alg none", none_token, "alg 'none' is refused"),
        (
            "HS256 signed with the RSA public key",
            sign(
                Algorithm::HS256,
                Some("rsa"),
                &EncodingKey::from_secret(&rsa_public_pem).unwrap(),
                &good,
            ),
            "alg HS256 is not allowed for key 'rsa'",
        ),
        (
            "HS256 signed with the RSA public key, no kid",
            sign(
                Algorithm::HS256,
                None,
                &EncodingKey::from_secret(&rsa_public_pem).unwrap(),
                &good,
            ),
            "no key accepts alg HS256",
        ),
        (
            "an alg the key is not configured for",
            sign(Algorithm::PS384, Some("rsa"), &rsa, &good),
            "alg PS384 is not allowed for key 'rsa'",
        ),
        (
            "unknown kid",
            sign(Algorithm::ES256, Some("j9"), &keys.encoding("j2"), &good),
            "unknown key id 'j9'",
        ),
        (
            "no tenant",
            sign(
                Algorithm::RS256,
                Some("rsa"),
                &rsa,
                &claims(json!({"tenant": null})),
            ),
            "token has no 'tenant' claim",
        ),
        (
            "malformed",
            "not.a-jwt".to_owned(),
            "unknown API key, and not a JWT",
        ),
        (
            "garbage header",
            "e30x.e30.e30".to_owned(),
            "malformed token",
        ),
    ];
    for (what, token, reason) in &refused {
        let headers: Vec<(&str, String)> = if token.is_empty() {
            vec![]
        } else {
            vec![("authorization", bearer(token))]
        };
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (status, error, challenge) = infer_http(&gateway, "add_sub", &headers).await;
        assert_eq!(status, 401, "{what}: {error}");
        assert!(
            error.starts_with("invalid credentials: ") && error.contains(reason),
            "{what}: {error}"
        );
        assert!(
            challenge.starts_with(
                "Bearer realm=\"infergate\", error=\"invalid_token\", error_description=\""
            ) && challenge.contains(reason),
            "{what}: {challenge}"
        );
        if let Some(signature) = token.rsplit('.').next().filter(|s| s.len() > 8) {
            assert!(
                !error.contains(signature) && !challenge.contains(signature),
                "{what} echoed"
            );
        }
        let metadata: Vec<(&'static str, &str)> =
            headers.iter().map(|(_, v)| ("authorization", *v)).collect();
        let (code, message) = infer_grpc(&mut grpc, "add_sub", &metadata).await;
        assert_eq!(
            (code, message.as_str()),
            (Code::Unauthenticated, error.as_str()),
            "{what} over gRPC"
        );
    }

    // JWKS rotation: a new kid is fetched when a token names it (refresh on unknown kid).
    let j2 = sign(Algorithm::ES256, Some("j2"), &keys.encoding("j2"), &good);
    let (status, error, _) =
        infer_http(&gateway, "add_sub", &[("authorization", &bearer(&j2))]).await;
    assert_eq!(
        (status, error.as_str()),
        (401, "invalid credentials: unknown key id 'j2'")
    );
    std::fs::write(&jwks, keys.jwks(&["j1", "j2"])).unwrap();
    let (status, _, _) = infer_http(&gateway, "add_sub", &[("authorization", &bearer(&j2))]).await;
    assert_eq!(status, 200, "the rotated-in key is accepted at once");
    // A refresh that fails keeps the last good set.
    std::fs::write(&jwks, "{ not json").unwrap();
    let j9 = sign(Algorithm::ES256, Some("j9"), &keys.encoding("j2"), &good);
    let (status, _, _) = infer_http(&gateway, "add_sub", &[("authorization", &bearer(&j9))]).await;
    assert_eq!(status, 401);
    let (status, _, _) = infer_http(&gateway, "add_sub", &[("authorization", &bearer(&j2))]).await;
    assert_eq!(status, 200, "the last good JWKS is kept");
    // A key rotated out stops working, even for a token verified (and cached) before.
    std::fs::write(&jwks, keys.jwks(&["j2"])).unwrap();
    let j1 = &accepted[10].1;
    let (status, error, _) =
        infer_http(&gateway, "add_sub", &[("authorization", &bearer(&j9))]).await;
    assert_eq!(
        (status, error.as_str()),
        (401, "invalid credentials: unknown key id 'j9'")
    );
    let (status, error, _) =
        infer_http(&gateway, "add_sub", &[("authorization", &bearer(j1))]).await;
    assert_eq!(
        (status, error.as_str()),
        (401, "invalid credentials: unknown key id 'j1'")
    );

    // Decisions are counted; the refused ones have no tenant.
    let metrics = gateway.metrics_text("/metrics").await;
    let decisions = |tenant: &str, outcome: &str| -> f64 {
        let (tenant, outcome) = (
            format!("tenant=\"{tenant}\""),
            format!("outcome=\"{outcome}\""),
        );
        support::metric_sum(
            &metrics,
            "infergate_auth_decisions_total",
            &[&tenant, &outcome],
        )
    };
    assert!(
        decisions("acme", "allowed") >= 2.0 * accepted.len() as f64,
        "{metrics}"
    );
    assert!(
        decisions("", "unauthenticated") >= 2.0 * refused.len() as f64,
        "{metrics}"
    );
}

#[tokio::test]
async fn api_keys_tenants_roles_pins_and_sticky_claims() {
    let Setup {
        keys,
        jwks: _,
        _triton,
        gateway,
    } = setup("authtenants").await;
    let client = reqwest::Client::new();
    let mut grpc = grpc_client(&gateway).await;

    // API keys, as x-api-key or as a bearer token.
    for header in [
        ("x-api-key", ACME_KEY.to_owned()),
        ("authorization", bearer(ACME_KEY)),
    ] {
        let (status, error, _) = infer_http(&gateway, "add_sub", &[(header.0, &header.1)]).await;
        assert_eq!((status, error.as_str()), (200, ""), "{header:?}");
    }
    let (status, error, _) = infer_http(&gateway, "add_sub", &[("x-api-key", "guess")]).await;
    assert_eq!(
        (status, error.as_str()),
        (401, "invalid credentials: unknown API key")
    );

    // The tenant's globs: add_sub* is allowed, the rest is 403 naming the model.
    let (status, _, _) = infer_http(&gateway, "add_sub_int", &[("x-api-key", ACME_KEY)]).await;
    assert_ne!(status, 403);
    let (status, error, _) = infer_http(&gateway, "string_echo", &[("x-api-key", ACME_KEY)]).await;
    assert_eq!(
        (status, error.as_str()),
        (403, "tenant 'acme' may not use model 'string_echo'")
    );
    let (code, message) = infer_grpc(&mut grpc, "string_echo", &[("x-api-key", ACME_KEY)]).await;
    assert_eq!(
        (code, message.as_str()),
        (Code::PermissionDenied, error.as_str())
    );
    // A tenant without a list in config gets its token's models claim.
    let free = sign(
        Algorithm::RS256,
        Some("rsa"),
        &keys.encoding("rsa"),
        &claims(json!({"tenant": "free", "models": ["add_sub"]})),
    );
    let (status, _, _) =
        infer_http(&gateway, "add_sub", &[("authorization", &bearer(&free))]).await;
    assert_eq!(status, 200);
    let (status, error, _) = infer_http(
        &gateway,
        "add_sub_int",
        &[("authorization", &bearer(&free))],
    )
    .await;
    assert_eq!(
        (status, error.as_str()),
        (403, "tenant 'free' may not use model 'add_sub_int'")
    );

    // Health stays open, the metrics listener is its own; everything else needs a credential.
    let get = |url: String, key: Option<&str>| {
        let mut request = client.get(url);
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(
        get(format!("{}/v2/health/ready", gateway.url()), None).await,
        200
    );
    assert_eq!(
        get(format!("{}/v2/health/live", gateway.url()), None).await,
        200
    );
    assert_eq!(
        get(format!("http://{}/metrics", gateway.metrics), None).await,
        200
    );
    assert_eq!(get(format!("{}/v2", gateway.url()), None).await, 401);
    assert_eq!(
        get(format!("{}/v2", gateway.url()), Some(ACME_KEY)).await,
        200
    );
    let live = grpc.server_live(ServerLiveRequest {}).await.unwrap();
    assert!(live.into_inner().live, "gRPC liveness is open");
    let metadata = grpc
        .server_metadata(ServerMetadataRequest {})
        .await
        .unwrap_err();
    assert_eq!(metadata.code(), Code::Unauthenticated);

    // The repository extension, every model's statistics and the admin API need the admin role.
    let post = |path: &str, key: Option<&str>| {
        let mut request = client
            .post(format!("{}{path}", gateway.url()))
            .json(&json!({}));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (status, body["error"].as_str().unwrap_or("").to_owned())
        }
    };
    for path in [
        "/v2/repository/index",
        "/v2/repository/models/add_sub/load",
        "/v2/repository/models/add_sub_int/unload",
    ] {
        let (status, error) = post(path, Some(ACME_KEY)).await;
        assert_eq!(
            (status, error.as_str()),
            (
                403,
                "tenant 'acme' may not use the repository API: it needs the 'admin' role"
            ),
            "{path}"
        );
        assert_eq!(post(path, None).await.0, 401, "{path}");
    }
    assert_eq!(post("/v2/repository/index", Some(OPS_KEY)).await.0, 200);
    assert_eq!(
        post("/v2/repository/models/add_sub/load", Some(OPS_KEY))
            .await
            .0,
        200
    );
    assert_eq!(
        get(format!("{}/v2/models/stats", gateway.url()), Some(ACME_KEY)).await,
        403
    );
    assert_eq!(
        get(format!("{}/v2/models/stats", gateway.url()), Some(OPS_KEY)).await,
        200
    );
    let admin = format!("http://{}/admin/backends", gateway.admin);
    assert_eq!(get(admin.clone(), None).await, 401);
    assert_eq!(get(admin.clone(), Some(ACME_KEY)).await, 403);
    assert_eq!(get(admin, Some(OPS_KEY)).await, 200);
    let mut index = tonic::Request::new(RepositoryIndexRequest::default());
    index
        .metadata_mut()
        .insert("x-api-key", ACME_KEY.parse().unwrap());
    assert_eq!(
        grpc.repository_index(index).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let mut index = tonic::Request::new(RepositoryIndexRequest::default());
    index
        .metadata_mut()
        .insert("x-api-key", OPS_KEY.parse().unwrap());
    assert!(grpc.repository_index(index).await.is_ok());

    // Sticky by the verified token's sub: one user keeps one target; users spread.
    let route = |sub: &str| {
        sign(
            Algorithm::HS256,
            Some("hmac"),
            &EncodingKey::from_secret(HMAC_SECRET.as_bytes()).unwrap(),
            &claims(json!({"sub": sub})),
        )
    };
    let sized = json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]});
    let served = |token: String, pin: Option<&'static str>| {
        let mut request = client
            .post(format!("{}/v2/models/sticky_ranker/infer", gateway.url()))
            .header("authorization", bearer(&token))
            .json(&sized);
        if let Some(pin) = pin {
            request = request.header("infergate-target", pin);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap();
            (
                status,
                body["model_name"]
                    .as_str()
                    .or(body["error"].as_str())
                    .unwrap_or("")
                    .to_owned(),
            )
        }
    };
    let (status, first) = served(route("user-7"), None).await;
    assert_eq!(status, 200, "{first}");
    for _ in 0..50 {
        assert_eq!(served(route("user-7"), None).await.1, first);
    }
    let mut seen = std::collections::HashSet::new();
    for user in 0..30 {
        seen.insert(served(route(&format!("u{user}")), None).await.1);
    }
    assert_eq!(seen.len(), 2, "30 users all landed on one target: {seen:?}");

    // Only the admin role may pin a target.
    let (status, error) = served(route("user-7"), Some("sized_b")).await;
    assert_eq!(status, 403);
    assert!(
        error.contains("infergate-target needs the admin role"),
        "{error}"
    );
    let ops_token = sign(
        Algorithm::RS256,
        Some("rsa"),
        &keys.encoding("rsa"),
        &claims(json!({"tenant": "ops", "roles": ["admin"]})),
    );
    assert_eq!(
        served(ops_token, Some("sized_b")).await,
        (200, "sized_b".into())
    );

    let metrics = gateway.metrics_text("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("infergate_auth_decisions_total{")
                && l.contains("tenant=\"acme\"")
                && l.contains("outcome=\"forbidden\"")),
        "{metrics}"
    );
}

#[tokio::test]
async fn tenant_limits_answer_429_then_recover() {
    let Setup {
        keys: _,
        jwks: _,
        _triton,
        gateway,
    } = setup("authlimits").await;
    let key = [("x-api-key", SLOW_KEY)];

    // add_sub's first request loads it: another tenant's, so that the load (about a second,
    // in which slowpoke's bucket would refill) is over before the burst below.
    assert_eq!(
        infer_http(&gateway, "add_sub", &[("x-api-key", ACME_KEY)])
            .await
            .0,
        200
    );
    // Requests per second: a burst of 3 passes (above the rate of 1), the fourth is 429 with
    // Retry-After.
    tokio::time::sleep(Duration::from_millis(3100)).await;
    for n in 1..=3 {
        assert_eq!(
            infer_http(&gateway, "add_sub", &key).await.0,
            200,
            "request {n}"
        );
    }
    let response = reqwest::Client::new()
        .post(format!("{}/v2/models/add_sub/infer", gateway.url()))
        .header("x-api-key", SLOW_KEY)
        .json(&support::add_sub_request())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["error"],
        "tenant 'slowpoke' is over its limit of 1 requests per second; retry in 1s"
    );
    // ... and over gRPC, RESOURCE_EXHAUSTED with retry-after metadata.
    let mut grpc = grpc_client(&gateway).await;
    let status = grpc
        .model_infer(add_sub_grpc("add_sub", &key))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.metadata().get("retry-after").unwrap(), "1");
    // Recovery: two seconds later the bucket has two tokens again.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(infer_http(&gateway, "add_sub", &key).await.0, 200);
    let (code, message) = infer_grpc(&mut grpc, "add_sub", &key).await;
    assert_eq!(code, Code::Ok, "{message}");

    // Concurrency: one request at a time; a second while the first runs is 429, and does
    // not spend the rate.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let slow_url = format!("{}/v2/models/slow_model/infer", gateway.url());
    let slow = tokio::spawn(
        reqwest::Client::new()
            .post(slow_url)
            .header("x-api-key", SLOW_KEY)
            .json(&json!({"parameters": {"delay_ms": 1500},
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}))
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, error, _) = infer_http(&gateway, "add_sub", &key).await;
    assert_eq!(
        (status, error.as_str()),
        (
            429,
            "tenant 'slowpoke' has 1 requests in progress, its limit; retry in 1s"
        )
    );
    let slow_grpc = support::grpc::slow(10);
    let mut request = tonic::Request::new(slow_grpc);
    request
        .metadata_mut()
        .insert("x-api-key", SLOW_KEY.parse().unwrap());
    assert_eq!(
        grpc.model_infer(request).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    assert_eq!(slow.await.unwrap().unwrap().status(), 200);
    assert_eq!(
        infer_http(&gateway, "add_sub", &key).await.0,
        200,
        "the slot came back"
    );

    let metrics = gateway.metrics_text("/metrics").await;
    for outcome in ["rate_limited", "concurrency_limited", "allowed"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("infergate_auth_decisions_total{")
                    && l.contains("tenant=\"slowpoke\"")
                    && l.contains(&format!("outcome=\"{outcome}\""))),
            "{outcome}: {metrics}"
        );
    }
}

#[tokio::test]
async fn keys_taken_out_of_the_config_stop_working_on_reload() {
    let keys = Keys::generate();
    let jwks = keys.dir.path().join("jwks.json");
    std::fs::write(&jwks, keys.jwks(&["j1"])).unwrap();
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    set_secret();
    let base = config_for("authreload", &[&triton], "", "");
    let path = keys.dir.path().join("gateway.toml");
    std::fs::write(&path, format!("{base}{}", auth_config(&keys, &jwks, ""))).unwrap();
    let gateway = TestGateway::start_from_file_with_admin_key(&path, OPS_KEY).await;
    let ed = sign(
        Algorithm::EdDSA,
        Some("ed"),
        &keys.encoding("ed"),
        &claims(json!({})),
    );
    assert_eq!(
        infer_http(&gateway, "add_sub", &[("authorization", &bearer(&ed))])
            .await
            .0,
        200
    );
    assert_eq!(
        infer_http(&gateway, "add_sub", &[("x-api-key", ACME_KEY)])
            .await
            .0,
        200
    );

    // The Ed25519 key and acme's API key leave the config.
    let text = auth_config(&keys, &jwks, "")
        .replace(
            &format!(
                "[[auth.jwt_keys]]\nid = \"ed\"\nalgorithms = [\"EdDSA\"]\npem_file = \"{}\"\n",
                keys.public("ed").display()
            ),
            "",
        )
        .replace(
            &format!(
                "[[auth.api_keys]]\nname = \"acme-batch\"\ntenant = \"acme\"\nsha256 = \"{}\"\n",
                infergate::hash_key(ACME_KEY)
            ),
            "",
        );
    std::fs::write(&path, format!("{base}{text}")).unwrap();
    let reloaded = reqwest::Client::new()
        .post(format!("http://{}/admin/reload", gateway.admin))
        .header("x-api-key", OPS_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(reloaded.status(), 200, "{}", reloaded.text().await.unwrap());
    let (status, error, _) =
        infer_http(&gateway, "add_sub", &[("authorization", &bearer(&ed))]).await;
    assert_eq!(
        (status, error.as_str()),
        (401, "invalid credentials: unknown key id 'ed'")
    );
    let (status, error, _) = infer_http(&gateway, "add_sub", &[("x-api-key", ACME_KEY)]).await;
    assert_eq!(
        (status, error.as_str()),
        (401, "invalid credentials: unknown API key")
    );
    // The admin API itself needs the admin role to reload.
    let refused = reqwest::Client::new()
        .post(format!("http://{}/admin/reload", gateway.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
}

#[tokio::test]
async fn tritonclient_sends_a_bearer_token_through_the_gateway() {
    let Setup {
        keys,
        jwks: _,
        _triton,
        gateway,
    } = setup("authpython").await;
    let token = sign(
        Algorithm::RS256,
        Some("rsa"),
        &keys.encoding("rsa"),
        &claims(json!({})),
    );
    let script = keys.dir.path().join("client.py");
    std::fs::write(
        &script,
        r#"
import os, sys
import numpy as np
import tritonclient.http as httpclient
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

# A fresh dict per call: tritonclient.http adds its own entries to the one it is given.
def headers():
    return {"Authorization": "Bearer " + os.environ["TOKEN"]}
a = np.array([1, 2, 3, 4], dtype=np.float32)
b = np.ones(4, dtype=np.float32)

http = httpclient.InferenceServerClient(os.environ["HTTP_URL"])
inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
inputs[0].set_data_from_numpy(a); inputs[1].set_data_from_numpy(b)
out = http.infer("add_sub", inputs, headers=headers()).as_numpy("OUTPUT0")
assert list(out) == [2, 3, 4, 5], out
try:
    http.infer("add_sub", inputs)
    sys.exit("HTTP without a token was accepted")
except InferenceServerException as e:
    assert "no credentials" in str(e), e

grpc = grpcclient.InferenceServerClient(os.environ["GRPC_URL"])
inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
inputs[0].set_data_from_numpy(a); inputs[1].set_data_from_numpy(b)
out = grpc.infer("add_sub", inputs, headers={"authorization": headers()["Authorization"]}).as_numpy("OUTPUT0")
assert list(out) == [2, 3, 4, 5], out
try:
    grpc.infer("add_sub", inputs)
    sys.exit("gRPC without a token was accepted")
except InferenceServerException as e:
    assert e.status() == "StatusCode.UNAUTHENTICATED", e.status()
print("ok")
"#,
    )
    .unwrap();
    let http = gateway.http.to_string();
    let grpc = gateway.grpc.to_string();
    let output = support::run_python(
        &script,
        &[],
        &[
            ("TOKEN", token.as_str()),
            ("HTTP_URL", http.as_str()),
            ("GRPC_URL", grpc.as_str()),
        ],
    )
    .await;
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("ok"),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn a_jwks_url_is_fetched_and_refetched_for_an_unknown_kid() {
    let keys = Keys::generate();
    let jwks_file = keys.dir.path().join("jwks.json");
    std::fs::write(&jwks_file, keys.jwks(&["j1"])).unwrap();
    // A JWKS server whose document the test rewrites.
    let served = std::sync::Arc::new(std::sync::Mutex::new(keys.jwks(&["j1"])));
    let document = served.clone();
    let app = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            let document = document.clone();
            async move { document.lock().unwrap().clone() }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let extra = format!("[[auth.jwt_keys]]\njwks_url = \"{url}\"\nalgorithms = [\"ES256\"]\n");
    let gateway = start(&keys, &jwks_file, &triton, "authjwksurl", &extra).await;
    let good = claims(json!({}));
    // j2 is only ever served by the URL.
    let j2 = sign(Algorithm::ES256, Some("j2"), &keys.encoding("j2"), &good);
    let (status, error, _) =
        infer_http(&gateway, "add_sub", &[("authorization", &bearer(&j2))]).await;
    assert_eq!(
        (status, error.as_str()),
        (401, "invalid credentials: unknown key id 'j2'")
    );
    *served.lock().unwrap() = keys.jwks(&["j2"]);
    let (status, error, _) =
        infer_http(&gateway, "add_sub", &[("authorization", &bearer(&j2))]).await;
    assert_eq!(
        (status, error.as_str()),
        (200, ""),
        "fetched again for the unknown kid"
    );
}

/// A JWKS server for one test: it serves `document` (or 500 while `failing`) and counts the
/// fetches it answered; once `hold` is armed, the next fetch signals `asked` and waits for
/// `release` before it answers.
#[derive(Clone, Default)]
struct JwksServer {
    document: std::sync::Arc<std::sync::Mutex<String>>,
    failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    fetches: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    hold: std::sync::Arc<std::sync::Mutex<Option<Hold>>>,
}

/// `JwksServer`'s held fetch: `asked` when it has come in, `release` to let it answer.
#[derive(Clone, Default)]
struct Hold {
    asked: std::sync::Arc<tokio::sync::Notify>,
    release: std::sync::Arc<tokio::sync::Notify>,
}

impl JwksServer {
    /// Starts serving on a free port; returns the document's URL.
    async fn start(&self) -> String {
        use std::sync::atomic::Ordering;
        let server = self.clone();
        let app = axum::Router::new().route(
            "/jwks.json",
            axum::routing::get(move || {
                let server = server.clone();
                async move {
                    server.fetches.fetch_add(1, Ordering::SeqCst);
                    let held = server.hold.lock().unwrap().take();
                    if let Some(hold) = held {
                        hold.asked.notify_one();
                        hold.release.notified().await;
                    }
                    if server.failing.load(Ordering::SeqCst) {
                        Err(axum::http::StatusCode::INTERNAL_SERVER_ERROR)
                    } else {
                        Ok(server.document.lock().unwrap().clone())
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn fetches(&self) -> usize {
        self.fetches.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_jwks_url_is_read_at_start_then_on_its_interval_and_kept_when_it_fails() {
    let keys = Keys::generate();
    let server = JwksServer::default();
    // An identity provider's usual document: an RSA key naming RS256, and an EC key.
    *server.document.lock().unwrap() =
        keys.jwks_of(&[("rsa", Algorithm::RS256), ("j1", Algorithm::ES256)]);
    let url = server.start().await;
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    // Only the interval refreshes here: a refresh for an unknown kid is held back for an hour
    // after the first fetch.
    let mut config = config_for("authjwksinterval", &[&triton], "", "");
    config.push_str(&format!(
        r#"
[auth]
mode = "required"
jwks_refresh_interval = "1s"
jwks_min_refresh_interval = "1h"
default_models = ["*"]

[[auth.jwt_keys]]
jwks_url = "{url}"
algorithms = ["RS256", "RS512", "ES256"]

[[auth.api_keys]]
name = "ops"
sha256 = "{ops}"
roles = ["admin"]
"#,
        ops = infergate::hash_key(OPS_KEY),
    ));
    let gateway = TestGateway::start_with_admin_key(&config, OPS_KEY).await;
    let good = claims(json!({}));
    let call = async |token: &str| {
        let (status, error, _) =
            infer_http(&gateway, "add_sub", &[("authorization", &bearer(token))]).await;
        (status, error)
    };

    // Read at start: the keys exist only at the URL, and the first token is accepted.
    let rs256 = sign(Algorithm::RS256, Some("rsa"), &keys.encoding("rsa"), &good);
    assert_eq!(call(&rs256).await, (200, String::new()));
    let j1 = sign(Algorithm::ES256, Some("j1"), &keys.encoding("j1"), &good);
    assert_eq!(call(&j1).await, (200, String::new()));
    // The key names RS256, so RS512 under it is refused though the source allows RS512.
    let rs512 = sign(Algorithm::RS512, Some("rsa"), &keys.encoding("rsa"), &good);
    assert_eq!(
        call(&rs512).await,
        (
            401,
            "invalid credentials: alg RS512 is not allowed for key 'rsa'".into()
        )
    );

    // The provider rotates j1 out and j2 in; the interval picks it up within a few seconds.
    let j2 = sign(Algorithm::ES256, Some("j2"), &keys.encoding("j2"), &good);
    assert_eq!(
        call(&j2).await,
        (401, "invalid credentials: unknown key id 'j2'".into())
    );
    *server.document.lock().unwrap() = keys.jwks(&["j2"]);
    support::eventually(
        Duration::from_secs(5),
        "the interval refresh took j2 in",
        async || call(&j2).await.0 == 200,
    )
    .await;
    assert_eq!(
        call(&j1).await,
        (401, "invalid credentials: unknown key id 'j1'".into())
    );

    // The provider fails: two refreshes fail and the last good keys still verify.
    server
        .failing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let before = server.fetches();
    support::eventually(
        Duration::from_secs(5),
        "the interval kept fetching",
        async || server.fetches() >= before + 2,
    )
    .await;
    assert_eq!(call(&j2).await, (200, String::new()));
    let metrics = gateway.metrics_text("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("infergate_auth_jwks_refreshes_total{result=\"failed\"}")),
        "{metrics}"
    );
}

/// A stream of requests sent with `key` (none: no credential), and the stream's answers.
async fn open_stream(
    grpc: &mut GrpcInferenceServiceClient<Channel>,
    key: Option<&str>,
) -> Result<
    (
        tokio::sync::mpsc::Sender<ModelInferRequest>,
        tonic::Streaming<infergate::protocol::inference::ModelStreamInferResponse>,
    ),
    tonic::Status,
> {
    let (requests, queue) = tokio::sync::mpsc::channel(8);
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(queue));
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("x-api-key", key.parse().unwrap());
    }
    let answers = grpc.model_stream_infer(request).await?.into_inner();
    Ok((requests, answers))
}

#[tokio::test]
async fn streams_and_grpc_repository_calls_are_authorized() {
    let Setup {
        keys: _,
        jwks: _,
        _triton,
        gateway,
    } = setup("authstreams").await;
    let mut grpc = grpc_client(&gateway).await;

    // No credential: the stream is refused as it opens.
    let status = open_stream(&mut grpc, None).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    // A model the tenant may not use is refused on the stream, in HTTP's words, and the
    // stream goes on.
    let (requests, mut answers) = open_stream(&mut grpc, Some(ACME_KEY)).await.unwrap();
    let mut forbidden = support::grpc::slow(10);
    forbidden.id = "forbidden".into();
    requests.send(forbidden).await.unwrap();
    let mut allowed = add_sub_grpc("add_sub", &[]).into_inner();
    allowed.id = "allowed".into();
    requests.send(allowed).await.unwrap();
    let first = answers.message().await.unwrap().unwrap();
    assert_eq!(
        first.error_message,
        "tenant 'acme' may not use model 'slow_model'"
    );
    assert_eq!(first.infer_response.unwrap().id, "forbidden");
    let second = answers.message().await.unwrap().unwrap();
    assert_eq!(second.error_message, "");
    let second = second.infer_response.unwrap();
    assert_eq!(second.id, "allowed");
    assert_eq!(second.raw_output_contents.len(), 2);
    drop(requests);
    assert!(
        answers.message().await.unwrap().is_none(),
        "the stream ends cleanly"
    );

    // The repository over gRPC needs the admin role, as on HTTP.
    fn with_key<T>(key: &str, mut request: tonic::Request<T>) -> tonic::Request<T> {
        request
            .metadata_mut()
            .insert("x-api-key", key.parse().unwrap());
        request
    }
    let load = || {
        tonic::Request::new(infergate::protocol::inference::RepositoryModelLoadRequest {
            model_name: "add_sub".into(),
            ..Default::default()
        })
    };
    let unload = || {
        tonic::Request::new(
            infergate::protocol::inference::RepositoryModelUnloadRequest {
                model_name: "add_sub".into(),
                ..Default::default()
            },
        )
    };
    let status = grpc
        .repository_model_load(with_key(ACME_KEY, load()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        "tenant 'acme' may not use the repository API: it needs the 'admin' role"
    );
    let status = grpc
        .repository_model_unload(with_key(ACME_KEY, unload()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        _triton
            .loaded_models()
            .await
            .unwrap()
            .contains(&"add_sub".to_string())
    );
    grpc.repository_model_load(with_key(OPS_KEY, load()))
        .await
        .unwrap();

    // A streamed request holds its tenant's concurrency slot until the backend answers it:
    // slowpoke (one request at a time) is refused a unary call meanwhile, then served.
    let (requests, mut answers) = open_stream(&mut grpc, Some(SLOW_KEY)).await.unwrap();
    requests.send(support::grpc::slow(1_500)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, message) = infer_grpc(&mut grpc, "add_sub", &[("x-api-key", SLOW_KEY)]).await;
    assert_eq!(
        (code, message.as_str()),
        (
            Code::ResourceExhausted,
            "tenant 'slowpoke' has 1 requests in progress, its limit; retry in 1s"
        )
    );
    let answer = answers.message().await.unwrap().unwrap();
    assert_eq!(answer.error_message, "");
    let (code, message) = infer_grpc(&mut grpc, "add_sub", &[("x-api-key", SLOW_KEY)]).await;
    assert_eq!(
        code,
        Code::Ok,
        "the slot came back with the answer: {message}"
    );
    drop(requests);
}

/// The config snapshot is taken once per request, at the edge. A request whose token names
/// a key the gateway must fetch first waits inside authentication; a reload that lands then
/// (the route now sends its traffic elsewhere) does not reach that request: it is routed by
/// the config it was authenticated with, and the next request by the new one.
#[tokio::test]
async fn a_reload_between_authentication_and_routing_cannot_mix_two_configs() {
    set_secret();
    let keys = Keys::generate();
    let jwks_file = keys.dir.path().join("jwks.json");
    std::fs::write(&jwks_file, keys.jwks(&["j1"])).unwrap();
    let jwks = JwksServer::default();
    *jwks.document.lock().unwrap() = r#"{"keys":[]}"#.into();
    let url = jwks.start().await;
    let triton = Triton::start(TritonOptions::default()).await.unwrap();
    let config = |target: &str| {
        let mut text = support::gateway::pool_config("snapshot", &[&triton], "1GiB", "", "");
        text.push_str(&auth_config(
            &keys,
            &jwks_file,
            &format!(
                "[[routes]]\nmodel = \"add_sub_r\"\ntargets = [{{ model = \"{target}\", weight = 1 }}]\n\
                 [[auth.jwt_keys]]\njwks_url = \"{url}\"\n"
            ),
        ));
        text
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config("sized_a")).unwrap();
    let gateway = TestGateway::start_from_file_with_admin_key(&path, OPS_KEY).await;
    // From now on the URL has j2, and its next fetch waits until the reload is done.
    *jwks.document.lock().unwrap() = keys.jwks(&["j2"]);
    let hold = Hold::default();
    *jwks.hold.lock().unwrap() = Some(hold.clone());
    let token = sign(
        Algorithm::ES256,
        Some("j2"),
        &keys.encoding("j2"),
        &claims(json!({})),
    );
    let infer = |token: String| {
        let url = format!("{}/v2/models/add_sub_r/infer", gateway.url());
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .header("authorization", bearer(&token))
                .json(&json!({"inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}
                ]}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let target = response
                .headers()
                .get("infergate-target")
                .map(|v| v.to_str().unwrap().to_owned());
            (status, target, response.text().await.unwrap())
        }
    };
    let held = tokio::spawn(infer(token.clone()));
    tokio::time::timeout(Duration::from_secs(20), hold.asked.notified())
        .await
        .expect("the request asks for its key");

    std::fs::write(&path, config("sized_b")).unwrap();
    let reloaded = reqwest::Client::new()
        .post(format!("http://{}/admin/reload", gateway.admin))
        .header("x-api-key", OPS_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(reloaded.status(), 200, "{}", reloaded.text().await.unwrap());
    hold.release.notify_one();

    let (status, target, body) = held.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        target.as_deref(),
        Some("sized_a"),
        "routed by the config it was authenticated with: {body}"
    );
    let (status, target, body) = infer(token).await;
    assert_eq!(
        (status, target.as_deref()),
        (200, Some("sized_b")),
        "{body}"
    );
}
