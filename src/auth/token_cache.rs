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
//!
//! A token is found by a hash of its last bytes, not all of them: an RS256 token is some 600
//! bytes, and hashing them was half of a warm check. Its tail is its signature's, which differs
//! from token to token; the whole token is then compared, so two tokens that share a tail
//! only share a slot (the later one takes it, and the other is verified again).

use super::{Identity, unix_now};
use foldhash::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, PoisonError, RwLock};

/// How many of a token's last bytes find it.
const TAIL: usize = 32;

/// Verified tokens and their identities, at most `capacity` of them.
pub(super) struct TokenCache {
    capacity: usize,
    /// Hashes a token's tail (seeded per process, as a map's own hasher is).
    tail_hash: foldhash::fast::RandomState,
    map: RwLock<Tokens>,
}

#[derive(Default)]
struct Tokens {
    /// By the hash of the token's tail.
    by_tail: HashMap<u64, Kept>,
    /// No sweep for expired tokens before this second (Unix time).
    next_sweep: u64,
}

struct Kept {
    token: Box<[u8]>,
    identity: Arc<Identity>,
}

impl TokenCache {
    /// A cache of at most `capacity` tokens (more than zero).
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            tail_hash: foldhash::fast::RandomState::default(),
            map: RwLock::default(),
        }
    }

    /// The identity `token` was verified as, if it is kept (expired or not: the caller
    /// decides).
    pub(super) fn get(&self, token: &[u8]) -> Option<Arc<Identity>> {
        let tail = self.tail(token);
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let kept = map.by_tail.get(&tail)?;
        (*kept.token == *token).then(|| kept.identity.clone())
    }

    /// Keeps a verified token, making room when the cache is full.
    pub(super) fn insert(&self, token: &[u8], identity: Arc<Identity>) {
        let tail = self.tail(token);
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.by_tail.len() >= self.capacity && !map.by_tail.contains_key(&tail) {
            map.make_room(self.capacity);
        }
        let token = token.into();
        map.by_tail.insert(tail, Kept { token, identity });
    }

    /// Forgets every token (the keys that verified them changed).
    pub(super) fn clear(&self) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        map.by_tail.clear();
    }

    fn tail(&self, token: &[u8]) -> u64 {
        self.tail_hash
            .hash_one(&token[token.len().saturating_sub(TAIL)..])
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.read().unwrap().by_tail.len()
    }
}

impl Tokens {
    /// Leaves fewer than `capacity` tokens: the expired ones first, then any.
    fn make_room(&mut self, capacity: usize) {
        let now = unix_now();
        if now >= self.next_sweep {
            self.by_tail
                .retain(|_, kept| kept.identity.expires.is_some_and(|exp| exp > now));
            self.next_sweep = now + 1;
        }
        while self.by_tail.len() >= capacity {
            let Some(&any) = self.by_tail.keys().next() else {
                break;
            };
            self.by_tail.remove(&any);
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

    /// Tokens are told apart by all their bytes: one that shares another's tail is not
    /// answered with the other's identity.
    #[test]
    fn a_token_is_answered_only_for_its_own_bytes() {
        let cache = TokenCache::new(8);
        let tail = [b'x'; TAIL];
        let (first, second) = (
            [b"a".as_slice(), &tail].concat(),
            [b"b".as_slice(), &tail].concat(),
        );
        cache.insert(&first, identity(1));
        assert_eq!(cache.get(&first).and_then(|i| i.expires), Some(1));
        assert!(cache.get(&second).is_none());
        cache.insert(&second, identity(2));
        assert_eq!(cache.get(&second).and_then(|i| i.expires), Some(2));
        assert!(cache.get(&first).is_none(), "the later token took the slot");
        assert!(
            cache.get(&tail[1..]).is_none(),
            "a shorter token is another token"
        );
    }
}
