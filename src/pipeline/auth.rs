//! `auth`: the first stage of every request on both front-ends. The credential becomes a
//! `Caller`; each model request or admin operation is then admitted (allow list, admin
//! role, limits) or refused, and every decision is counted by tenant and outcome.

use crate::auth::{Access, Admission, Auth, Credentials, Identity, Outcome};
use crate::error::GatewayError;
use crate::telemetry;
use std::borrow::Cow;
use std::sync::Arc;

/// Who is calling.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Authentication is off (`auth.mode = "none"`): anyone may do anything.
    Open,
    /// A verified identity.
    Known(Arc<Identity>),
}

impl Caller {
    /// The caller's tenant, for logs.
    pub fn tenant(&self) -> Option<&Arc<str>> {
        match self {
            Self::Open => None,
            Self::Known(identity) => Some(&identity.tenant),
        }
    }

    /// Whether the caller may choose a route's target with `infergate-target`: with auth
    /// off anyone may; with auth on only the admin role.
    pub fn may_pin(&self) -> bool {
        match self {
            Self::Open => true,
            Self::Known(identity) => identity.admin,
        }
    }

    /// A claim of the caller's verified token (for `sticky = "claim:NAME"`).
    pub fn claim(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        match self {
            Self::Open => None,
            Self::Known(identity) => identity.claim(name),
        }
    }
}

fn count(tenant: Option<&Arc<str>>, outcome: Outcome) {
    let tenant: metrics::SharedString = match tenant {
        Some(tenant) => tenant.clone().into(),
        None => metrics::SharedString::const_str(""),
    };
    metrics::counter!(telemetry::AUTH_DECISIONS, "tenant" => tenant, "outcome" => outcome.as_str())
        .increment(1);
}

/// Verifies the request's credential (nothing to verify when auth is off).
pub async fn authenticate(
    auth: &Auth,
    credentials: Credentials<'_>,
) -> Result<Caller, GatewayError> {
    if !auth.is_on() {
        return Ok(Caller::Open);
    }
    match auth.authenticate(credentials).await {
        Ok(identity) => Ok(Caller::Known(identity)),
        Err(error) => {
            count(None, Outcome::Unauthenticated);
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
            count(Some(&identity.tenant), Outcome::Allowed);
            Ok(admission)
        }
        Err((outcome, error)) => {
            count(Some(&identity.tenant), outcome);
            Err(error)
        }
    }
}
