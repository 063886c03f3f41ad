//! `[[routes]]`: one model name clients call, split across target models or versions.

use super::ConfigError;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// A route as written in the config file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The name clients call.
    pub model: String,
    /// Where the sticky key comes from: `header:NAME` (or, with auth, `claim:NAME`); absent
    /// for a fresh choice per request.
    pub sticky: Option<String>,
    /// The targets and their weights.
    pub targets: Vec<RouteTarget>,
}

/// One target of a route.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTarget {
    /// Triton model name.
    pub model: String,
    /// Triton model version; absent for the server's choice.
    pub version: Option<String>,
    /// Integer share of traffic, any total; 0 takes the target out.
    pub weight: u32,
}

/// Where a sticky key is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StickyKey {
    /// A request header (HTTP) or metadata entry (gRPC), lower-case.
    Header(String),
    /// A claim of the caller's verified token.
    Claim(String),
}

impl StickyKey {
    /// Parses `header:x-user-id` or `claim:sub`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            Some(("header", name)) if !name.is_empty() => {
                Ok(Self::Header(name.to_ascii_lowercase()))
            }
            Some(("claim", name)) if !name.is_empty() => Ok(Self::Claim(name.to_string())),
            _ => Err(format!(
                "invalid sticky key {text:?} (expected \"header:NAME\" or \"claim:NAME\")"
            )),
        }
    }
}

/// Checks routes: unique names, targets present, weights usable, sticky keys well-formed.
pub(super) fn validate(routes: &[Route], errors: &mut Vec<ConfigError>) {
    let mut error = |key: String, message: String| errors.push(ConfigError { key, message });
    let mut names = HashSet::new();
    for (i, route) in routes.iter().enumerate() {
        if route.model.trim().is_empty() {
            error(format!("routes[{i}].model"), "must not be empty".into());
        } else if !names.insert(route.model.as_str()) {
            error(
                format!("routes[{i}].model"),
                format!("duplicate route {:?}", route.model),
            );
        }
        if let Some(sticky) = &route.sticky
            && let Err(message) = StickyKey::parse(sticky)
        {
            error(format!("routes[{i}].sticky"), message);
        }
        if route.targets.is_empty() {
            error(
                format!("routes[{i}].targets"),
                "a route needs at least one target".into(),
            );
        }
        let mut labels = HashSet::new();
        for (j, target) in route.targets.iter().enumerate() {
            if target.model.trim().is_empty() {
                error(
                    format!("routes[{i}].targets[{j}].model"),
                    "must not be empty".into(),
                );
            }
            if !labels.insert((target.model.as_str(), target.version.as_deref())) {
                error(
                    format!("routes[{i}].targets[{j}]"),
                    "the same target twice".into(),
                );
            }
        }
    }
}
