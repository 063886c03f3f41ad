//! `Caller`: who a request comes from, as authentication established it. Admission, routing
//! (the pin, `claim:` sticky keys) and the logs read it.

use super::Identity;
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
