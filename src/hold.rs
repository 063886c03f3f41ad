//! Holding, not failing: a request that nothing can take *right now* (no backend ready, as
//! when a pool starts, scales from zero or every Triton is busy starting; the registry
//! briefly unreachable for a cold model) waits for the pool instead of getting an immediate
//! 503, as Knative's activator holds requests for a revision scaled to zero. It waits up to
//! `server.ready_wait`, never past the client's deadline, and is tried again as soon as the
//! pool can take it; only then is it refused, with the reason and `Retry-After`. Held
//! requests are let go in the order they arrived (a FIFO line, as the activator's queue): a
//! request tries again only once every request held before it has been served, refused, or
//! is on its way (its try has gone past the quick check that the pool can take it). At most
//! `server.max_waiting` requests wait at once: past that a request is refused at once, so a
//! pool that is down cannot gather an unbounded crowd (a waiting body counts against the
//! in-flight byte limits like any other).

use crate::error::GatewayError;
use crate::telemetry;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// How often a held request looks at the pool again: health checks change it no faster.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// The requests waiting now, for `server.max_waiting`.
#[derive(Debug, Default)]
pub struct Holding {
    waiting: AtomicUsize,
    /// The line held requests wait in: tokio's mutex is fair (first come, first served),
    /// and a request that leaves it (its client gone) leaves no gap.
    line: tokio::sync::Mutex<()>,
}

/// Whether a failure is one the pool may mend within moments, so the request waits it out.
pub fn waits_out(error: &GatewayError) -> bool {
    matches!(
        error,
        GatewayError::NoBackendReady | GatewayError::RegistryUnreachable { .. }
    )
}

/// A place in the waiting room; leaving it (by any path) frees it.
struct Seat<'h> {
    holding: &'h Holding,
    model: String,
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        self.holding.waiting.fetch_sub(1, Ordering::AcqRel);
        metrics::gauge!(telemetry::REQUESTS_WAITING, "model" => std::mem::take(&mut self.model))
            .decrement(1.0);
    }
}

impl Holding {
    /// Runs `attempt` until it succeeds or fails for a reason the pool will not mend, holding
    /// between tries while it fails for one it may (`waits_out`): up to `wait` from now, and
    /// never past `deadline`. The last failure is the answer when the wait ends, or at once
    /// when `max_waiting` requests wait already.
    pub async fn hold<T, F: Future<Output = Result<T, GatewayError>>>(
        &self,
        model: &str,
        (wait, max_waiting): (Duration, usize),
        deadline: Option<Instant>,
        mut attempt: impl FnMut() -> F,
    ) -> Result<T, GatewayError> {
        let first = attempt().await;
        match &first {
            Err(error) if waits_out(error) && !wait.is_zero() => {}
            _ => return first,
        }
        let held = |outcome: &'static str| {
            metrics::counter!(telemetry::REQUESTS_HELD, "model" => model.to_owned(),
                "outcome" => outcome)
            .increment(1);
        };
        let Some(_seat) = self.seat(model, max_waiting) else {
            held("full");
            return first;
        };
        let until = deadline.map_or(Instant::now() + wait, |d| d.min(Instant::now() + wait));
        let mut last = first;
        loop {
            let Ok(turn) = tokio::time::timeout_at(until, self.line.lock()).await else {
                break;
            };
            last = self.try_in_turn(turn, until, &mut attempt).await;
            match &last {
                // A try that was on its way and failed after all: look again a little later.
                Err(error) if waits_out(error) && Instant::now() < until => {
                    tokio::time::sleep_until(until.min(Instant::now() + LOOK_AGAIN)).await;
                }
                Err(error) if waits_out(error) => break,
                Ok(_) => {
                    held("served");
                    return last;
                }
                Err(_) => return last,
            }
        }
        held("timeout");
        last
    }

    /// The head of the line tries at once, then every `LOOK_AGAIN` until the pool can take
    /// it, and gives up its `turn` as soon as its try is answered or on its way (not
    /// answered at its first poll: a load, a forward, a registry call); the next in line then
    /// tries at once. Returns the last answer: a failure the pool may mend only when `until`
    /// came, or when the try was on its way and failed after all (the request then lines up
    /// again).
    async fn try_in_turn<T, F: Future<Output = Result<T, GatewayError>>>(
        &self,
        turn: tokio::sync::MutexGuard<'_, ()>,
        until: Instant,
        attempt: &mut impl FnMut() -> F,
    ) -> Result<T, GatewayError> {
        use futures_util::FutureExt;
        loop {
            let mut trying = std::pin::pin!(attempt());
            match (&mut trying).now_or_never() {
                Some(Err(error)) if waits_out(&error) && Instant::now() < until => {
                    tokio::time::sleep_until(until.min(Instant::now() + LOOK_AGAIN)).await;
                }
                Some(answer) => return answer,
                None => {
                    drop(turn);
                    return trying.await;
                }
            }
        }
    }

    /// A seat, unless `max_waiting` requests wait already.
    fn seat(&self, model: &str, max_waiting: usize) -> Option<Seat<'_>> {
        let taken = self.waiting.fetch_add(1, Ordering::AcqRel);
        metrics::gauge!(telemetry::REQUESTS_WAITING, "model" => model.to_owned()).increment(1.0);
        let seat = Seat {
            holding: self,
            model: model.to_owned(),
        };
        (taken < max_waiting).then_some(seat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held request is answered as soon as the pool mends, within the wait.
    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_the_pool_then_is_served() {
        let holding = Holding::default();
        let ready_at = Instant::now() + Duration::from_secs(3);
        let started = Instant::now();
        let answer = holding
            .hold("m", (Duration::from_secs(10), 8), None, || async {
                if Instant::now() >= ready_at {
                    Ok("served")
                } else {
                    Err(GatewayError::NoBackendReady)
                }
            })
            .await;
        assert_eq!(answer.unwrap(), "served");
        assert!(started.elapsed() < Duration::from_millis(3100));
        assert_eq!(holding.waiting.load(Ordering::Acquire), 0);
    }

    /// Held requests are let go in the order they came, whatever their clocks: five
    /// requests 60 ms apart, the pool mended between two of their looks.
    #[tokio::test(start_paused = true)]
    async fn held_requests_are_served_in_the_order_they_came() {
        let holding = std::sync::Arc::new(Holding::default());
        let mended = Instant::now() + Duration::from_millis(3025);
        let served = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut requests = Vec::new();
        for i in 0..5 {
            let (holding, served) = (holding.clone(), served.clone());
            requests.push(tokio::spawn(async move {
                holding
                    .hold("m", (Duration::from_secs(10), 8), None, || async {
                        if Instant::now() < mended {
                            return Err(GatewayError::NoBackendReady);
                        }
                        served.lock().unwrap().push(i);
                        Ok(i)
                    })
                    .await
            }));
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        for request in requests {
            request.await.unwrap().unwrap();
        }
        assert_eq!(*served.lock().unwrap(), [0, 1, 2, 3, 4]);
        assert!(Instant::now() < mended + Duration::from_millis(100));
    }

    /// A try still on its way gives the line up; one that fails after all lines up again
    /// and is tried later, not in a loop.
    #[tokio::test(start_paused = true)]
    async fn a_try_on_its_way_lets_the_next_one_go() {
        let holding = std::sync::Arc::new(Holding::default());
        let tries = std::sync::Arc::new(AtomicUsize::new(0));
        let slow = {
            let (holding, tries) = (holding.clone(), tries.clone());
            tokio::spawn(async move {
                holding
                    .hold("m", (Duration::from_secs(1), 8), None, || {
                        tries.fetch_add(1, Ordering::AcqRel);
                        async {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            Err::<(), _>(GatewayError::NoBackendReady)
                        }
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let started = Instant::now();
        let quick = holding
            .hold("m", (Duration::from_secs(1), 8), None, || async {
                if Instant::now() < started + Duration::from_millis(100) {
                    Err(GatewayError::NoBackendReady)
                } else {
                    Ok("served")
                }
            })
            .await;
        assert_eq!(quick.unwrap(), "served");
        assert!(started.elapsed() < Duration::from_millis(200));
        assert!(slow.await.unwrap().is_err());
        let tries = tries.load(Ordering::Acquire);
        assert!((10..=30).contains(&tries), "{tries} tries in 1 s");
    }

    /// The wait ends at `ready_wait` or the client's deadline, whichever is first, with the
    /// reason; other failures, a full room and a zero wait are answered at once.
    #[tokio::test(start_paused = true)]
    async fn a_wait_is_bounded_and_only_for_what_the_pool_may_mend() {
        let holding = Holding::default();
        let never = || async { Err::<(), _>(GatewayError::NoBackendReady) };
        let started = Instant::now();
        let refused = holding
            .hold("m", (Duration::from_secs(10), 8), None, never)
            .await;
        assert!(matches!(refused, Err(GatewayError::NoBackendReady)));
        assert_eq!(started.elapsed(), Duration::from_secs(10));

        let started = Instant::now();
        let deadline = Some(started + Duration::from_secs(2));
        let _ = holding
            .hold("m", (Duration::from_secs(10), 8), deadline, never)
            .await;
        assert_eq!(started.elapsed(), Duration::from_secs(2));

        let started = Instant::now();
        let _ = holding.hold("m", (Duration::ZERO, 8), None, never).await;
        let _ = holding
            .hold("m", (Duration::from_secs(10), 0), None, never)
            .await;
        let unknown = || async { Err::<(), _>(GatewayError::UnknownModel { model: "m".into() }) };
        let _ = holding
            .hold("m", (Duration::from_secs(10), 8), None, unknown)
            .await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(holding.waiting.load(Ordering::Acquire), 0);
    }
}
