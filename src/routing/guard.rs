//! Automatic rollback. Every answer of a guarded route is counted per target in a sliding
//! window (time slots of requests, failures and a latency histogram); when a canary's
//! window breaks a limit, the canary is switched off at once and the trip is kept, with its
//! reason, for the admin API. It stays off until the route's config changes (a reload with
//! an unchanged route keeps the same guard, and so the trip).

use crate::config;
use crate::telemetry;
use serde::Serialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Slots a window is cut into: the window slides by a tenth of its length.
const SLOTS: usize = 10;

/// A guard over one route's targets.
#[derive(Debug)]
pub struct Guard {
    limits: config::Guard,
    /// The target canaries are compared with: the highest weight, first on a tie.
    stable: usize,
    off: Vec<AtomicBool>,
    windows: Vec<Mutex<Window>>,
    trips: Mutex<Vec<Trip>>,
}

/// Why a canary was switched off.
#[derive(Clone, Debug, Serialize)]
pub struct Trip {
    /// `model[/version]` of the canary.
    pub target: String,
    /// Which limit: `error_rate` or `p95_ratio`.
    pub reason: &'static str,
    /// The figures, in words.
    pub message: String,
    /// When, in seconds since the Unix epoch.
    pub at_unix: f64,
    /// The replica whose guard tripped, when another replica's trip switched the canary
    /// off here (`[cluster]`); absent for this replica's own trips.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// One target's figures over the window, for the admin API.
#[derive(Clone, Debug, Serialize)]
pub struct Figures {
    /// Answers in the window.
    pub requests: u64,
    /// Of which failed.
    pub failures: u64,
    /// 95th percentile latency, milliseconds (bucketed to within ~6%).
    pub p95_ms: Option<f64>,
}

impl Guard {
    /// A guard over targets with these weights.
    pub fn new(limits: config::Guard, weights: &[u32]) -> Self {
        let stable = (0..weights.len())
            .max_by_key(|&i| (weights[i], std::cmp::Reverse(i)))
            .unwrap_or(0);
        let slot = limits.window.0 / SLOTS as u32;
        Self {
            limits,
            stable,
            off: weights.iter().map(|_| AtomicBool::new(false)).collect(),
            windows: weights
                .iter()
                .map(|_| Mutex::new(Window::new(slot)))
                .collect(),
            trips: Mutex::new(Vec::new()),
        }
    }

    /// Whether the latency rule times a stream to its first token (`latency =
    /// "first_token"`): then a streamed answer is counted when its first event comes.
    pub fn times_first_token(&self) -> bool {
        self.limits.latency == config::GuardLatency::FirstToken
    }

    /// Whether target `i` has been switched off by a trip.
    pub fn is_off(&self, i: usize) -> bool {
        self.off[i].load(Ordering::Relaxed)
    }

    /// Counts one answer of target `i` (labelled `label`) of route `route`; a canary that now
    /// breaks a limit is switched off, and the trip kept, logged and counted. Returns the
    /// trip, if this answer caused one.
    pub fn observe(
        &self,
        route: &str,
        (i, label): (usize, &str),
        failed: bool,
        latency: Duration,
    ) -> Option<Trip> {
        let now = Instant::now();
        self.windows[i]
            .lock()
            .expect("guard window")
            .add(now, failed, latency);
        if i == self.stable || self.is_off(i) {
            return None;
        }
        let (reason, message) = self.broken(i, now)?;
        if self.off[i].swap(true, Ordering::Relaxed) {
            return None;
        }
        let trip = Trip {
            target: label.to_string(),
            reason,
            message,
            at_unix: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            replica: None,
        };
        self.record(route, trip.clone());
        Some(trip)
    }

    /// Switches canary `i` off for a trip another replica's guard made (`trip.replica`),
    /// so the whole pool rolls back together. False when it was off already, or `i` is the
    /// stable target (never switched off). Counted in the rollback metric only where the
    /// guard tripped, so a pool-wide sum counts each rollback once.
    pub fn apply(&self, route: &str, i: usize, trip: Trip) -> bool {
        if i == self.stable || i >= self.off.len() || self.off[i].swap(true, Ordering::Relaxed) {
            return false;
        }
        tracing::warn!(
            route,
            target = trip.target,
            reason = trip.reason,
            replica = trip.replica.as_deref().unwrap_or(""),
            "canary switched off by another replica's guard: {}",
            trip.message
        );
        self.trips.lock().expect("guard trips").push(trip);
        true
    }

    fn record(&self, route: &str, trip: Trip) {
        tracing::warn!(
            route,
            target = trip.target,
            reason = trip.reason,
            "canary switched off: {}",
            trip.message
        );
        metrics::counter!(telemetry::ROUTE_ROLLBACKS,
            "route" => route.to_string(),
            "target" => trip.target.clone(),
            "reason" => trip.reason)
        .increment(1);
        self.trips.lock().expect("guard trips").push(trip);
    }

    /// Every trip so far.
    pub fn trips(&self) -> Vec<Trip> {
        self.trips.lock().expect("guard trips").clone()
    }

    /// Target `i`'s figures over the window.
    pub fn figures(&self, i: usize) -> Figures {
        let merged = self.windows[i]
            .lock()
            .expect("guard window")
            .merged(Instant::now());
        Figures {
            requests: merged.requests,
            failures: merged.failures,
            p95_ms: merged.latency.quantile(0.95).map(|us| us as f64 / 1_000.0),
        }
    }

    /// The limit canary `i` breaks now, if any, with the figures in words.
    fn broken(&self, i: usize, now: Instant) -> Option<(&'static str, String)> {
        let window = self.limits.window;
        // Counts first: merging the latency histograms is only worth it for a p95 limit.
        let (requests, failures) = self.windows[i].lock().expect("guard window").counts(now);
        if requests < self.limits.min_requests {
            return None;
        }
        if let Some(max) = self.limits.max_error_rate {
            let rate = failures as f64 / requests as f64;
            if rate > max {
                return Some((
                    "error_rate",
                    format!(
                        "error rate {rate:.3} ({failures} of {requests} requests in {window}) is above max_error_rate {max}"
                    ),
                ));
            }
        }
        let max = self.limits.max_p95_ratio?;
        let canary = self.windows[i].lock().expect("guard window").merged(now);
        let stable = self.windows[self.stable]
            .lock()
            .expect("guard window")
            .merged(now);
        if stable.requests < self.limits.min_requests {
            return None;
        }
        let (canary_p95, stable_p95) = (
            canary.latency.quantile(0.95)?,
            stable.latency.quantile(0.95)?,
        );
        let ratio = canary_p95 as f64 / stable_p95.max(1) as f64;
        let latency = match self.limits.latency {
            config::GuardLatency::Response => "",
            config::GuardLatency::FirstToken => " time to first token",
        };
        (ratio > max).then(|| {
            (
                "p95_ratio",
                format!(
                    "p95{latency} {:.2} ms is {ratio:.2}x the stable target's {:.2} ms (in {window}), above max_p95_ratio {max}",
                    canary_p95 as f64 / 1e3,
                    stable_p95 as f64 / 1e3
                ),
            )
        })
    }
}

/// A sliding window: `SLOTS` time slots, the oldest reused as time moves on.
#[derive(Debug)]
struct Window {
    origin: Instant,
    slot: Duration,
    slots: Vec<Slot>,
}

#[derive(Debug, Default, Clone)]
struct Slot {
    /// Which slot of time since `origin` this holds.
    epoch: u64,
    requests: u64,
    failures: u64,
    latency: Histogram,
}

impl Window {
    fn new(slot: Duration) -> Self {
        Self {
            origin: Instant::now(),
            slot: slot.max(Duration::from_millis(1)),
            slots: vec![Slot::default(); SLOTS],
        }
    }

    fn epoch(&self, now: Instant) -> u64 {
        (now.duration_since(self.origin).as_nanos() / self.slot.as_nanos()) as u64
    }

    fn add(&mut self, now: Instant, failed: bool, latency: Duration) {
        let epoch = self.epoch(now);
        let slot = &mut self.slots[epoch as usize % SLOTS];
        if slot.epoch != epoch || slot.requests == 0 {
            *slot = Slot {
                epoch,
                ..Slot::default()
            };
        }
        slot.requests += 1;
        slot.failures += u64::from(failed);
        slot.latency.add(latency);
    }

    /// The slots still inside the window, summed. A slot newer than `now` counts: another
    /// thread may have added to it after this caller read the clock (the canary's and the
    /// stable target's windows are locked one after the other, never together).
    fn merged(&self, now: Instant) -> Slot {
        let mut sum = Slot::default();
        for slot in self.live(now) {
            sum.requests += slot.requests;
            sum.failures += slot.failures;
            sum.latency.merge(&slot.latency);
        }
        sum
    }

    /// Requests and failures of the slots still inside the window (`merged` without the
    /// latency, so without allocating).
    fn counts(&self, now: Instant) -> (u64, u64) {
        self.live(now).fold((0, 0), |(r, f), slot| {
            (r + slot.requests, f + slot.failures)
        })
    }

    fn live(&self, now: Instant) -> impl Iterator<Item = &Slot> {
        let epoch = self.epoch(now);
        self.slots.iter().filter(move |slot| {
            slot.requests > 0 && epoch.saturating_sub(slot.epoch) < SLOTS as u64
        })
    }
}

/// Latency in microseconds, log-linear buckets: 8 per power of two, so a quantile is known
/// to within about 6%, in 4 KiB whatever the range.
#[derive(Debug, Clone)]
struct Histogram(Vec<u64>);

const SUB: u64 = 8;
const BUCKETS: usize = 62 * SUB as usize;

impl Default for Histogram {
    fn default() -> Self {
        Self(vec![0; BUCKETS])
    }
}

impl Histogram {
    fn add(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.0[bucket(us)] += 1;
    }

    fn merge(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a += b;
        }
    }

    /// The middle of the bucket holding quantile `q`, in microseconds.
    fn quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.0.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        let i = self.0.iter().position(|&n| {
            seen += n;
            seen >= rank
        })?;
        let (low, high) = bounds(i);
        Some(low + (high - low) / 2)
    }
}

fn bucket(us: u64) -> usize {
    if us < SUB {
        return us as usize;
    }
    let exp = u64::from(63 - us.leading_zeros());
    let sub = (us >> (exp - 3)) & (SUB - 1);
    (((exp - 2) * SUB + sub) as usize).min(BUCKETS - 1)
}

/// `[low, high)` of bucket `i`, in microseconds.
fn bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < SUB {
        return (i, i + 1);
    }
    let (exp, sub) = (i / SUB + 2, i % SUB);
    ((SUB + sub) << (exp - 3), (SUB + sub + 1) << (exp - 3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: Option<f64>, ratio: Option<f64>) -> config::Guard {
        config::Guard {
            max_error_rate: rate,
            max_p95_ratio: ratio,
            latency: config::GuardLatency::Response,
            window: config::HumanDuration(Duration::from_secs(60)),
            min_requests: 20,
        }
    }

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut last = 0;
        for us in (0..100_000).chain([u64::MAX / 2, u64::MAX]) {
            let b = bucket(us);
            assert!(b >= last, "{us}");
            last = b;
            let (low, high) = bounds(b);
            assert!(
                (low..high).contains(&us) || b == BUCKETS - 1,
                "{us} in {low}..{high}"
            );
        }
    }

    #[test]
    fn quantiles_are_close() {
        let mut h = Histogram::default();
        for ms in 1..=100 {
            h.add(Duration::from_millis(ms));
        }
        let p95 = h.quantile(0.95).unwrap() as f64;
        assert!((p95 / 95_000.0 - 1.0).abs() < 0.07, "{p95}");
    }

    #[test]
    fn a_failing_canary_trips_after_min_requests_and_the_stable_never_does() {
        let guard = Guard::new(limits(Some(0.1), None), &[90, 10]);
        for _ in 0..50 {
            assert!(
                guard
                    .observe("r", (0, "t"), true, Duration::from_millis(1))
                    .is_none()
            );
        }
        assert!(!guard.is_off(0), "the stable target is never switched off");
        for n in 1..20 {
            assert!(
                guard
                    .observe("r", (1, "t"), true, Duration::from_millis(1))
                    .is_none(),
                "{n}"
            );
        }
        let trip = guard
            .observe("r", (1, "t"), true, Duration::from_millis(1))
            .unwrap();
        assert_eq!(trip.reason, "error_rate");
        assert!(trip.message.contains("20 of 20"), "{}", trip.message);
        assert!(guard.is_off(1));
        assert!(
            guard
                .observe("r", (1, "t"), true, Duration::from_millis(1))
                .is_none()
        );
    }

    #[test]
    fn a_slow_canary_trips_on_the_p95_ratio() {
        let guard = Guard::new(limits(None, Some(2.0)), &[50, 50]);
        for _ in 0..30 {
            guard.observe("r", (0, "t"), false, Duration::from_millis(10));
        }
        for _ in 0..19 {
            assert!(
                guard
                    .observe("r", (1, "t"), false, Duration::from_millis(15))
                    .is_none()
            );
        }
        assert!(
            guard
                .observe("r", (1, "t"), false, Duration::from_millis(15))
                .is_none()
        );
        let tripped =
            (0..10).find_map(|_| guard.observe("r", (1, "t"), false, Duration::from_millis(80)));
        assert_eq!(tripped.unwrap().reason, "p95_ratio");
        assert_eq!(guard.figures(0).requests, 30);
    }

    #[test]
    fn a_first_token_guard_says_which_latency_tripped_it() {
        let mut limits = limits(None, Some(2.0));
        limits.latency = config::GuardLatency::FirstToken;
        limits.min_requests = 1;
        let guard = Guard::new(limits, &[50, 50]);
        assert!(guard.times_first_token());
        guard.observe("r", (0, "t"), false, Duration::from_millis(10));
        let trip = guard
            .observe("r", (1, "t"), false, Duration::from_millis(100))
            .unwrap();
        assert!(
            trip.message.starts_with("p95 time to first token 10"),
            "{}",
            trip.message
        );
    }

    #[test]
    fn old_slots_leave_the_window() {
        let mut window = Window::new(Duration::from_millis(10));
        let start = window.origin;
        window.add(start, true, Duration::from_millis(1));
        assert_eq!(window.merged(start).failures, 1);
        assert_eq!(window.merged(start + Duration::from_millis(95)).requests, 1);
        assert_eq!(
            window.merged(start + Duration::from_millis(105)).requests,
            0
        );
        window.add(
            start + Duration::from_millis(105),
            false,
            Duration::from_millis(1),
        );
        let merged = window.merged(start + Duration::from_millis(105));
        assert_eq!((merged.requests, merged.failures), (1, 0));
    }

    #[test]
    fn a_slot_newer_than_the_clock_read_still_counts() {
        let mut window = Window::new(Duration::from_millis(10));
        let start = window.origin;
        window.add(
            start + Duration::from_millis(25),
            true,
            Duration::from_millis(1),
        );
        // Read before that slot began: what a thread that took `now` just before another
        // thread added sees.
        let merged = window.merged(start + Duration::from_millis(5));
        assert_eq!((merged.requests, merged.failures), (1, 1));
    }

    #[test]
    fn threads_observing_at_once_never_break_the_guard() {
        // 1 ms slots (a 10 ms window), so slot boundaries pass while threads race: each
        // reads the clock, then locks the canary's window and the stable target's.
        let mut limits = limits(Some(0.99), Some(1_000.0));
        limits.window = config::HumanDuration(Duration::from_millis(10));
        limits.min_requests = 1;
        let guard = std::sync::Arc::new(Guard::new(limits, &[50, 50]));
        let deadline = Instant::now() + Duration::from_millis(300);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let guard = guard.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        guard.observe("r", (t % 2, "t"), false, Duration::from_micros(n % 50));
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let observed: u64 = threads
            .into_iter()
            .map(|t| t.join().expect("no thread panicked"))
            .sum();
        assert!(observed > 1_000, "{observed}");
        assert!(!guard.is_off(1), "nothing failed and latencies match");
        assert!(guard.trips().is_empty());
    }
}
