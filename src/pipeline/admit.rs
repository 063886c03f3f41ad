//! `admit`: the first phase of every request on both front-ends. The credential becomes a
//! `Caller` (`authenticate`); each model request or admin operation is then admitted (allow
//! list, admin role, limits) or refused (`model`, `admin`), and every decision is counted by
//! tenant and outcome. Both read the request's own config snapshot.

use super::RequestCtx;
use crate::auth::limits::Reservation;
use crate::auth::{Access, Admission, Auth, Caller, Credentials, Decision};
use crate::error::GatewayError;
use crate::telemetry;
use foldhash::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

/// The headers (HTTP) and metadata keys (gRPC) that carry a credential: read here, and
/// never forwarded to a backend while auth is on. Names, not strings: a header map finds a
/// name without parsing it first.
const CREDENTIAL_HEADERS: [http::HeaderName; 2] = [
    http::header::AUTHORIZATION,
    http::HeaderName::from_static("x-api-key"),
];

/// Where a request's credential headers are (HTTP headers, gRPC metadata): read to
/// authenticate, then taken off so they never reach a backend.
pub trait CredentialHeaders {
    /// A header's value.
    fn credential(&self, name: &http::HeaderName) -> Option<&[u8]>;
    /// Takes a header off.
    fn strip(&mut self, name: &http::HeaderName);
}

impl CredentialHeaders for http::HeaderMap {
    fn credential(&self, name: &http::HeaderName) -> Option<&[u8]> {
        self.get(name).map(http::HeaderValue::as_bytes)
    }

    fn strip(&mut self, name: &http::HeaderName) {
        self.remove(name);
    }
}

/// The admit phase's first half, on every listener and wire: verifies the request's
/// credential (its headers, and the subject of the client's verified certificate the edge
/// put on the context) with its own snapshot's `[auth]`, and keeps the caller on the
/// context. With auth on, the credential headers are then taken off, so they never reach a
/// backend.
pub async fn authenticate(
    ctx: &mut RequestCtx,
    headers: &mut impl CredentialHeaders,
) -> Result<(), GatewayError> {
    let auth = ctx.live.auth.clone();
    let [authorization, api_key] = &CREDENTIAL_HEADERS;
    let credentials = Credentials {
        authorization: headers.credential(authorization),
        api_key: headers.credential(api_key),
        peer: ctx.peer.as_deref(),
    };
    // Only a header that came is taken off: taking one off hashes its name, sent or not.
    let sent = [credentials.authorization, credentials.api_key].map(|value| value.is_some());
    ctx.caller = verify(&auth, credentials).await?;
    if auth.is_on() {
        for (name, _) in CREDENTIAL_HEADERS
            .iter()
            .zip(sent)
            .filter(|(_, sent)| *sent)
        {
            headers.strip(name);
        }
    }
    Ok(())
}

/// Admits a model request for the model the client named (a route name, not its targets:
/// choosing a target is the admin's `infergate-target`).
pub fn model(ctx: &mut RequestCtx) -> Result<(), GatewayError> {
    let name = ctx.requested.as_ref().map_or("", |m| m.name.as_str());
    ctx.admission = admit(&ctx.live.auth, &ctx.caller, Access::Model(name))?;
    Ok(())
}

/// The admit phase's part for the OpenAI endpoints, once the prompt is counted: reserves
/// `tokens` (prompt plus `max_tokens`) under the tenant's `tokens_per_minute`, refusing
/// with 429 and `Retry-After` when they are not there. The reservation is settled with the
/// real count when the answer is done.
pub fn tokens(ctx: &RequestCtx, tokens: u64) -> Result<Option<Reservation>, GatewayError> {
    let Caller::Known(identity) = &ctx.caller else {
        return Ok(None);
    };
    ctx.live
        .auth
        .reserve_tokens(&ctx.admission, &identity.tenant, tokens)
        .map_err(|(outcome, error)| {
            count(Some(&identity.tenant), outcome);
            error
        })
}

/// Admits an operation that needs the admin role (`what` names it in the refusal).
pub fn admin(ctx: &mut RequestCtx, what: &'static str) -> Result<(), GatewayError> {
    ctx.admission = admit(&ctx.live.auth, &ctx.caller, Access::Admin(what))?;
    Ok(())
}

/// Counts a decision in `infergate_auth_decisions_total`. Every request is counted, so each
/// (tenant, decision) series is registered once and kept: building a series' labels and
/// finding it in the registry cost more than counting into it.
fn count(tenant: Option<&Arc<str>>, decision: Decision) {
    type Series = HashMap<(Arc<str>, Decision), metrics::Counter>;
    static SERIES: LazyLock<RwLock<Series>> = LazyLock::new(Default::default);
    static NONE: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(""));
    let key = (tenant.unwrap_or(&NONE).clone(), decision);
    if let Some(counter) = SERIES.read().expect("series lock").get(&key) {
        counter.increment(1);
        return;
    }
    let tenant = metrics::SharedString::from(key.0.clone());
    let counter = metrics::counter!(telemetry::AUTH_DECISIONS, "tenant" => tenant, "outcome" => decision.as_str());
    counter.increment(1);
    SERIES.write().expect("series lock").insert(key, counter);
}

/// Verifies a credential (nothing to verify when auth is off).
pub async fn verify(auth: &Auth, credentials: Credentials<'_>) -> Result<Caller, GatewayError> {
    if !auth.is_on() {
        return Ok(Caller::Open);
    }
    match auth.authenticate(credentials).await {
        Ok(identity) => Ok(Caller::Known(identity)),
        Err(error) => {
            count(None, Decision::Unauthenticated);
            Err(error)
        }
    }
}

/// Lets a request of `caller` do `access`, or refuses it (403, 429). The admission holds
/// the tenant's concurrency slot: keep it until the answer is sent.
pub fn admit(auth: &Auth, caller: &Caller, access: Access<'_>) -> Result<Admission, GatewayError> {
    let Caller::Known(identity) = caller else {
        return Ok(Admission::default());
    };
    match auth.admit(identity, access) {
        Ok(admission) => {
            count(Some(&identity.tenant), Decision::Allowed);
            Ok(admission)
        }
        Err((outcome, error)) => {
            count(Some(&identity.tenant), outcome);
            Err(error)
        }
    }
}
