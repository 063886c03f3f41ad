//! API keys: kept only as SHA-256 hashes, looked up by the hash of what the client sent.
//!
//! The lookup is a `HashMap` keyed by the digest, so its timing depends on the digest of the
//! presented key, never on how much of a stored key it shares; the entry found is then
//! compared in constant time (`subtle`) as a second guard.

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

/// Every configured key, by digest, with the identity it stands for.
#[derive(Debug, Default)]
pub struct ApiKeys {
    by_digest: HashMap<[u8; 32], ([u8; 32], Arc<Identity>)>,
}

impl ApiKeys {
    /// Adds a key (by its digest).
    pub fn insert(&mut self, digest: [u8; 32], identity: Arc<Identity>) {
        self.by_digest.insert(digest, (digest, identity));
    }

    /// Whether any key is configured.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// The identity of a presented key, if it is one of ours.
    pub fn find(&self, key: &[u8]) -> Option<&Arc<Identity>> {
        let presented = digest(key);
        let (stored, identity) = self.by_digest.get(&presented)?;
        bool::from(stored.ct_eq(&presented)).then_some(identity)
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
}
