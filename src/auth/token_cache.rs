//! The verified JWTs, by their bytes: a warm request's token check is one map lookup under a
//! read lock, where verifying its signature again would cost tens of microseconds.
//!
//! It is a plain map, not a general-purpose cache (moka was one here): a lookup is every
//! request's cost, and with moka's read bookkeeping (its clock, the read log its housekeeper
//! drains) a warm check cost about 1.5k instructions, against about 0.55k for a map behind a
//! lock, half of that hashing the token (`loadtest/instructions.sh`, everything on,
//! `2026-12-06-6a0e43e-instructions.md`). Entries are few and live until their token's
//! `exp`, so the map needs little policy: a token past its `exp` is never answered (the
//! caller checks), and at capacity the expired ones are swept (at most once a second) and, if
//! it is still full of live ones, an arbitrary one makes room.

use super::{Identity, unix_now};
use foldhash::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

/// Verified tokens and their identities, at most `capacity` of them.
pub(super) struct TokenCache {
    capacity: usize,
    map: RwLock<Tokens>,
}

#[derive(Default)]
struct Tokens {
    by_token: HashMap<Box<[u8]>, Arc<Identity>>,
    /// No sweep for expired tokens before this second (Unix time).
    next_sweep: u64,
}

impl TokenCache {
    /// A cache of at most `capacity` tokens (more than zero).
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            map: RwLock::default(),
        }
    }

    /// The identity `token` was verified as, if it is kept (expired or not: the caller
    /// decides).
    pub(super) fn get(&self, token: &[u8]) -> Option<Arc<Identity>> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.by_token.get(token).cloned()
    }

    /// Keeps a verified token, making room when the cache is full.
    pub(super) fn insert(&self, token: &[u8], identity: Arc<Identity>) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.by_token.len() >= self.capacity && !map.by_token.contains_key(token) {
            map.make_room(self.capacity);
        }
        map.by_token.insert(token.into(), identity);
    }

    /// Forgets every token (the keys that verified them changed).
    pub(super) fn clear(&self) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        map.by_token.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.read().unwrap().by_token.len()
    }
}

impl Tokens {
    /// Leaves fewer than `capacity` tokens: the expired ones first, then any.
    fn make_room(&mut self, capacity: usize) {
        let now = unix_now();
        if now >= self.next_sweep {
            self.by_token
                .retain(|_, identity| identity.expires.is_some_and(|exp| exp > now));
            self.next_sweep = now + 1;
        }
        while self.by_token.len() >= capacity {
            let Some(any) = self.by_token.keys().next().cloned() else {
                break;
            };
            self.by_token.remove(&any);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(expires: u64) -> Arc<Identity> {
        Arc::new(Identity {
            tenant: Arc::from("t"),
            admin: false,
            roles: Vec::new(),
            models: None,
            claims: None,
            expires: Some(expires),
            key_generation: 0,
        })
    }

    /// A kept token is found by its bytes; the cache never holds more than its capacity, and
    /// a full one gives up its expired tokens before any live one.
    #[test]
    fn tokens_are_kept_up_to_capacity_expired_ones_going_first() {
        let cache = TokenCache::new(3);
        let live = unix_now() + 3600;
        cache.insert(b"expired", identity(1));
        cache.insert(b"a", identity(live));
        cache.insert(b"b", identity(live));
        assert_eq!(cache.get(b"a").and_then(|i| i.expires), Some(live));
        cache.insert(b"c", identity(live));
        assert_eq!(cache.len(), 3);
        assert!(cache.get(b"expired").is_none(), "the expired token went");
        for name in [b"a", b"b", b"c"] {
            assert!(cache.get(name).is_some());
        }
        for i in 0..100u32 {
            cache.insert(&i.to_le_bytes(), identity(live));
            assert!(cache.len() <= 3);
            assert!(cache.get(&i.to_le_bytes()).is_some(), "the newest is kept");
        }
        // A token kept again replaces its entry without evicting another.
        cache.insert(&99u32.to_le_bytes(), identity(live + 1));
        assert_eq!(cache.len(), 3);
        cache.clear();
        assert_eq!(cache.len(), 0);
    }
}
