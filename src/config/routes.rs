//! `[[routes]]`: one model name clients call, split across target models or versions.

use super::ConfigError;
use super::units::HumanDuration;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// A route as written in the config file.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The name clients call.
    pub model: String,
    /// Where the sticky key comes from: `header:NAME` (or, with auth, `claim:NAME`); absent
    /// for a fresh choice per request.
    pub sticky: Option<String>,
    /// The targets and their weights.
    pub targets: Vec<RouteTarget>,
    /// Automatic rollback: limits the canaries are held to.
    pub guard: Option<Guard>,
}

/// One target of a route.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTarget {
    /// Triton model name.
    pub model: String,
    /// Triton model version; absent for the server's choice.
    pub version: Option<String>,
    /// Integer share of traffic, any total; 0 takes the target out. Not for mirrors.
    pub weight: Option<u32>,
    /// A shadow target: gets a copy of `percent` of the route's requests, its answers
    /// discarded. Never chosen to answer a client.
    #[serde(default)]
    pub mirror: bool,
    /// Share of the route's requests (0 to 100) a mirror gets a copy of.
    pub percent: Option<f64>,
}

impl RouteTarget {
    /// The configured weight (validated present for every target that is not a mirror).
    pub fn weight(&self) -> u32 {
        self.weight.unwrap_or(0)
    }
}

/// Automatic rollback: when a canary (any target but the stable one, the one with the
/// highest weight) breaks a limit over the window, its weight drops to 0 until the
/// route's config changes.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Guard {
    /// Highest share of a canary's requests that may fail (5xx), 0 to 1.
    pub max_error_rate: Option<f64>,
    /// Highest ratio of a canary's p95 latency to the stable target's.
    pub max_p95_ratio: Option<f64>,
    /// Which latency `max_p95_ratio` compares.
    #[serde(default)]
    pub latency: GuardLatency,
    /// How far back the limits look.
    #[serde(default = "Guard::default_window")]
    pub window: HumanDuration,
    /// Requests a target needs in the window before its figures count.
    #[serde(default = "Guard::default_min_requests")]
    pub min_requests: u64,
}

impl Guard {
    fn default_window() -> HumanDuration {
        HumanDuration(std::time::Duration::from_secs(60))
    }

    fn default_min_requests() -> u64 {
        100
    }
}

/// The latency a guard's `max_p95_ratio` compares between a canary and the stable target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardLatency {
    /// From the copy being placed to the answer's headers: a whole answer for a call, the
    /// start of a stream for a streamed one.
    #[default]
    Response,
    /// From the copy being placed to a streamed answer's first event (time to first token:
    /// a language model's streams, whose headers come at once whatever the model's speed).
    /// An answer that is not a token stream counts its response latency.
    FirstToken,
}

/// Where a sticky key is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StickyKey {
    /// A request header (HTTP) or metadata entry (gRPC): a name read on every request, so
    /// it is parsed once, here.
    Header(http::HeaderName),
    /// A claim of the caller's verified token.
    Claim(String),
}

impl StickyKey {
    /// Parses `header:x-user-id` or `claim:sub`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            Some(("header", name)) if !name.is_empty() => {
                http::HeaderName::from_bytes(name.as_bytes())
                    .map(Self::Header)
                    .map_err(|_| {
                        format!("invalid sticky key {text:?}: {name:?} is not a header name")
                    })
            }
            Some(("claim", name)) if !name.is_empty() => Ok(Self::Claim(name.to_string())),
            _ => Err(format!(
                "invalid sticky key {text:?} (expected \"header:NAME\" or \"claim:NAME\")"
            )),
        }
    }
}

/// Checks routes: unique names, targets present, weights usable, sticky keys well-formed.
pub(super) fn validate(routes: &[RouteConfig], errors: &mut Vec<ConfigError>) {
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
        if let Some(guard) = &route.guard {
            validate_guard(guard, &format!("routes[{i}].guard"), &mut error);
        }
        let mut labels = HashSet::new();
        for (j, target) in route.targets.iter().enumerate() {
            let key = format!("routes[{i}].targets[{j}]");
            if target.model.trim().is_empty() {
                error(format!("{key}.model"), "must not be empty".into());
            }
            validate_share(target, &key, &mut error);
            if !labels.insert((target.model.as_str(), target.version.as_deref())) {
                error(key, "the same target twice".into());
            }
        }
    }
}

/// A target answers by `weight`; a mirror copies by `percent`: each has its own, not both.
fn validate_share(target: &RouteTarget, key: &str, error: &mut impl FnMut(String, String)) {
    match (target.mirror, target.weight, target.percent) {
        (false, Some(_), None) => {}
        (false, None, _) => error(
            format!("{key}.weight"),
            "required (a mirror sets `mirror = true` and `percent` instead)".into(),
        ),
        (false, Some(_), Some(_)) => error(
            format!("{key}.percent"),
            "only for mirrors (`mirror = true`)".into(),
        ),
        (true, Some(_), _) => error(
            format!("{key}.weight"),
            "a mirror never answers: give it `percent` of the traffic to copy instead".into(),
        ),
        (true, None, None) => error(
            format!("{key}.percent"),
            "required for a mirror (0 to 100)".into(),
        ),
        (true, None, Some(p)) if !(0.0..=100.0).contains(&p) => error(
            format!("{key}.percent"),
            format!("{p} is not between 0 and 100"),
        ),
        (true, None, Some(_)) => {}
    }
}

fn validate_guard(guard: &Guard, key: &str, error: &mut impl FnMut(String, String)) {
    if guard.max_error_rate.is_none() && guard.max_p95_ratio.is_none() {
        error(
            key.to_string(),
            "set max_error_rate, max_p95_ratio or both".into(),
        );
    }
    if let Some(rate) = guard.max_error_rate
        && !(0.0..=1.0).contains(&rate)
    {
        error(
            format!("{key}.max_error_rate"),
            format!("{rate} is not between 0 and 1"),
        );
    }
    if let Some(ratio) = guard.max_p95_ratio
        && !(ratio > 0.0 && ratio.is_finite())
    {
        error(
            format!("{key}.max_p95_ratio"),
            format!("{ratio} must be above 0"),
        );
    }
    if guard.window.0.is_zero() {
        error(format!("{key}.window"), "must be above 0".into());
    }
    if guard.min_requests == 0 {
        error(format!("{key}.min_requests"), "must be at least 1".into());
    }
}
