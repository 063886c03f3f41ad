//! hyper's HTTP/1 header timer (`server.header_read_timeout`) for one connection, on one
//! tokio timer that all the connection's request heads share.
//!
//! hyper starts the timer each time it begins to read a request head and drops it once the
//! head is in. With `TokioTimer` each request of a keep-alive connection allocated a tokio
//! `Sleep`, registered it in the timer wheel while the connection waited for the next
//! request, and took it out again: about 750 instructions a request
//! (loadtest/results/2026-12-06-a775ca5-instructions.md). Here a head's sleep is only its deadline,
//! waited for on the connection's one `DeadlineTimer`. hyper still decides when a head's time
//! starts and ends.

use crate::deadline_timer::DeadlineTimer;
use hyper::rt::{Sleep, Timer};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The timer of one connection's request heads.
pub(super) struct HeadTimer {
    shared: Arc<Mutex<DeadlineTimer>>,
}

impl HeadTimer {
    /// A timer for a new connection (its tokio timer is armed by the first wait).
    pub(super) fn new() -> Self {
        let now = tokio::time::Instant::now();
        Self {
            shared: Arc::new(Mutex::new(DeadlineTimer::new(now))),
        }
    }
}

impl Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        Box::pin(HeadSleep {
            deadline: deadline.into(),
            shared: self.shared.clone(),
        })
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<HeadSleep>() {
            Some(head) => head.get_mut().deadline = new_deadline.into(),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }

    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// One head's wait: ready at `deadline`.
struct HeadSleep {
    deadline: tokio::time::Instant,
    shared: Arc<Mutex<DeadlineTimer>>,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut timer = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        timer.poll_until(self.deadline, cx)
    }
}

impl Sleep for HeadSleep {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    /// Whether `sleep` is ready when polled now.
    fn ready(sleep: &mut Pin<Box<dyn Sleep>>) -> bool {
        let waker = std::task::Waker::noop();
        sleep
            .as_mut()
            .poll(&mut Context::from_waker(waker))
            .is_ready()
    }

    #[tokio::test(start_paused = true)]
    async fn each_head_waits_for_its_own_deadline_on_the_shared_timer() {
        let timer = HeadTimer::new();
        let second = Duration::from_secs(1);
        // The first head: pending before its deadline, ready at it.
        let mut first = timer.sleep(second);
        assert!(!ready(&mut first));
        tokio::time::advance(second / 2).await;
        assert!(!ready(&mut first));
        tokio::time::advance(second / 2).await;
        assert!(ready(&mut first));
        // The next head starts later: the shared timer, armed for the first's deadline, is
        // moved on, and a wait is woken by the timer at the new deadline.
        drop(first);
        let mut next = timer.sleep(second);
        tokio::time::advance(second / 2).await;
        assert!(!ready(&mut next));
        let started = tokio::time::Instant::now();
        poll_fn(|cx| next.as_mut().poll(cx)).await;
        assert_eq!(started.elapsed(), second / 2);
        // hyper's reset moves a head's deadline without a new sleep.
        let mut reset = timer.sleep(second);
        timer.reset(&mut reset, timer.now() + second * 3);
        tokio::time::advance(second * 2).await;
        assert!(!ready(&mut reset));
        tokio::time::advance(second).await;
        assert!(ready(&mut reset));
        // A shorter deadline than the one the shared timer is armed for wakes in time.
        let mut long = timer.sleep(second * 10);
        assert!(!ready(&mut long));
        let mut short = timer.sleep(second);
        let started = tokio::time::Instant::now();
        poll_fn(|cx| short.as_mut().poll(cx)).await;
        assert_eq!(started.elapsed(), second);
    }
}
