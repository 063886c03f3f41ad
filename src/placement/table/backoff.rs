//! Failed loads and their backoff: a load that failed on a backend is not tried there again
//! until its pause is over, and a request that finds every candidate backing off is refused
//! with the last failure. Its own file so the planning code reads without the retry rules.

use super::Table;
use crate::error::GatewayError;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A failed load's pause on one backend.
#[derive(Debug)]
pub(super) struct LoadBackoff {
    failures: u32,
    retry_at: Instant,
    reason: Arc<str>,
}

impl Table {
    /// Failed loads still backing off: (model, backend index, failures, retry in, reason).
    pub fn failures(&self, now: Instant) -> Vec<(String, usize, u32, Duration, Arc<str>)> {
        let mut rows: Vec<_> = self
            .failures
            .iter()
            .map(|((model, b), f)| {
                (
                    model.clone(),
                    *b,
                    f.failures,
                    f.retry_at.saturating_duration_since(now),
                    f.reason.clone(),
                )
            })
            .collect();
        rows.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        rows
    }

    /// A model's backoff on backend `b`: failures in a row, time left, the last reason.
    pub fn backoff(&self, model: &str, b: usize) -> Option<(u32, Duration, Arc<str>)> {
        let failure = self.failures.get(&(model.to_string(), b))?;
        let left = failure.retry_at.saturating_duration_since(Instant::now());
        Some((failure.failures, left, failure.reason.clone()))
    }

    /// Takes another replica's backoff from a failed load (`[cluster]`): the later retry
    /// time wins.
    pub fn remote_backoff(
        &mut self,
        model: &str,
        b: usize,
        failures: u32,
        retry_at: Instant,
        reason: &str,
    ) {
        let entry = self
            .failures
            .entry((model.to_string(), b))
            .or_insert(LoadBackoff {
                failures: 0,
                retry_at,
                reason: Arc::from(reason),
            });
        if retry_at >= entry.retry_at {
            entry.retry_at = retry_at;
            entry.failures = entry.failures.max(failures);
            entry.reason = Arc::from(reason);
        }
    }

    /// The backends among `backends` not waiting out a failed load of the model.
    pub(super) fn not_backing_off(
        &self,
        model: &str,
        backends: &[usize],
        now: Instant,
    ) -> Vec<usize> {
        backends
            .iter()
            .copied()
            .filter(|&b| {
                self.failures
                    .get(&(model.to_string(), b))
                    .is_none_or(|f| f.retry_at <= now)
            })
            .collect()
    }

    pub(super) fn refusal_after_failures(
        &self,
        model: &str,
        candidates: &[usize],
        now: Instant,
    ) -> GatewayError {
        let last = candidates
            .iter()
            .filter_map(|&b| self.failures.get(&(model.to_string(), b)))
            .min_by_key(|f| f.retry_at);
        match last {
            Some(failure) => GatewayError::LoadFailed {
                model: model.to_string(),
                reason: failure.reason.to_string(),
                retry_after: failure.retry_at.saturating_duration_since(now),
            },
            None => GatewayError::NoRoom {
                reason: format!("no ready backend can take model '{model}'"),
            },
        }
    }

    pub(super) fn back_off(
        &mut self,
        backend: usize,
        model: &str,
        reason: &Arc<str>,
        now: Instant,
    ) {
        let entry = self
            .failures
            .entry((model.to_string(), backend))
            .or_insert(LoadBackoff {
                failures: 0,
                retry_at: now,
                reason: reason.clone(),
            });
        entry.failures += 1;
        let factor = 1u32 << (entry.failures - 1).min(16);
        let pause = self
            .policy
            .backoff
            .saturating_mul(factor)
            .min(self.policy.backoff_max);
        entry.retry_at = now + pause;
        entry.reason = reason.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::super::Decision;
    use super::super::tests::{MIB, assert_within_capacity, est, model, policy, view};
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failed_loads_back_off_per_backend_and_then_refuse() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB, 100 * MIB], policy(), start);
        let first = match table.decide(&model("bad"), &est(1), &view(2), false, true, start) {
            Decision::Load(plan) => plan.backend,
            other => panic!("{other:?}"),
        };
        table.finish_load(first, "bad", &Err("boom".into()), start);
        let second = match table.decide(&model("bad"), &est(1), &view(2), false, true, start) {
            Decision::Load(plan) => plan.backend,
            other => panic!("{other:?}"),
        };
        assert_ne!(first, second, "retried elsewhere");
        table.finish_load(second, "bad", &Err("boom".into()), start);
        match table.decide(&model("bad"), &est(1), &view(2), false, true, start) {
            Decision::Refuse(GatewayError::LoadFailed {
                reason,
                retry_after,
                ..
            }) => {
                assert_eq!(reason, "boom");
                assert_eq!(retry_after, Duration::from_secs(5));
            }
            other => panic!("{other:?}"),
        }
        // After the pause it is tried again; a second failure doubles the pause.
        let later = start + Duration::from_secs(5);
        let third = match table.decide(&model("bad"), &est(1), &view(2), false, true, later) {
            Decision::Load(plan) => plan.backend,
            other => panic!("{other:?}"),
        };
        table.finish_load(third, "bad", &Err("boom".into()), later);
        let rows = table.failures(later);
        assert!(
            rows.iter()
                .any(|r| r.1 == third && r.2 == 2 && r.3 == Duration::from_secs(10)),
            "{rows:?}"
        );
        assert_within_capacity(&table);
    }
}
