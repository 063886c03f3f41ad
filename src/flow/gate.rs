//! One model's gate: the slots its copies offer (`max_in_flight` × copies) and the waiting
//! room behind them (`FairQueue`).
//!
//! Below saturation, a request reads one counter (is anyone waiting?) and takes a slot with
//! one compare-and-swap; giving it back is one subtraction and one read. Only when requests
//! wait is the room's lock taken: a request joins under it, and whoever frees a slot (a
//! finished request, a waiter gone) hands it to the next in the queue under it, so a
//! newcomer never jumps the queue and no slot is lost between the two. Both sides use
//! sequentially consistent atomics for that: a request joining counts itself before looking
//! for a slot, a finished request frees its slot before looking for waiters, so at least
//! one of them sees the other.

use super::queue::{Bounds, FairQueue, Joined, Shed};
use super::snapshot::{GateView, LaneView, Slots};
use super::{Band, TenantFlow};
use crate::telemetry;
use foldhash::HashMap;
use metrics::{Counter, Gauge, Histogram};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Pops the drain rate needs before it is trusted to refuse a request on arrival.
const DRAIN_SAMPLES: u32 = 4;

/// A model's slots and waiting room.
#[derive(Debug)]
pub struct Gate {
    model: Arc<str>,
    in_flight: AtomicUsize,
    /// `max_in_flight` × copies, as last computed (on the gate's last full moment).
    limit: AtomicUsize,
    /// Requests in the room.
    queued: AtomicUsize,
    room: Mutex<Room>,
}

#[derive(Debug)]
struct Room {
    queue: FairQueue<Waiter>,
    drain: Drain,
    next_id: u64,
    /// Each band's lanes' series, by tenant: registered at a lane's first waiter and kept.
    series: [HashMap<Arc<str>, Arc<LaneSeries>>; Band::COUNT],
}

/// The flow series of one lane of a model's room (its band and tenant). A request that
/// waits moves the depth gauge twice and is counted once admitted; looking each series up
/// by its labels built, sorted and hashed them again every time, some 600 instructions
/// apiece (`loadtest/instructions.sh` at c=64, where half the requests wait).
#[derive(Debug)]
struct LaneSeries {
    /// `infergate_flow_queue_depth`.
    depth: Gauge,
    /// `infergate_flow_wait_seconds`.
    wait: Histogram,
    /// `infergate_flow_admitted_total`.
    admitted: Counter,
}

/// The labels of every flow series of a lane: its model, tenant ("" for anonymous traffic)
/// and band. The room's own series and the pipeline's count of refusals both take them here.
pub fn lane_labels(model: &Arc<str>, tenant: &Arc<str>, band: Band) -> [metrics::Label; 3] {
    [
        metrics::Label::new("model", metrics::SharedString::from(model.clone())),
        metrics::Label::new("tenant", metrics::SharedString::from(tenant.clone())),
        metrics::Label::new("band", band.as_str()),
    ]
}

impl LaneSeries {
    fn new(model: &Arc<str>, band: Band, tenant: &Arc<str>) -> Self {
        let labels = lane_labels(model, tenant, band);
        Self {
            depth: metrics::gauge!(telemetry::FLOW_QUEUE_DEPTH, labels.to_vec()),
            wait: metrics::histogram!(telemetry::FLOW_WAIT, labels.to_vec()),
            admitted: metrics::counter!(telemetry::FLOW_ADMITTED, labels.to_vec()),
        }
    }
}

/// A request in the room: where its slot (or its refusal) goes.
#[derive(Debug)]
struct Waiter {
    id: u64,
    reply: oneshot::Sender<Result<(), Shed>>,
    band: Band,
    tenant: Arc<str>,
}

/// How fast the room empties while it has a backlog: a moving mean of the time between
/// two requests leaving it.
#[derive(Debug, Default)]
struct Drain {
    last: Option<Instant>,
    gap: Option<f64>,
    samples: u32,
}

impl Drain {
    fn popped(&mut self, now: Instant, backlog_left: bool) {
        if let Some(last) = self.last {
            let gap = (now - last).as_secs_f64();
            self.gap = Some(self.gap.map_or(gap, |mean| mean * 0.9 + gap * 0.1));
            self.samples += 1;
        }
        // A gap that starts with the room empty would count idle time as work.
        self.last = backlog_left.then_some(now);
    }

    /// Requests leaving per second, once measured.
    fn per_sec(&self) -> Option<f64> {
        let gap = self.gap.filter(|_| self.samples >= DRAIN_SAMPLES)?;
        Some(1.0 / gap.max(1e-6))
    }
}

/// A request that wants a slot of a model's copies.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its band, capped by its tenant's policy.
    pub band: Band,
    /// Its tenant ("" for anonymous traffic).
    pub tenant: Arc<str>,
    /// Its tenant's policy (weight, bound).
    pub flow: TenantFlow,
    /// When it stops waiting: its client's deadline, or `server.queue_timeout` from now.
    pub until: Instant,
    /// Its body's bytes, which count against the room's byte bound while it waits.
    pub bytes: usize,
}

/// A slot on the model's copies, held for the request's length; dropping it gives the slot
/// to the next waiting request, or back.
#[derive(Debug)]
pub struct Permit {
    gate: Arc<Gate>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release();
    }
}

/// A refused request: why, and when to try again (from the drain rate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why it was shed.
    pub shed: Shed,
    /// When a retry could find room: the time the room takes to empty, at its drain rate.
    pub retry_after: Duration,
}

impl Gate {
    /// A gate of `limit` slots (one copy's worth until its first full moment).
    pub fn new(model: &str, limit: usize) -> Self {
        Self {
            model: Arc::from(model),
            in_flight: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit.max(1)),
            queued: AtomicUsize::new(0),
            room: Mutex::new(Room {
                queue: FairQueue::new(Bounds {
                    per_tenant: usize::MAX,
                    total: usize::MAX,
                    bytes: usize::MAX,
                }),
                drain: Drain::default(),
                next_id: 0,
                series: Default::default(),
            }),
        }
    }

    /// A slot for the request: at once below saturation; else in turn, or refused.
    /// `full` is called only when the gate is full: the request's entry, and the slots
    /// (`max_in_flight` × copies) and bounds now.
    pub async fn enter(
        self: &Arc<Self>,
        full: impl FnOnce() -> (Entry, usize, Bounds),
    ) -> Result<Permit, Refusal> {
        if let Some(permit) = self.try_enter() {
            return Ok(permit);
        }
        let (entry, limit, bounds) = full();
        self.wait(&entry, (limit, bounds)).await
    }

    /// `enter`'s first step, for a caller that must read what `full` needs before any
    /// await: a slot at once when nobody waits and one is free (one counter read and one
    /// compare-and-swap), else `None`, and the request goes on to `wait`.
    pub fn try_enter(self: &Arc<Self>) -> Option<Permit> {
        (self.queued.load(SeqCst) == 0 && self.try_slot()).then(|| Permit { gate: self.clone() })
    }

    /// A limit learned outside a full moment (the model's config, once fetched): kept, and
    /// the slots it frees handed to waiters. Without it a gate made with the constant
    /// default above a copy's capacity might never fill, and so never read its true limit.
    pub fn relimit(&self, limit: usize) {
        self.limit.store(limit.max(1), SeqCst);
        if self.queued.load(SeqCst) > 0 {
            self.pump(&mut self.room());
        }
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.queued.load(SeqCst)
    }

    /// What the gate holds now (`/admin/flow`): the room's lock is held only to copy its
    /// lanes' lengths and the drain rate.
    pub fn snapshot(&self) -> GateView {
        let room = self.room();
        let mut queues: Vec<LaneView> = (room.queue.lanes())
            .map(|(band, tenant, depth, weight)| LaneView {
                tenant: tenant.to_string(),
                band,
                depth,
                weight,
            })
            .collect();
        let drain_per_second = room.drain.per_sec();
        let slots = Slots {
            in_use: self.in_flight.load(SeqCst),
            limit: self.limit.load(SeqCst),
        };
        drop(room);
        queues.sort_by(|a, b| (a.band, &a.tenant).cmp(&(b.band, &b.tenant)));
        GateView {
            model: self.model.to_string(),
            slots,
            queued: queues.iter().map(|l| l.depth).sum(),
            drain_per_second,
            queues,
        }
    }

    fn try_slot(&self) -> bool {
        let limit = self.limit.load(SeqCst);
        (self.in_flight)
            .fetch_update(SeqCst, SeqCst, |n| (n < limit).then_some(n + 1))
            .is_ok()
    }

    fn room(&self) -> MutexGuard<'_, Room> {
        self.room.lock().expect("flow room")
    }

    /// A slot given back: handed to the next waiter, if any.
    fn release(&self) {
        self.in_flight.fetch_sub(1, SeqCst);
        if self.queued.load(SeqCst) > 0 {
            self.pump(&mut self.room());
        }
    }

    /// `enter`'s second step: joins the room with the slots (`max_in_flight` × copies) and
    /// bounds now, unless the request cannot be served before `entry.until` at the drain
    /// rate, and waits for a slot. A request let in is counted, with how long it waited, in
    /// its lane's series.
    pub async fn wait(
        self: &Arc<Self>,
        entry: &Entry,
        (limit, bounds): (usize, Bounds),
    ) -> Result<Permit, Refusal> {
        let joined_at = Instant::now();
        let (reply, rx) = oneshot::channel();
        let (id, series) = {
            let mut room = self.room();
            self.limit.store(limit.max(1), SeqCst);
            room.queue.set_bounds(bounds);
            // A limit raised since the last full moment may have freed slots.
            self.pump(&mut room);
            if let Some(wait) = room.expected_wait(entry)
                && joined_at + wait > entry.until
            {
                return Err(room.refusal(Shed::Deadline));
            }
            let id = room.next_id;
            room.next_id += 1;
            let waiter = Waiter {
                id,
                reply,
                band: entry.band,
                tenant: entry.tenant.clone(),
            };
            self.queued.fetch_add(1, SeqCst);
            let lane = (&entry.tenant, entry.flow.weight);
            match room.queue.join(entry.band, lane, entry.bytes, waiter) {
                Joined::Refused(shed) => {
                    self.queued.fetch_sub(1, SeqCst);
                    return Err(room.refusal(shed));
                }
                Joined::QueuedPushing(pushed) => {
                    self.queued.fetch_sub(1, SeqCst);
                    self.series(&mut room, pushed.band, &pushed.tenant)
                        .depth
                        .decrement(1.0);
                    let _ = pushed.reply.send(Err(Shed::Pressure));
                }
                Joined::Queued => {}
            }
            let series = self.series(&mut room, entry.band, &entry.tenant);
            series.depth.increment(1.0);
            self.pump(&mut room);
            (id, series)
        };
        let mut ticket = Ticket {
            gate: self,
            entry,
            id,
            rx,
            granted: false,
        };
        let answer = tokio::time::timeout_at(entry.until, &mut ticket.rx).await;
        let shed = match answer {
            Ok(Ok(Ok(()))) => {
                ticket.granted = true;
                series.wait.record(joined_at.elapsed().as_secs_f64());
                series.admitted.increment(1);
                return Ok(Permit { gate: self.clone() });
            }
            Ok(Ok(Err(shed))) => shed,
            // The room never drops a waiter unanswered; were it to, that is a full room.
            Ok(Err(_)) => Shed::Full,
            Err(_) => Shed::Deadline,
        };
        drop(ticket);
        Err(self.room().refusal(shed))
    }

    /// Hands free slots to waiters, in the queue's order. A waiter whose request has gone
    /// gives its slot straight back.
    fn pump(&self, room: &mut Room) {
        while !room.queue.is_empty() && self.try_slot() {
            let (band, tenant, waiter) = room.queue.next().expect("not empty");
            self.queued.fetch_sub(1, SeqCst);
            room.drain.popped(Instant::now(), !room.queue.is_empty());
            self.series(room, band, &tenant).depth.decrement(1.0);
            if waiter.reply.send(Ok(())).is_err() {
                self.in_flight.fetch_sub(1, SeqCst);
            }
        }
    }

    /// The series of the lane of `band` and `tenant`, registered on its first use.
    fn series(&self, room: &mut Room, band: Band, tenant: &Arc<str>) -> Arc<LaneSeries> {
        let lanes = &mut room.series[band.index()];
        if let Some(series) = lanes.get(&**tenant) {
            return series.clone();
        }
        let series = Arc::new(LaneSeries::new(&self.model, band, tenant));
        lanes.insert(tenant.clone(), series.clone());
        series
    }
}

impl Room {
    /// How long a newcomer would wait, at the drain rate: the higher bands' requests, then
    /// its turn in its band (its lane's backlog, spread over the band's tenants by
    /// weight). `None` until the rate is measured.
    fn expected_wait(&self, entry: &Entry) -> Option<Duration> {
        let rate = self.drain.per_sec()?;
        let (band, tenant) = (entry.band, &*entry.tenant);
        let band_len = self.queue.lane_total(band);
        let higher = self.queue.ahead_of(band) - band_len;
        let lane = self.queue.lane_len(band, tenant);
        let weight = u64::from(entry.flow.weight.max(1));
        let weights = self.queue.active_weight(band) + if lane == 0 { weight } else { 0 };
        let turns = (lane + 1) as f64 * weights as f64 / weight as f64;
        let ahead = higher as f64 + turns.min((band_len + 1) as f64);
        Some(Duration::from_secs_f64(ahead / rate))
    }

    /// A refusal, with the time the room takes to empty at its drain rate.
    fn refusal(&self, shed: Shed) -> Refusal {
        let retry_after = match self.drain.per_sec() {
            Some(rate) => Duration::from_secs_f64(self.queue.len() as f64 / rate),
            None => Duration::from_secs(1),
        };
        Refusal { shed, retry_after }
    }
}

/// A waiter's place. Left without a slot (its deadline, its client gone), it takes its
/// entry out of the queue, or gives back a slot handed to it meanwhile.
struct Ticket<'a> {
    gate: &'a Arc<Gate>,
    entry: &'a Entry,
    id: u64,
    rx: oneshot::Receiver<Result<(), Shed>>,
    granted: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        let gate = self.gate;
        let (band, tenant) = (self.entry.band, &self.entry.tenant);
        let mut room = gate.room();
        if room
            .queue
            .remove(band, tenant, |w| w.id == self.id)
            .is_some()
        {
            gate.queued.fetch_sub(1, SeqCst);
            gate.series(&mut room, band, tenant).depth.decrement(1.0);
            return;
        }
        drop(room);
        // Its turn came: the slot handed over (if any) goes back.
        self.rx.close();
        if let Ok(Ok(())) = self.rx.try_recv() {
            gate.release();
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    const ROOMY: Bounds = Bounds {
        per_tenant: 1000,
        total: 1000,
        bytes: usize::MAX,
    };

    /// A request of `tenant` (of `weight`) in `band` that waits at most `wait`.
    pub(in crate::flow) fn entry(band: Band, tenant: &str, weight: u32, wait: Duration) -> Entry {
        Entry {
            band,
            tenant: Arc::from(tenant),
            flow: TenantFlow {
                weight,
                ..TenantFlow::default()
            },
            until: Instant::now() + wait,
            bytes: 0,
        }
    }

    async fn enter(gate: &Arc<Gate>, entry: &Entry) -> Result<Permit, Refusal> {
        gate.enter(|| (entry.clone(), 1, ROOMY)).await
    }

    /// Below its limit a gate admits at once; past it requests wait, and each slot given
    /// back goes to the next in the queue's order (here the critical request first).
    #[tokio::test(start_paused = true)]
    async fn below_the_limit_nothing_waits_and_freed_slots_go_in_order() {
        let gate = Arc::new(Gate::new("m", 1));
        let long = Duration::from_secs(60);
        let first = gate
            .try_enter()
            .expect("below the limit a slot is taken at once");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for (i, band) in [Band::Standard, Band::Sheddable, Band::Critical]
            .into_iter()
            .enumerate()
        {
            let (gate, order) = (gate.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let permit = enter(&gate, &entry(band, "b", 1, long)).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(permit);
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.queued(), 3);
        drop(first);
        for w in waiting {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [2, 0, 1]);
        assert_eq!((gate.queued(), gate.in_flight.load(SeqCst)), (0, 0));
    }

    /// Once the drain rate is known, a request whose deadline the queue cannot meet is
    /// refused at once (no time passes), with `Retry-After` the time the queue takes to
    /// empty; one that can wait is served.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_the_queue_cannot_meet_is_refused_at_once() {
        let gate = Arc::new(Gate::new("m", 1));
        let long = Duration::from_secs(60);
        // One slot, each request holding it 100 ms: 10 per second.
        let mut clients = Vec::new();
        for _ in 0..12 {
            let gate = gate.clone();
            clients.push(tokio::spawn(async move {
                let permit = enter(&gate, &entry(Band::Standard, "a", 1, long)).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                permit.is_ok()
            }));
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(650)).await;
        let queued = gate.queued();
        assert_eq!(queued, 5);
        let started = Instant::now();
        let hurried = entry(Band::Standard, "a", 1, Duration::from_millis(50));
        let refused = enter(&gate, &hurried).await.unwrap_err();
        assert_eq!(refused.shed, Shed::Deadline);
        assert_eq!(started.elapsed(), Duration::ZERO);
        let secs = refused.retry_after.as_secs_f64();
        assert!((0.45..=0.55).contains(&secs), "retry after {secs}s");
        // Another tenant, alone in its lane, is next in line by turns: 200 ms.
        let patient = entry(Band::Standard, "b", 1, Duration::from_millis(300));
        assert!(enter(&gate, &patient).await.is_ok());
        assert!(started.elapsed() <= Duration::from_millis(300));
        for c in clients {
            assert!(c.await.unwrap());
        }
    }

    /// A request that waits past its deadline leaves with `Deadline`, and the slot it would
    /// have had goes to the next; one pushed out of a full room by a higher band is told so
    /// at once.
    #[tokio::test(start_paused = true)]
    async fn timeouts_and_pushes_leave_no_slot_behind() {
        let gate = Arc::new(Gate::new("m", 1));
        let bounds = Bounds {
            per_tenant: 10,
            total: 1,
            bytes: usize::MAX,
        };
        let bounded = move |entry: Entry| move || (entry, 1, bounds);
        let held = gate
            .enter(bounded(entry(
                Band::Standard,
                "a",
                1,
                Duration::from_secs(1),
            )))
            .await
            .unwrap();
        let short = entry(Band::Sheddable, "a", 1, Duration::from_millis(20));
        let started = Instant::now();
        let timed_out = gate.enter(bounded(short)).await.unwrap_err();
        assert_eq!(timed_out.shed, Shed::Deadline);
        assert_eq!(started.elapsed(), Duration::from_millis(20));
        // It left the room: a sheddable one takes its place, and a critical one pushes that
        // out.
        let pushed = {
            let gate = gate.clone();
            let low = entry(Band::Sheddable, "b", 1, Duration::from_secs(5));
            tokio::spawn(async move { gate.enter(bounded(low)).await })
        };
        tokio::task::yield_now().await;
        let critical = entry(Band::Critical, "c", 1, Duration::from_secs(5));
        let served = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter(bounded(critical)).await.is_ok() })
        };
        tokio::task::yield_now().await;
        assert_eq!(pushed.await.unwrap().unwrap_err().shed, Shed::Pressure);
        drop(held);
        assert!(served.await.unwrap());
        assert_eq!((gate.queued(), gate.in_flight.load(SeqCst)), (0, 0));
    }

    /// A limit learned outside a full moment (the model's config fetched) applies at once:
    /// lowered, the next request waits though the gate was made roomier; raised, it lets
    /// waiters in without another request arriving.
    #[tokio::test(start_paused = true)]
    async fn a_learned_limit_applies_at_once() {
        let gate = Arc::new(Gate::new("m", 32));
        let long = Duration::from_secs(60);
        let a = enter(&gate, &entry(Band::Standard, "a", 1, long)).await;
        let b = enter(&gate, &entry(Band::Standard, "a", 1, long)).await;
        gate.relimit(1);
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let gate = gate.clone();
                let entry = entry(Band::Standard, "a", 1, long);
                tokio::spawn(async move { gate.enter(|| (entry, 1, ROOMY)).await.is_ok() })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(gate.queued(), 2);
        gate.relimit(4);
        assert_eq!((gate.queued(), gate.in_flight.load(SeqCst)), (0, 4));
        for w in waiting {
            assert!(w.await.unwrap());
        }
        drop((a, b));
        assert_eq!(gate.in_flight.load(SeqCst), 0);
    }
}
