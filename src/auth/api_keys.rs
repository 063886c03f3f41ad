//! API keys: kept only as SHA-256 hashes, looked up by the hash of what the client sent.
//!
//! The presented key is hashed, its digest's first 8 bytes pick the candidates from a
//! `HashMap`, and each candidate's whole digest is compared in constant time (`subtle`). The
//! lookup's timing can only tell an attacker about 8 bytes of a SHA-256 of what they sent,
//! never how much of a stored key they matched.

use super::Identity;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The SHA-256 of a key, as 32 bytes.
pub fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// The lower-case hex SHA-256 of a key: what `api_keys[].sha256` holds and
/// `infergate hash-key` prints.
pub fn hash_key(key: &str) -> String {
    hex(&digest(key.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        text.push(DIGITS[usize::from(b >> 4)] as char);
        text.push(DIGITS[usize::from(b & 15)] as char);
    }
    text
}

/// Parses 64 hex digits (validated config) into a digest.
pub fn parse_hex(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// A configured key's digest and the identity it stands for.
type Entry = ([u8; 32], Arc<Identity>);

/// Every configured key, bucketed by its digest's first 8 bytes.
#[derive(Debug, Default)]
pub struct ApiKeys {
    by_prefix: HashMap<u64, Vec<Entry>>,
}

fn prefix(digest: &[u8; 32]) -> u64 {
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

impl ApiKeys {
    /// Adds a key (by its digest).
    pub fn insert(&mut self, digest: [u8; 32], identity: Arc<Identity>) {
        let bucket = self.by_prefix.entry(prefix(&digest)).or_default();
        bucket.retain(|(stored, _)| *stored != digest);
        bucket.push((digest, identity));
    }

    /// The identity of a presented key, if it is one of ours.
    pub fn find(&self, key: &[u8]) -> Option<&Arc<Identity>> {
        let presented = digest(key);
        self.by_prefix
            .get(&prefix(&presented))?
            .iter()
            .find(|(stored, _)| bool::from(stored.ct_eq(&presented)))
            .map(|(_, identity)| identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_round_trip_through_hex() {
        let hash = hash_key("secret-key");
        assert_eq!(hash.len(), 64);
        // sha256("abc"), the FIPS 180-2 test vector.
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(parse_hex(&hash), Some(digest(b"secret-key")));
        assert_eq!(parse_hex("zz"), None);
    }

    fn identity(tenant: &str) -> Arc<Identity> {
        Arc::new(Identity::without_token(tenant, Vec::new(), false))
    }

    #[test]
    fn keys_sharing_a_digest_prefix_are_told_apart_by_the_whole_digest() {
        let mut keys = ApiKeys::default();
        let real = digest(b"real-key");
        let mut twin = real;
        twin[31] ^= 1;
        keys.insert(twin, identity("twin"));
        keys.insert(real, identity("real"));
        assert_eq!(&*keys.find(b"real-key").unwrap().tenant, "real");
        assert!(keys.find(b"other-key").is_none());
        keys.insert(real, identity("replaced"));
        assert_eq!(&*keys.find(b"real-key").unwrap().tenant, "replaced");
    }
}
