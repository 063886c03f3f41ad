//! `Live`: the config snapshot a request sees from its first phase to its last. A reload
//! (`crate::reload`) builds a new one and swaps it whole; a request in flight keeps the one
//! it started with.

use crate::config::{Config, ConfigErrors};
use crate::routing::RouteTable;
use std::sync::Arc;
use std::time::SystemTime;

/// What a request reads from the config while it runs: swapped whole on reload.
#[derive(Debug)]
pub struct Live {
    /// The running config as loaded.
    pub config: Arc<Config>,
    /// Routes built from it.
    pub routes: RouteTable,
    /// Keys, tenants and limits built from its `[auth]` (limits start afresh on reload).
    pub auth: Arc<crate::auth::Auth>,
    /// FNV-1a of the file text, to tell which file is running.
    pub hash: String,
    /// When it was loaded.
    pub loaded_at: SystemTime,
}

impl Live {
    /// The live snapshot of a config and the text it came from; routes the config leaves
    /// as they were in `previous` keep their state (guards), and JWKS keys fetched from a
    /// URL stay until fetched again. Building it reads the auth key files, secrets and JWKS
    /// files; their errors name their keys.
    pub fn new(config: Config, text: &str, previous: Option<&Live>) -> Result<Self, ConfigErrors> {
        let auth = crate::auth::Auth::new(&config.auth).map_err(ConfigErrors)?;
        if let Some(previous) = previous {
            auth.inherit(&previous.auth);
        }
        Ok(Self {
            routes: RouteTable::new(&config.routes, previous.map(|p| &p.routes)),
            auth: Arc::new(auth),
            config: Arc::new(config),
            hash: format!("{:016x}", crate::fnv::fnv1a(text.as_bytes())),
            loaded_at: SystemTime::now(),
        })
    }
}
