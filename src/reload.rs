//! Config reload without dropping a request: the new file is parsed and fully validated
//! before anything changes, then the live part (routes) is swapped in one atomic store.
//! A request takes the live snapshot once and keeps it to the end, so in-flight requests
//! finish on the config they started with. Listeners, connection pools and loaded models
//! are untouched; parts of the file that cannot change while running are refused by key.

use crate::config::{Backend, Config, ConfigError, ConfigErrors};
use crate::gateway::{Gateway, Settled};
use crate::live::Live;
use crate::placement::Versions;
use crate::telemetry;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What a successful reload changed.
#[derive(Debug, serde::Serialize)]
pub struct Reloaded {
    /// Hash of the new file.
    pub hash: String,
    /// Models (`model`) and versions (`model/version`) no route or pin uses any more, which
    /// the reload unloads from Triton once the requests holding them finish (blue/green
    /// leftovers).
    pub unloaded: Vec<String>,
    /// Backends added to the pool (they take traffic after their first good check).
    pub added_backends: Vec<String>,
    /// Backends taken out of the pool (drained: requests on them finish).
    pub removed_backends: Vec<String>,
}

/// Keys that can change while running; everything else needs a restart.
const RELOADABLE: [&str; 3] = ["routes", "backends", "auth"];

/// Reads, validates and applies the config file. On any error nothing changes, and the
/// errors name their keys. Reloads run one at a time.
pub async fn reload(gateway: &Gateway, path: &Path) -> Result<Reloaded, ConfigErrors> {
    let _one_at_a_time = gateway.reload_lock().lock().await;
    let outcome = apply(gateway, path).await;
    let result = if outcome.is_ok() {
        "success"
    } else {
        "failure"
    };
    metrics::counter!(telemetry::CONFIG_RELOADS, "result" => result).increment(1);
    match &outcome {
        Ok(reloaded) => {
            tracing::info!(config = %path.display(), hash = reloaded.hash, unloaded = ?reloaded.unloaded, "config reloaded");
            gateway.warn_if_open();
        }
        Err(errors) => {
            tracing::warn!(config = %path.display(), %errors, "config reload refused; the running config stays")
        }
    }
    outcome
}

async fn apply(gateway: &Gateway, path: &Path) -> Result<Reloaded, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            key: String::new(),
            message: format!("cannot read {}: {e}", path.display()),
        }])
    })?;
    let config = Config::parse(&text)?;
    let fixed = fixed_keys_changed(&gateway.live().config, &config);
    if !fixed.is_empty() {
        return Err(ConfigErrors(
            fixed
                .into_iter()
                .map(|key| ConfigError {
                    key,
                    message: "cannot change while running; restart the gateway to apply it".into(),
                })
                .collect(),
        ));
    }
    // Everything is built and checked before anything changes: new backends, the
    // certificate files (the same files, read again, or others) and the auth keys. A part
    // that fails refuses the whole reload and leaves the rest as it was.
    let found = gateway.discovery().found();
    let changes = BackendChanges::between(
        &gateway.live().config.instances(&found),
        &config.instances(&found),
        &config,
    )?;
    let groups_changed = !gateway.live().config.dns_groups().eq(config.dns_groups());
    let tls = match (gateway.tls(), &config.listen.tls) {
        (Some(tls), Some(settings)) => {
            Some((tls, tls.stage(settings).map_err(|e| ConfigErrors(vec![e]))?))
        }
        _ => None,
    };
    let live = Live::new(config, &text, Some(&gateway.live()))?;
    let hash = live.hash.clone();
    let leaving = leaving(&gateway.live().config, &live.config);

    // Now apply: certificate, then the one swap requests see.
    if let Some((tls, staged)) = tls {
        tls.commit(staged);
    }
    let settled = gateway.swap_live(live);
    let (removed_backends, added_backends) = changes.apply(gateway).await;
    if groups_changed {
        gateway.discovery().wake();
    }
    let leaving: Vec<Leaving> = leaving
        .into_iter()
        .filter(|l| gateway.placement().holds(&l.model, l.versions.as_ref()))
        .collect();
    let unloaded = leaving.iter().flat_map(Leaving::labels).collect();
    tokio::spawn(unload_leftovers(gateway.clone(), settled, leaving));
    Ok(Reloaded {
        hash,
        unloaded,
        added_backends,
        removed_backends,
    })
}

/// A model, or numbered versions of one, that the running config used and a new one does
/// not: a blue/green leftover to unload.
#[derive(Debug, PartialEq)]
struct Leaving {
    model: String,
    /// `None`: the whole model.
    versions: Option<BTreeSet<u64>>,
}

impl Leaving {
    fn labels(&self) -> Vec<String> {
        match &self.versions {
            None => vec![self.model.clone()],
            Some(versions) => versions
                .iter()
                .map(|v| format!("{}/{v}", self.model))
                .collect(),
        }
    }
}

/// What `running` uses and `new` does not. A model no route targets (or mirrors) any more,
/// and that `[[models]]` does not pin, leaves whole; a model still routed loses the
/// numbered versions no route names any more. The default policy ("latest") of a model
/// still in use stays: a request without a version may ask for it.
fn leaving(running: &Config, new: &Config) -> Vec<Leaving> {
    let after = in_use(new);
    in_use(running)
        .into_iter()
        .filter_map(|(model, before)| match after.get(&model) {
            None => Some(Leaving {
                model,
                versions: None,
            }),
            Some(after) => {
                let gone: BTreeSet<u64> =
                    before.pinned.difference(&after.pinned).copied().collect();
                (!gone.is_empty()).then_some(Leaving {
                    model,
                    versions: Some(gone),
                })
            }
        })
        .collect()
}

/// The versions each model is used for by the routes' targets and mirrors, and ("latest")
/// by the pins of `[[models]]`.
fn in_use(config: &Config) -> BTreeMap<String, Versions> {
    let mut used: BTreeMap<String, Versions> = BTreeMap::new();
    let targets = config.routes.iter().flat_map(|r| &r.targets);
    for target in targets {
        let version = crate::model::version_number(target.version.as_deref())
            .ok()
            .flatten();
        let entry = used.entry(target.model.clone()).or_default();
        *entry = entry.union(&Versions::requested(version));
    }
    for model in config.models.iter().filter(|m| m.pinned()) {
        let entry = used.entry(model.name.clone()).or_default();
        *entry = entry.union(&Versions::latest());
    }
    used
}

/// How often a leftover that requests still hold is looked at again.
const LEFTOVER_POLL: Duration = Duration::from_millis(10);

/// Unloads what a reload left behind, once no request can still use it: first every routed
/// request resolved on a replaced config must have placed its target (or the drain timeout
/// passed), so none asks for a leftover again; then each leftover goes once no request
/// holds it (Triton would let a request it already has finish, but not one the gateway
/// holds while validating it). A leftover a later reload uses again stays.
async fn unload_leftovers(gateway: Gateway, settled: Settled, leaving: Vec<Leaving>) {
    let in_time = settled.await;
    if leaving.is_empty() {
        return;
    }
    if !in_time {
        tracing::warn!(
            "requests routed on a replaced config still running after server.drain_timeout; unloading its leftovers anyway"
        );
    }
    let tasks = leaving.into_iter().map(|leaving| {
        let gateway = gateway.clone();
        async move {
            loop {
                let used = in_use(&gateway.live().config);
                let back = used.get(&leaving.model).is_some_and(|v| match &leaving.versions {
                    None => true,
                    Some(versions) => !v.pinned.is_disjoint(versions),
                });
                if back {
                    tracing::info!(model = leaving.model, "a later reload uses it again; not unloaded");
                    return;
                }
                let placement = gateway.placement();
                let done = match &leaving.versions {
                    None => placement.unload_if_idle(&leaving.model).await.is_some(),
                    Some(versions) => placement.drop_versions_if_idle(&leaving.model, versions).await,
                };
                if done {
                    tracing::info!(unloaded = ?leaving.labels(), "no route uses it any more: unloaded");
                    return;
                }
                tokio::time::sleep(LEFTOVER_POLL).await;
            }
        }
    });
    futures_util::future::join_all(tasks).await;
}

/// Backends a reload or a DNS round takes out and puts in, by instance name; one whose
/// entry changed is both.
pub(crate) struct BackendChanges {
    removed: Vec<String>,
    added: Vec<crate::upstream::Backend>,
}

impl BackendChanges {
    /// The difference between two lists of instances (`Config::instances`), with every new
    /// backend already built as `config` says (so a bad one refuses the whole change before
    /// anything changes).
    pub(crate) fn between(
        running: &[Backend],
        new: &[Backend],
        config: &Config,
    ) -> Result<Self, ConfigErrors> {
        let find = |list: &[Backend], name: &str| list.iter().find(|b| b.name == name).cloned();
        let removed = running
            .iter()
            .filter(|b| find(new, &b.name).as_ref() != Some(*b))
            .map(|b| b.name.clone())
            .collect();
        let mut added = Vec::new();
        let mut errors = Vec::new();
        for backend in new {
            if find(running, &backend.name).as_ref() == Some(backend) {
                continue;
            }
            match crate::upstream::Pool::build(backend, config) {
                Ok(built) => added.push(built),
                Err(message) => errors.push(ConfigError {
                    key: config.key_of_instance(&backend.name),
                    message,
                }),
            }
        }
        if errors.is_empty() {
            Ok(Self { removed, added })
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// Retires the removed backends (pinned models move first; requests on them finish),
    /// then adds the new ones with their health checks.
    pub(crate) async fn apply(self, gateway: &Gateway) -> (Vec<String>, Vec<String>) {
        for name in &self.removed {
            gateway.placement().retire(name).await;
        }
        let mut added = Vec::new();
        for backend in self.added {
            added.push(backend.name.clone());
            gateway.add_backend(backend);
        }
        (self.removed, added)
    }
}

/// One DNS discovery round: every group of the running config looked up, and the difference
/// applied to the pool as a reload applies its backends. Runs under the reload lock, so it
/// never races a reload's own changes.
pub async fn discover(gateway: &Gateway) {
    let discovery = gateway.discovery();
    let answers = discovery.lookup_groups(&gateway.live().config).await;
    let _one_at_a_time = gateway.reload_lock().lock().await;
    let live = gateway.live();
    let config = &live.config;
    let (before, after) = discovery.answered(config, answers);
    if after == before {
        return;
    }
    match BackendChanges::between(
        &config.instances(&before),
        &config.instances(&after),
        config,
    ) {
        Ok(changes) => {
            discovery.keep(after);
            let (removed, added) = changes.apply(gateway).await;
            tracing::info!(?added, ?removed, "DNS discovery changed the pool");
        }
        Err(errors) => {
            tracing::warn!(%errors, "DNS discovery found instances that cannot be built; the pool stays")
        }
    }
}

/// Discovery rounds every `upstream.discovery_interval` (or when a reload wakes it), until
/// `shutdown`.
pub async fn follow_dns(gateway: Gateway, shutdown: CancellationToken) {
    while gateway.discovery().next_round(&shutdown).await {
        discover(&gateway).await;
    }
}

/// Top-level keys other than the reloadable ones whose values differ. `listen.tls` may
/// change (other files, client CAs) but not appear or disappear: listeners are not re-bound.
fn fixed_keys_changed(running: &Config, new: &Config) -> Vec<String> {
    let (Ok(serde_json::Value::Object(mut a)), Ok(serde_json::Value::Object(mut b))) =
        (serde_json::to_value(running), serde_json::to_value(new))
    else {
        return vec![String::new()];
    };
    if running.listen.tls.is_some() && new.listen.tls.is_some() {
        for config in [&mut a, &mut b] {
            if let Some(serde_json::Value::Object(listen)) = config.get_mut("listen") {
                listen.remove("tls");
            }
        }
    }
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| !RELOADABLE.contains(&k.as_str()) && a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// Reloads on SIGHUP and when the file changes (checked every `poll`, acted on once the
/// file has stopped changing for one more poll), until `shutdown`.
pub fn spawn_triggers(
    gateway: &Gateway,
    path: &Path,
    poll: Duration,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) {
    let (gateway, path, shutdown) = (gateway.clone(), path.to_path_buf(), shutdown.clone());
    // Installed before the listeners open: a SIGHUP's default action ends the process.
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    tasks.spawn(async move {
        let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let mut seen = modified(&path);
        let mut pending: Option<SystemTime> = None;
        loop {
            #[cfg(unix)]
            let sighup = async {
                match hangup.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let sighup = std::future::pending::<Option<()>>();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = sighup => {
                    tracing::info!("SIGHUP received: reloading config");
                    let _ = reload(&gateway, &path).await;
                    seen = modified(&path);
                }
                _ = tokio::time::sleep(poll) => {
                    let now = modified(&path);
                    if now != seen {
                        // Debounce: act once the file has stopped changing.
                        if pending == now {
                            let _ = reload(&gateway, &path).await;
                            seen = now;
                            pending = None;
                        } else {
                            pending = now;
                        }
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
        [listen]
        http = "127.0.0.1:0"
        [[backends]]
        name = "b"
        http = "http://127.0.0.1:1"
        [[routes]]
        model = "r"
        targets = [{ model = "a", weight = 1 }]
    "#;

    #[test]
    fn only_routes_and_backends_may_change_while_running() {
        let running = Config::parse(BASE).unwrap();
        let routes_changed = Config::parse(&BASE.replace("weight = 1", "weight = 5")).unwrap();
        assert!(fixed_keys_changed(&running, &routes_changed).is_empty());
        let backend_changed = Config::parse(&BASE.replace("127.0.0.1:1", "127.0.0.1:2")).unwrap();
        assert!(fixed_keys_changed(&running, &backend_changed).is_empty());
        let listener_changed = Config::parse(&BASE.replace("127.0.0.1:0", "127.0.0.1:9")).unwrap();
        assert_eq!(fixed_keys_changed(&running, &listener_changed), ["listen"]);
    }

    #[test]
    fn tls_files_may_change_but_tls_may_not_be_turned_on() {
        let tls = |cert: &str| {
            BASE.replace(
                "http = \"127.0.0.1:0\"",
                &format!(
                    "http = \"127.0.0.1:0\"\n[listen.tls]\ncert = \"{cert}\"\nkey = \"k.pem\""
                ),
            )
        };
        let running = Config::parse(&tls("a.pem")).unwrap();
        let rotated = Config::parse(&tls("b.pem")).unwrap();
        assert!(fixed_keys_changed(&running, &rotated).is_empty());
        let plain = Config::parse(BASE).unwrap();
        assert_eq!(fixed_keys_changed(&plain, &rotated), ["listen"]);
    }

    #[test]
    fn the_hash_tells_files_apart() {
        let a = Live::new(Config::parse(BASE).unwrap(), BASE, None).unwrap();
        let b = Live::new(Config::parse(BASE).unwrap(), &format!("{BASE}\n"), None).unwrap();
        assert_ne!(a.hash, b.hash);
        assert_eq!(a.hash.len(), 16);
    }
}
