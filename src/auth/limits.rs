//! Per-tenant limits: a token bucket for requests per second (with burst) and a count of
//! requests in progress. Both are per gateway process: N replicas let a tenant N times the
//! rate through.
//!
//! The bucket sits behind a `std::sync::Mutex` taken for a few instructions and never across
//! an `.await`; the concurrency limit is a semaphore whose permit the request holds until its
//! answer has been sent.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

    /// Takes one token at `now`, or tells how long until one is there.
    pub fn take(&self, now: Instant) -> Result<(), Duration> {
        let mut state = self.state.lock().expect("bucket lock");
        let (tokens, last) = *state;
        let refilled = (tokens + now.saturating_duration_since(last).as_secs_f64() * self.rate)
            .min(self.burst);
        if refilled >= 1.0 {
            *state = (refilled - 1.0, now);
            Ok(())
        } else {
            *state = (refilled, now);
            Err(Duration::from_secs_f64((1.0 - refilled) / self.rate))
        }
    }
}

/// Requests in progress at once.
#[derive(Debug)]
pub struct Concurrency {
    limit: u32,
    slots: Arc<Semaphore>,
}

impl Concurrency {
    /// At most `limit` at once.
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            slots: Arc::new(Semaphore::new(limit as usize)),
        }
    }

    /// The limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// A slot, held until dropped, or `None` when all are taken (never waits).
    pub fn try_enter(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_the_burst_then_the_rate() {
        let bucket = TokenBucket::new(2.0, 3);
        let start = Instant::now();
        for _ in 0..3 {
            assert!(bucket.take(start).is_ok());
        }
        let wait = bucket.take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        assert!(bucket.take(start + Duration::from_millis(500)).is_ok());
        assert!(bucket.take(start + Duration::from_millis(500)).is_err());
        // Never more than the burst, however long idle.
        let later = start + Duration::from_secs(100);
        for _ in 0..3 {
            assert!(bucket.take(later).is_ok());
        }
        assert!(bucket.take(later).is_err());
    }

    #[test]
    fn concurrency_slots_come_back_when_dropped() {
        let limit = Concurrency::new(2);
        let a = limit.try_enter().unwrap();
        let _b = limit.try_enter().unwrap();
        assert!(limit.try_enter().is_none());
        drop(a);
        assert!(limit.try_enter().is_some());
    }
}
