//! The load slots of one backend, which it owns and placement takes: at most
//! `max_loading_concurrency` loads at once, the others waiting in arrival order, and loads a
//! request is waiting for ahead of background ones (extra copies, preloads, drain moves), so
//! a client never queues behind work nobody is waiting on.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Who waits on a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// A request is waiting for this model.
    Request,
    /// Nobody waits: scaling, preloading, moving.
    Background,
}

/// One backend's load slots.
#[derive(Debug)]
pub struct LoadQueue {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    requests: VecDeque<oneshot::Sender<Slot>>,
    background: VecDeque<oneshot::Sender<Slot>>,
}

/// A held load slot; dropping it hands the slot to the next waiter.
#[derive(Debug)]
pub struct Slot {
    queue: Arc<LoadQueue>,
}

impl LoadQueue {
    /// `slots` loads at once.
    pub fn new(slots: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: slots,
                requests: VecDeque::new(),
                background: VecDeque::new(),
            }),
        })
    }

    /// Waits for a slot: at once when one is free, else after every request-driven load
    /// queued before it (and, for a request-driven load, before any background one).
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> Slot {
        let waiting = {
            let mut state = self.state.lock().expect("load queue");
            if state.free > 0 {
                state.free -= 1;
                return Slot {
                    queue: self.clone(),
                };
            }
            let (send, waiting) = oneshot::channel();
            match priority {
                Priority::Request => state.requests.push_back(send),
                Priority::Background => state.background.push_back(send),
            }
            waiting
        };
        waiting
            .await
            .expect("a queued sender is always sent a slot or dropped with the queue")
    }

    /// Loads waiting for a slot.
    pub fn waiting(&self) -> usize {
        let state = self.state.lock().expect("load queue");
        state.requests.len() + state.background.len()
    }

    /// Hands a freed slot to the first live waiter, requests first; else it is free.
    fn release(self: &Arc<Self>) {
        let mut state = self.state.lock().expect("load queue");
        loop {
            let next = match state.requests.pop_front() {
                Some(send) => send,
                None => match state.background.pop_front() {
                    Some(send) => send,
                    None => {
                        state.free += 1;
                        return;
                    }
                },
            };
            let slot = Slot {
                queue: self.clone(),
            };
            match next.send(slot) {
                Ok(()) => return,
                // That waiter is gone: the same slot goes to the next one. (Forgotten, not
                // dropped: dropping would release it again under this lock.)
                Err(slot) => std::mem::forget(slot),
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.queue.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    #[tokio::test]
    async fn requests_go_ahead_of_background_loads_and_each_class_keeps_its_order() {
        let queue = LoadQueue::new(1);
        let held = queue.acquire(Priority::Background).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, priority) in [
            ("scale-up", Priority::Background),
            ("cold-1", Priority::Request),
            ("preload", Priority::Background),
            ("cold-2", Priority::Request),
        ] {
            let (queue, order) = (queue.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _slot = queue.acquire(priority).await;
                order.lock().unwrap().push(name);
                settle().await;
            }));
            settle().await;
        }
        assert_eq!(queue.waiting(), 4);
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["cold-1", "cold-2", "scale-up", "preload"]
        );
        assert_eq!(queue.state.lock().unwrap().free, 1);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_does_not_lose_the_slot() {
        let queue = LoadQueue::new(1);
        let held = queue.acquire(Priority::Request).await;
        let gone = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.acquire(Priority::Request).await })
        };
        settle().await;
        gone.abort();
        let _ = gone.await;
        drop(held);
        let again =
            tokio::time::timeout(Duration::from_secs(1), queue.acquire(Priority::Request)).await;
        assert!(again.is_ok(), "the slot came back");
    }
}
