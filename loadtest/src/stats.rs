//! Measurement bookkeeping and the numbers the report is made of:
//! latency percentiles from HDR histograms, throughput per window, window
//! stability, and the "max RPS at p95 target" pick across a sweep.
//!
//! Everything here is plain data and pure functions so that the figures the
//! README quotes can be unit-tested independently of any network.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::outcome::ErrorKind;

/// Highest latency the histograms can hold: one hour, in microseconds.
/// Larger values (impossible with any sane `--timeout`) are clamped.
pub const MAX_TRACKABLE_US: u64 = 3_600_000_000;

/// Creates the latency histogram every window uses: microsecond unit,
/// 3 significant digits (so ±0.1% of any value; exact below 2.048 ms).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_TRACKABLE_US, 3).expect("static histogram bounds are valid")
}

/// What happened during one measurement window (or a whole step, once the
/// windows are merged).
#[derive(Debug, Clone)]
pub struct WindowStats {
    /// Successful inferences completed (closed loop) or scheduled (open loop)
    /// in the window.
    pub ok: u64,
    /// Failed requests, by kind.
    pub errors: BTreeMap<ErrorKind, u64>,
    /// Latency of successful requests, in microseconds.
    pub latency: Histogram<u64>,
}

impl Default for WindowStats {
    fn default() -> Self {
        WindowStats {
            ok: 0,
            errors: BTreeMap::new(),
            latency: new_histogram(),
        }
    }
}

impl WindowStats {
    /// Records one request. Only successes enter the latency histogram: an
    /// error's "latency" (a refused connection, a timeout) would distort it.
    pub fn record(&mut self, latency_us: u64, outcome: Result<(), ErrorKind>) {
        match outcome {
            Ok(()) => {
                self.ok += 1;
                self.latency.saturating_record(latency_us.max(1));
            }
            Err(kind) => *self.errors.entry(kind).or_default() += 1,
        }
    }

    /// Total failed requests.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Adds another window's counts into this one.
    pub fn merge(&mut self, other: &WindowStats) {
        self.ok += other.ok;
        for (k, v) in &other.errors {
            *self.errors.entry(*k).or_default() += v;
        }
        self.latency
            .add(&other.latency)
            .expect("histograms share the same bounds");
    }
}

/// The load applied during one step of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Closed loop: this many requests always in flight, each sent as soon
    /// as the previous one on its worker completes.
    Closed {
        /// Number of concurrent workers.
        concurrency: usize,
    },
    /// Open loop: requests sent on a fixed schedule, whatever the responses.
    Open {
        /// Requests per second.
        rate: f64,
    },
}

impl Load {
    /// Short label for tables and progress lines (`c=16`, `rate=500`).
    pub fn label(&self) -> String {
        match self {
            Load::Closed { concurrency } => format!("c={concurrency}"),
            Load::Open { rate } => format!("rate={}", trim_float(*rate)),
        }
    }
}

fn trim_float(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{}", x as u64)
    } else {
        format!("{x}")
    }
}

/// Raw result of one step: its windows and, for the open loop, how late
/// requests actually went out compared with their schedule.
#[derive(Debug, Clone)]
pub struct StepResult {
    /// The load that was applied.
    pub load: Load,
    /// In-flight / connection cap used for the step.
    pub connections: usize,
    /// Length of each measurement window.
    pub window: Duration,
    /// One entry per measurement window, in order.
    pub windows: Vec<WindowStats>,
    /// Open loop: send lag (actual send minus scheduled time, including any
    /// wait for a free connection slot), in microseconds.
    pub send_lag: Option<Histogram<u64>>,
}

/// Latency percentiles of successful requests, in microseconds
/// (`--json` field `latency_us`). All zero when nothing succeeded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Number of latencies recorded (= successful requests).
    pub count: u64,
    /// Smallest latency.
    pub min: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 95th percentile.
    pub p95: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest latency.
    pub max: u64,
}

impl LatencySummary {
    /// Reads the percentiles off a histogram.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        LatencySummary {
            count: h.len(),
            min: h.min(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

/// One window of a step in the `--json` document (`steps[].windows[]`).
#[derive(Debug, Clone, Serialize)]
pub struct WindowSummary {
    /// Successful inferences per second in this window.
    pub throughput_rps: f64,
    /// Successful requests.
    pub ok: u64,
    /// Failed requests.
    pub errors: u64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 95th percentile latency, microseconds.
    pub p95_us: u64,
    /// 99th percentile latency, microseconds.
    pub p99_us: u64,
}

/// Send-lag percentiles for the open loop (`steps[].send_lag_us`).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LagSummary {
    /// Median lag.
    pub p50: u64,
    /// 99th percentile lag.
    pub p99: u64,
    /// Largest lag.
    pub max: u64,
}

/// Everything reported about one step (`--json` field `steps[]`).
#[derive(Debug, Clone, Serialize)]
pub struct StepSummary {
    /// `c=16` or `rate=500`.
    pub label: String,
    /// Closed loop: number of concurrent workers; `null` for the open loop.
    pub concurrency: Option<usize>,
    /// Open loop: target requests per second; `null` for the closed loop.
    pub rate: Option<f64>,
    /// Cap on requests in flight (= HTTP/1.1 connections in use).
    pub connections: usize,
    /// Measured time: windows × window length, seconds.
    pub measured_s: f64,
    /// `ok + errors`.
    pub requests: u64,
    /// Successful requests.
    pub ok: u64,
    /// Failed requests.
    pub errors: u64,
    /// `errors / requests` (0 when no request).
    pub error_rate: f64,
    /// Failed requests by kind name (`http_503`, `timeout`...).
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Successful inferences per second over the whole measured time.
    pub throughput_rps: f64,
    /// Latency percentiles of successful requests, microseconds.
    pub latency_us: LatencySummary,
    /// Each measurement window.
    pub windows: Vec<WindowSummary>,
    /// Largest deviation of a window's throughput from the mean, in percent
    /// of the mean.
    pub window_spread_pct: f64,
    /// Whether `window_spread_pct` is within `--stability`; `null` with a
    /// single window (nothing to compare).
    pub stable: Option<bool>,
    /// Open loop only: how late requests left compared with the schedule.
    pub send_lag_us: Option<LagSummary>,
}

impl StepSummary {
    /// Summarises a step; `stability` is the allowed spread as a fraction.
    pub fn from_result(r: &StepResult, stability: f64) -> Self {
        let secs = r.window.as_secs_f64();
        let mut total = WindowStats::default();
        let mut windows = Vec::with_capacity(r.windows.len());
        for w in &r.windows {
            total.merge(w);
            windows.push(WindowSummary {
                throughput_rps: if secs > 0.0 { w.ok as f64 / secs } else { 0.0 },
                ok: w.ok,
                errors: w.error_count(),
                p50_us: w.latency.value_at_quantile(0.50),
                p95_us: w.latency.value_at_quantile(0.95),
                p99_us: w.latency.value_at_quantile(0.99),
            });
        }
        let measured_s = secs * r.windows.len() as f64;
        let errors = total.error_count();
        let requests = total.ok + errors;
        let rates: Vec<f64> = windows.iter().map(|w| w.throughput_rps).collect();
        let spread = window_spread(&rates);
        let (concurrency, rate) = match r.load {
            Load::Closed { concurrency } => (Some(concurrency), None),
            Load::Open { rate } => (None, Some(rate)),
        };
        StepSummary {
            label: r.load.label(),
            concurrency,
            rate,
            connections: r.connections,
            measured_s,
            requests,
            ok: total.ok,
            errors,
            error_rate: if requests > 0 {
                errors as f64 / requests as f64
            } else {
                0.0
            },
            errors_by_kind: total.errors.iter().map(|(k, v)| (k.name(), *v)).collect(),
            throughput_rps: if measured_s > 0.0 {
                total.ok as f64 / measured_s
            } else {
                0.0
            },
            latency_us: LatencySummary::from_histogram(&total.latency),
            windows,
            window_spread_pct: spread * 100.0,
            stable: (rates.len() > 1).then_some(spread <= stability + 1e-12),
            send_lag_us: r.send_lag.as_ref().map(|h| LagSummary {
                p50: h.value_at_quantile(0.50),
                p99: h.value_at_quantile(0.99),
                max: h.max(),
            }),
        }
    }
}

/// Largest relative deviation of any value from the mean (0.05 = 5%).
///
/// This is the stability criterion: with `--stability 10%` a step is stable
/// when every window's throughput is within ±10% of the windows' mean.
/// All-zero or empty input has no spread.
pub fn window_spread(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    if mean <= 0.0 {
        return 0.0;
    }
    values
        .iter()
        .map(|v| (v - mean).abs() / mean)
        .fold(0.0, f64::max)
}

/// Picks the step with the highest throughput whose p95 latency is at most
/// `target_us` and whose error rate is at most `max_error_rate`.
///
/// This is the headline "max RPS at p95 target" figure: the most load the
/// server sustains while still meeting a latency objective. Steps that fail
/// too many requests are excluded because fast errors would otherwise make
/// an overloaded server look good. Returns the step's index.
pub fn max_rps_at_p95(steps: &[StepSummary], target_us: u64, max_error_rate: f64) -> Option<usize> {
    steps
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            s.ok > 0 && s.latency_us.p95 <= target_us && s.error_rate <= max_error_rate
        })
        .max_by(|(_, a), (_, b)| a.throughput_rps.total_cmp(&b.throughput_rps))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window_with(latencies: impl IntoIterator<Item = u64>) -> WindowStats {
        let mut w = WindowStats::default();
        for l in latencies {
            w.record(l, Ok(()));
        }
        w
    }

    #[test]
    fn percentiles_from_histogram() {
        let w = window_with(1..=1000);
        let s = LatencySummary::from_histogram(&w.latency);
        assert_eq!(s.count, 1000);
        assert_eq!(s.min, 1);
        assert_eq!(s.p50, 500);
        assert_eq!(s.p90, 900);
        assert_eq!(s.p95, 950);
        assert_eq!(s.p99, 990);
        assert_eq!(s.max, 1000);
        assert!((s.mean - 500.5).abs() < 0.01);
    }

    #[test]
    fn percentiles_keep_three_significant_digits_for_large_values() {
        let w = window_with([1_234_567, 10, 20]);
        let s = LatencySummary::from_histogram(&w.latency);
        let rel = (s.max as f64 - 1_234_567.0).abs() / 1_234_567.0;
        assert!(rel < 0.001, "max {} too far off", s.max);
    }

    #[test]
    fn empty_histogram_gives_zeros() {
        assert_eq!(
            LatencySummary::from_histogram(&new_histogram()),
            LatencySummary::default()
        );
    }

    #[test]
    fn errors_do_not_enter_latency() {
        let mut w = WindowStats::default();
        w.record(100, Ok(()));
        w.record(5_000_000, Err(ErrorKind::Timeout));
        w.record(3, Err(ErrorKind::Status(503)));
        w.record(4, Err(ErrorKind::Status(503)));
        assert_eq!(w.ok, 1);
        assert_eq!(w.error_count(), 3);
        assert_eq!(w.errors[&ErrorKind::Status(503)], 2);
        assert_eq!(w.latency.max(), 100);
        // Out-of-range values are clamped rather than lost.
        w.record(u64::MAX, Ok(()));
        assert_eq!(w.latency.len(), 2);
    }

    #[test]
    fn spread_and_stability() {
        assert_eq!(window_spread(&[]), 0.0);
        assert_eq!(window_spread(&[0.0, 0.0]), 0.0);
        assert_eq!(window_spread(&[100.0, 100.0, 100.0]), 0.0);
        assert!((window_spread(&[90.0, 100.0, 110.0]) - 0.10).abs() < 1e-12);
        assert!((window_spread(&[100.0, 200.0]) - 1.0 / 3.0).abs() < 1e-12);
    }

    fn step(load: Load, windows: Vec<WindowStats>) -> StepResult {
        StepResult {
            load,
            connections: 1,
            window: Duration::from_secs(1),
            windows,
            send_lag: None,
        }
    }

    #[test]
    fn step_summary_merges_windows() {
        let mut w2 = window_with(vec![200; 110]);
        w2.record(0, Err(ErrorKind::Connect));
        let r = step(
            Load::Closed { concurrency: 4 },
            vec![window_with(vec![100; 90]), w2],
        );
        let s = StepSummary::from_result(&r, 0.10);
        assert_eq!(s.label, "c=4");
        assert_eq!(s.concurrency, Some(4));
        assert_eq!(s.rate, None);
        assert_eq!(s.ok, 200);
        assert_eq!(s.errors, 1);
        assert_eq!(s.requests, 201);
        assert_eq!(s.errors_by_kind["connect"], 1);
        assert!((s.throughput_rps - 100.0).abs() < 1e-9);
        assert!((s.windows[0].throughput_rps - 90.0).abs() < 1e-9);
        assert!((s.window_spread_pct - 10.0).abs() < 1e-9);
        assert_eq!(s.stable, Some(true));
        assert_eq!(StepSummary::from_result(&r, 0.05).stable, Some(false));
        assert_eq!(s.latency_us.p50, 200);
        assert_eq!(s.latency_us.min, 100);

        let single = step(Load::Open { rate: 250.0 }, vec![window_with([1])]);
        let s = StepSummary::from_result(&single, 0.10);
        assert_eq!(s.stable, None);
        assert_eq!(s.label, "rate=250");
        assert_eq!(s.rate, Some(250.0));
    }

    fn summary(throughput: f64, p95: u64, error_rate: f64) -> StepSummary {
        StepSummary {
            label: String::new(),
            concurrency: None,
            rate: None,
            connections: 1,
            measured_s: 1.0,
            requests: 100,
            ok: if throughput > 0.0 { 100 } else { 0 },
            errors: 0,
            error_rate,
            errors_by_kind: BTreeMap::new(),
            throughput_rps: throughput,
            latency_us: LatencySummary {
                p95,
                ..Default::default()
            },
            windows: vec![],
            window_spread_pct: 0.0,
            stable: None,
            send_lag_us: None,
        }
    }

    #[test]
    fn max_rps_at_target_picks_fastest_step_within_target() {
        let steps = vec![
            summary(1_000.0, 1_000, 0.0),
            summary(8_000.0, 4_000, 0.0),
            summary(12_000.0, 15_000, 0.0), // too slow
            summary(9_000.0, 9_999, 0.0),
        ];
        assert_eq!(max_rps_at_p95(&steps, 10_000, 0.01), Some(3));
        assert_eq!(max_rps_at_p95(&steps, 5_000, 0.01), Some(1));
        assert_eq!(max_rps_at_p95(&steps, 15_000, 0.01), Some(2));
        assert_eq!(max_rps_at_p95(&steps, 500, 0.01), None);
    }

    #[test]
    fn max_rps_at_target_ignores_failing_and_empty_steps() {
        let steps = vec![
            summary(1_000.0, 1_000, 0.0),
            summary(50_000.0, 100, 0.5), // fast because it fails
            summary(0.0, 0, 0.0),        // nothing succeeded
        ];
        assert_eq!(max_rps_at_p95(&steps, 10_000, 0.01), Some(0));
        assert_eq!(max_rps_at_p95(&steps, 10_000, 1.0), Some(1));
        assert_eq!(max_rps_at_p95(&[], 10_000, 0.01), None);
    }
}
