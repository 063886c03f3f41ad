//! The eviction order (`placement.policy`): which idle copy a backend gives up first when a
//! load needs room. The table keeps each backend's idle copies sorted by the `Rank` this
//! module gives them, so a cold miss reads its victims off the front; what may be ranked at
//! all (ready, unused, not pinned, idle past `min_churn_age`) is the table's rule, the same
//! under every policy.
//!
//! - `lru`: the copy used longest ago first.
//! - `lfu`: LFU with dynamic ageing (LFU-DA): a copy is worth the clock plus its uses.
//! - `gdsf`: GreedyDual-Size-Frequency: the clock plus uses × reload cost / size, where the
//!   reload cost is the model's learned load time (until one is timed, assumed from its size).
//!
//! - `tinylfu`: GDSF's worth with the frequency of a TinyLFU sketch (`sketch`): how often the
//!   model was asked for lately, remembered across evictions, × reload cost / GiB^1.15,
//!   aged by the sketch's halvings, whose window tunes itself by hill climbing on the hit
//!   ratio. The sketch is this table's, so in a pool of replicas each counts the requests
//!   it serves itself (see `sketch`).
//!
//! The clock of `lfu` and `gdsf` rises to the worth of each copy evicted, and a copy takes
//! the clock's value when it is ranked: a model that was hot an hour ago and is idle now
//! keeps the worth it had then, which newly ranked copies overtake as the clock rises. That
//! is the ageing that stops yesterday's hot model from staying forever. Under every policy a
//! model marked `keep` comes after every copy that is not.

use super::sketch::TinyLfu;
use crate::config::EvictionPolicy;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// Until a model's load has been timed, its load is assumed to take this long, plus...
const ASSUMED_LOAD_BASE_SECONDS: f64 = 0.5;
/// ...this long per GiB (the simulator's default load time).
const ASSUMED_LOAD_SECONDS_PER_GIB: f64 = 1.0;
/// Share of a new load time in the learned one (an exponential mean over the last few).
const LEARNING_RATE: f64 = 0.3;
const GIB: f64 = (1u64 << 30) as f64;

/// A copy's place in the eviction order: lower ranks are evicted first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rank {
    /// `keep` copies come after every other.
    keep: bool,
    /// LRU: nanoseconds from the order's epoch to the last use. LFU and GDSF: the worth, an
    /// f64 that is never negative, as its bits (which sort as the numbers do).
    worth: u64,
    /// Ties go to the copy used longest ago: nanoseconds from the epoch to the last use.
    used: u64,
}

/// What `[[models]]` says of one model's place in the order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelWeight {
    /// Evicted last (`keep = true`).
    pub keep: bool,
    /// Multiplies what each use is worth under `lfu` and `gdsf` (`cost_weight`).
    pub cost_weight: f64,
}

impl Default for ModelWeight {
    fn default() -> Self {
        Self {
            keep: false,
            cost_weight: 1.0,
        }
    }
}

/// What a copy is ranked by.
#[derive(Clone, Copy, Debug)]
pub struct Usage<'a> {
    /// The model.
    pub model: &'a str,
    /// Bytes the copy is counted for.
    pub bytes: u64,
    /// Requests it has served since it was placed.
    pub uses: u64,
    /// When a request last finished with it.
    pub last_used: Instant,
}

/// The policy, its ageing clock, the per-model weights and the learned load times: all that
/// ranks a copy.
#[derive(Debug)]
pub struct EvictionOrder {
    policy: EvictionPolicy,
    epoch: Instant,
    clock: f64,
    weights: HashMap<String, ModelWeight>,
    load_seconds: HashMap<String, f64>,
    /// `tinylfu`: how often each model was asked for lately, and the window that tunes it
    /// (`None` under other policies, whose warm hits then pay nothing for it).
    tinylfu: Option<TinyLfu>,
}

impl EvictionOrder {
    /// An order for `policy`, with no per-model weights and no load timed yet.
    pub fn new(policy: EvictionPolicy, epoch: Instant) -> Self {
        Self {
            policy,
            epoch,
            clock: 0.0,
            weights: HashMap::new(),
            load_seconds: HashMap::new(),
            tinylfu: (policy == EvictionPolicy::Tinylfu).then(TinyLfu::new),
        }
    }

    /// Counts a request for `model` (`tinylfu`'s sketch; nothing under other policies).
    /// A warm hit pays for this: one hash of the name and four counters.
    pub fn record(&mut self, model: &str) {
        if let Some(tinylfu) = &mut self.tinylfu {
            tinylfu.record(model);
        }
    }

    /// Counts a cold miss: a new copy placed for a request (what `tinylfu`'s window is
    /// tuned to make rarer).
    pub fn missed(&mut self) {
        if let Some(tinylfu) = &mut self.tinylfu {
            tinylfu.missed();
        }
    }

    /// Sets a model's `keep` and `cost_weight`.
    pub fn weigh(&mut self, model: &str, weight: ModelWeight) {
        if weight == ModelWeight::default() {
            self.weights.remove(model);
        } else {
            self.weights.insert(model.to_string(), weight);
        }
    }

    /// The policy this order follows.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Records how long a load of `model` took (a cold start's cost, for `gdsf`).
    pub fn learn_load_time(&mut self, model: &str, took: Duration) {
        let seconds = took.as_secs_f64();
        self.load_seconds
            .entry(model.to_string())
            .and_modify(|mean| *mean += LEARNING_RATE * (seconds - *mean))
            .or_insert(seconds);
    }

    /// What reloading the model would cost, in seconds: its learned load time, else one
    /// assumed from its size.
    pub fn reload_seconds(&self, model: &str, bytes: u64) -> f64 {
        self.load_seconds.get(model).copied().unwrap_or_else(|| {
            ASSUMED_LOAD_BASE_SECONDS + ASSUMED_LOAD_SECONDS_PER_GIB * bytes as f64 / GIB
        })
    }

    /// The copy's rank now.
    pub fn rank(&self, usage: Usage<'_>) -> Rank {
        let weight = self.weights.get(usage.model).copied().unwrap_or_default();
        let uses = usage.uses.max(1) as f64;
        let since = usage.last_used.saturating_duration_since(self.epoch);
        let used = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        let worth = match self.policy {
            EvictionPolicy::Lru => {
                return Rank {
                    keep: weight.keep,
                    worth: used,
                    used,
                };
            }
            EvictionPolicy::Lfu => self.clock + uses * weight.cost_weight,
            EvictionPolicy::Gdsf => {
                // A model the books count as (nearly) nothing is worth as much as a 1 MiB one.
                let gib = (usage.bytes as f64 / GIB).max(1.0 / 1024.0);
                let cost = self.reload_seconds(usage.model, usage.bytes) * weight.cost_weight;
                self.clock + uses * cost / gib
            }
            EvictionPolicy::Tinylfu => {
                let tinylfu = self.tinylfu.as_ref().expect("tinylfu keeps a sketch");
                let cost = self.reload_seconds(usage.model, usage.bytes) * weight.cost_weight;
                tinylfu.worth(usage.model, usage.bytes, cost)
            }
        };
        Rank {
            keep: weight.keep,
            worth: worth.max(0.0).to_bits(),
            used,
        }
    }

    /// Copies were evicted, `top` the highest rank among them: the ageing clock rises to
    /// its worth.
    pub fn evicted(&mut self, top: Option<Rank>) {
        if let Some(top) = top
            && matches!(self.policy, EvictionPolicy::Lfu | EvictionPolicy::Gdsf)
        {
            self.clock = self.clock.max(f64::from_bits(top.worth));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn usage(model: &str, mib: u64, uses: u64, last_used: Instant) -> Usage<'_> {
        Usage {
            model,
            bytes: mib * MIB,
            uses,
            last_used,
        }
    }

    #[test]
    fn lru_ranks_by_last_use_alone() {
        let epoch = Instant::now();
        let order = EvictionOrder::new(EvictionPolicy::Lru, epoch);
        let later = epoch + Duration::from_secs(1);
        let old_and_busy = order.rank(usage("a", 10, 1000, epoch));
        let new_and_rare = order.rank(usage("b", 4000, 1, later));
        assert!(old_and_busy < new_and_rare);
    }

    #[test]
    fn lfu_ranks_by_uses_and_ages_with_the_clock() {
        let now = Instant::now();
        let mut order = EvictionOrder::new(EvictionPolicy::Lfu, now);
        let hot = order.rank(usage("hot", 10, 50, now));
        let warm = order.rank(usage("warm", 10, 5, now));
        assert!(warm < hot, "fewer uses go first");
        let warm_later = order.rank(usage("warm", 10, 5, now + Duration::from_secs(1)));
        assert!(
            warm < warm_later,
            "of equals, the one used longest ago first"
        );
        // Evictions push the clock past what the hot model was worth: a model ranked now with
        // a few uses outranks it (yesterday's hot model does not stay forever).
        order.evicted(Some(hot));
        let today = order.rank(usage("today", 10, 2, now));
        assert!(hot < today);
    }

    #[test]
    fn gdsf_weighs_uses_by_reload_cost_over_size() {
        let now = Instant::now();
        let mut order = EvictionOrder::new(EvictionPolicy::Gdsf, now);
        // Same uses: the big model is worth less per byte and goes first.
        let small = order.rank(usage("small", 64, 3, now));
        let big = order.rank(usage("big", 4096, 3, now));
        assert!(big < small);
        // A model that loads slowly for its size is worth more than its size alone says.
        order.learn_load_time("slow", Duration::from_secs(60));
        let slow = order.rank(usage("slow", 4096, 3, now));
        assert!(small < slow);
        // The learned time is a mean that follows new loads.
        order.learn_load_time("slow", Duration::from_secs(10));
        assert!((order.reload_seconds("slow", 0) - 45.0).abs() < 1e-9);
    }

    #[test]
    fn keep_comes_after_everything_and_weights_scale_uses() {
        let now = Instant::now();
        for policy in [
            EvictionPolicy::Lru,
            EvictionPolicy::Lfu,
            EvictionPolicy::Gdsf,
        ] {
            let mut order = EvictionOrder::new(policy, now);
            order.weigh(
                "kept",
                ModelWeight {
                    keep: true,
                    cost_weight: 1.0,
                },
            );
            let kept = order.rank(usage("kept", 8000, 1, now));
            let other = order.rank(usage("other", 16, 1000, now + Duration::from_secs(9)));
            assert!(other < kept, "{policy:?}");
        }
        let mut order = EvictionOrder::new(EvictionPolicy::Gdsf, now);
        order.weigh(
            "dear",
            ModelWeight {
                keep: false,
                cost_weight: 4.0,
            },
        );
        let dear = order.rank(usage("dear", 100, 1, now));
        let plain = order.rank(usage("plain", 100, 3, now));
        assert!(
            plain < dear,
            "one use at weight 4 is worth more than three at 1"
        );
    }
}
