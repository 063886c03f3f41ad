//! What the repository API said about each model: the config override its copies are
//! loaded with, and whether it was unloaded explicitly.
//!
//! Triton keeps both per server: a load with `{"parameters": {"config": ...}}` serves that
//! config until the model is unloaded, and an unloaded model stays unloaded until someone
//! loads it. The gateway loads copies on many backends, at any time (first requests,
//! evictions, scaling, newer versions), so it keeps them per model, for every copy: each
//! load of the model sends the override, and a model unloaded on purpose is loaded by no
//! request until a load through the repository API (or the admin API) says so.
//!
//! The specs live in the gateway's memory, like Triton's own: they survive config reloads
//! (placement is not rebuilt by one), not a restart of the gateway. With `[cluster]` they
//! are shared through the registry (`Placement::share_spec`), and live as long as it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// One model's spec. The default (no override, not unloaded) is what every model starts with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    /// The config override (Triton's JSON `ModelConfig`, as the client sent it) every copy is
    /// loaded with; `None`: the repository's config.pbtxt.
    pub config: Option<Arc<str>>,
    /// Unloaded through the repository API: not served, and loaded by no request.
    pub unloaded: bool,
}

/// Every model's spec, by name; a model without an entry has the default.
#[derive(Debug, Default)]
pub struct Specs {
    models: RwLock<HashMap<String, Spec>>,
}

impl Specs {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Spec>> {
        self.models.read().expect("specs lock")
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Spec>> {
        self.models.write().expect("specs lock")
    }

    /// The model's spec (the default without an entry).
    pub fn get(&self, model: &str) -> Spec {
        self.read().get(model).cloned().unwrap_or_default()
    }

    /// The override the model's copies are loaded with, if any.
    pub fn config(&self, model: &str) -> Option<Arc<str>> {
        self.read().get(model).and_then(|s| s.config.clone())
    }

    /// Whether the model was unloaded explicitly (and not loaded since). One read lock and
    /// one lookup per inference; nothing is allocated.
    pub fn is_unloaded(&self, model: &str) -> bool {
        self.read().get(model).is_some_and(|s| s.unloaded)
    }

    /// A load through the repository API: the model is wanted again, with `config` (`None`:
    /// a plain load, back to the repository's config). Returns the spec it replaces.
    pub fn loaded(&self, model: &str, config: Option<Arc<str>>) -> Spec {
        let spec = Spec {
            config,
            unloaded: false,
        };
        self.replace(model, spec)
    }

    /// An explicit unload: the override goes with it, and no request loads the model again.
    pub fn unloaded(&self, model: &str) {
        self.replace(
            model,
            Spec {
                config: None,
                unloaded: true,
            },
        );
    }

    /// The admin API's load: wanted again, with the override it had.
    pub fn wanted(&self, model: &str) {
        if let Some(spec) = self.write().get_mut(model) {
            spec.unloaded = false;
        }
    }

    /// Puts `spec` in place (a failed load puts the previous one back); returns the old one.
    pub fn replace(&self, model: &str, spec: Spec) -> Spec {
        let mut models = self.write();
        let old = if spec == Spec::default() {
            models.remove(model)
        } else {
            models.insert(model.to_string(), spec)
        };
        old.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_lasts_until_a_plain_load_or_an_unload() {
        let specs = Specs::default();
        assert_eq!(specs.config("m"), None);
        let old = specs.loaded("m", Some("{\"max_batch_size\":4}".into()));
        assert_eq!(old, Spec::default());
        assert_eq!(specs.config("m").as_deref(), Some("{\"max_batch_size\":4}"));
        specs.unloaded("m");
        assert!(specs.is_unloaded("m"));
        assert_eq!(specs.config("m"), None);
        specs.loaded("m", Some("{}".into()));
        assert!(!specs.is_unloaded("m"));
        let old = specs.loaded("m", None);
        assert_eq!(old.config.as_deref(), Some("{}"));
        assert_eq!(specs.config("m"), None);
        assert!(specs.read().is_empty(), "the default spec keeps no entry");
        specs.unloaded("m");
        specs.wanted("m");
        assert!(!specs.is_unloaded("m"));
    }
}
