//! When a backend takes traffic, Envoy-style: active health checks with thresholds, and
//! outlier detection on real requests.
//!
//! - A backend is taken out after `upstream.unhealthy_threshold` failed checks in a row, not
//!   one: a single slow answer on a busy machine is not an outage. It comes back after
//!   `upstream.healthy_threshold` good ones, so a flapping backend does not flap traffic. A
//!   backend that never passed a check (start-up) comes in on its first good one, as Envoy's
//!   do, so a pool starts serving at once.
//! - Requests are the best health signal: `upstream.eject_after_failures` failures in a row on
//!   traffic (a connection reset or timed out, a 502/503/504) eject the backend until its
//!   next good check, as Envoy's `successful_active_health_check_uneject_host` does. A
//!   connection refused ejects it at once: nothing listens there.
//!
//! The state is plain data; `Backend` keeps it behind a lock and mirrors "ready" in an atomic
//! for the request path.

/// The `[upstream]` thresholds.
#[derive(Clone, Copy, Debug)]
pub(super) struct Thresholds {
    pub unhealthy: u32,
    pub healthy: u32,
    pub failed_requests: u32,
}

/// Why a backend was taken out: the `reason` label of `infergate_backend_ejections_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ejection {
    /// `upstream.unhealthy_threshold` failed health checks in a row.
    HealthCheck,
    /// `upstream.eject_after_failures` failed requests in a row, or a refused connection.
    Requests,
}

impl Ejection {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HealthCheck => "health_check",
            Self::Requests => "requests",
        }
    }
}

/// A backend's health as its checks and its traffic have shown it.
#[derive(Debug, Default)]
pub(super) struct HealthState {
    /// The checks count it healthy.
    checked_in: bool,
    /// It passed a check at least once: later returns need `healthy` good checks.
    ever_in: bool,
    failed_checks: u32,
    good_checks: u32,
    /// Ejected by its traffic, until its next good check.
    ejected: bool,
}

impl HealthState {
    /// Whether it takes traffic.
    pub fn ready(&self) -> bool {
        self.checked_in && !self.ejected
    }

    /// A good check: ends an ejection by traffic, and counts towards coming back.
    pub fn check_passed(&mut self, thresholds: Thresholds) {
        self.failed_checks = 0;
        self.ejected = false;
        if self.checked_in {
            return;
        }
        self.good_checks += 1;
        if !self.ever_in || self.good_checks >= thresholds.healthy {
            self.checked_in = true;
            self.ever_in = true;
            self.good_checks = 0;
        }
    }

    /// A failed check; `Some` when this one takes the backend out.
    pub fn check_failed(&mut self, thresholds: Thresholds) -> Option<Ejection> {
        self.good_checks = 0;
        self.failed_checks = self.failed_checks.saturating_add(1);
        let out = self.checked_in && self.failed_checks >= thresholds.unhealthy;
        if out {
            self.checked_in = false;
        }
        (out && !self.ejected).then_some(Ejection::HealthCheck)
    }

    /// Traffic's streak of failures reached the threshold; `Some` when this takes the
    /// backend out.
    pub fn eject(&mut self) -> Option<Ejection> {
        let was_ready = self.ready();
        self.ejected = true;
        was_ready.then_some(Ejection::Requests)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THRESHOLDS: Thresholds = Thresholds {
        unhealthy: 3,
        healthy: 2,
        failed_requests: 3,
    };

    #[test]
    fn a_backend_comes_in_on_its_first_good_check_and_goes_after_the_threshold() {
        let mut state = HealthState::default();
        assert!(!state.ready());
        assert_eq!(state.check_failed(THRESHOLDS), None);
        state.check_passed(THRESHOLDS);
        assert!(state.ready(), "start-up needs one good check");
        assert_eq!(state.check_failed(THRESHOLDS), None);
        assert_eq!(state.check_failed(THRESHOLDS), None);
        assert!(state.ready(), "two failed checks are not three");
        state.check_passed(THRESHOLDS);
        assert_eq!(state.check_failed(THRESHOLDS), None);
        assert_eq!(state.check_failed(THRESHOLDS), None);
        assert!(state.ready(), "a good check starts the count again");
        assert_eq!(state.check_failed(THRESHOLDS), Some(Ejection::HealthCheck));
        assert!(!state.ready());
        assert_eq!(state.check_failed(THRESHOLDS), None, "counted once");
    }

    #[test]
    fn a_backend_taken_out_comes_back_after_healthy_threshold_good_checks_in_a_row() {
        let mut state = HealthState::default();
        state.check_passed(THRESHOLDS);
        for _ in 0..3 {
            state.check_failed(THRESHOLDS);
        }
        state.check_passed(THRESHOLDS);
        assert!(!state.ready(), "one good check is not two");
        state.check_failed(THRESHOLDS);
        state.check_passed(THRESHOLDS);
        assert!(!state.ready(), "a failure between them starts again");
        state.check_passed(THRESHOLDS);
        assert!(state.ready());
    }

    #[test]
    fn traffic_ejects_until_the_next_good_check_and_counts_once() {
        let mut state = HealthState::default();
        state.check_passed(THRESHOLDS);
        assert_eq!(state.eject(), Some(Ejection::Requests));
        assert!(!state.ready());
        assert_eq!(state.eject(), None);
        state.check_passed(THRESHOLDS);
        assert!(state.ready(), "uneject on a good check");
    }
}
