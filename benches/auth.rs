//! What the `auth` stage costs per request: verifying a JWT (RS256 and HS256) with and
//! without the verified-token cache, and looking up an API key. The cached figure is what a
//! client that reuses its token pays after its first request.
//!
//! The RSA key is generated with the `openssl` command into a temporary directory.
//!
//! Run: `cargo bench --bench auth`.

use criterion::{Criterion, criterion_group, criterion_main};
use infergate::hash_key;
use infergate::internals::{Auth, Config, Credentials};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use std::hint::black_box;
use std::time::{SystemTime, UNIX_EPOCH};

const SECRET: &str = "a-bench-hmac-secret-of-32-bytes-or-more";
const API_KEY: &str = "bench-api-key-0123456789";

fn auth(dir: &std::path::Path, cache: u64) -> Auth {
    let config = Config::parse(&format!(
        r#"
        [listen]
        http = "127.0.0.1:0"
        [[backends]]
        name = "b"
        http = "http://127.0.0.1:1"
        [auth]
        mode = "required"
        issuers = ["https://issuer.bench"]
        audiences = ["infergate"]
        token_cache_capacity = {cache}
        [[auth.jwt_keys]]
        id = "rsa"
        algorithms = ["RS256"]
        pem_file = "{}"
        [[auth.jwt_keys]]
        id = "hmac"
        algorithms = ["HS256"]
        secret_env = "INFERGATE_BENCH_JWT_SECRET"
        [[auth.api_keys]]
        name = "bench"
        sha256 = "{}"
        "#,
        dir.join("rsa.pub.pem").display(),
        hash_key(API_KEY),
    ))
    .unwrap();
    Auth::new(&config.auth).unwrap()
}

fn openssl(args: &[&str]) {
    let status = std::process::Command::new("openssl")
        .args(args)
        .status()
        .expect("openssl");
    assert!(status.success());
}

fn bench(c: &mut Criterion) {
    // SAFETY: set once, before any thread of this process reads the environment.
    unsafe { std::env::set_var("INFERGATE_BENCH_JWT_SECRET", SECRET) };
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("rsa.pem");
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        private.to_str().unwrap(),
    ]);
    openssl(&[
        "pkey",
        "-in",
        private.to_str().unwrap(),
        "-pubout",
        "-out",
        dir.path().join("rsa.pub.pem").to_str().unwrap(),
    ]);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "iss": "https://issuer.bench", "aud": "infergate", "sub": "user-1", "tenant": "acme",
        "roles": ["reader"], "exp": now + 3600, "iat": now,
    });
    let sign = |alg: Algorithm, kid: &str, key: &EncodingKey| {
        let mut header = Header::new(alg);
        header.kid = Some(kid.into());
        format!(
            "Bearer {}",
            jsonwebtoken::encode(&header, &claims, key).unwrap()
        )
    };
    let rs256 = sign(
        Algorithm::RS256,
        "rsa",
        &EncodingKey::from_rsa_pem(&std::fs::read(&private).unwrap()).unwrap(),
    );
    let hs256 = sign(
        Algorithm::HS256,
        "hmac",
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let uncached = auth(dir.path(), 0);
    let cached = auth(dir.path(), 10_000);
    let mut group = c.benchmark_group("auth");
    for (name, header) in [("rs256", &rs256), ("hs256", &hs256)] {
        for (mode, auth) in [("uncached", &uncached), ("cached", &cached)] {
            let credentials = Credentials {
                authorization: Some(header.as_bytes()),
                api_key: None,
                peer: None,
            };
            runtime.block_on(auth.authenticate(credentials)).unwrap();
            group.bench_function(format!("jwt_{name}_{mode}"), |b| {
                b.iter(|| {
                    runtime
                        .block_on(auth.authenticate(black_box(credentials)))
                        .unwrap()
                })
            });
        }
    }
    let credentials = Credentials {
        authorization: None,
        api_key: Some(API_KEY.as_bytes()),
        peer: None,
    };
    group.bench_function("api_key", |b| {
        b.iter(|| {
            runtime
                .block_on(uncached.authenticate(black_box(credentials)))
                .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
