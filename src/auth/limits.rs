//! Per-tenant limits: a token bucket for requests per second (with burst) and a count of
//! requests in progress. Both are counted per gateway process; with `[cluster]` each
//! replica enforces its share, the configured limit divided by the live replicas (`Share`),
//! so the pool as a whole lets about the configured limit through.
//!
//! The bucket sits behind a `std::sync::Mutex` taken for a few instructions and never across
//! an `.await`; the concurrency limit is a counter whose slot the request holds until its
//! answer has been sent.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How many replicas share each tenant's limits: 1 without `[cluster]`, else the live
/// replicas the registry counts. One per gateway, shared by every generation of the auth
/// state a reload builds, and read once per admitted request (one relaxed load).
#[derive(Debug)]
pub struct Share(AtomicU32);

impl Default for Share {
    fn default() -> Self {
        Self(AtomicU32::new(1))
    }
}

impl Share {
    /// The replicas sharing the limits now (at least 1).
    pub fn replicas(&self) -> u32 {
        self.0.load(Ordering::Relaxed).max(1)
    }

    /// Sets the live replica count (the cluster's registry watch calls this).
    pub fn set_replicas(&self, replicas: u32) {
        self.0.store(replicas.max(1), Ordering::Relaxed);
    }
}

/// Requests per second with a burst.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `rate` per second.
    pub fn new(rate: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// The sustained rate.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Takes one token at `now`, or tells how long until one is there. With `replicas`
    /// sharing the limit, this one refills at `rate / replicas` and holds at most
    /// `burst / replicas` tokens (rounded up, at least 1).
    pub fn take(&self, now: Instant, replicas: u32) -> Result<(), Duration> {
        let share = f64::from(replicas.max(1));
        let (rate, burst) = (self.rate / share, (self.burst / share).ceil().max(1.0));
        let mut state = self.state.lock().expect("bucket lock");
        let (tokens, last) = *state;
        let refilled =
            (tokens + now.saturating_duration_since(last).as_secs_f64() * rate).min(burst);
        if refilled >= 1.0 {
            *state = (refilled - 1.0, now);
            Ok(())
        } else {
            *state = (refilled, now);
            Err(Duration::from_secs_f64((1.0 - refilled) / rate))
        }
    }
}

/// Tokens per minute (the OpenAI endpoints' prompt plus completion): a budget of one
/// minute's tokens, refilled continuously. A request reserves its estimate (prompt plus
/// `max_tokens`) before the call and settles with the real count after, so the budget may
/// run below zero when an answer was longer than reserved; the next requests then wait.
#[derive(Debug)]
pub struct TokenQuota {
    per_minute: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenQuota {
    /// A full minute's budget of `per_minute` tokens.
    pub fn new(per_minute: u64) -> Self {
        let per_minute = per_minute as f64;
        Self {
            per_minute,
            state: Mutex::new((per_minute, Instant::now())),
        }
    }

    /// The limit, per minute.
    pub fn per_minute(&self) -> f64 {
        self.per_minute
    }

    /// Reserves `tokens` at `now` (this replica's share of the budget when `replicas`
    /// share it), or tells how long until they are there. A reservation larger than the
    /// whole budget passes once the budget is full, or it could never pass.
    pub fn reserve(&self, tokens: u64, now: Instant, replicas: u32) -> Result<(), Duration> {
        let budget = self.per_minute / f64::from(replicas.max(1));
        let rate = budget / 60.0;
        let mut state = self.state.lock().expect("quota lock");
        let (left, last) = *state;
        let left = (left + now.saturating_duration_since(last).as_secs_f64() * rate).min(budget);
        let wanted = (tokens as f64).min(budget);
        if left >= wanted {
            *state = (left - tokens as f64, now);
            Ok(())
        } else {
            *state = (left, now);
            Err(Duration::from_secs_f64((wanted - left) / rate))
        }
    }

    /// Gives back what a request reserved and did not use, or takes what it used beyond.
    pub fn settle(&self, reserved: u64, used: u64) {
        let mut state = self.state.lock().expect("quota lock");
        state.0 = (state.0 + reserved as f64 - used as f64).min(self.per_minute);
    }
}

/// Tokens reserved for one request under its tenant's `TokenQuota`, settled with the real
/// count (`settle`); dropped unsettled, the reservation stands as used.
#[derive(Debug)]
pub struct Reservation {
    quota: Arc<TokenQuota>,
    reserved: u64,
}

impl Reservation {
    /// `reserved` tokens taken from `quota`.
    pub fn new(quota: Arc<TokenQuota>, reserved: u64) -> Self {
        Self { quota, reserved }
    }

    /// Settles with the tokens the request used.
    pub fn settle(self, used: u64) {
        self.quota.settle(self.reserved, used);
    }
}

/// Requests in progress at once.
#[derive(Debug)]
pub struct Concurrency {
    limit: u32,
    in_progress: Arc<AtomicU32>,
}

/// A request's place under its tenant's concurrency limit, given back when dropped.
#[derive(Debug)]
pub struct Slot(Arc<AtomicU32>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Concurrency {
    /// At most `limit` at once.
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            in_progress: Arc::new(AtomicU32::new(0)),
        }
    }

    /// This replica's part of the limit when `replicas` share it: rounded up, so every
    /// replica lets at least one request in.
    pub fn share(&self, replicas: u32) -> u32 {
        self.limit.div_ceil(replicas.max(1)).max(1)
    }

    /// A slot, held until dropped, or `None` when this replica's share is taken (never
    /// waits).
    pub fn try_enter(&self, replicas: u32) -> Option<Slot> {
        let share = self.share(replicas);
        self.in_progress
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < share).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.in_progress.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_quota_reserves_then_settles_the_real_count() {
        let quota = Arc::new(TokenQuota::new(60)); // one token a second
        let start = Instant::now();
        assert!(quota.reserve(50, start, 1).is_ok());
        let wait = quota.reserve(20, start, 1).unwrap_err();
        assert!((wait.as_secs_f64() - 10.0).abs() < 1e-6, "{wait:?}");
        Reservation::new(quota.clone(), 50).settle(30); // 20 given back
        assert!(quota.reserve(30, start, 1).is_ok());
        Reservation::new(quota.clone(), 0).settle(5); // an answer longer than reserved
        let wait = quota.reserve(1, start, 1).unwrap_err();
        assert!((wait.as_secs_f64() - 6.0).abs() < 1e-6, "{wait:?}");
        assert!(
            quota
                .reserve(500, start + Duration::from_secs(120), 1)
                .is_ok()
        );
    }

    #[test]
    fn the_bucket_allows_the_burst_then_the_rate() {
        let bucket = TokenBucket::new(2.0, 3);
        let start = Instant::now();
        for _ in 0..3 {
            assert!(bucket.take(start, 1).is_ok());
        }
        let wait = bucket.take(start, 1).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        assert!(bucket.take(start + Duration::from_millis(500), 1).is_ok());
        assert!(bucket.take(start + Duration::from_millis(500), 1).is_err());
        // Never more than the burst, however long idle.
        let later = start + Duration::from_secs(100);
        for _ in 0..3 {
            assert!(bucket.take(later, 1).is_ok());
        }
        assert!(bucket.take(later, 1).is_err());
    }

    #[test]
    fn replicas_sharing_a_bucket_each_get_their_part() {
        let bucket = TokenBucket::new(4.0, 4);
        let start = Instant::now() + Duration::from_secs(10);
        // Two replicas: a burst of 2 and 2 per second each.
        assert!(bucket.take(start, 2).is_ok());
        assert!(bucket.take(start, 2).is_ok());
        let wait = bucket.take(start, 2).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        // Three replicas: 4 / 3 rounds up to a burst of 2.
        let bucket = TokenBucket::new(4.0, 4);
        assert!(bucket.take(start, 3).is_ok());
        assert!(bucket.take(start, 3).is_ok());
        assert!(bucket.take(start, 3).is_err());
    }

    #[test]
    fn concurrency_slots_come_back_when_dropped() {
        let limit = Concurrency::new(2);
        let a = limit.try_enter(1).unwrap();
        let _b = limit.try_enter(1).unwrap();
        assert!(limit.try_enter(1).is_none());
        drop(a);
        assert!(limit.try_enter(1).is_some());
    }

    #[test]
    fn replicas_sharing_a_concurrency_limit_each_take_their_part_rounded_up() {
        let limit = Concurrency::new(3);
        assert_eq!(
            (
                limit.share(1),
                limit.share(2),
                limit.share(3),
                limit.share(5)
            ),
            (3, 2, 1, 1)
        );
        let a = limit.try_enter(2).unwrap();
        let _b = limit.try_enter(2).unwrap();
        assert!(limit.try_enter(2).is_none());
        drop(a);
        assert!(
            limit.try_enter(3).is_none(),
            "two in progress, a share of one"
        );
    }
}
