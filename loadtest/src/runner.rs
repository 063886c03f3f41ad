//! Drives one step of load through a [`Transport`] and collects the samples.
//!
//! Two load shapes:
//! - closed loop (`--concurrency`): N workers, each sending its next request
//!   as soon as the previous one completes. Latency runs from the moment the
//!   worker starts a request; a sample belongs to the window it completes in.
//! - open loop (`--rate`): requests leave on a fixed schedule whatever the
//!   server does. Latency runs from the *scheduled* send time, so a stalled
//!   server shows up as latency instead of as fewer, fast samples
//!   (coordinated omission). A sample belongs to the window it was
//!   scheduled in, and the step waits for in-flight requests (at most
//!   `--timeout`) so that slow answers are not silently dropped.
//!
//! Workers send their samples over a channel to one collector task, which
//! owns the histograms (no locks on the hot path) and prints the
//! once-a-second progress line.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio::time::{Instant, timeout_at};

use crate::outcome::ErrorKind;
use crate::sequence::{SequenceRequest, Sequences};
use crate::stats::{Load, StepResult, WindowStats, new_histogram};
use crate::transport::Transport;
use crate::units::fmt_duration;

/// Timing of every step: warmup, then `windows` windows of `window` each.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Load applied before measuring, to open connections and warm caches.
    pub warmup: Duration,
    /// Length of one measurement window (`--duration`).
    pub window: Duration,
    /// Number of measurement windows (`--windows`).
    pub windows: usize,
    /// Per-request deadline, counted from the intended send time.
    pub timeout: Duration,
}

/// One step of a run: the load and the in-flight cap.
#[derive(Debug, Clone, Copy)]
pub struct StepConfig {
    /// Closed loop at a concurrency, or open loop at a rate.
    pub load: Load,
    /// Maximum requests in flight, which is also the number of HTTP/1.1
    /// connections the pool can have busy at once (`--connections`).
    pub connections: usize,
    /// Sequence mode (closed loop): each worker runs these sequences back to back.
    pub sequences: Option<Sequences>,
}

/// Where progress lines go (stderr), and whether to print them at all.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Print the once-a-second progress line.
    pub enabled: bool,
    /// Prefix, e.g. `[2/3 c=16]`.
    pub prefix: String,
}

/// One finished request, as sent from a worker to the collector.
struct Sample {
    /// Completion time (closed loop) or scheduled time (open loop): decides
    /// the window the sample belongs to.
    at: Instant,
    latency_us: u64,
    /// Open loop: how late the request actually went out.
    lag_us: Option<u64>,
    outcome: Result<(), ErrorKind>,
}

#[derive(Clone, Copy)]
struct Phases {
    start: Instant,
    measure_start: Instant,
    end: Instant,
    window: Duration,
    windows: usize,
}

impl Phases {
    /// Index of the measurement window containing `at`, or `None` during
    /// warmup or after the end.
    fn window_of(&self, at: Instant) -> Option<usize> {
        if at < self.measure_start || at >= self.end {
            return None;
        }
        let idx = (at - self.measure_start).as_nanos() / self.window.as_nanos().max(1);
        let idx = idx as usize;
        (idx < self.windows).then_some(idx)
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

/// Runs one step to completion and returns its raw measurements.
///
/// `transport` should be fresh for the step (its own connection pool), so
/// the warmup of each step opens that step's connections.
pub async fn run_step<T: Transport>(
    transport: Arc<T>,
    step: StepConfig,
    timing: Timing,
    progress: Progress,
) -> StepResult {
    let start = Instant::now();
    let measure_start = start + timing.warmup;
    let phases = Phases {
        start,
        measure_start,
        end: measure_start + timing.window * timing.windows as u32,
        window: timing.window,
        windows: timing.windows,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let open = matches!(step.load, Load::Open { .. });
    let collector = tokio::spawn(collect(rx, phases, open, progress));

    match step.load {
        Load::Closed { concurrency } => {
            // A semaphore only when the connection cap is below the number of
            // workers; otherwise it would be pure overhead.
            let sem = (step.connections < concurrency)
                .then(|| Arc::new(Semaphore::new(step.connections.max(1))));
            let mut workers = Vec::with_capacity(concurrency);
            for id in 0..concurrency {
                workers.push(tokio::spawn(closed_worker(
                    transport.clone(),
                    tx.clone(),
                    sem.clone(),
                    phases.end,
                    timing.timeout,
                    (id as u64, concurrency as u64),
                    step.sequences,
                )));
            }
            drop(tx);
            for w in workers {
                let _ = w.await;
            }
        }
        Load::Open { rate } => {
            let sem = Arc::new(Semaphore::new(step.connections.max(1)));
            let handle = tokio::runtime::Handle::current();
            let dispatcher = tokio::task::spawn_blocking(move || {
                open_dispatcher(handle, transport, tx, sem, rate, phases, timing.timeout)
            });
            let _ = dispatcher.await;
        }
    }
    let (windows, lag) = collector.await.expect("collector task panicked");
    StepResult {
        load: step.load,
        connections: step.connections,
        window: timing.window,
        windows,
        send_lag: open.then_some(lag),
    }
}

/// One closed-loop worker. Worker `first_seq` of `stride` sends request numbers (or in
/// sequence mode, runs sequence numbers) `first_seq`, `first_seq + stride`, ...
async fn closed_worker<T: Transport>(
    transport: Arc<T>,
    tx: mpsc::UnboundedSender<Sample>,
    sem: Option<Arc<Semaphore>>,
    end: Instant,
    timeout: Duration,
    (first_seq, stride): (u64, u64),
    sequences: Option<Sequences>,
) {
    let mut seq = first_seq;
    // Sequence mode: the rest of the sequence under way.
    let mut pending: std::vec::IntoIter<SequenceRequest> = Vec::new().into_iter();
    loop {
        let started = Instant::now();
        if started >= end {
            break;
        }
        let in_sequence = match sequences {
            Some(plan) => {
                if pending.len() == 0 {
                    pending = plan.requests(seq).collect::<Vec<_>>().into_iter();
                    seq += stride;
                }
                pending.next()
            }
            None => None,
        };
        // One timer per request: the request's own deadline, or the end of
        // the step if that comes first (then the request is abandoned, not
        // counted: it belongs to no window).
        let req_deadline = started + timeout;
        let deadline = req_deadline.min(end);
        let fut = async {
            let _permit = match &sem {
                Some(s) => Some(s.acquire().await.expect("semaphore is never closed")),
                None => None,
            };
            match &in_sequence {
                Some(request) => transport.infer_sequence(request).await,
                None => transport.infer(seq).await,
            }
        };
        let outcome = match timeout_at(deadline, fut).await {
            Ok(r) => r,
            Err(_) if req_deadline > end => break,
            Err(_) => Err(ErrorKind::Timeout),
        };
        let done = Instant::now();
        let sample = Sample {
            at: done,
            latency_us: micros(done - started),
            lag_us: None,
            outcome,
        };
        if tx.send(sample).is_err() {
            break;
        }
        if in_sequence.is_none() {
            seq += stride;
        }
    }
    close_sequence(&*transport, pending, timeout).await;
}

/// A sequence cut short by the end of the step still gets its `sequence_end` (its next
/// request, flagged last, not counted): a server holds a sequence's slot until it ends or
/// idles out (`max_sequence_idle_microseconds`), and left open, the next step's or the next
/// run's sequences would wait behind it.
async fn close_sequence<T: Transport>(
    transport: &T,
    mut rest: std::vec::IntoIter<SequenceRequest>,
    timeout: Duration,
) {
    let Some(mut last) = rest.next() else {
        return;
    };
    last.end = true;
    let _ = tokio::time::timeout(timeout, transport.infer_sequence(&last)).await;
}

/// Below this much time to go, the dispatcher yields instead of sleeping:
/// a sleep costs a few microseconds of syscall and wake-up by itself.
const SPIN_BELOW: Duration = Duration::from_micros(10);

/// Asks Linux to wake this thread's sleeps on time. The default timer
/// slack (50 µs) lets the kernel delay wake-ups to batch them, which would
/// show up as open-loop latency. Best effort: ignored where unsupported.
fn tighten_timer_slack() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and only affects the
    // calling thread's timer slack; no memory is passed.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// The open-loop schedule, run on a dedicated (blocking-pool) thread.
///
/// tokio's timer has millisecond granularity and rounds deadlines up, which
/// would send every request up to 1 ms late, and since open-loop latency
/// counts from the scheduled time, add that to every measurement. A thread
/// sleeping with `std::thread::sleep` and yielding for the last few tens of
/// microseconds, with a 1 ns timer slack, keeps sends within microseconds of
/// the schedule.
fn open_dispatcher<T: Transport>(
    handle: tokio::runtime::Handle,
    transport: Arc<T>,
    tx: mpsc::UnboundedSender<Sample>,
    sem: Arc<Semaphore>,
    rate: f64,
    phases: Phases,
    timeout: Duration,
) {
    tighten_timer_slack();
    let start = phases.start.into_std();
    let end = phases.end.into_std();
    let interval = 1.0 / rate;
    let mut i: u64 = 0;
    loop {
        // Computed from the start each time, so rounding never drifts.
        let scheduled = start + Duration::from_secs_f64(i as f64 * interval);
        if scheduled >= end {
            break;
        }
        loop {
            let now = std::time::Instant::now();
            if now >= scheduled {
                break;
            }
            let remaining = scheduled - now;
            if remaining > SPIN_BELOW {
                std::thread::sleep(remaining - SPIN_BELOW);
            } else {
                std::thread::yield_now();
            }
        }
        // When the thread wakes late, every overdue request is sent at once
        // with its original scheduled time: latency still counts from there.
        handle.spawn(open_request(
            transport.clone(),
            tx.clone(),
            sem.clone(),
            Instant::from_std(scheduled),
            timeout,
            i,
        ));
        i += 1;
    }
}

async fn open_request<T: Transport>(
    transport: Arc<T>,
    tx: mpsc::UnboundedSender<Sample>,
    sem: Arc<Semaphore>,
    scheduled: Instant,
    timeout: Duration,
    seq: u64,
) {
    let mut sent_at: Option<Instant> = None;
    let result = timeout_at(scheduled + timeout, async {
        let _permit = sem.acquire().await.expect("semaphore is never closed");
        sent_at = Some(Instant::now());
        transport.infer(seq).await
    })
    .await;
    let outcome = match result {
        Ok(r) => r,
        Err(_) if sent_at.is_none() => Err(ErrorKind::NoConnectionSlot),
        Err(_) => Err(ErrorKind::Timeout),
    };
    let done = Instant::now();
    let _ = tx.send(Sample {
        at: scheduled,
        latency_us: micros(done - scheduled),
        lag_us: sent_at.map(|s| micros(s - scheduled)),
        outcome,
    });
}

async fn collect(
    mut rx: mpsc::UnboundedReceiver<Sample>,
    phases: Phases,
    open: bool,
    progress: Progress,
) -> (Vec<WindowStats>, hdrhistogram::Histogram<u64>) {
    let mut windows = vec![WindowStats::default(); phases.windows];
    let mut lag = new_histogram();
    let tty = std::io::stderr().is_terminal();
    let mut tick = tokio::time::interval_at(
        phases.start + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (mut ok, mut err, mut ok_last) = (0u64, 0u64, 0u64);
    let mut last_tick = phases.start;
    let mut buf = Vec::with_capacity(256);
    let mut printed = false;
    loop {
        tokio::select! {
            biased;
            n = rx.recv_many(&mut buf, 256) => {
                if n == 0 {
                    break;
                }
                for s in buf.drain(..) {
                    if s.outcome.is_ok() { ok += 1 } else { err += 1 }
                    if let Some(idx) = phases.window_of(s.at) {
                        windows[idx].record(s.latency_us, s.outcome);
                        if let Some(l) = s.lag_us {
                            lag.saturating_record(l.max(1));
                        }
                    }
                }
            }
            _ = tick.tick(), if progress.enabled => {
                let now = Instant::now();
                let secs = (now - last_tick).as_secs_f64().max(1e-9);
                let rate = (ok - ok_last) as f64 / secs;
                ok_last = ok;
                last_tick = now;
                let phase = phase_at(now, &phases, open);
                let line = format!(
                    "{} {phase} | ok {ok} err {err} | {rate:.0} infer/s",
                    progress.prefix
                );
                show_progress(&line, tty);
                printed = true;
            }
        }
    }
    if printed && tty {
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[2K");
        let _ = e.flush();
    }
    (windows, lag)
}

/// Where the run is at `now`, for the progress line: warm-up, which window, or the
/// wait for the last answers.
fn phase_at(now: Instant, phases: &Phases, open: bool) -> String {
    if now < phases.measure_start {
        format!(
            "warmup {}/{}",
            fmt_duration(round_s(now - phases.start)),
            fmt_duration(phases.measure_start - phases.start)
        )
    } else if now < phases.end {
        let idx = phases.window_of(now).unwrap_or(phases.windows - 1);
        format!(
            "window {}/{} {}/{}",
            idx + 1,
            phases.windows,
            fmt_duration(round_s(now - phases.measure_start)),
            fmt_duration(phases.end - phases.measure_start)
        )
    } else if open {
        "waiting for in-flight requests".to_string()
    } else {
        "finishing".to_string()
    }
}

/// Writes a progress line: redrawn in place on a terminal, one line each otherwise, so a
/// log file gets no control characters.
fn show_progress(line: &str, tty: bool) {
    let mut e = std::io::stderr().lock();
    if tty {
        let _ = write!(e, "\r\x1b[2K{line}");
    } else {
        let _ = writeln!(e, "{line}");
    }
    let _ = e.flush();
}

fn round_s(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs_f64().round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A transport that answers after a fixed delay and fails every
    /// `fail_every`-th request, to test the runner without a network.
    struct FakeTransport {
        delay: Duration,
        fail_every: u64,
        calls: AtomicU64,
        sequence_log: std::sync::Mutex<Vec<(crate::sequence::SequenceId, bool, bool)>>,
    }

    impl Transport for FakeTransport {
        async fn infer_sequence(&self, request: &SequenceRequest) -> Result<(), ErrorKind> {
            self.sequence_log.lock().unwrap().push((
                request.id.clone(),
                request.start,
                request.end,
            ));
            self.infer(0).await
        }

        async fn infer(&self, _seq: u64) -> Result<(), ErrorKind> {
            let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
            tokio::time::sleep(self.delay).await;
            if self.fail_every > 0 && (n / self.fail_every) * self.fail_every == n {
                Err(ErrorKind::Status(500))
            } else {
                Ok(())
            }
        }
    }

    fn timing(windows: usize) -> Timing {
        Timing {
            warmup: Duration::from_millis(100),
            window: Duration::from_millis(200),
            windows,
            timeout: Duration::from_millis(500),
        }
    }

    fn quiet() -> Progress {
        Progress {
            enabled: false,
            prefix: String::new(),
        }
    }

    #[test]
    fn window_assignment() {
        let start = Instant::now();
        let p = Phases {
            start,
            measure_start: start + Duration::from_secs(1),
            end: start + Duration::from_secs(4),
            window: Duration::from_secs(1),
            windows: 3,
        };
        assert_eq!(p.window_of(start), None);
        assert_eq!(p.window_of(start + Duration::from_millis(999)), None);
        assert_eq!(p.window_of(start + Duration::from_secs(1)), Some(0));
        assert_eq!(p.window_of(start + Duration::from_millis(2500)), Some(1));
        assert_eq!(p.window_of(start + Duration::from_millis(3999)), Some(2));
        assert_eq!(p.window_of(start + Duration::from_secs(4)), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closed_loop_counts_successes_and_errors() {
        let t = Arc::new(FakeTransport {
            delay: Duration::from_millis(2),
            fail_every: 10,
            calls: AtomicU64::new(0),
            sequence_log: Default::default(),
        });
        let step = StepConfig {
            load: Load::Closed { concurrency: 4 },
            connections: 4,
            sequences: None,
        };
        let r = run_step(t, step, timing(2), quiet()).await;
        assert_eq!(r.windows.len(), 2);
        assert!(r.send_lag.is_none());
        for w in &r.windows {
            // 4 workers × ~200ms / ~2ms ≈ 400 requests per window; allow
            // plenty of slack for a loaded test machine.
            assert!(w.ok > 50, "only {} ok", w.ok);
            assert!(w.errors[&ErrorKind::Status(500)] > 0);
            assert!(w.latency.value_at_quantile(0.5) >= 2_000);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connection_cap_limits_closed_loop_throughput() {
        let mk = || {
            Arc::new(FakeTransport {
                delay: Duration::from_millis(10),
                fail_every: 0,
                calls: AtomicU64::new(0),
                sequence_log: Default::default(),
            })
        };
        let full = run_step(
            mk(),
            StepConfig {
                load: Load::Closed { concurrency: 8 },
                connections: 8,
                sequences: None,
            },
            timing(1),
            quiet(),
        )
        .await;
        let capped = run_step(
            mk(),
            StepConfig {
                load: Load::Closed { concurrency: 8 },
                connections: 1,
                sequences: None,
            },
            timing(1),
            quiet(),
        )
        .await;
        // 1 in flight at 10ms each → at most ~20 per 200ms window.
        assert!(
            capped.windows[0].ok <= 22,
            "capped ok {}",
            capped.windows[0].ok
        );
        assert!(full.windows[0].ok > capped.windows[0].ok * 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn open_loop_follows_the_schedule() {
        let t = Arc::new(FakeTransport {
            delay: Duration::from_millis(1),
            fail_every: 0,
            calls: AtomicU64::new(0),
            sequence_log: Default::default(),
        });
        let step = StepConfig {
            load: Load::Open { rate: 500.0 },
            connections: 64,
            sequences: None,
        };
        let r = run_step(t.clone(), step, timing(2), quiet()).await;
        // 500/s × 200ms = 100 scheduled per window, all answered.
        for w in &r.windows {
            assert_eq!(w.ok, 100, "window ok {}", w.ok);
            assert_eq!(w.error_count(), 0);
        }
        // Warmup (50) + 2 windows (200) requests were sent in total.
        assert_eq!(t.calls.load(Ordering::Relaxed), 250);
        assert!(r.send_lag.unwrap().len() == 200);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn open_loop_measures_from_schedule_when_server_stalls() {
        // One connection slot and 20ms service time at 200/s: the server can
        // do 50/s, so requests queue and time out. A coordinated-omission-
        // free client must report this as huge latency or timeouts, never as
        // ~20ms latencies.
        let t = Arc::new(FakeTransport {
            delay: Duration::from_millis(20),
            fail_every: 0,
            calls: AtomicU64::new(0),
            sequence_log: Default::default(),
        });
        let step = StepConfig {
            load: Load::Open { rate: 200.0 },
            connections: 1,
            sequences: None,
        };
        let r = run_step(t, step, timing(1), quiet()).await;
        let w = &r.windows[0];
        assert_eq!(w.ok + w.error_count(), 40);
        // Queued requests run out of time waiting for the slot or while
        // being served: either way they are errors, not fast successes.
        assert!(w.error_count() > 0, "{:?} ok {}", w.errors, w.ok);
        assert!(
            w.errors
                .keys()
                .all(|k| matches!(k, ErrorKind::Timeout | ErrorKind::NoConnectionSlot)),
            "{:?}",
            w.errors
        );
        if w.ok > 0 {
            assert!(w.latency.max() > 100_000, "max {}", w.latency.max());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sequence_mode_runs_whole_sequences_per_worker() {
        let t = Arc::new(FakeTransport {
            delay: Duration::from_millis(1),
            fail_every: 0,
            calls: AtomicU64::new(0),
            sequence_log: Default::default(),
        });
        let step = StepConfig {
            load: Load::Closed { concurrency: 3 },
            connections: 3,
            sequences: Some(Sequences {
                length: 4,
                first_id: 10,
                string_ids: false,
            }),
        };
        run_step(t.clone(), step, timing(1), quiet()).await;
        let log = t.sequence_log.lock().unwrap().clone();
        assert!(log.len() > 12, "{}", log.len());
        // Each id's requests are start, middle, middle, end, in that order (a sequence the
        // step cut short ends early), and no id is used by two sequences.
        let mut by_id: std::collections::BTreeMap<String, Vec<(bool, bool)>> = Default::default();
        for (id, start, end) in log {
            by_id
                .entry(format!("{id:?}"))
                .or_default()
                .push((start, end));
        }
        let whole = [(true, false), (false, false), (false, false), (false, true)];
        for flags in by_id.values() {
            let (last, before) = flags.split_last().unwrap();
            assert!(whole.starts_with(before), "{flags:?}");
            assert!(last.1, "every sequence ends: {flags:?}");
        }
        assert!(by_id.values().filter(|f| f.len() == 4).count() >= 3);
        assert!(by_id.contains_key("Number(10)") && by_id.contains_key("Number(12)"));
    }
}
