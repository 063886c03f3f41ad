//! A connection's own tasks, run inside the connection's task.
//!
//! hyper's HTTP/2 connections hand work to an executor: a client two futures per request (the
//! request body's pipe, and the wait for the answer's head). Spawned on tokio, each was a task:
//! an allocation, an entry in the runtime's task list, a schedule, polls through the task's
//! harness, and the future copied into its cell and its end copied over it: together about
//! 2,500 instructions a task (`loadtest/instructions.sh` over gRPC). Here the executor (`Tasks`)
//! queues them, and the connection's task (`run`) polls them beside the connection, each only
//! when its own waker fired (`FuturesUnordered`), on the thread the connection lives on.

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use futures_util::task::AtomicWaker;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The executor a connection is built with: what it is given to run goes to that
/// connection's `run`.
#[derive(Clone, Default)]
pub(crate) struct Tasks(Arc<Inbox>);

#[derive(Default)]
struct Inbox {
    /// Given and not yet polled.
    new: Mutex<Vec<Task>>,
    /// The task of `run`.
    runner: AtomicWaker,
    /// `run` is polling: what is given now is polled before it returns, with no wake.
    polling: AtomicBool,
}

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tasks")
    }
}

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for Tasks {
    fn execute(&self, future: F) {
        self.0.new.lock().expect("tasks").push(Box::pin(future));
        if !self.0.polling.load(Ordering::Acquire) {
            self.0.runner.wake();
        }
    }
}

/// Runs `connection` and every task its executor `tasks` is given, until the connection
/// has ended and so have they.
pub(crate) async fn run(connection: impl Future<Output = ()> + Send + 'static, tasks: Tasks) {
    let inbox = tasks.0;
    let mut running: FuturesUnordered<Task> = FuturesUnordered::new();
    running.push(Box::pin(connection));
    poll_fn(|cx| {
        inbox.runner.register(cx.waker());
        inbox.polling.store(true, Ordering::Release);
        let done = loop {
            let idle = loop {
                match running.poll_next_unpin(cx) {
                    Poll::Ready(Some(())) => {}
                    Poll::Ready(None) => break true,
                    Poll::Pending => break false,
                }
            };
            let new = std::mem::take(&mut *inbox.new.lock().expect("tasks"));
            if new.is_empty() {
                break idle;
            }
            running.extend(new);
        };
        inbox.polling.store(false, Ordering::Release);
        // Given between the last look and the flag's reset (from another thread): not lost.
        if !inbox.new.lock().expect("tasks").is_empty() {
            cx.waker().wake_by_ref();
        }
        if done { Poll::Ready(()) } else { Poll::Pending }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::sync::atomic::AtomicUsize;

    /// What the connection gives while it runs is run to its end, and `run` ends only after
    /// both the connection and its tasks have; a task given from elsewhere later wakes it.
    #[tokio::test]
    async fn a_connection_and_the_tasks_it_gives_run_to_their_ends() {
        let tasks = Tasks::default();
        let ran = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let connection = {
            let (tasks, ran) = (tasks.clone(), ran.clone());
            async move {
                // A task given during the connection's own poll, which waits on something.
                let counted = ran.clone();
                tasks.execute(async move {
                    released.await.unwrap();
                    counted.fetch_add(1, Ordering::SeqCst);
                });
                tokio::task::yield_now().await;
                ran.fetch_add(1, Ordering::SeqCst);
            }
        };
        let runner = tokio::spawn(run(connection, tasks.clone()));
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the connection ended");
        assert!(!runner.is_finished(), "its task has not");
        // Given from outside the runner's poll.
        let counted = ran.clone();
        tasks.execute(async move {
            counted.fetch_add(10, Ordering::SeqCst);
        });
        release.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), runner)
            .await
            .expect("run ends")
            .unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 12);
    }
}
