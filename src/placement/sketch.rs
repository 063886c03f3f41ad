//! A count-min frequency sketch with periodic halving: how often each model was asked for
//! lately, in fixed memory, remembered across evictions. It is TinyLFU's sketch (Einziger,
//! Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission Policy"; Caffeine's and
//! moka's `FrequencySketch`): a copy's own `served` count starts again at zero every time the
//! copy is placed, so a model evicted an hour ago and asked for every minute since looks
//! exactly like a model asked for once; the sketch tells them apart.
//!
//! Four rows of small saturating counters, each indexed by a different hash of the model's
//! name; a model's estimate is the least of its four counters (collisions only ever add).
//! Every `sample` increments, every counter is halved: that is the ageing, so the sketch
//! follows popularity as it drifts, and a model hot yesterday is cold today. Its memory is
//! fixed (`ROWS` × `width` counters), whatever the number of models.
//!
//! Admission, as TinyLFU means it, cannot refuse here: the request that misses needs its
//! model, so the copy is loaded. What the sketch decides is what stays: once idle past
//! `min_churn_age`, a copy is ranked by its sketched frequency, so a model asked for once is
//! the next to go, and a model asked for often keeps its place even though its copy is new.
//!
//! Replicas: each replica's table keeps its own sketch and climber, counting the requests it
//! serves itself; nothing of them goes through the registry. Behind a balancer that spreads
//! requests, each replica sees a sample of the same popularity, so its counts are about the
//! pool's divided by the number of replicas and rank the models alike; the window, in
//! requests, then spans that many times longer in time, which the climber corrects. A
//! replica that serves a skewed share (sticky routes) ranks by what it sees: the victims it
//! chooses are agreed through the registry like any other eviction, so the pool stays
//! consistent, but may differ from what another replica would have chosen. A new replica
//! starts empty: until it has counted, every model is worth one request (GDSF's first use).

use std::hash::BuildHasher;

/// Counters per row: 256 KiB in all, which keeps collisions rare up to about 100,000 models.
const WIDTH: usize = 1 << 16;
/// Counters saturate here. TinyLFU's 4-bit counters (15) cannot tell a large model asked for
/// a hundred times from one asked for fifteen times, and size-weighted worth needs that: with
/// them the serverless trace loaded 27.4 TiB against 21.8 TiB (see docs/placement.md).
const MAX_COUNT: u8 = 255;
/// The window a sketch starts with, in requests between halvings; the climber moves it.
const START_WINDOW: u64 = 50_000;
/// The climber's bounds on the window.
const MIN_WINDOW: u64 = 2_000;
const MAX_WINDOW: u64 = 1_000_000;
/// Requests per climbing step: enough that a step's hit ratio is not mostly noise.
const CLIMB_PERIOD: u64 = 20_000;
/// How much one step changes the window (multiplied or divided).
const CLIMB_STEP: f64 = 1.25;
/// Worth is `freq × reload seconds / GiB^SIZE_EXPONENT`: slightly more than GDSF's 1, which
/// measured best on hits without loading more bytes than GDSF (1.0 and 1.3 were tried).
const SIZE_EXPONENT: f64 = 1.15;
const GIB: f64 = (1u64 << 30) as f64;

/// `placement.policy = "tinylfu"`'s state: the sketch and the climber that tunes its window.
#[derive(Debug, Clone)]
pub struct TinyLfu {
    sketch: FrequencySketch,
    climber: WindowClimber,
}

impl TinyLfu {
    /// An empty sketch at the starting window.
    pub fn new() -> Self {
        Self {
            sketch: FrequencySketch::new(WIDTH, MAX_COUNT, START_WINDOW),
            climber: WindowClimber::new(),
        }
    }

    /// Counts a request served (a hit, or a miss once its load is done).
    pub fn record(&mut self, model: &str) {
        self.sketch.increment(model);
        if let Some(window) = self.climber.served(self.sketch.sample()) {
            self.sketch.set_sample(window);
        }
    }

    /// Counts a cold miss.
    pub fn missed(&mut self) {
        self.climber.missed += 1;
    }

    /// What an idle copy of `model`, `bytes` big, costing `cost` seconds to load again, is
    /// worth keeping: its sketched frequency × `cost` / GiB^1.15 (GDSF's rule with the
    /// sketch's frequency), in a log scale that ages it. Each halving of the sketch adds 1 to
    /// the worth of every copy ranked after it, which orders copies exactly as if every
    /// worth ranked before had been halved with the counters — without touching them, so
    /// ageing costs nothing per copy. (GDSF's additive clock, tried here, lost 2–5 points:
    /// it ranks every newly idle copy, one-hit ones included, above older valuable ones.)
    pub fn worth(&self, model: &str, bytes: u64, cost: f64) -> f64 {
        // A model the books count as (nearly) nothing is worth as much as a 1 MiB one.
        let gib = (bytes as f64 / GIB).max(1.0 / 1024.0);
        let freq = f64::from(self.sketch.estimate(model)).max(1.0);
        let value = (freq * cost / gib.powf(SIZE_EXPONENT)).max(f64::MIN_POSITIVE);
        // Worth must not be negative (ranks sort its bits); log2 of any value here is far
        // above -64.
        (64.0 + self.sketch.halvings() as f64 + value.log2()).max(0.0)
    }
}

impl Default for TinyLfu {
    fn default() -> Self {
        Self::new()
    }
}

/// Tunes the sketch's window (requests between halvings: how long a request is remembered)
/// by hill climbing on the hit ratio, as Caffeine's adaptive W-TinyLFU tunes its window
/// (Einziger et al., "Adaptive Software Cache Management", Middleware 2018): every
/// `CLIMB_PERIOD` requests the window takes one step in the direction it last moved, or
/// turns back if the hit ratio fell over the last period. A short window follows popularity
/// that drifts fast; a long one remembers models asked for every few hours. O(1) per request.
#[derive(Debug, Clone)]
struct WindowClimber {
    requests: u64,
    missed: u64,
    last: Option<f64>,
    up: bool,
}

impl WindowClimber {
    fn new() -> Self {
        Self {
            requests: 0,
            missed: 0,
            last: None,
            up: false,
        }
    }

    /// One request served; at the end of a period, the next window.
    fn served(&mut self, window: u64) -> Option<u64> {
        self.requests += 1;
        if self.requests < CLIMB_PERIOD {
            return None;
        }
        let ratio = 1.0 - self.missed as f64 / self.requests as f64;
        self.requests = 0;
        self.missed = 0;
        if self.last.is_some_and(|last| ratio < last) {
            self.up = !self.up;
        }
        self.last = Some(ratio);
        let next = if self.up {
            window as f64 * CLIMB_STEP
        } else {
            window as f64 / CLIMB_STEP
        };
        Some((next as u64).clamp(MIN_WINDOW, MAX_WINDOW))
    }
}

/// Rows, each with its own hash: the estimate is the minimum over them.
const ROWS: usize = 4;

/// Seeds the four row hashes, fixed so a replay is the same every time.
const SEED: u64 = 0x5EED_0F1F_E000_0001;

/// A count-min sketch of small saturating counters, halved every `sample` increments.
#[derive(Debug, Clone)]
pub struct FrequencySketch {
    counters: Vec<u8>,
    /// Counters per row (a power of two).
    width: usize,
    /// Counters saturate here: 15 is TinyLFU's 4-bit counter.
    max: u8,
    /// Increments between two halvings.
    sample: u64,
    /// Increments since the last halving.
    added: u64,
    /// Halvings so far.
    halvings: u64,
    hasher: foldhash::fast::FixedState,
}

impl FrequencySketch {
    /// A sketch of `width` counters per row (rounded up to a power of two), saturating at
    /// `max`, halved every `sample` increments.
    pub fn new(width: usize, max: u8, sample: u64) -> Self {
        let width = width.max(64).next_power_of_two();
        Self {
            counters: vec![0; ROWS * width],
            width,
            max: max.max(1),
            sample: sample.max(1),
            added: 0,
            halvings: 0,
            hasher: foldhash::fast::FixedState::with_seed(SEED),
        }
    }

    /// The counter of `model` in each row.
    fn slots(&self, model: &str) -> [usize; ROWS] {
        let hash = self.hasher.hash_one(model);
        let mask = self.width - 1;
        let mut slots = [0; ROWS];
        for (row, slot) in slots.iter_mut().enumerate() {
            // Each row takes 16 different bits of one 64-bit hash, remixed by its row.
            let h = hash
                .rotate_left(16 * row as u32)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15 | 1);
            *slot = row * self.width + ((h >> 32) as usize & mask);
        }
        slots
    }

    /// Counts one request for `model`. Only the least of its counters are raised
    /// (conservative update), which keeps collisions from inflating estimates.
    pub fn increment(&mut self, model: &str) {
        let slots = self.slots(model);
        let least = slots.iter().map(|&s| self.counters[s]).min().unwrap_or(0);
        if least < self.max {
            for &s in &slots {
                if self.counters[s] == least {
                    self.counters[s] += 1;
                }
            }
        }
        self.added += 1;
        if self.added >= self.sample {
            self.halve();
        }
    }

    /// How often `model` was asked for lately (an over-estimate at worst, never under).
    pub fn estimate(&self, model: &str) -> u8 {
        let slots = self.slots(model);
        slots.iter().map(|&s| self.counters[s]).min().unwrap_or(0)
    }

    /// Halves every counter: the ageing step.
    fn halve(&mut self) {
        for counter in &mut self.counters {
            *counter >>= 1;
        }
        self.added /= 2;
        self.halvings += 1;
    }

    /// Halvings so far: a worth computed now, doubled this many times, compares with one
    /// computed before as if every earlier worth had been halved with the counters.
    pub fn halvings(&self) -> u64 {
        self.halvings
    }

    /// Increments between two halvings.
    pub fn sample(&self) -> u64 {
        self.sample
    }

    /// Sets the increments between two halvings (the climber's knob).
    pub fn set_sample(&mut self, sample: u64) {
        self.sample = sample.max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_climber_keeps_going_while_hits_rise_and_turns_back_when_they_fall() {
        let mut climber = WindowClimber::new();
        let period = |climber: &mut WindowClimber, window: u64, misses: u64| {
            climber.missed = misses;
            (0..CLIMB_PERIOD - 1).for_each(|_| assert_eq!(climber.served(window), None));
            climber.served(window).expect("a period ends")
        };
        // First period: a step down (no ratio to compare with yet).
        assert_eq!(period(&mut climber, 50_000, 5_000), 40_000);
        // Fewer misses: keep going down.
        assert_eq!(period(&mut climber, 40_000, 4_000), 32_000);
        // More misses: turn back up.
        assert_eq!(period(&mut climber, 32_000, 6_000), 40_000);
        // Bounded below.
        assert_eq!(period(&mut climber, 2_000, 0), 2_500);
        assert_eq!(period(&mut climber, 2_000, 9_000), MIN_WINDOW);
    }

    #[test]
    fn worth_rises_with_frequency_and_reload_cost_and_falls_with_size() {
        let mut tiny = TinyLfu::new();
        for _ in 0..10 {
            tiny.record("often");
        }
        tiny.record("once");
        let mib = 1u64 << 20;
        let often = tiny.worth("often", 256 * mib, 1.0);
        let once = tiny.worth("once", 256 * mib, 1.0);
        assert!(once < often);
        assert!(tiny.worth("once", 256 * mib, 5.0) > once, "slower to load");
        assert!(tiny.worth("once", 4096 * mib, 1.0) < once, "bigger");
        // A worth ranked after a halving compares as if the older ones had been halved: ten
        // requests then, five now (after the halving) are worth the same.
        for i in 0..START_WINDOW {
            tiny.sketch.increment(&format!("noise-{}", i % 5000));
            if tiny.sketch.halvings() == 1 {
                break;
            }
        }
        assert_eq!(tiny.sketch.estimate("often"), 5);
        assert!((tiny.worth("often", 256 * mib, 1.0) - often).abs() < 1e-9);
    }

    #[test]
    fn counts_saturate_and_halve() {
        let mut sketch = FrequencySketch::new(1024, 15, 1000);
        for _ in 0..40 {
            sketch.increment("hot");
        }
        sketch.increment("once");
        assert_eq!(sketch.estimate("hot"), 15, "4-bit counters saturate at 15");
        assert_eq!(sketch.estimate("once"), 1);
        assert_eq!(sketch.estimate("never"), 0);
        // 41 counted so far; 959 more reach the sample and halve everything.
        for i in 0..959 {
            sketch.increment(&format!("noise-{i}"));
        }
        assert_eq!(sketch.estimate("hot"), 7);
        assert_eq!(sketch.estimate("once"), 0);
    }

    #[test]
    fn distinct_models_rarely_collide() {
        let mut sketch = FrequencySketch::new(4096, 15, u64::MAX);
        for i in 0..1000 {
            sketch.increment(&format!("model-{i}"));
        }
        let overcounted = (0..1000)
            .filter(|i| sketch.estimate(&format!("model-{i}")) > 1)
            .count();
        assert!(overcounted < 10, "{overcounted}");
    }
}
