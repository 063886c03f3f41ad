//! `route`: which model (and version) a request is really for. A name configured as a route
//! is split across its targets by weight, sticky by a key when the route says so; any other
//! name is its own target.

use super::ModelRef;
use crate::config::{self, StickyKey};
use crate::error::GatewayError;
use crate::routing::{Route, Target};
use std::collections::HashMap;

/// Header that pins a request to one target of a route (for testing a canary directly):
/// the same name the answer uses to say which target served it.
pub const PIN_HEADER: &str = crate::protocol::TARGET_HEADER;

/// Where a request goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Routed {
    /// The route's name, when the request named a route.
    pub route: Option<String>,
    /// The model and version to place and call.
    pub target: ModelRef,
    /// `model[/version]` of the chosen target, when routed.
    pub label: Option<String>,
}

/// Every configured route, by the name clients call.
#[derive(Debug, Default)]
pub struct RouteTable {
    routes: HashMap<String, (Route, Option<StickyKey>)>,
}

impl RouteTable {
    /// Builds the table from (validated) config.
    pub fn new(routes: &[config::Route]) -> Self {
        let routes = routes
            .iter()
            .map(|r| {
                let targets = r
                    .targets
                    .iter()
                    .map(|t| Target {
                        model: t.model.clone(),
                        version: t.version.clone(),
                        weight: t.weight,
                    })
                    .collect();
                let sticky = r.sticky.as_deref().and_then(|s| StickyKey::parse(s).ok());
                (
                    r.model.clone(),
                    (Route::new(r.model.clone(), targets), sticky),
                )
            })
            .collect();
        Self { routes }
    }

    /// Resolves a request. `header(name)` reads a request header (or gRPC metadata); the pin
    /// header, when present, must name one of the route's targets.
    pub fn resolve<'h>(
        &self,
        requested: ModelRef,
        header: impl Fn(&str) -> Option<&'h [u8]>,
    ) -> Result<Routed, GatewayError> {
        let Some((route, sticky)) = self
            .routes
            .get(&requested.name)
            .filter(|_| requested.version.is_none())
        else {
            return Ok(Routed {
                route: None,
                target: requested,
                label: None,
            });
        };
        let chosen = match header(PIN_HEADER) {
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
                let key = match sticky {
                    Some(StickyKey::Header(name)) => header(name),
                    // Claims come with authentication; without a token the choice is random.
                    Some(StickyKey::Claim(_)) | None => None,
                };
                route
                    .choose(key)
                    .ok_or_else(|| GatewayError::RouteUnavailable {
                        route: route.name.clone(),
                    })?
            }
        };
        let target = &route.targets[chosen];
        Ok(Routed {
            route: Some(route.name.clone()),
            target: ModelRef::new(target.model.clone(), target.version.clone()),
            label: Some(route.label(chosen).to_string()),
        })
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
            "#,
        )
        .unwrap();
        RouteTable::new(&config.routes)
    }

    #[test]
    fn plain_models_route_to_themselves() {
        let routed = table()
            .resolve(ModelRef::new("add_sub", None), |_| None)
            .unwrap();
        assert_eq!(routed.target, ModelRef::new("add_sub", None));
        assert_eq!(routed.route, None);
        // A version asked of a route name is a model of that name, not the route.
        let routed = table()
            .resolve(ModelRef::new("ranker", Some("3".into())), |_| None)
            .unwrap();
        assert_eq!(routed.route, None);
    }

    #[test]
    fn sticky_header_and_pin() {
        let table = table();
        let user = |value: &'static [u8]| move |name: &str| (name == "x-user-id").then_some(value);
        let first = table
            .resolve(ModelRef::new("ranker", None), user(b"u-42"))
            .unwrap();
        for _ in 0..100 {
            assert_eq!(
                table
                    .resolve(ModelRef::new("ranker", None), user(b"u-42"))
                    .unwrap(),
                first
            );
        }
        assert_eq!(first.route.as_deref(), Some("ranker"));
        let pinned = table
            .resolve(ModelRef::new("ranker", None), |name| {
                (name == PIN_HEADER).then_some(&b"ranker_b/2"[..])
            })
            .unwrap();
        assert_eq!(pinned.target, ModelRef::new("ranker_b", Some("2".into())));
        assert_eq!(pinned.label.as_deref(), Some("ranker_b/2"));
        let wrong = table.resolve(ModelRef::new("ranker", None), |name| {
            (name == PIN_HEADER).then_some(&b"other"[..])
        });
        assert!(
            matches!(wrong, Err(GatewayError::BadRequest(m)) if m.contains("not a target of route 'ranker'"))
        );
        let off = table.resolve(ModelRef::new("off", None), |_| None);
        assert!(matches!(off, Err(GatewayError::RouteUnavailable { .. })));
    }
}
