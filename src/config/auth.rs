//! `[auth]`: who may call the gateway, as which tenant, for which models, how often.
//!
//! Only the shape and what can be checked without touching the disk live here; reading key
//! files, secrets from the environment and JWKS documents happens when `auth::Auth` is built
//! from this, and its errors name these keys too.

use super::{ConfigError, HumanDuration};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::time::Duration;

/// Whether requests must carry a credential.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Open: anyone may call (local use). The gateway warns at start when it listens beyond
    /// loopback like this.
    #[default]
    None,
    /// Every request except health probes needs a valid JWT or API key.
    Required,
}

/// The `[auth]` table.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Auth {
    /// `none` (default) or `required`.
    pub mode: AuthMode,
    /// Accepted `iss` values (a token must carry one of them); empty: any issuer.
    pub issuers: Vec<String>,
    /// Accepted `aud` values (a token must name one); empty: `aud` is not checked.
    pub audiences: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: HumanDuration,
    /// Claim naming a token's tenant.
    pub tenant_claim: String,
    /// Claim listing a token's roles (an array, or a space-separated string).
    pub roles_claim: String,
    /// Claim listing the model globs a token may use (used when its tenant has no list in
    /// config).
    pub models_claim: String,
    /// The role that may use the repository extension, the admin API and `infergate-target`.
    pub admin_role: String,
    /// Model globs for identities whose tenant has no list in config and whose token has no
    /// models claim.
    pub default_models: Vec<String>,
    /// Verified tokens kept (until they expire) so a repeated token is not verified again;
    /// 0 turns the cache off.
    pub token_cache_capacity: u64,
    /// How often JWKS sources are read again.
    pub jwks_refresh_interval: HumanDuration,
    /// A token with an unknown `kid` makes the JWKS sources be read again at once, at most
    /// this often.
    pub jwks_min_refresh_interval: HumanDuration,
    /// Keys that verify JWT signatures.
    pub jwt_keys: Vec<JwtKey>,
    /// API keys, by the SHA-256 of the key (`infergate hash-key` prints it).
    pub api_keys: Vec<ApiKey>,
    /// Per-tenant model access and limits.
    pub tenants: Vec<Tenant>,
    /// A verified client certificate (mTLS, `listen.tls.client_ca`) is a credential of its
    /// own for a request that carries no other: its subject (`listen.tls.client_identity`)
    /// names the tenant, with no roles.
    pub client_certificates: bool,
}

impl Default for Auth {
    fn default() -> Self {
        Self {
            mode: AuthMode::None,
            issuers: Vec::new(),
            audiences: Vec::new(),
            leeway: HumanDuration(Duration::from_secs(30)),
            tenant_claim: "tenant".into(),
            roles_claim: "roles".into(),
            models_claim: "models".into(),
            admin_role: "admin".into(),
            default_models: vec!["*".into()],
            token_cache_capacity: 10_000,
            jwks_refresh_interval: HumanDuration(Duration::from_secs(300)),
            jwks_min_refresh_interval: HumanDuration(Duration::from_secs(10)),
            jwt_keys: Vec::new(),
            api_keys: Vec::new(),
            client_certificates: false,
            tenants: Vec::new(),
        }
    }
}

/// One source of JWT verification keys: exactly one of `pem_file`, `secret_env`,
/// `jwks_file`, `jwks_url`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JwtKey {
    /// The `kid` tokens name this key by (PEM and secret keys); without it, a token with no
    /// `kid` is tried against this key.
    pub id: Option<String>,
    /// Algorithms this key may verify: for PEM and secret keys, required and all of one
    /// family (HS*, RS*/PS*, ES*, EdDSA); for a JWKS, a filter over its keys (each key still
    /// verifies only its own family, or its `alg`), default: no filter.
    #[serde(default)]
    pub algorithms: Vec<String>,
    /// A public key in PEM (RSA, EC or Ed25519, as `algorithms` says).
    pub pem_file: Option<String>,
    /// Environment variable holding an HMAC secret.
    pub secret_env: Option<String>,
    /// A JWKS document on disk, read again every `jwks_refresh_interval`.
    pub jwks_file: Option<String>,
    /// A JWKS document over HTTP(S), fetched again every `jwks_refresh_interval`.
    pub jwks_url: Option<String>,
}

/// One API key.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    /// Names the key in logs (never the key itself); the tenant when `tenant` is absent.
    pub name: String,
    /// Lower-case hex SHA-256 of the key.
    pub sha256: String,
    /// The tenant the key acts for; default: `name`.
    pub tenant: Option<String>,
    /// Roles (`admin` for the repository and admin API).
    #[serde(default)]
    pub roles: Vec<String>,
}

/// What one tenant may do.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// The tenant, as a token's tenant claim or an API key's tenant names it.
    pub name: String,
    /// Model globs (`ranker*`, `add_sub`) this tenant may call; absent: from the token's
    /// models claim, else `auth.default_models`.
    pub models: Option<Vec<String>>,
    /// Sustained requests per second (token bucket); absent: no rate limit.
    pub requests_per_second: Option<f64>,
    /// Requests allowed at once above the rate; default: the rate, rounded up (at least 1).
    pub burst: Option<u32>,
    /// Requests in progress at once; absent: no limit.
    pub max_concurrent: Option<u32>,
    /// Tokens (prompt plus completion) per minute on the OpenAI endpoints: a request is
    /// admitted against its prompt plus its `max_tokens`, then settled with the real count;
    /// absent: no token limit.
    pub tokens_per_minute: Option<u64>,
    /// The band of a request that asks for none (`x-infergate-priority`); absent:
    /// `standard`.
    pub priority: Option<super::Band>,
    /// The highest band a request may ask for; one asking higher is served at this band
    /// (and counted). Absent: `priority`, so a tenant asks for more only when allowed.
    pub max_priority: Option<super::Band>,
    /// Its share of a band's turns at a saturated model against other tenants; absent: 1.
    pub weight: Option<u32>,
    /// Its requests waiting at once for one saturated model, all bands; absent: only
    /// `server.max_queued`.
    pub max_queued: Option<usize>,
}

/// The algorithm names jsonwebtoken verifies, by family.
pub const ALGORITHM_FAMILIES: [(&str, &[&str]); 4] = [
    ("hmac", &["HS256", "HS384", "HS512"]),
    (
        "rsa",
        &["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"],
    ),
    ("ec", &["ES256", "ES384"]),
    ("ed", &["EdDSA"]),
];

/// The family of an algorithm name, if it is one jsonwebtoken verifies.
pub fn algorithm_family(name: &str) -> Option<&'static str> {
    ALGORITHM_FAMILIES
        .iter()
        .find(|(_, names)| names.contains(&name))
        .map(|(family, _)| *family)
}

impl Auth {
    /// Checks what can be checked without reading files. Each part of `[auth]` checks its own
    /// keys; the order here is the order the errors are reported in.
    pub(super) fn validate(&self, errors: &mut Vec<ConfigError>) {
        let mut error = |key: String, message: String| errors.push(ConfigError { key, message });
        self.check_mode_and_claims(&mut error);
        // Key ids are unique across all keys, so the set outlives each key's check.
        let mut ids = HashSet::new();
        for (i, key) in self.jwt_keys.iter().enumerate() {
            key.check(i, &mut ids, &mut error);
        }
        self.check_api_keys(&mut error);
        self.check_tenants(&mut error);
    }

    /// The table's own keys: `required` with no way to present a credential would refuse
    /// every request, and an empty claim or role name could never match.
    fn check_mode_and_claims(&self, error: &mut impl FnMut(String, String)) {
        if self.mode == AuthMode::Required
            && self.jwt_keys.is_empty()
            && self.api_keys.is_empty()
            && !self.client_certificates
        {
            error(
                "auth.mode".into(),
                "\"required\" needs at least one [[auth.jwt_keys]] or [[auth.api_keys]] entry, or client_certificates = true"
                    .into(),
            );
        }
        for (key, value) in [
            ("auth.tenant_claim", &self.tenant_claim),
            ("auth.roles_claim", &self.roles_claim),
            ("auth.models_claim", &self.models_claim),
            ("auth.admin_role", &self.admin_role),
        ] {
            if value.trim().is_empty() {
                error(key.into(), "must not be empty".into());
            }
        }
        if self.jwks_refresh_interval.0.is_zero() {
            error(
                "auth.jwks_refresh_interval".into(),
                "must be greater than 0".into(),
            );
        }
    }

    /// API keys are looked up by name in logs and by hash at the door: both must be unique,
    /// and the hash must be one `infergate hash-key` could have printed.
    fn check_api_keys(&self, error: &mut impl FnMut(String, String)) {
        let mut names = HashSet::new();
        let mut hashes = HashSet::new();
        for (i, key) in self.api_keys.iter().enumerate() {
            if key.name.trim().is_empty() {
                error(
                    format!("auth.api_keys[{i}].name"),
                    "must not be empty".into(),
                );
            } else if !names.insert(key.name.as_str()) {
                error(
                    format!("auth.api_keys[{i}].name"),
                    format!("duplicate API key name {:?}", key.name),
                );
            }
            let hash = &key.sha256;
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                error(
                    format!("auth.api_keys[{i}].sha256"),
                    "must be 64 hex digits, the SHA-256 of the key (infergate hash-key prints it)"
                        .into(),
                );
            } else if !hashes.insert(hash.to_ascii_lowercase()) {
                error(
                    format!("auth.api_keys[{i}].sha256"),
                    "the same key twice".into(),
                );
            }
        }
    }

    /// Tenants are found by name, so names are unique; each checks its own limits.
    fn check_tenants(&self, error: &mut impl FnMut(String, String)) {
        let mut tenants = HashSet::new();
        for (i, tenant) in self.tenants.iter().enumerate() {
            if tenant.name.trim().is_empty() {
                error(
                    format!("auth.tenants[{i}].name"),
                    "must not be empty".into(),
                );
            } else if !tenants.insert(tenant.name.as_str()) {
                error(
                    format!("auth.tenants[{i}].name"),
                    format!("duplicate tenant {:?}", tenant.name),
                );
            }
            tenant.check_limits(i, error);
        }
    }
}

impl JwtKey {
    /// Checks `auth.jwt_keys[i]`; `ids` holds the key ids seen in earlier keys.
    fn check<'a>(
        &'a self,
        i: usize,
        ids: &mut HashSet<&'a str>,
        error: &mut impl FnMut(String, String),
    ) {
        self.check_source(i, ids, error);
        let families = self.check_algorithm_names(i, error);
        self.check_families(i, &families, error);
        if let Some(url) = &self.jwks_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            error(
                format!("auth.jwt_keys[{i}].jwks_url"),
                "must be an http:// or https:// URL".into(),
            );
        }
    }

    /// Whether the key verifies through a JWKS document, which names and types its own keys.
    fn is_jwks(&self) -> bool {
        self.jwks_file.is_some() || self.jwks_url.is_some()
    }

    /// Where the key comes from decides what else it needs: exactly one source, an `id` only
    /// for a single key, and an algorithm list unless a JWKS says it per key.
    fn check_source<'a>(
        &'a self,
        i: usize,
        ids: &mut HashSet<&'a str>,
        error: &mut impl FnMut(String, String),
    ) {
        let at = |field: &str| format!("auth.jwt_keys[{i}].{field}");
        let sources = [
            self.pem_file.is_some(),
            self.secret_env.is_some(),
            self.jwks_file.is_some(),
            self.jwks_url.is_some(),
        ]
        .iter()
        .filter(|&&s| s)
        .count();
        if sources != 1 {
            error(
                format!("auth.jwt_keys[{i}]"),
                "needs exactly one of pem_file, secret_env, jwks_file, jwks_url".into(),
            );
        }
        let jwks = self.is_jwks();
        if let Some(id) = &self.id
            && !ids.insert(id.as_str())
        {
            error(at("id"), format!("duplicate key id {id:?}"));
        }
        if jwks && self.id.is_some() {
            error(
                at("id"),
                "a JWKS names its keys itself (each key's kid)".into(),
            );
        }
        if !jwks && self.algorithms.is_empty() {
            error(
                at("algorithms"),
                "required: the algorithms this key may verify, e.g. [\"RS256\"]".into(),
            );
        }
    }

    /// Refuses unknown algorithm names (and `none`, which would accept unsigned tokens);
    /// returns the families of the known ones.
    fn check_algorithm_names(
        &self,
        i: usize,
        error: &mut impl FnMut(String, String),
    ) -> HashSet<&'static str> {
        let at = format!("auth.jwt_keys[{i}].algorithms");
        let mut families = HashSet::new();
        for alg in &self.algorithms {
            match algorithm_family(alg) {
                Some(family) => {
                    families.insert(family);
                }
                None if alg.eq_ignore_ascii_case("none") => error(
                    at.clone(),
                    "\"none\" is refused: tokens must be signed".into(),
                ),
                None => error(
                    at.clone(),
                    format!(
                        "unknown algorithm {alg:?} (HS256/384/512, RS256/384/512, \
                         PS256/384/512, ES256/384, EdDSA)"
                    ),
                ),
            }
        }
        families
    }

    /// One key material verifies one family: mixing them, or pairing a secret with a
    /// public-key algorithm (or a PEM with HMAC), could never verify a token.
    fn check_families(
        &self,
        i: usize,
        families: &HashSet<&'static str>,
        error: &mut impl FnMut(String, String),
    ) {
        let at = format!("auth.jwt_keys[{i}].algorithms");
        // A JWKS key's own type fixes its family, so a JWKS may list several.
        if families.len() > 1 && !self.is_jwks() {
            error(
                at.clone(),
                "all algorithms of one key must be of one family (HMAC, RSA, EC or EdDSA)".into(),
            );
        }
        let hmac = families.contains("hmac");
        if self.secret_env.is_some() && !families.is_empty() && !hmac {
            error(
                at.clone(),
                "an HMAC secret verifies HS256/384/512 only".into(),
            );
        }
        if self.pem_file.is_some() && hmac {
            error(
                at,
                "a PEM public key cannot verify HMAC (HS*) tokens; use secret_env".into(),
            );
        }
    }
}

impl Tenant {
    /// Limits that could never admit a request (a zero rate, burst or concurrency), or a
    /// burst with no rate to burst above.
    fn check_limits(&self, i: usize, error: &mut impl FnMut(String, String)) {
        if let Some(rate) = self.requests_per_second
            && !(rate.is_finite() && rate > 0.0)
        {
            error(
                format!("auth.tenants[{i}].requests_per_second"),
                "must be greater than 0".into(),
            );
        }
        if self.burst == Some(0) {
            error(
                format!("auth.tenants[{i}].burst"),
                "must be at least 1".into(),
            );
        }
        if self.burst.is_some() && self.requests_per_second.is_none() {
            error(
                format!("auth.tenants[{i}].burst"),
                "needs requests_per_second".into(),
            );
        }
        if self.max_concurrent == Some(0) {
            error(
                format!("auth.tenants[{i}].max_concurrent"),
                "must be at least 1".into(),
            );
        }
        if self.tokens_per_minute == Some(0) {
            error(
                format!("auth.tenants[{i}].tokens_per_minute"),
                "must be at least 1".into(),
            );
        }
        self.check_flow(i, error);
    }

    /// Flow settings that could never hold: a zero weight or bound, or a highest band below
    /// the default one.
    fn check_flow(&self, i: usize, error: &mut impl FnMut(String, String)) {
        if self.weight == Some(0) {
            error(
                format!("auth.tenants[{i}].weight"),
                "must be at least 1".into(),
            );
        }
        if self.max_queued == Some(0) {
            error(
                format!("auth.tenants[{i}].max_queued"),
                "must be at least 1".into(),
            );
        }
        if let (Some(default), Some(highest)) = (self.priority, self.max_priority)
            && highest > default
        {
            error(
                format!("auth.tenants[{i}].max_priority"),
                format!(
                    "must be at least priority ({}): the band a tenant gets without asking",
                    default.as_str()
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const BASE: &str = r#"
        [listen]
        http = "127.0.0.1:0"
        [[backends]]
        name = "b"
        http = "http://127.0.0.1:1"
    "#;

    fn errors(auth: &str) -> Vec<String> {
        match Config::parse(&format!("{BASE}{auth}")) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn auth_is_off_by_default_and_every_mistake_names_its_key() {
        let config = Config::parse(BASE).unwrap();
        assert_eq!(config.auth.mode, super::AuthMode::None);
        assert!(
            errors("[auth]\ncolour = 1")
                .iter()
                .any(|e| e.contains("colour"))
        );
        let found = errors(
            r#"
            [auth]
            mode = "required"
            [[auth.jwt_keys]]
            algorithms = ["none"]
            pem_file = "k.pem"
            [[auth.jwt_keys]]
            algorithms = ["RS256", "ES256"]
            pem_file = "k.pem"
            [[auth.jwt_keys]]
            algorithms = ["HS256"]
            pem_file = "k.pem"
            [[auth.jwt_keys]]
            secret_env = "X"
            [[auth.jwt_keys]]
            algorithms = ["RS256"]
            [[auth.api_keys]]
            name = "k"
            sha256 = "abc"
            [[auth.tenants]]
            name = "t"
            burst = 0
            "#,
        );
        for expected in [
            "auth.jwt_keys[0].algorithms: \"none\" is refused",
            "auth.jwt_keys[1].algorithms: all algorithms of one key must be of one family",
            "auth.jwt_keys[2].algorithms: a PEM public key cannot verify HMAC",
            "auth.jwt_keys[3].algorithms: required",
            "auth.jwt_keys[4]: needs exactly one of",
            "auth.api_keys[0].sha256: must be 64 hex digits",
            "auth.tenants[0].burst: must be at least 1",
            "auth.tenants[0].burst: needs requests_per_second",
        ] {
            assert!(
                found.iter().any(|e| e.starts_with(expected)),
                "{expected}: {found:#?}"
            );
        }
        let found = errors("[auth]\nmode = \"required\"");
        assert!(
            found[0].starts_with("auth.mode: \"required\" needs"),
            "{found:?}"
        );
    }
}
