//! The route table: which model (and version) a request is really for. A name configured as
//! a route is split across its targets by weight, sticky by a key when the route says so; any
//! other name is its own target. Built from config and swapped whole on reload; resolving a
//! request gives its `Routed` (the target, the guard's tally, the mirrors drawn).

use super::{Route, Target};
use crate::auth::Caller;
use crate::config::{self, StickyKey};
use crate::error::GatewayError;
use crate::model::{ModelRef, Served};
use foldhash::HashMap;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// Header that pins a request to one target of a route (for testing a canary directly):
/// the same name the answer uses to say which target served it.
pub const PIN_HEADER: http::HeaderName =
    http::HeaderName::from_static(crate::protocol::TARGET_HEADER);

/// The mirror targets one request is copied to (`Routed::shadow` makes one).
pub struct Shadow {
    /// The route the client called.
    pub route: Arc<str>,
    /// The mirror targets drawn for this request.
    pub mirrors: Vec<ModelRef>,
    /// Held by each copy until it has placed its target, as the client's request holds it:
    /// a reload that drops a mirror waits for its copies before unloading it.
    pub resolved: Option<TaskTrackerToken>,
}

/// Where a request goes.
#[derive(Debug)]
pub struct Routed {
    /// The route's name, when the request named a route.
    pub route: Option<Arc<str>>,
    /// The model and version to place and call.
    pub target: ModelRef,
    /// `model[/version]` of the chosen target, when routed.
    pub label: Option<Arc<str>>,
    /// For a guarded route: where the answer is to be counted (`finish::settle`).
    pub tally: Option<Tally>,
    /// Mirror targets that get a copy of this request (shadow traffic).
    pub mirrors: Vec<ModelRef>,
    /// Held while a routed request may still place its target: a reload waits for the
    /// old table's requests to let go before it unloads a target they may still ask for.
    _resolved: Option<TaskTrackerToken>,
}

impl Routed {
    /// The model and route the request resolved to, on no backend yet.
    pub fn served(&self) -> Served {
        Served {
            model: self.target.name.clone(),
            version: self.target.version.clone(),
            backend: String::new(),
            route: self.route.clone(),
        }
    }

    /// Only an inference is counted by a route's guard and copied to its mirrors: metadata,
    /// config and readiness calls would blur both. Call it once the kind of request is known.
    pub fn for_inference(&mut self, inference: bool) {
        if !inference {
            self.tally = None;
            self.mirrors.clear();
        }
    }

    /// The shadow copies of this request, when its route drew mirrors for it: call it once
    /// the request is known to be an inference (`for_inference`).
    pub fn shadow(&mut self) -> Option<Shadow> {
        if self.mirrors.is_empty() {
            return None;
        }
        Some(Shadow {
            route: self.route.clone()?,
            mirrors: std::mem::take(&mut self.mirrors),
            resolved: self._resolved.clone(),
        })
    }

    fn unrouted(target: ModelRef) -> Self {
        Self {
            route: None,
            target,
            label: None,
            tally: None,
            mirrors: Vec::new(),
            _resolved: None,
        }
    }
}

/// Counts a guarded route's answer for the target that gave it (automatic rollback).
#[derive(Debug)]
pub struct Tally {
    route: Arc<Route>,
    target: usize,
    started: Instant,
}

impl Tally {
    /// The target was placed: its latency counts from now, so a cold canary's load time is
    /// not its answer time.
    pub fn placed(&mut self) {
        self.started = Instant::now();
    }

    /// Whether the route's guard times a streamed answer to its first token
    /// (`guard.latency = "first_token"`).
    pub fn times_first_token(&self) -> bool {
        self.route
            .guard()
            .is_some_and(super::Guard::times_first_token)
    }

    /// The answer came: `failed` for a server-side failure (5xx, or no answer at all).
    pub fn finish(self, failed: bool) {
        self.route
            .observe(self.target, failed, self.started.elapsed());
    }
}

/// Every configured route, by the name clients call.
#[derive(Debug, Default)]
pub struct RouteTable {
    routes: HashMap<String, Entry>,
    /// Routed requests resolved on this table and not yet done with it.
    resolved: TaskTracker,
}

#[derive(Debug)]
struct Entry {
    config: config::RouteConfig,
    route: Arc<Route>,
    sticky: Option<StickyKey>,
}

impl RouteTable {
    /// Builds the table from (validated) config. A route whose config is the same as in
    /// `previous` keeps its state there (its guard's window and trips), so a reload that
    /// does not touch a route does not bring back a canary its guard switched off.
    pub fn new(routes: &[config::RouteConfig], previous: Option<&RouteTable>) -> Self {
        let routes = routes
            .iter()
            .map(|r| {
                let kept = previous
                    .and_then(|p| p.routes.get(&r.model))
                    .filter(|e| e.config == *r)
                    .map(|e| e.route.clone());
                let entry = Entry {
                    config: r.clone(),
                    route: kept.unwrap_or_else(|| Arc::new(build(r))),
                    sticky: r.sticky.as_deref().and_then(|s| StickyKey::parse(s).ok()),
                };
                (r.model.clone(), entry)
            })
            .collect();
        Self {
            routes,
            resolved: TaskTracker::new(),
        }
    }

    /// Waits until every routed request resolved on this table has let go of its choice
    /// (it has placed its target, or given up), for at most `limit`; false if it had not by
    /// then. After a reload, no request on the old table can then ask for a target again.
    pub async fn settled(&self, limit: std::time::Duration) -> bool {
        self.resolved.close();
        tokio::time::timeout(limit, self.resolved.wait())
            .await
            .is_ok()
    }

    /// Every route, for the admin API.
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.routes.values().map(|e| &*e.route)
    }

    /// Resolves a request. `header(name)` reads a request header (or gRPC metadata); the pin
    /// header, when present, must name one of the route's targets, and only a caller who
    /// may pin (the admin role, or anyone with auth off) may send it. `claim:NAME` sticky
    /// keys are read from the caller's verified token.
    pub fn resolve<'h>(
        &self,
        requested: ModelRef,
        header: impl Fn(&http::HeaderName) -> Option<&'h [u8]>,
        caller: &Caller,
    ) -> Result<Routed, GatewayError> {
        let Some(Entry { route, sticky, .. }) = self
            .routes
            .get(&requested.name)
            .filter(|_| requested.version.is_none())
        else {
            return Ok(Routed::unrouted(requested));
        };
        let chosen = match header(&PIN_HEADER) {
            Some(_) if !caller.may_pin() => {
                return Err(GatewayError::Forbidden {
                    message: format!(
                        "{PIN_HEADER} needs the admin role: tenant '{}' may call route '{}' \
                         but not choose its target",
                        caller.tenant().map_or("", |t| t),
                        route.name
                    ),
                });
            }
            Some(pin) => {
                let pin = String::from_utf8_lossy(pin);
                (0..route.targets.len())
                    .find(|&i| route.label(i) == pin)
                    .ok_or_else(|| {
                        GatewayError::BadRequest(format!(
                            "{PIN_HEADER} '{pin}' is not a target of route '{}'",
                            route.name
                        ))
                    })?
            }
            None => {
                let key: Option<Cow<'_, [u8]>> = match sticky {
                    Some(StickyKey::Header(name)) => header(name).map(Cow::Borrowed),
                    // Without a verified token (auth off, an API key) the choice is random.
                    Some(StickyKey::Claim(name)) => caller.claim(name),
                    None => None,
                };
                route
                    .choose(key.as_deref())
                    .ok_or_else(|| GatewayError::RouteUnavailable {
                        route: route.name.to_string(),
                    })?
            }
        };
        let model_ref = |i: usize| {
            let target = &route.targets[i];
            ModelRef::new(target.model.clone(), target.version.clone())
        };
        Ok(Routed {
            route: Some(route.name.clone()),
            target: model_ref(chosen),
            label: Some(route.labels[chosen].clone()),
            tally: route.guard().map(|_| Tally {
                route: route.clone(),
                target: chosen,
                started: Instant::now(),
            }),
            mirrors: route.mirrors().map(model_ref).collect(),
            _resolved: Some(self.resolved.token()),
        })
    }
}

/// The routing form of a configured route.
fn build(config: &config::RouteConfig) -> Route {
    let targets = config
        .targets
        .iter()
        .map(|t| Target {
            model: t.model.clone(),
            version: t.version.clone(),
            weight: t.weight(),
            mirror: t.mirror.then(|| t.percent.unwrap_or(0.0)),
        })
        .collect();
    let route = Route::new(config.model.clone(), targets);
    match &config.guard {
        Some(limits) => route.guarded(limits.clone()),
        None => route,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RouteTable {
        let config = config::Config::parse(
            r#"
            [listen]
            http = "127.0.0.1:0"
            [[backends]]
            name = "b"
            http = "http://127.0.0.1:1"
            [[routes]]
            model = "ranker"
            sticky = "header:x-user-id"
            targets = [{ model = "ranker_a", weight = 90 }, { model = "ranker_b", version = "2", weight = 10 }]
            [[routes]]
            model = "off"
            targets = [{ model = "x", weight = 0 }]
            [[routes]]
            model = "shadowed"
            targets = [{ model = "a", weight = 1 }, { model = "s", mirror = true, percent = 100 }]
            "#,
        )
        .unwrap();
        RouteTable::new(&config.routes, None)
    }

    #[test]
    fn plain_models_route_to_themselves() {
        let routed = table()
            .resolve(ModelRef::new("add_sub", None), |_| None, &Caller::Open)
            .unwrap();
        assert_eq!(routed.target, ModelRef::new("add_sub", None));
        assert_eq!(routed.route, None);
        // A version asked of a route name is a model of that name, not the route.
        let routed = table()
            .resolve(
                ModelRef::new("ranker", Some("3".into())),
                |_| None,
                &Caller::Open,
            )
            .unwrap();
        assert_eq!(routed.route, None);
    }

    #[test]
    fn sticky_header_and_pin() {
        let table = table();
        let user = |value: &'static [u8]| {
            move |name: &http::HeaderName| (name == "x-user-id").then_some(value)
        };
        let first = table
            .resolve(ModelRef::new("ranker", None), user(b"u-42"), &Caller::Open)
            .unwrap();
        for _ in 0..100 {
            let again = table
                .resolve(ModelRef::new("ranker", None), user(b"u-42"), &Caller::Open)
                .unwrap();
            assert_eq!(
                (again.target, again.label),
                (first.target.clone(), first.label.clone())
            );
        }
        assert_eq!(first.route.as_deref(), Some("ranker"));
        let pinned = table
            .resolve(
                ModelRef::new("ranker", None),
                |name| (name == PIN_HEADER).then_some(&b"ranker_b/2"[..]),
                &Caller::Open,
            )
            .unwrap();
        assert_eq!(pinned.target, ModelRef::new("ranker_b", Some("2".into())));
        assert_eq!(pinned.label.as_deref(), Some("ranker_b/2"));
        let wrong = table.resolve(
            ModelRef::new("ranker", None),
            |name| (name == PIN_HEADER).then_some(&b"other"[..]),
            &Caller::Open,
        );
        assert!(
            matches!(wrong, Err(GatewayError::BadRequest(m)) if m.contains("not a target of route 'ranker'"))
        );
        let off = table.resolve(ModelRef::new("off", None), |_| None, &Caller::Open);
        assert!(matches!(off, Err(GatewayError::RouteUnavailable { .. })));
    }

    #[tokio::test]
    async fn a_reload_waits_for_requests_routed_on_the_old_table() {
        let table = table();
        let wait = std::time::Duration::from_millis(20);
        let routed = table
            .resolve(ModelRef::new("ranker", None), |_| None, &Caller::Open)
            .unwrap();
        let unrouted = table
            .resolve(ModelRef::new("add_sub", None), |_| None, &Caller::Open)
            .unwrap();
        assert!(
            !table.settled(wait).await,
            "a routed request may still place its target"
        );
        drop(routed);
        assert!(
            table.settled(wait).await,
            "requests not routed are not waited for"
        );
        drop(unrouted);

        // A mirror copy outlives its request (it is sent from a task of its own): the
        // reload waits for it too.
        let mut routed = table
            .resolve(ModelRef::new("shadowed", None), |_| None, &Caller::Open)
            .unwrap();
        routed.for_inference(true);
        let copy = routed.shadow().expect("a mirror at 100%");
        assert_eq!(copy.mirrors, [ModelRef::new("s", None)]);
        drop(routed);
        assert!(!table.settled(wait).await, "a mirror copy may still place");
        drop(copy);
        assert!(table.settled(wait).await);
    }

    fn guarded(error_rate: f64) -> Vec<config::RouteConfig> {
        let text = format!(
            r#"
            [listen]
            http = "127.0.0.1:0"
            [[backends]]
            name = "b"
            http = "http://127.0.0.1:1"
            [[routes]]
            model = "g"
            targets = [{{ model = "stable", weight = 9 }}, {{ model = "canary", weight = 1 }}]
            guard = {{ max_error_rate = {error_rate}, min_requests = 1 }}
            "#
        );
        config::Config::parse(&text).unwrap().routes
    }

    #[test]
    fn a_trip_lasts_until_the_route_config_changes() {
        let table = RouteTable::new(&guarded(0.5), None);
        let canary = || {
            table
                .resolve(
                    ModelRef::new("g", None),
                    |name| (name == PIN_HEADER).then_some(&b"canary"[..]),
                    &Caller::Open,
                )
                .unwrap()
        };
        canary().tally.unwrap().finish(true);
        let trips = |t: &RouteTable| t.routes().next().unwrap().guard().unwrap().trips().len();
        assert_eq!(trips(&table), 1);
        let unchanged = RouteTable::new(&guarded(0.5), Some(&table));
        assert_eq!(
            trips(&unchanged),
            1,
            "a reload that leaves the route keeps the trip"
        );
        assert_eq!(unchanged.routes().next().unwrap().weight(1), 0);
        let changed = RouteTable::new(&guarded(0.6), Some(&table));
        assert_eq!(trips(&changed), 0);
        assert_eq!(changed.routes().next().unwrap().weight(1), 1);
    }
}
