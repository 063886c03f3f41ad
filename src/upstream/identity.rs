//! The backends' identity (name, version, protocol extensions) as server metadata answers
//! it, and the cache the gateway keeps of it (`services`' server metadata reads and fills it).

use arc_swap::ArcSwapOption;
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

/// A server's name, version and protocol extensions, as server metadata carries them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServerMetadata {
    /// `triton` from a Triton backend, or `server.name`.
    pub name: String,
    /// The backend's version (Triton's release, e.g. `2.51.0`).
    pub version: String,
    /// In the backend's order.
    pub extensions: Vec<String>,
}

/// The identity last read from a backend, shared by both front-ends.
#[derive(Default)]
pub struct IdentityCache(ArcSwapOption<(Instant, ServerMetadata)>);

impl IdentityCache {
    /// The identity last read, and when.
    pub fn last(&self) -> Option<Arc<(Instant, ServerMetadata)>> {
        self.0.load_full()
    }

    /// Keeps an identity just read.
    pub fn keep(&self, metadata: ServerMetadata) {
        self.0.store(Some(Arc::new((Instant::now(), metadata))));
    }
}
