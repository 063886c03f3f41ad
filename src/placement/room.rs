//! Waiting for room (`placement.room_wait`). A cold request that finds every copy that could
//! make room in use, loading or pinned is not refused at once: such copies are usually busy
//! for milliseconds. It waits in a queue per backend, in arrival order, for at most
//! `room_wait` (a gRPC deadline drops the wait sooner); only then is it answered 503 with
//! `Retry-After`.
//!
//! Room is handed over, not raced for. Whoever frees room on a backend (a lease released, a
//! load that failed) decides for the head of that backend's queue at once, so the waiter is
//! placed before any later request can take the room, and waiters are placed in the order
//! they came: the head of a queue that still finds no room blocks those behind it, so a large
//! model is not starved by small ones. A request holds a place on every backend its model
//! would fit on when empty, and leaves them all once it is placed.

use super::estimate::Sizing;
use super::table::Decision;
use super::{Placement, Priority, SequenceRef, Versions};
use crate::error::GatewayError;
use crate::model::ModelRef;
use crate::telemetry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How often a waiter asks for room itself, for room freed by what hands none over
/// (an unload finishing, a backend coming back, a load that ran with no request on it).
const SELF_OFFER: Duration = Duration::from_millis(100);

/// The waiters, per backend in arrival order.
#[derive(Default)]
pub(super) struct RoomQueue {
    /// Waiters queued anywhere: all that a released lease reads when nobody waits.
    waiting: AtomicUsize,
    queues: Mutex<Queues>,
}

#[derive(Default)]
struct Queues {
    next_id: u64,
    /// Per backend (by pool index), waiter ids, first come first.
    by_backend: Vec<VecDeque<u64>>,
    waiters: HashMap<u64, Waiter>,
}

/// A request waiting for room: what deciding for it needs, and where the decision goes.
struct Waiter {
    model: ModelRef,
    sequence: Option<SequenceRef>,
    sizing: Sizing,
    allow_evict: bool,
    backends: Vec<usize>,
    reply: oneshot::Sender<Decision>,
}

impl Queues {
    fn join(&mut self, waiter: Waiter) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        for &b in &waiter.backends {
            if self.by_backend.len() <= b {
                self.by_backend.resize_with(b + 1, VecDeque::new);
            }
            self.by_backend[b].push_back(id);
        }
        self.waiters.insert(id, waiter);
        id
    }

    fn head(&self, b: usize) -> Option<u64> {
        self.by_backend.get(b)?.front().copied()
    }

    fn leave(&mut self, id: u64) -> Option<Waiter> {
        let waiter = self.waiters.remove(&id)?;
        for &b in &waiter.backends {
            self.by_backend[b].retain(|&other| other != id);
        }
        Some(waiter)
    }
}

impl RoomQueue {
    fn queues(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.queues.lock().expect("room queues")
    }

    fn leave(&self, id: u64) -> Option<Waiter> {
        let left = self.queues().leave(id);
        if left.is_some() {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        left
    }
}

/// A place in the queues. Dropped with the request (a client gone, a gRPC deadline), it
/// leaves them, and a decision handed over meanwhile is undone.
struct Ticket<'a> {
    placement: &'a Arc<Placement>,
    id: u64,
    model: ModelRef,
    reply: oneshot::Receiver<Decision>,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.placement.room.leave(self.id);
        if let Ok(decision) = self.reply.try_recv() {
            self.placement.abandon(&self.model, decision);
        }
    }
}

impl Placement {
    /// Waits, until `until` at the latest, for room for a request that was refused for want
    /// of it; the decision made for it when room came, or `None` when none came (or its
    /// model is too large for every backend, which no wait changes). `deadline`, the
    /// client's, only tells how a wait that ends there is counted.
    pub(super) async fn wait_for_room(
        self: &Arc<Self>,
        model: &ModelRef,
        sequence: Option<&SequenceRef>,
        allow_evict: bool,
        (until, deadline): (Instant, Option<Instant>),
    ) -> Option<Decision> {
        if Instant::now() >= until {
            return None;
        }
        let view = self.view(&model.name);
        let sizing = self.sizing_for(&model.name, &view);
        let bytes = sizing.estimate(&Versions::latest()).bytes;
        let backends = self.books().could_hold(bytes, &view);
        if backends.is_empty() {
            return None;
        }
        let (reply, receiver) = oneshot::channel();
        let waiter = Waiter {
            model: model.clone(),
            sequence: sequence.cloned(),
            sizing,
            allow_evict,
            backends: backends.clone(),
            reply,
        };
        let id = self.room.queues().join(waiter);
        self.room.waiting.fetch_add(1, Ordering::AcqRel);
        let mut ticket = Ticket {
            placement: self,
            id,
            model: model.clone(),
            reply: receiver,
        };
        // Room freed between the refusal and joining would be offered to nobody: ask now.
        self.offer_room_on(&backends);
        let decision = loop {
            let tick = (Instant::now() + SELF_OFFER).min(until);
            match tokio::time::timeout_at(tick, &mut ticket.reply).await {
                Ok(decision) => break decision.ok(),
                Err(_) if Instant::now() >= until => {
                    // Out of the queues first, so nothing is handed over after this look.
                    self.room.leave(id);
                    break ticket.reply.try_recv().ok();
                }
                Err(_) => self.offer_room_on(&backends),
            }
        };
        let result = match decision {
            Some(_) => "placed",
            None if deadline.is_some_and(|d| Instant::now() >= d) => "deadline",
            None => "refused",
        };
        metrics::counter!(telemetry::PLACEMENT_ROOM_WAITS, "result" => result).increment(1);
        decision
    }

    /// Room may have come free on backend `b`: decides for the waiters at the head of its
    /// queue, in order, until one still finds none.
    pub(super) fn offer_room(self: &Arc<Self>, b: usize) {
        if self.room.waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut queues = self.room.queues();
        while let Some(id) = queues.head(b) {
            let waiter = &queues.waiters[&id];
            let decision = if waiter.reply.is_closed() {
                None
            } else {
                let view = self.view(&waiter.model.name);
                let pinned = self.pinned.contains(&waiter.model.name);
                let now = Instant::now();
                let mut books = self.books();
                let sequence = waiter.sequence.as_ref();
                let decision = books
                    .hit_for(&waiter.model, sequence, &view, now)
                    .unwrap_or_else(|| {
                        let rules = (pinned, waiter.allow_evict);
                        books.decide_for(&waiter.model, sequence, &waiter.sizing, &view, rules, now)
                    });
                if matches!(decision, Decision::Refuse(GatewayError::NoRoom { .. })) {
                    break;
                }
                Some(decision)
            };
            let waiter = queues.leave(id).expect("the head is queued");
            self.room.waiting.fetch_sub(1, Ordering::AcqRel);
            if let Some(decision) = decision
                && let Err(decision) = waiter.reply.send(decision)
            {
                self.abandon(&waiter.model, decision);
            }
        }
    }

    fn offer_room_on(self: &Arc<Self>, backends: &[usize]) {
        for &b in backends {
            self.offer_room(b);
        }
    }

    /// Undoes a decision made for a waiter that has gone: a lease counted on a copy is let
    /// go; a load already on the books runs (its victims are gone from them), so the books
    /// stay true.
    fn abandon(self: &Arc<Self>, model: &ModelRef, decision: Decision) {
        match decision {
            Decision::Serve(b) => {
                let version = model.version_number().ok().flatten();
                self.books()
                    .release_version(b, &model.name, version, Instant::now());
            }
            Decision::Load(plan) => {
                tokio::spawn(self.clone().run_load(plan, Priority::Request));
            }
            Decision::Wait(_) | Decision::Refuse(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(backends: &[usize]) -> (Waiter, oneshot::Receiver<Decision>) {
        let (reply, receiver) = oneshot::channel();
        let waiter = Waiter {
            model: ModelRef::new("m", None),
            sequence: None,
            sizing: super::super::estimate::Estimator::new(&Default::default(), &[]).unread(),
            allow_evict: true,
            backends: backends.to_vec(),
            reply,
        };
        (waiter, receiver)
    }

    /// Each backend's queue is first come first; leaving takes a waiter out of every queue
    /// it stood in, so the next in line is at the head everywhere.
    #[test]
    fn queues_are_first_come_first_and_leaving_clears_every_place() {
        let mut queues = Queues::default();
        let (a, _ra) = waiter(&[0, 1]);
        let (b, _rb) = waiter(&[1]);
        let (c, _rc) = waiter(&[0, 1]);
        let (a, b, c) = (queues.join(a), queues.join(b), queues.join(c));
        assert_eq!((queues.head(0), queues.head(1)), (Some(a), Some(a)));
        assert!(queues.leave(a).is_some());
        assert_eq!((queues.head(0), queues.head(1)), (Some(c), Some(b)));
        assert!(queues.leave(a).is_none(), "gone already");
        queues.leave(b);
        queues.leave(c);
        assert_eq!((queues.head(0), queues.head(1)), (None, None));
        assert!(queues.waiters.is_empty());
        assert_eq!(queues.head(7), None, "a backend nobody waits on");
    }
}
