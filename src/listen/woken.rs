//! Waiting on a busy future and a rare one together, polling the rare one only when it was
//! woken. `tokio::select!` polls every branch each time the task wakes: a connection's task
//! wakes several times per request, and its rare branches (shutdown has begun, a body
//! stalled) are waits on `Notify`s shared by every connection, each poll of which takes the
//! `Notify`'s lock to check its waker. Here the rare future has a waker of its own, and is
//! polled again only after it fired.

use futures_util::task::AtomicWaker;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

/// Which of the two finished first.
pub enum First<B, R> {
    /// The busy future.
    Busy(B),
    /// The rare future.
    Rare(R),
}

/// Waits for `busy` (polled at every wake of the task) or `rare` (polled the first time,
/// then only after its own waker fired), whichever is ready first.
pub async fn first<B: Future, R: Future>(
    mut busy: Pin<&mut B>,
    mut rare: Pin<&mut R>,
) -> First<B::Output, R::Output> {
    let woken = Arc::new(RareWaker {
        woken: AtomicBool::new(true),
        task: AtomicWaker::new(),
    });
    let waker = Waker::from(woken.clone());
    poll_fn(move |cx| {
        if let Poll::Ready(out) = busy.as_mut().poll(cx) {
            return Poll::Ready(First::Busy(out));
        }
        // Registered before the flag is read, so a wake after the read reaches this task.
        woken.task.register(cx.waker());
        if woken.woken.swap(false, Ordering::AcqRel)
            && let Poll::Ready(out) = rare.as_mut().poll(&mut Context::from_waker(&waker))
        {
            return Poll::Ready(First::Rare(out));
        }
        Poll::Pending
    })
    .await
}

/// The rare future's waker: marks it woken and wakes the task.
struct RareWaker {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for RareWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::sync::atomic::AtomicUsize;

    /// A future that counts its polls and is ready once `ready` is set.
    struct Counted<'a> {
        polls: &'a AtomicUsize,
        ready: &'a AtomicBool,
    }

    impl Future for Counted<'_> {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.ready.load(Ordering::Relaxed) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    #[tokio::test]
    async fn the_rare_future_is_polled_once_until_it_wakes_and_then_wins() {
        let (busy_polls, rare_polls) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let never = AtomicBool::new(false);
        let notify = tokio::sync::Notify::new();
        let mut busy = pin!(Counted {
            polls: &busy_polls,
            ready: &never,
        });
        let mut rare = pin!(async {
            rare_polls.fetch_add(1, Ordering::Relaxed);
            notify.notified().await;
            rare_polls.fetch_add(1, Ordering::Relaxed);
            "rare"
        });
        let mut both = pin!(first(busy.as_mut(), rare.as_mut()));
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        for _ in 0..5 {
            assert!(both.as_mut().poll(&mut cx).is_pending());
        }
        // The busy one at every poll, the rare one at the first only.
        assert_eq!(busy_polls.load(Ordering::Relaxed), 5);
        assert_eq!(rare_polls.load(Ordering::Relaxed), 1);
        notify.notify_waiters();
        match both.as_mut().poll(&mut cx) {
            Poll::Ready(First::Rare(out)) => assert_eq!(out, "rare"),
            _ => panic!("the rare future was woken and is ready"),
        }
    }

    #[tokio::test]
    async fn the_busy_future_wins_when_ready() {
        let polls = AtomicUsize::new(0);
        let ready = AtomicBool::new(true);
        let busy = pin!(Counted {
            polls: &polls,
            ready: &ready,
        });
        let rare = pin!(std::future::pending::<()>());
        assert!(matches!(first(busy, rare).await, First::Busy(())));
    }
}
