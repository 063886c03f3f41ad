//! FNV-1a, the small non-cryptographic hash the gateway uses where it needs a stable one:
//! the config file's fingerprint, JWKS fingerprints, the sticky-routing key.

/// 64-bit FNV-1a of `bytes`: stable across processes and versions (unlike `std`'s hasher).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
