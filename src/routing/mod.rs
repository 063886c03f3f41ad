//! Routes: a model name clients call, split by weight across target models or versions
//! (canary rollouts), optionally sticky by a key so one user keeps one target.
//!
//! Sticky choice is a weighted rendezvous hash: every (key, target) pair gets a score from a
//! stable hash, scaled by the target's weight, and the best score wins. The same key always
//! reaches the same target while weights stay the same, and changing weights moves only the
//! keys that must move. Hashes are fixed (FNV-1a + splitmix64), not per process, so every
//! gateway replica sends a key to the same target.

pub mod guard;
mod table;

pub use guard::Guard;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
pub use table::{PIN_HEADER, RouteTable, Routed, Shadow, Tally};

/// One place a route can send a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Triton model name.
    pub model: String,
    /// Triton model version, or the server's choice.
    pub version: Option<String>,
    /// Share of traffic; 0 takes the target out.
    pub weight: u32,
    /// For a mirror (never chosen to answer): the percentage of requests copied to it.
    pub mirror: Option<f64>,
}

impl Target {
    /// `model` or `model/version`, as shown in the `infergate-target` header and metrics.
    pub fn label(&self) -> String {
        match &self.version {
            Some(version) => format!("{}/{}", self.model, version),
            None => self.model.clone(),
        }
    }
}

/// Weighted targets behind one name.
#[derive(Debug)]
pub struct Route {
    /// The name clients call; shared with each request routed on it.
    pub name: Arc<str>,
    /// Where requests may go.
    pub targets: Vec<Target>,
    /// Each target's `model[/version]`, shared with each request sent to it.
    labels: Vec<Arc<str>>,
    guard: Option<Guard>,
}

/// Per-request randomness for non-sticky routes: a counter through splitmix64, uniform
/// enough for splitting traffic and free of locks and allocation.
static SEQUENCE: AtomicU64 = AtomicU64::new(0x5eed);

impl Route {
    /// Builds a route; targets keep their order.
    pub fn new(name: impl Into<String>, targets: Vec<Target>) -> Self {
        let labels = targets.iter().map(|t| Arc::from(t.label())).collect();
        Self {
            name: Arc::from(name.into()),
            targets,
            labels,
            guard: None,
        }
    }

    /// Holds the route's canaries to `limits` (automatic rollback).
    pub fn guarded(mut self, limits: crate::config::Guard) -> Self {
        let weights: Vec<u32> = self.targets.iter().map(|t| self.weight_of(t)).collect();
        self.guard = Some(Guard::new(limits, &weights));
        self
    }

    /// The guard, when the route has one.
    pub fn guard(&self) -> Option<&Guard> {
        self.guard.as_ref()
    }

    fn weight_of(&self, target: &Target) -> u32 {
        if target.mirror.is_some() {
            0
        } else {
            target.weight
        }
    }

    /// Target `i`'s weight now: 0 for a mirror and for a canary its guard switched off.
    pub fn weight(&self, i: usize) -> u32 {
        if self.guard.as_ref().is_some_and(|g| g.is_off(i)) {
            0
        } else {
            self.weight_of(&self.targets[i])
        }
    }

    /// Index of the target for a request: by the sticky key when there is one, else at
    /// random by weight. `None` when every weight is 0.
    pub fn choose(&self, sticky_key: Option<&[u8]>) -> Option<usize> {
        let total: u64 = (0..self.targets.len())
            .map(|i| u64::from(self.weight(i)))
            .sum();
        if total == 0 {
            return None;
        }
        match sticky_key {
            Some(key) => self.rendezvous(key),
            None => {
                let draw = random() % total;
                let mut acc = 0;
                (0..self.targets.len()).find(|&i| {
                    acc += u64::from(self.weight(i));
                    draw < acc
                })
            }
        }
    }

    /// The mirrors that get a copy of this request, each drawn at its percentage.
    pub fn mirrors(&self) -> impl Iterator<Item = usize> + '_ {
        self.targets.iter().enumerate().filter_map(|(i, t)| {
            let percent = t.mirror?;
            let draw = (random() % 10_000) as f64;
            (draw < percent * 100.0).then_some(i)
        })
    }

    /// Counts an answer of target `i` in the guard, which may switch it off.
    pub fn observe(&self, i: usize, failed: bool, latency: Duration) {
        if let Some(guard) = &self.guard {
            guard.observe(&self.name, (i, &self.labels[i]), failed, latency);
        }
    }

    /// Applies another replica's guard trip (`[cluster]`) to the target it names by label;
    /// false when the route has no guard, no such target, or it was off already.
    pub fn apply_trip(&self, trip: guard::Trip) -> bool {
        let Some(guard) = &self.guard else {
            return false;
        };
        match self.labels.iter().position(|label| **label == *trip.target) {
            Some(i) => guard.apply(&self.name, i, trip),
            None => false,
        }
    }

    /// The label (`model[/version]`) of target `i`.
    pub fn label(&self, i: usize) -> &str {
        &self.labels[i]
    }

    fn rendezvous(&self, key: &[u8]) -> Option<usize> {
        let key_hash = crate::fnv::fnv1a(key);
        let mut best: Option<(usize, f64)> = None;
        for i in 0..self.targets.len() {
            let weight = self.weight(i);
            if weight == 0 {
                continue;
            }
            let h = splitmix64(key_hash ^ crate::fnv::fnv1a(self.labels[i].as_bytes()));
            // Uniform in (0, 1]; score = -w / ln(u) is largest for the winner.
            let u = ((h >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            let score = -f64::from(weight) / u.ln();
            if best.is_none_or(|(_, s)| score > s) {
                best = Some((i, score));
            }
        }
        best.map(|(i, _)| i)
    }
}

/// A uniform draw for per-request choices.
fn random() -> u64 {
    splitmix64(SEQUENCE.fetch_add(1, Ordering::Relaxed))
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(weights: &[u32]) -> Route {
        Route::new(
            "ranker",
            weights
                .iter()
                .enumerate()
                .map(|(i, &weight)| Target {
                    model: format!("ranker_{i}"),
                    version: (i == 1).then(|| "2".to_string()),
                    weight,
                    mirror: None,
                })
                .collect(),
        )
    }

    #[test]
    fn random_split_follows_the_weights() {
        let route = route(&[90, 10]);
        let n = 100_000;
        let canary = (0..n).filter(|_| route.choose(None) == Some(1)).count();
        let share = canary as f64 / n as f64;
        assert!((share - 0.10).abs() < 0.01, "{share}");
        assert_eq!(route.label(1), "ranker_1/2");
    }

    #[test]
    fn sticky_keys_split_by_weight_and_never_change() {
        let route = route(&[90, 10]);
        let keys: Vec<String> = (0..20_000).map(|i| format!("user-{i}")).collect();
        let first: Vec<_> = keys
            .iter()
            .map(|k| route.choose(Some(k.as_bytes())))
            .collect();
        let again: Vec<_> = keys
            .iter()
            .map(|k| route.choose(Some(k.as_bytes())))
            .collect();
        assert_eq!(first, again);
        let share = first.iter().filter(|c| **c == Some(1)).count() as f64 / keys.len() as f64;
        assert!((share - 0.10).abs() < 0.015, "{share}");
    }

    #[test]
    fn changing_weights_moves_only_keys_that_must_move() {
        let before = route(&[90, 10]);
        let after = route(&[50, 50]);
        let keys: Vec<String> = (0..20_000).map(|i| format!("user-{i}")).collect();
        let mut moved_back = 0;
        let mut moved = 0;
        for key in &keys {
            let (a, b) = (
                before.choose(Some(key.as_bytes())),
                after.choose(Some(key.as_bytes())),
            );
            if a != b {
                moved += 1;
                // Raising the canary's weight only ever moves keys onto it.
                if b == Some(0) {
                    moved_back += 1;
                }
            }
        }
        assert_eq!(moved_back, 0);
        let share = moved as f64 / keys.len() as f64;
        assert!((share - 0.40).abs() < 0.02, "{share}: the minimum is 40%");
    }

    #[test]
    fn zero_weights_take_targets_out() {
        let route = route(&[0, 5]);
        assert!((0..1000).all(|_| route.choose(None) == Some(1)));
        assert_eq!(route.choose(Some(b"k")), Some(1));
        assert_eq!(Route::new("none", vec![]).choose(None), None);
        assert_eq!(super::tests::route(&[0, 0]).choose(Some(b"k")), None);
    }
}
