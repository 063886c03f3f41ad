//! Who is calling, and what they may do: JWT bearer tokens and API keys become an `Identity`
//! (a tenant and roles); a tenant's allow list and limits decide each request.
//!
//! `Auth` is built from `[auth]` with the rest of the live config and swapped whole on
//! reload. The pipeline's `auth` stage (`pipeline::auth`) is the only caller; both front-ends
//! go through it.

pub mod api_keys;
mod caller;
pub mod jwt;
pub mod limits;
pub mod tenants;
mod token_cache;

use crate::config::{self, AuthMode};
use crate::error::GatewayError;
use crate::flow::TenantFlow;
use api_keys::ApiKeys;
use foldhash::HashMap;
use jwt::{Claims, JwtKeys};
use limits::{Concurrency, Reservation, Share, Slot, TokenBucket, TokenQuota};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tenants::ModelAccess;
use token_cache::TokenCache;

pub use api_keys::hash_key;
pub use caller::Caller;

/// A caller the gateway has verified.
#[derive(Debug)]
pub struct Identity {
    /// The tenant it acts for.
    pub tenant: Arc<str>,
    /// Its roles.
    pub roles: Vec<String>,
    /// Whether one of the roles is `auth.admin_role`.
    pub admin: bool,
    /// Models its token allows (the models claim), used when its tenant has no list in
    /// config.
    pub models: Option<ModelAccess>,
    /// A token's claims (for `sticky = "claim:NAME"`); none for an API key.
    pub claims: Option<Claims>,
    /// When the token expires (Unix seconds); none for an API key.
    pub expires: Option<u64>,
    /// The JWT key generation it was verified under (a cached token is verified again
    /// once the keys change).
    key_generation: u64,
}

impl Identity {
    /// An identity that is only a tenant with roles, such as an API key or a client
    /// certificate stands for: no token, so no claims, expiry or key generation.
    pub fn without_token(tenant: &str, roles: Vec<String>, admin: bool) -> Self {
        Self {
            tenant: Arc::from(tenant),
            admin,
            roles,
            models: None,
            claims: None,
            expires: None,
            key_generation: 0,
        }
    }

    /// A claim's value as sticky-key bytes: strings as they are, other values as JSON.
    pub fn claim(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        match self.claims.as_ref()?.get(name)? {
            serde_json::Value::String(s) => Some(Cow::Borrowed(s.as_bytes())),
            serde_json::Value::Null => None,
            other => Some(Cow::Owned(other.to_string().into_bytes())),
        }
    }
}

/// The credentials a request carries: the `authorization` header (or gRPC metadata) and
/// `x-api-key`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Credentials<'a> {
    /// `Authorization` value.
    pub authorization: Option<&'a [u8]>,
    /// `x-api-key` value.
    pub api_key: Option<&'a [u8]>,
    /// The subject of the client's verified certificate (mTLS), if any.
    pub peer: Option<&'a str>,
}

/// What a request wants to do, for `Auth::admit`.
#[derive(Clone, Copy, Debug)]
pub enum Access<'a> {
    /// Call a model (by the name the client called: a route name is checked, not its
    /// targets).
    Model(&'a str),
    /// Use an endpoint that needs the admin role; the text names it in the refusal.
    Admin(&'static str),
}

/// A tenant's flow settings, defaults filled in.
fn tenant_flow(tenant: &crate::config::Tenant) -> TenantFlow {
    let priority = tenant.priority.unwrap_or_default();
    TenantFlow {
        priority,
        max_priority: tenant.max_priority.unwrap_or(priority),
        weight: tenant.weight.unwrap_or(1),
        max_queued: tenant.max_queued,
    }
}

/// One tenant's configured policy.
#[derive(Debug, Default)]
struct TenantPolicy {
    models: Option<ModelAccess>,
    rate: Option<TokenBucket>,
    concurrency: Option<Concurrency>,
    tokens: Option<Arc<TokenQuota>>,
    flow: TenantFlow,
}

/// A request let through; holds its tenant's concurrency slot until dropped.
#[derive(Debug, Default)]
pub struct Admission {
    _slot: Option<Slot>,
    /// Its tenant's `tokens_per_minute`, which the OpenAI endpoints reserve from once the
    /// prompt is counted (`Auth::reserve_tokens`).
    tokens: Option<Arc<TokenQuota>>,
    /// Its tenant's flow policy (band, highest band, weight), for the flow phase; the
    /// default (`standard`, no asking higher) for anonymous traffic and tenants not
    /// configured.
    pub flow: TenantFlow,
}

/// How a refused admission is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Let through.
    Allowed,
    /// No valid credential.
    Unauthenticated,
    /// A valid identity that may not do this.
    Forbidden,
    /// Over the tenant's requests per second.
    RateLimited,
    /// Over the tenant's concurrent requests.
    ConcurrencyLimited,
}

impl Decision {
    /// Label value for `infergate_auth_decisions_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden => "forbidden",
            Self::RateLimited => "rate_limited",
            Self::ConcurrencyLimited => "concurrency_limited",
        }
    }
}

/// Authentication and authorization state for one config.
pub struct Auth {
    mode: AuthMode,
    admin_role: String,
    tenant_claim: String,
    roles_claim: String,
    models_claim: String,
    default_models: ModelAccess,
    jwt: JwtKeys,
    api_keys: ApiKeys,
    tenants: HashMap<Arc<str>, TenantPolicy>,
    cache: Option<TokenCache>,
    refresh_interval: Duration,
    client_certificates: bool,
    /// How many replicas share the tenants' limits; one per gateway, kept across reloads.
    share: arc_swap::ArcSwap<Share>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A claim that may be a JSON array of strings or one space-separated string.
fn string_list(value: Option<&serde_json::Value>) -> Option<Vec<String>> {
    match value? {
        serde_json::Value::String(s) => Some(s.split_whitespace().map(str::to_owned).collect()),
        serde_json::Value::Array(items) => Some(
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        ),
        _ => None,
    }
}

fn unauthenticated(reason: impl Into<String>) -> GatewayError {
    GatewayError::Unauthenticated {
        reason: reason.into(),
    }
}

impl Auth {
    /// Builds the state: reads key files, secrets and JWKS files. Errors name their keys.
    pub fn new(config: &config::Auth) -> Result<Self, Vec<config::ConfigError>> {
        let jwt = JwtKeys::new(config)?;
        let mut keys = ApiKeys::default();
        for key in &config.api_keys {
            let tenant = key.tenant.as_deref().unwrap_or(&key.name);
            let admin = key.roles.contains(&config.admin_role);
            let identity = Identity::without_token(tenant, key.roles.clone(), admin);
            if let Some(digest) = api_keys::parse_hex(&key.sha256) {
                keys.insert(digest, Arc::new(identity));
            }
        }
        let tenants = config
            .tenants
            .iter()
            .map(|t| {
                let policy = TenantPolicy {
                    models: t.models.as_ref().map(ModelAccess::new),
                    rate: t.requests_per_second.map(|rate| {
                        TokenBucket::new(rate, t.burst.unwrap_or(rate.ceil().max(1.0) as u32))
                    }),
                    concurrency: t.max_concurrent.map(Concurrency::new),
                    tokens: t.tokens_per_minute.map(|n| Arc::new(TokenQuota::new(n))),
                    flow: tenant_flow(t),
                };
                (Arc::from(t.name.as_str()), policy)
            })
            .collect();
        let cache = (config.token_cache_capacity > 0).then(|| {
            TokenCache::new(usize::try_from(config.token_cache_capacity).unwrap_or(usize::MAX))
        });
        Ok(Self {
            mode: config.mode,
            admin_role: config.admin_role.clone(),
            tenant_claim: config.tenant_claim.clone(),
            roles_claim: config.roles_claim.clone(),
            models_claim: config.models_claim.clone(),
            default_models: ModelAccess::new(&config.default_models),
            jwt,
            api_keys: keys,
            tenants,
            client_certificates: config.client_certificates,
            share: arc_swap::ArcSwap::from_pointee(Share::default()),
            cache,
            refresh_interval: config.jwks_refresh_interval.0,
        })
    }

    /// Whether requests need credentials.
    pub fn is_on(&self) -> bool {
        self.mode == AuthMode::Required
    }

    /// How often JWKS sources are read again.
    pub fn refresh_interval(&self) -> Duration {
        self.refresh_interval
    }

    /// Keeps what the previous config had fetched (JWKS keys from URLs).
    pub fn inherit(&self, previous: &Auth) {
        self.jwt.inherit(&previous.jwt);
        self.share.store(previous.share.load_full());
    }

    /// How many replicas share the tenants' limits (`[cluster]` keeps it current): each
    /// replica enforces its part of every limit.
    pub fn limit_share(&self) -> Arc<Share> {
        self.share.load_full()
    }

    /// Reads every JWKS source again; a changed set empties the token cache, so a token
    /// signed by a key that was taken out stops working at once.
    pub async fn refresh_jwks(&self) {
        if self.jwt.refresh().await
            && let Some(cache) = &self.cache
        {
            cache.clear();
        }
    }

    /// Verifies the request's credential: an `x-api-key`, or an `Authorization: Bearer`
    /// value that is either an API key or a JWT. The error says what was wrong.
    pub async fn authenticate(
        &self,
        credentials: Credentials<'_>,
    ) -> Result<Arc<Identity>, GatewayError> {
        if let Some(key) = credentials.api_key {
            return self
                .api_keys
                .find(key)
                .cloned()
                .ok_or_else(|| unauthenticated("unknown API key"));
        }
        let Some(header) = credentials.authorization else {
            if self.client_certificates
                && let Some(subject) = credentials.peer
            {
                return Ok(Arc::new(Identity::without_token(
                    subject,
                    Vec::new(),
                    false,
                )));
            }
            return Err(unauthenticated(
                "no credentials: send Authorization: Bearer <token> or x-api-key",
            ));
        };
        let token = header
            .strip_prefix(b"Bearer ")
            .or_else(|| header.strip_prefix(b"bearer "))
            .ok_or_else(|| unauthenticated("the Authorization header is not 'Bearer <token>'"))?;
        // A token verified before is a JWT: answered from the cache by its bytes, before
        // they are checked as UTF-8 (a cached token is), as a JWT's shape (a scan of all its
        // bytes) or hashed as an API key (the digest cost as much as the rest of a warm check).
        let cached = token.trim_ascii();
        if let Some(identity) = self.cached_jwt(cached) {
            return Ok(identity);
        }
        let jwt_shaped = |token: &[u8]| memchr::memchr_iter(b'.', token).take(3).count() == 2;
        let token = std::str::from_utf8(token)
            .map_err(|_| unauthenticated("malformed token"))?
            .trim();
        let jwt_shaped = jwt_shaped(token.as_bytes());
        if let Some(identity) = self.api_keys.find(token.as_bytes()) {
            return Ok(identity.clone());
        }
        if !jwt_shaped {
            return Err(unauthenticated(if self.jwt.is_empty() {
                "unknown API key"
            } else {
                "unknown API key, and not a JWT"
            }));
        }
        if self.jwt.is_empty() {
            return Err(unauthenticated(
                "JWTs are not accepted: no jwt_keys configured",
            ));
        }
        let generation = self.jwt.generation();
        let claims = self.jwt.verify(token).await.map_err(unauthenticated)?;
        let identity = Arc::new(self.identity(claims, generation)?);
        if let Some(cache) = &self.cache {
            cache.insert(token.as_bytes(), identity.clone());
        }
        Ok(identity)
    }

    /// The identity of a JWT verified before, while it and the keys that verified it are
    /// still valid.
    fn cached_jwt(&self, token: &[u8]) -> Option<Arc<Identity>> {
        let identity = self.cache.as_ref()?.get(token)?;
        (identity.expires.is_some_and(|exp| exp > unix_now())
            && identity.key_generation == self.jwt.generation())
        .then_some(identity)
    }

    /// The identity a verified token stands for.
    fn identity(&self, claims: Claims, key_generation: u64) -> Result<Identity, GatewayError> {
        let tenant: Arc<str> = match claims.get(&self.tenant_claim) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Arc::from(s.as_str()),
            Some(serde_json::Value::Number(n)) => Arc::from(n.to_string()),
            _ => {
                return Err(unauthenticated(format!(
                    "token has no '{}' claim naming its tenant",
                    self.tenant_claim
                )));
            }
        };
        let roles = string_list(claims.get(&self.roles_claim)).unwrap_or_default();
        let models = string_list(claims.get(&self.models_claim)).map(ModelAccess::new);
        let expires = claims.get("exp").and_then(serde_json::Value::as_u64);
        Ok(Identity {
            tenant,
            admin: roles.contains(&self.admin_role),
            roles,
            models,
            claims: Some(claims),
            expires,
            key_generation,
        })
    }

    /// Decides one request of a verified identity: the admin role where needed, the
    /// tenant's model allow list, then its limits (concurrency first, so a request refused
    /// for concurrency does not spend a rate token).
    pub fn admit(
        &self,
        identity: &Identity,
        access: Access<'_>,
    ) -> Result<Admission, (Decision, GatewayError)> {
        let policy = self.tenants.get(&identity.tenant);
        self.check_access(identity, policy, access)?;
        let Some(policy) = policy else {
            return Ok(Admission::default());
        };
        let replicas = self.share.load().replicas();
        let slot = match &policy.concurrency {
            Some(limit) => Some(enter(limit, identity, replicas)?),
            None => None,
        };
        if let Some(bucket) = &policy.rate {
            take_rate_token(bucket, identity, replicas)?;
        }
        Ok(Admission {
            _slot: slot,
            tokens: policy.tokens.clone(),
            flow: policy.flow,
        })
    }

    /// Reserves `tokens` (a prompt plus its `max_tokens`) under the admitted request's
    /// `tokens_per_minute` (this replica's share), or refuses with how long to wait; `None`
    /// when its tenant has no token limit.
    pub fn reserve_tokens(
        &self,
        admission: &Admission,
        tenant: &str,
        tokens: u64,
    ) -> Result<Option<Reservation>, (Decision, GatewayError)> {
        let Some(quota) = &admission.tokens else {
            return Ok(None);
        };
        let replicas = self.share.load().replicas();
        match quota.reserve(tokens, Instant::now(), replicas) {
            Ok(()) => Ok(Some(Reservation::new(quota.clone(), tokens))),
            Err(wait) => Err((
                Decision::RateLimited,
                GatewayError::RateLimited {
                    message: format!(
                        "tenant '{tenant}' is over its limit of {} tokens per minute{}: this request needs {tokens} (prompt plus max_tokens)",
                        quota.per_minute() / f64::from(replicas),
                        of_replicas(replicas)
                    ),
                    retry_after: wait,
                },
            )),
        }
    }

    /// Whether `caller` may use `model` by its allow list (no limit spent): what
    /// `/v1/models` lists a caller, by the rule `admit` refuses with.
    pub fn may_use(&self, caller: &Caller, model: &str) -> bool {
        let Caller::Known(identity) = caller else {
            return true;
        };
        let policy = self.tenants.get(&identity.tenant);
        self.allow_list(identity, policy).allows(model)
    }

    /// The identity's model allow list: the tenant's from config, else its token's, else
    /// `auth.default_models`.
    fn allow_list<'a>(
        &'a self,
        identity: &'a Identity,
        policy: Option<&'a TenantPolicy>,
    ) -> &'a ModelAccess {
        policy
            .and_then(|p| p.models.as_ref())
            .or(identity.models.as_ref())
            .unwrap_or(&self.default_models)
    }

    /// Whether the identity may do this at all, before any limit is spent on it: admin
    /// endpoints need the admin role, a model must be on the tenant's list (from config,
    /// else the token, else `auth.default_models`).
    fn check_access(
        &self,
        identity: &Identity,
        policy: Option<&TenantPolicy>,
        access: Access<'_>,
    ) -> Result<(), (Decision, GatewayError)> {
        match access {
            Access::Admin(what) if !identity.admin => Err((
                Decision::Forbidden,
                GatewayError::Forbidden {
                    message: format!(
                        "tenant '{}' may not use {what}: it needs the '{}' role",
                        identity.tenant, self.admin_role
                    ),
                },
            )),
            Access::Admin(_) => Ok(()),
            Access::Model(model) => {
                if self.allow_list(identity, policy).allows(model) {
                    return Ok(());
                }
                Err((
                    Decision::Forbidden,
                    GatewayError::Forbidden {
                        message: format!(
                            "tenant '{}' may not use model '{model}'",
                            identity.tenant
                        ),
                    },
                ))
            }
        }
    }
}

/// A slot under the tenant's concurrency limit (this replica's share of it), or the refusal
/// that says how many are in progress.
fn enter(
    limit: &Concurrency,
    identity: &Identity,
    replicas: u32,
) -> Result<Slot, (Decision, GatewayError)> {
    limit.try_enter(replicas).ok_or_else(|| {
        (
            Decision::ConcurrencyLimited,
            GatewayError::RateLimited {
                message: format!(
                    "tenant '{}' has {} requests in progress, its limit{}",
                    identity.tenant,
                    limit.share(replicas),
                    of_replicas(replicas)
                ),
                retry_after: Duration::from_secs(1),
            },
        )
    })
}

/// One token from the tenant's rate bucket (this replica's share of the rate), or the
/// refusal with how long to wait for the next.
fn take_rate_token(
    bucket: &TokenBucket,
    identity: &Identity,
    replicas: u32,
) -> Result<(), (Decision, GatewayError)> {
    bucket.take(Instant::now(), replicas).map_err(|wait| {
        (
            Decision::RateLimited,
            GatewayError::RateLimited {
                message: format!(
                    "tenant '{}' is over its limit of {} requests per second{}",
                    identity.tenant,
                    bucket.rate() / f64::from(replicas),
                    of_replicas(replicas)
                ),
                retry_after: wait,
            },
        )
    })
}

/// Limits are split over replicas; a refusal says so, or a client reading "limit 5" while
/// it sees 2 refused would be misled.
fn of_replicas(replicas: u32) -> String {
    if replicas > 1 {
        format!(" (this replica's share over {replicas} replicas)")
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(extra: &str) -> Auth {
        let config = config::Config::parse(&format!(
            r#"
            [listen]
            http = "127.0.0.1:0"
            [[backends]]
            name = "b"
            http = "http://127.0.0.1:1"
            [auth]
            mode = "required"
            [[auth.api_keys]]
            name = "ops"
            sha256 = "{}"
            roles = ["admin"]
            [[auth.api_keys]]
            name = "acme-batch"
            tenant = "acme"
            sha256 = "{}"
            {extra}
            "#,
            hash_key("ops-key"),
            hash_key("acme-key"),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        Auth::new(&config.auth).unwrap()
    }

    fn key(value: &str) -> Credentials<'_> {
        Credentials {
            authorization: None,
            api_key: Some(value.as_bytes()),
            peer: None,
        }
    }

    #[tokio::test]
    async fn api_keys_name_their_tenant_and_roles() {
        let auth = auth("");
        let ops = auth.authenticate(key("ops-key")).await.unwrap();
        assert_eq!((&*ops.tenant, ops.admin), ("ops", true));
        let bearer = auth
            .authenticate(Credentials {
                authorization: Some(b"Bearer acme-key"),
                api_key: None,
                peer: None,
            })
            .await
            .unwrap();
        assert_eq!((&*bearer.tenant, bearer.admin), ("acme", false));
        let wrong = auth.authenticate(key("acme-key2")).await.unwrap_err();
        assert_eq!(wrong.to_string(), "invalid credentials: unknown API key");
        let none = auth.authenticate(Credentials::default()).await.unwrap_err();
        assert!(none.to_string().contains("no credentials"), "{none}");
    }

    #[tokio::test]
    async fn a_bearer_api_key_shaped_like_a_jwt_is_still_an_api_key() {
        let auth = auth(&format!(
            "[[auth.api_keys]]\nname = \"dotted\"\ntenant = \"dots\"\nsha256 = \"{}\"",
            hash_key("x.y.z")
        ));
        let bearer = Credentials {
            authorization: Some(b"Bearer x.y.z"),
            api_key: None,
            peer: None,
        };
        let identity = auth.authenticate(bearer).await.unwrap();
        assert_eq!(&*identity.tenant, "dots");
    }

    #[test]
    fn claim_names_and_the_admin_role_come_from_config() {
        let config = config::Config::parse(&format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\n[[backends]]\nname = \"b\"\n\
             http = \"http://127.0.0.1:1\"\n[auth]\nmode = \"required\"\n\
             tenant_claim = \"org\"\nroles_claim = \"groups\"\nmodels_claim = \"allowed\"\n\
             admin_role = \"ops\"\n[[auth.api_keys]]\nname = \"k\"\nsha256 = \"{}\"\n",
            hash_key("k")
        ))
        .unwrap();
        let auth = Auth::new(&config.auth).unwrap();
        let claims = |value: serde_json::Value| value.as_object().unwrap().clone();

        let identity = auth
            .identity(
                claims(serde_json::json!({
                    "org": "initech", "tenant": "ignored", "groups": "dev ops",
                    "allowed": ["ranker*"], "exp": 4_000_000_000u64,
                })),
                0,
            )
            .unwrap();
        assert_eq!(&*identity.tenant, "initech");
        assert_eq!(identity.roles, ["dev", "ops"]);
        assert!(identity.admin, "the configured admin role is in the groups");
        let models = identity.models.as_ref().unwrap();
        assert!(models.allows("ranker_b") && !models.allows("add_sub"));

        // The default claim names mean nothing once renamed.
        let refused = auth
            .identity(
                claims(serde_json::json!({"tenant": "acme", "roles": ["ops"]})),
                0,
            )
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "invalid credentials: token has no 'org' claim naming its tenant"
        );
    }

    #[tokio::test]
    async fn tenants_get_their_models_and_limits() {
        let auth = auth(
            r#"
            [[auth.tenants]]
            name = "acme"
            models = ["ranker*"]
            requests_per_second = 1.0
            burst = 2
            max_concurrent = 1
            "#,
        );
        let acme = auth.authenticate(key("acme-key")).await.unwrap();
        let (outcome, error) = auth.admit(&acme, Access::Model("secret")).unwrap_err();
        assert_eq!(outcome, Decision::Forbidden);
        assert_eq!(
            error.to_string(),
            "tenant 'acme' may not use model 'secret'"
        );
        let (outcome, _) = auth
            .admit(&acme, Access::Admin("the repository API"))
            .unwrap_err();
        assert_eq!(outcome, Decision::Forbidden);
        let first = auth.admit(&acme, Access::Model("ranker_a")).unwrap();
        let (outcome, _) = auth.admit(&acme, Access::Model("ranker_a")).unwrap_err();
        assert_eq!(outcome, Decision::ConcurrencyLimited);
        drop(first);
        drop(auth.admit(&acme, Access::Model("ranker_a")).unwrap());
        let (outcome, error) = auth.admit(&acme, Access::Model("ranker_a")).unwrap_err();
        assert_eq!(outcome, Decision::RateLimited);
        assert_eq!(error.http_status(), 429);
        // A tenant without a policy gets the default models, no limits.
        let ops = auth.authenticate(key("ops-key")).await.unwrap();
        for _ in 0..10 {
            auth.admit(&ops, Access::Model("anything")).unwrap();
        }
        auth.admit(&ops, Access::Admin("the admin API")).unwrap();
    }
}
