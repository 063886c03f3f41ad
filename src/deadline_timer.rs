//! One tokio timer for a series of deadlines that only move later: the requests of one
//! connection, each with its own deadline (an upstream answer's, a request head's).
//!
//! A tokio `Sleep` per deadline is registered in the timer wheel when first polled and taken
//! out when dropped: about 650 instructions a request, per timer. Here the timer is moved
//! only when it fires before the deadline waited on (lazily: while requests keep coming,
//! about once per timeout), and it is polled only when it may have fired or another task
//! waits: a timer that has not fired still holds the waker of the task that waits.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::time::{Instant, Sleep};

/// A timer armed for the deadlines of one connection.
pub struct DeadlineTimer {
    sleep: Pin<Box<Sleep>>,
    /// The waker the timer holds, when it is armed and has been polled.
    waker: Option<Waker>,
}

impl DeadlineTimer {
    /// A timer first armed for `deadline`.
    pub fn new(deadline: Instant) -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            waker: None,
        }
    }

    /// Ready once `deadline` has passed; until then the task is woken by it.
    pub fn poll_until(&mut self, deadline: Instant, cx: &mut Context<'_>) -> Poll<()> {
        // Armed for later than this deadline (a timeout shortened by a reload): too late.
        if self.sleep.deadline() > deadline {
            self.rearm(deadline);
        }
        let waits = self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if waits && !self.sleep.is_elapsed() {
            return Poll::Pending;
        }
        while self.sleep.as_mut().poll(cx).is_ready() {
            if Instant::now() >= deadline {
                self.waker = None;
                return Poll::Ready(());
            }
            self.rearm(deadline);
        }
        self.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn rearm(&mut self, deadline: Instant) {
        self.sleep.as_mut().reset(deadline);
        self.waker = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::time::Duration;

    fn ready(timer: &mut DeadlineTimer, deadline: Instant) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        timer.poll_until(deadline, &mut cx).is_ready()
    }

    #[tokio::test(start_paused = true)]
    async fn each_deadline_is_kept_on_the_one_timer() {
        let second = Duration::from_secs(1);
        let first = Instant::now() + second;
        let mut timer = DeadlineTimer::new(first);
        assert!(!ready(&mut timer, first));
        tokio::time::advance(second / 2).await;
        assert!(!ready(&mut timer, first));
        tokio::time::advance(second / 2).await;
        assert!(ready(&mut timer, first));
        // A later deadline, after the timer fired: moved on, and the waiting task is woken
        // at the new deadline, not before.
        tokio::time::advance(second / 2).await;
        let next = Instant::now() + second;
        assert!(!ready(&mut timer, next));
        let started = Instant::now();
        poll_fn(|cx| timer.poll_until(next, cx)).await;
        assert_eq!(started.elapsed(), second);
        // A deadline set before the timer fires for an earlier one: woken early, it waits on.
        let early = Instant::now() + second;
        let late = early + second * 2;
        assert!(!ready(&mut timer, early));
        let started = Instant::now();
        poll_fn(|cx| timer.poll_until(late, cx)).await;
        assert_eq!(started.elapsed(), second * 3);
        // A shorter one than the timer is armed for wakes in time.
        let long = Instant::now() + second * 10;
        assert!(!ready(&mut timer, long));
        let short = Instant::now() + second;
        let started = Instant::now();
        poll_fn(|cx| timer.poll_until(short, cx)).await;
        assert_eq!(started.elapsed(), second);
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_did_not_arm_the_timer_is_woken_too() {
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut timer = DeadlineTimer::new(deadline);
        assert!(!ready(&mut timer, deadline)); // armed with another (no-op) waker
        let started = Instant::now();
        poll_fn(|cx| timer.poll_until(deadline, cx)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }
}
