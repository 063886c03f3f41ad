//! JWT bearer tokens: the verification keys (PEM files, HMAC secrets from the environment,
//! JWKS documents from a file or a URL) and the check of one token.
//!
//! The header is read here before jsonwebtoken sees the token, so a refusal can say exactly
//! what was wrong: `alg: none`, an algorithm the key is not configured for (which is also
//! how HS256-signed-with-the-RSA-public-key is refused: the RSA key allows RS*/PS* only, and
//! jsonwebtoken refuses a key of another family), an unknown `kid`. Every key carries one
//! prepared `Validation` per algorithm it allows, so the check itself allocates only the
//! claims.
//!
//! JWKS sets are swapped whole (`ArcSwap`): a refresh that fails keeps the last good set.

use crate::config::{self, algorithm_family};
use crate::telemetry;
use arc_swap::ArcSwap;
use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The claims of a verified token.
pub type Claims = serde_json::Map<String, serde_json::Value>;

/// A key that verifies signatures, with the algorithms it may verify.
pub struct VerifyKey {
    /// The `kid` tokens name it by.
    pub kid: Option<String>,
    /// Where it came from, for logs (`auth.jwt_keys[0]`).
    pub origin: String,
    key: DecodingKey,
    validations: Vec<(Algorithm, Validation)>,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyKey")
            .field("kid", &self.kid)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl VerifyKey {
    fn allows(&self, alg: Algorithm) -> bool {
        self.validations.iter().any(|(a, _)| *a == alg)
    }
}

/// What the token checks need besides keys.
#[derive(Clone, Debug)]
struct Rules {
    issuers: Vec<String>,
    audiences: Vec<String>,
    leeway: u64,
}

impl Rules {
    fn validation(&self, alg: Algorithm) -> Validation {
        let mut validation = Validation::new(alg);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        // A configured issuer or audience makes its claim required: jsonwebtoken skips the
        // check of a claim that is absent unless it is also listed here.
        let mut required = vec!["exp"];
        if !self.issuers.is_empty() {
            validation.set_issuer(&self.issuers);
            required.push("iss");
        }
        if self.audiences.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&self.audiences);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        validation
    }

    fn key(
        &self,
        kid: Option<String>,
        origin: String,
        key: DecodingKey,
        algs: &[Algorithm],
    ) -> VerifyKey {
        VerifyKey {
            kid,
            origin,
            key,
            validations: algs.iter().map(|&a| (a, self.validation(a))).collect(),
        }
    }
}

/// Where a JWKS document is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Location {
    File(PathBuf),
    Url(String),
}

/// One JWKS source and its last good set of keys.
pub struct JwksSource {
    origin: String,
    location: Location,
    algorithms: Vec<Algorithm>,
    keys: ArcSwap<Vec<Arc<VerifyKey>>>,
    /// FNV-1a of the document the keys came from (0: none yet).
    fingerprint: AtomicU64,
}

/// Every verification key, and the rules tokens are checked by.
pub struct JwtKeys {
    rules: Rules,
    fixed: Vec<Arc<VerifyKey>>,
    jwks: Vec<JwksSource>,
    min_refresh: Duration,
    /// Milliseconds since `epoch()` of the last refresh started because of an unknown key.
    last_refresh: AtomicU64,
    /// Bumped whenever a JWKS set changes: tokens verified under an older generation are
    /// verified again (a key taken out of a JWKS stops working at once, cache or not).
    generation: AtomicU64,
    http: Option<reqwest::Client>,
}

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn parse_algorithms(names: &[String]) -> Vec<Algorithm> {
    names
        .iter()
        .filter_map(|n| Algorithm::from_str(n).ok())
        .collect()
}

/// What one configured key becomes: a key that verifies as it is, or a JWKS source whose
/// keys come and go.
enum Configured {
    Fixed(VerifyKey),
    Jwks(JwksSource),
}

impl JwtKeys {
    /// Reads every configured key: PEM files and secrets now, JWKS files now (URLs are
    /// fetched by `refresh`). Errors name the key.
    pub fn new(config: &config::Auth) -> Result<Self, Vec<config::ConfigError>> {
        let rules = Rules {
            issuers: config.issuers.clone(),
            audiences: config.audiences.clone(),
            leeway: config.leeway.0.as_secs(),
        };
        let mut errors = Vec::new();
        let mut fixed = Vec::new();
        let mut jwks = Vec::new();
        for (i, key) in config.jwt_keys.iter().enumerate() {
            match configure_key(&rules, format!("auth.jwt_keys[{i}]"), key) {
                Ok(Some(Configured::Fixed(key))) => fixed.push(Arc::new(key)),
                Ok(Some(Configured::Jwks(source))) => jwks.push(source),
                Ok(None) => {}
                Err(error) => errors.push(error),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let http = jwks_client(&jwks);
        Ok(Self {
            rules,
            fixed,
            jwks,
            min_refresh: config.jwks_min_refresh_interval.0,
            last_refresh: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            http,
        })
    }

    /// Whether any key is configured.
    pub fn is_empty(&self) -> bool {
        self.fixed.is_empty() && self.jwks.is_empty()
    }

    /// The current key generation (see the field).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Keeps the keys of JWKS sources that the previous config had too (same location), so
    /// a reload does not forget keys fetched from a URL.
    pub fn inherit(&self, previous: &JwtKeys) {
        for source in &self.jwks {
            if source.keys.load().is_empty()
                && let Some(old) = previous.jwks.iter().find(|o| o.location == source.location)
            {
                let keys: Vec<Arc<VerifyKey>> = old
                    .keys
                    .load()
                    .iter()
                    .map(|k| {
                        let algs: Vec<Algorithm> = k.validations.iter().map(|(a, _)| *a).collect();
                        Arc::new(self.rules.key(
                            k.kid.clone(),
                            source.origin.clone(),
                            k.key.clone(),
                            &algs,
                        ))
                    })
                    .collect();
                source.keys.store(Arc::new(keys));
                source
                    .fingerprint
                    .store(old.fingerprint.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }

    /// Reads every JWKS source again. A source that cannot be read or parsed keeps its last
    /// good set (and says so in the log). Returns true when any set changed.
    pub async fn refresh(&self) -> bool {
        let mut changed = false;
        for source in &self.jwks {
            let text = match &source.location {
                Location::File(path) => tokio::fs::read(path)
                    .await
                    .map_err(|e| format!("cannot read {}: {e}", path.display())),
                Location::Url(url) => match &self.http {
                    Some(client) => fetch(client, url).await,
                    None => Err("no HTTP client".into()),
                },
            };
            let parsed = text.and_then(|text| {
                let print = crate::fnv::fnv1a(&text);
                if print == source.fingerprint.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                source
                    .parse(&self.rules, &text)
                    .map(|keys| Some((keys, print)))
            });
            let result = match &parsed {
                Ok(None) => "unchanged",
                Ok(Some(_)) => "changed",
                Err(_) => "failed",
            };
            metrics::counter!(telemetry::JWKS_REFRESHES, "result" => result).increment(1);
            match parsed {
                Ok(None) => {}
                Ok(Some((keys, print))) => {
                    tracing::info!(
                        source = source.origin,
                        keys = keys.len(),
                        "JWKS keys refreshed"
                    );
                    source.keys.store(Arc::new(keys));
                    source.fingerprint.store(print, Ordering::Relaxed);
                    self.generation.fetch_add(1, Ordering::AcqRel);
                    changed = true;
                }
                Err(error) => tracing::warn!(
                    source = source.origin,
                    error,
                    "JWKS refresh failed; keeping the last good keys"
                ),
            }
        }
        changed
    }

    /// Claims the right to refresh because a token named a key we do not have: at most
    /// once per `jwks_min_refresh_interval`, and only when there is a JWKS to refresh.
    fn may_refresh_now(&self) -> bool {
        if self.jwks.is_empty() {
            return false;
        }
        let now = epoch().elapsed().as_millis() as u64 + 1;
        let last = self.last_refresh.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < self.min_refresh.as_millis() as u64 {
            return false;
        }
        self.last_refresh
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Lookup {
        let jwks_sets: Vec<_> = self.jwks.iter().map(|s| s.keys.load()).collect();
        let all = self
            .fixed
            .iter()
            .chain(jwks_sets.iter().flat_map(|set| set.iter()));
        match kid {
            Some(kid) => match all.into_iter().find(|k| k.kid.as_deref() == Some(kid)) {
                Some(key) if key.allows(alg) => Lookup::Keys(vec![key.clone()]),
                Some(key) => Lookup::AlgNotAllowed(key.clone()),
                None => Lookup::UnknownKid,
            },
            None => {
                let keys: Vec<_> = all
                    .into_iter()
                    .filter(|k| k.kid.is_none() && k.allows(alg))
                    .cloned()
                    .collect();
                if keys.is_empty() {
                    Lookup::NoKeyForAlg
                } else {
                    Lookup::Keys(keys)
                }
            }
        }
    }

    /// Checks a token: header, key, signature, `exp`, `nbf`, `iss`, `aud`. The error says
    /// what was wrong, never repeating the token.
    pub async fn verify(&self, token: &str) -> Result<Claims, String> {
        let header = read_header(token)?;
        if header.alg.eq_ignore_ascii_case("none") {
            return Err("alg 'none' is refused: tokens must be signed".into());
        }
        let alg = Algorithm::from_str(&header.alg)
            .map_err(|_| format!("unsupported alg '{}'", printable(&header.alg)))?;
        let kid = header.kid.as_deref();
        let mut lookup = self.find(kid, alg);
        if matches!(lookup, Lookup::UnknownKid | Lookup::NoKeyForAlg) && self.may_refresh_now() {
            self.refresh().await;
            lookup = self.find(kid, alg);
        }
        let keys = match lookup {
            Lookup::Keys(keys) => keys,
            Lookup::UnknownKid => {
                return Err(format!("unknown key id '{}'", printable(kid.unwrap_or(""))));
            }
            Lookup::AlgNotAllowed(key) => {
                return Err(format!(
                    "alg {alg:?} is not allowed for key '{}'",
                    key.kid.as_deref().unwrap_or(&key.origin)
                ));
            }
            Lookup::NoKeyForAlg => return Err(format!("no key accepts alg {alg:?}")),
        };
        let mut last = String::new();
        for key in &keys {
            let validation = key
                .validations
                .iter()
                .find(|(a, _)| *a == alg)
                .map(|(_, v)| v)
                .expect("the key allows alg");
            match jsonwebtoken::decode::<Claims>(token, &key.key, validation) {
                Ok(data) => return Ok(data.claims),
                Err(error) => last = describe(&error),
            }
        }
        Err(last)
    }
}

enum Lookup {
    Keys(Vec<Arc<VerifyKey>>),
    UnknownKid,
    AlgNotAllowed(Arc<VerifyKey>),
    NoKeyForAlg,
}

/// Reads one `[[auth.jwt_keys]]` entry from whichever source it names; the error names the
/// field at fault. `None`: the entry names no source (config validation has refused it).
fn configure_key(
    rules: &Rules,
    origin: String,
    key: &config::JwtKey,
) -> Result<Option<Configured>, config::ConfigError> {
    let algorithms = parse_algorithms(&key.algorithms);
    let error = |field: &str, message: String| config::ConfigError {
        key: format!("{origin}.{field}"),
        message,
    };
    if let Some(path) = &key.pem_file {
        let family = key.algorithms.first().and_then(|a| algorithm_family(a));
        let decoding = read_pem_key(path, family).map_err(|m| error("pem_file", m))?;
        let verify = rules.key(key.id.clone(), origin.clone(), decoding, &algorithms);
        Ok(Some(Configured::Fixed(verify)))
    } else if let Some(var) = &key.secret_env {
        let decoding = read_secret(var).map_err(|m| error("secret_env", m))?;
        let verify = rules.key(key.id.clone(), origin.clone(), decoding, &algorithms);
        Ok(Some(Configured::Fixed(verify)))
    } else {
        let location = match (&key.jwks_file, &key.jwks_url) {
            (Some(path), _) => Location::File(PathBuf::from(path)),
            (None, Some(url)) => Location::Url(url.clone()),
            (None, None) => return Ok(None),
        };
        let source = JwksSource {
            origin: origin.clone(),
            location,
            algorithms,
            keys: ArcSwap::from_pointee(Vec::new()),
            fingerprint: AtomicU64::new(0),
        };
        source.load_file(rules).map_err(|m| error("jwks_file", m))?;
        Ok(Some(Configured::Jwks(source)))
    }
}

/// A PEM public key of the family its first algorithm names: the family decides which of
/// jsonwebtoken's readers applies, and an HMAC family has no public key at all.
fn read_pem_key(path: &str, family: Option<&str>) -> Result<DecodingKey, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    match family {
        Some("rsa") => DecodingKey::from_rsa_pem(&pem),
        Some("ec") => DecodingKey::from_ec_pem(&pem),
        Some("ed") => DecodingKey::from_ed_pem(&pem),
        _ => return Err("no public-key algorithm given".into()),
    }
    .map_err(|e| {
        format!(
            "{path} is not a {} public key in PEM: {e}",
            family.unwrap_or("").to_uppercase()
        )
    })
}

/// An HMAC secret from the environment, so it never sits in the config file; an empty one
/// would let anyone sign.
fn read_secret(var: &str) -> Result<DecodingKey, String> {
    match std::env::var(var) {
        Ok(secret) if !secret.is_empty() => {
            DecodingKey::from_secret(secret.as_bytes()).map_err(|e| format!("unusable secret: {e}"))
        }
        _ => Err(format!("environment variable {var} is not set or empty")),
    }
}

/// One HTTP client for every JWKS URL, built only when some source is a URL.
fn jwks_client(jwks: &[JwksSource]) -> Option<reqwest::Client> {
    jwks.iter()
        .any(|s| matches!(s.location, Location::Url(_)))
        .then(|| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("HTTP client for JWKS")
        })
}

impl JwksSource {
    /// A JWKS file is read at start, so a missing or broken file is a config error rather
    /// than a gateway that refuses every token; a URL waits for `refresh`.
    fn load_file(&self, rules: &Rules) -> Result<(), String> {
        let Location::File(path) = &self.location else {
            return Ok(());
        };
        let text =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let keys = self.parse(rules, &text)?;
        self.keys.store(Arc::new(keys));
        self.fingerprint
            .store(crate::fnv::fnv1a(&text), Ordering::Relaxed);
        Ok(())
    }

    /// The keys of a JWKS document this source may use: each key's algorithms are its
    /// `alg` if it names one, else its family's, narrowed to the configured ones.
    fn parse(&self, rules: &Rules, text: &[u8]) -> Result<Vec<Arc<VerifyKey>>, String> {
        let set: JwkSet =
            serde_json::from_slice(text).map_err(|e| format!("not a JWKS document: {e}"))?;
        let mut keys = Vec::new();
        for jwk in &set.keys {
            let family: &[Algorithm] = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => &[
                    Algorithm::RS256,
                    Algorithm::RS384,
                    Algorithm::RS512,
                    Algorithm::PS256,
                    Algorithm::PS384,
                    Algorithm::PS512,
                ],
                AlgorithmParameters::EllipticCurve(p) => match p.curve {
                    EllipticCurve::P256 => &[Algorithm::ES256],
                    EllipticCurve::P384 => &[Algorithm::ES384],
                    _ => continue,
                },
                AlgorithmParameters::OctetKeyPair(_) => &[Algorithm::EdDSA],
                AlgorithmParameters::OctetKey(_) => {
                    &[Algorithm::HS256, Algorithm::HS384, Algorithm::HS512]
                }
                _ => continue,
            };
            let named = jwk
                .common
                .key_algorithm
                .and_then(|a| serde_json::to_value(a).ok())
                .and_then(|v| v.as_str().and_then(|s| Algorithm::from_str(s).ok()));
            let algs: Vec<Algorithm> = family
                .iter()
                .copied()
                .filter(|a| named.is_none_or(|n| n == *a))
                .filter(|a| self.algorithms.is_empty() || self.algorithms.contains(a))
                .collect();
            if algs.is_empty() {
                continue;
            }
            let Ok(decoding) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            keys.push(Arc::new(rules.key(
                jwk.common.key_id.clone(),
                self.origin.clone(),
                decoding,
                &algs,
            )));
        }
        Ok(keys)
    }
}

async fn fetch(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("cannot fetch {url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("{url} answered {}", response.status()));
    }
    response
        .bytes()
        .await
        .map(|b| b.to_vec())
        .map_err(|e| format!("cannot read {url}: {e}"))
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
}

/// The token's header, read without trusting it.
fn read_header(token: &str) -> Result<Header, String> {
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("malformed token: not three dot-separated parts".into());
    };
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header.trim_end_matches('='))
        .map_err(|_| "malformed token: the header is not base64url".to_string())?;
    serde_json::from_slice(&json)
        .map_err(|_| "malformed token: the header is not a JSON object with an alg".to_string())
}

/// jsonwebtoken's error in the words a client should see.
fn describe(error: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match error.kind() {
        ErrorKind::ExpiredSignature => "token expired".into(),
        ErrorKind::ImmatureSignature => "token not valid yet (nbf is in the future)".into(),
        ErrorKind::InvalidIssuer => "wrong issuer".into(),
        ErrorKind::InvalidAudience => "wrong audience".into(),
        ErrorKind::InvalidSignature => "bad signature".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("token has no '{claim}' claim"),
        ErrorKind::InvalidClaimFormat(claim) => format!("claim '{claim}' has the wrong type"),
        ErrorKind::InvalidAlgorithm => "alg does not match the key".into(),
        ErrorKind::InvalidEcdsaKey | ErrorKind::InvalidRsaKey(_) | ErrorKind::InvalidEddsaKey => {
            "bad signature".into()
        }
        _ => "malformed token".into(),
    }
}

/// Untrusted text from a token header, safe to put in a message: printable ASCII, at most
/// 64 characters.
fn printable(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(64)
        .collect()
}
