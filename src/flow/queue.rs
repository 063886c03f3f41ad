//! The queue discipline of one model's waiting room, with no clock and no locks: one FIFO
//! per (band, tenant), bands strictly in order, and deficit round robin between the
//! tenants of a band by weight (Shreedhar and Varghese's DRR with every request costing
//! one), so taking the next request is O(1) whatever the number of tenants. Bounds per
//! tenant and in all, in requests and in body bytes; when the room holds as many requests
//! as it may, a newcomer pushes out the newest request of a lower band, so `sheddable` goes
//! first and `standard` next. `Gate` adds the clock, the
//! locks and the slots around it.

use super::Band;
use std::collections::VecDeque;
use std::sync::Arc;

/// Why a request left its queue without being served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    /// Its deadline could not be met at the queue's drain rate (refused on arrival), or
    /// passed while it waited.
    Deadline,
    /// Its tenant's queue was full.
    TenantFull,
    /// Every queue of the model together was full, with nothing of a lower band to push
    /// out.
    Full,
    /// Pushed out of a full room by a request of a higher band.
    Pressure,
    /// Its body would have taken the bytes of the model's waiting requests past their bound
    /// (`server.max_queued_bytes`).
    Bytes,
}

impl Shed {
    /// The `reason` label of `infergate_flow_shed_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deadline => "deadline",
            Self::TenantFull => "tenant_full",
            Self::Full => "full",
            Self::Pressure => "pressure",
            Self::Bytes => "bytes",
        }
    }
}

/// One tenant's queue in one band: each request with its body's bytes.
#[derive(Debug)]
struct Lane<T> {
    items: VecDeque<(T, usize)>,
    weight: u32,
    /// DRR's deficit: requests this lane may still take in its current turn.
    deficit: u32,
}

/// One band: its lanes, and the ring of those with requests (a lane is in it exactly when
/// it has items).
#[derive(Debug)]
struct BandQueues<T> {
    lanes: foldhash::HashMap<Arc<str>, Lane<T>>,
    active: VecDeque<Arc<str>>,
    len: usize,
}

impl<T> Default for BandQueues<T> {
    fn default() -> Self {
        Self {
            lanes: Default::default(),
            active: VecDeque::new(),
            len: 0,
        }
    }
}

/// Bounds on a model's waiting room.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Requests of one tenant waiting at once, all bands together.
    pub per_tenant: usize,
    /// Requests waiting at once, all tenants and bands together.
    pub total: usize,
    /// Body bytes of the requests waiting at once, all together.
    pub bytes: usize,
}

/// What joining a queue did.
#[derive(Debug)]
pub enum Joined<T> {
    /// The request waits.
    Queued,
    /// The request waits, and pushed this one (of a lower band) out.
    QueuedPushing(T),
    /// The request was refused.
    Refused(Shed),
}

/// The queues of one model: bands, lanes per tenant, bounds.
#[derive(Debug)]
pub struct FairQueue<T> {
    bands: [BandQueues<T>; Band::COUNT],
    per_tenant: foldhash::HashMap<Arc<str>, usize>,
    /// Body bytes waiting, all together.
    bytes: usize,
    bounds: Bounds,
}

impl<T> FairQueue<T> {
    /// An empty waiting room with these bounds.
    pub fn new(bounds: Bounds) -> Self {
        Self {
            bands: Default::default(),
            per_tenant: Default::default(),
            bytes: 0,
            bounds,
        }
    }

    /// New bounds (a reload's), for the requests that join from now on.
    pub fn set_bounds(&mut self, bounds: Bounds) {
        self.bounds = bounds;
    }

    /// Requests waiting in `band`.
    pub fn lane_total(&self, band: Band) -> usize {
        self.bands[band.index()].len
    }

    /// Requests waiting, all bands.
    pub fn len(&self) -> usize {
        self.bands.iter().map(|b| b.len).sum()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Requests waiting in `band` and every band above it: those served before a newcomer
    /// of `band` at the latest.
    pub fn ahead_of(&self, band: Band) -> usize {
        Band::ALL[..=band.index()]
            .iter()
            .map(|b| self.bands[b.index()].len)
            .sum()
    }

    /// Requests of `tenant` waiting in `band`.
    pub fn lane_len(&self, band: Band, tenant: &str) -> usize {
        self.bands[band.index()]
            .lanes
            .get(tenant)
            .map_or(0, |l| l.items.len())
    }

    /// The weights of the tenants with requests in `band`, together (DRR shares a band's
    /// turns in their proportion).
    pub fn active_weight(&self, band: Band) -> u64 {
        let queues = &self.bands[band.index()];
        (queues.active.iter())
            .map(|t| u64::from(queues.lanes[t].weight))
            .sum()
    }

    /// Every lane with requests, as (band, tenant, requests waiting, weight): for a
    /// snapshot (`/admin/flow`), linear in the lanes.
    pub fn lanes(&self) -> impl Iterator<Item = (Band, &Arc<str>, usize, u32)> {
        Band::ALL.iter().flat_map(move |&band| {
            (self.bands[band.index()].lanes.iter())
                .map(move |(tenant, lane)| (band, tenant, lane.items.len(), lane.weight))
        })
    }

    /// Puts `item` (with a body of `bytes`) at the back of `tenant`'s lane in `band`, if
    /// the bounds let it; a room holding as many requests as it may pushes out the newest
    /// request of the lowest band below `band` that has one. Bytes push nothing out: a body
    /// that does not fit beside those waiting is refused.
    pub fn join(
        &mut self,
        band: Band,
        (tenant, weight): (&Arc<str>, u32),
        bytes: usize,
        item: T,
    ) -> Joined<T> {
        if self.per_tenant.get(tenant).copied().unwrap_or(0) >= self.bounds.per_tenant {
            return Joined::Refused(Shed::TenantFull);
        }
        if self.bytes.saturating_add(bytes) > self.bounds.bytes {
            return Joined::Refused(Shed::Bytes);
        }
        let pushed = if self.len() >= self.bounds.total {
            match self.push_out_below(band) {
                Some(pushed) => Some(pushed),
                None => return Joined::Refused(Shed::Full),
            }
        } else {
            None
        };
        let queues = &mut self.bands[band.index()];
        let lane = queues.lanes.entry(tenant.clone()).or_insert(Lane {
            items: VecDeque::new(),
            weight: 1,
            deficit: 0,
        });
        lane.weight = weight.max(1);
        if lane.items.is_empty() {
            queues.active.push_back(tenant.clone());
        }
        lane.items.push_back((item, bytes));
        queues.len += 1;
        self.bytes += bytes;
        *self.per_tenant.entry(tenant.clone()).or_insert(0) += 1;
        match pushed {
            Some(pushed) => Joined::QueuedPushing(pushed),
            None => Joined::Queued,
        }
    }

    /// The next request to serve, with its band and tenant: the highest band with any, and
    /// within it the lane whose DRR turn it is.
    pub fn next(&mut self) -> Option<(Band, Arc<str>, T)> {
        let band = *Band::ALL.iter().find(|b| self.bands[b.index()].len > 0)?;
        let queues = &mut self.bands[band.index()];
        let tenant = queues.active.front()?.clone();
        let lane = queues.lanes.get_mut(&tenant).expect("an active lane");
        if lane.deficit == 0 {
            lane.deficit = lane.weight;
        }
        let (item, bytes) = lane.items.pop_front().expect("an active lane has items");
        lane.deficit -= 1;
        if lane.items.is_empty() {
            // An emptied lane leaves the ring and forgets its turn (DRR's rule), and its
            // entry, so tenants that come and go leave nothing behind.
            queues.active.pop_front();
            queues.lanes.remove(&tenant);
        } else if lane.deficit == 0 {
            queues.active.rotate_left(1);
        }
        queues.len -= 1;
        self.left(&tenant, bytes);
        Some((band, tenant, item))
    }

    /// Takes out the request of `tenant` in `band` that `is` picks, if it still waits: a
    /// request that leaves before its turn (its deadline, its client gone). Linear in its
    /// lane and in the band's tenants, which only a request leaving early pays.
    pub fn remove(&mut self, band: Band, tenant: &str, is: impl Fn(&T) -> bool) -> Option<T> {
        let queues = &mut self.bands[band.index()];
        let lane = queues.lanes.get_mut(tenant)?;
        let at = lane.items.iter().position(|(item, _)| is(item))?;
        let (item, bytes) = lane.items.remove(at).expect("found");
        if lane.items.is_empty() {
            queues.lanes.remove(tenant);
            queues.active.retain(|t| &**t != tenant);
        }
        queues.len -= 1;
        self.left(tenant, bytes);
        Some(item)
    }

    /// Pushes out the newest request of the lowest band below `band` that has one: the
    /// back of the last lane in that band's ring.
    fn push_out_below(&mut self, band: Band) -> Option<T> {
        let lowest = *Band::ALL[band.index() + 1..]
            .iter()
            .rev()
            .find(|b| self.bands[b.index()].len > 0)?;
        let queues = &mut self.bands[lowest.index()];
        let tenant = queues.active.back()?.clone();
        let lane = queues.lanes.get_mut(&tenant).expect("an active lane");
        let (item, bytes) = lane.items.pop_back().expect("an active lane has items");
        if lane.items.is_empty() {
            queues.active.pop_back();
            queues.lanes.remove(&tenant);
        }
        queues.len -= 1;
        self.left(&tenant, bytes);
        Some(item)
    }

    fn left(&mut self, tenant: &str, bytes: usize) {
        self.bytes -= bytes;
        if let Some(n) = self.per_tenant.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                self.per_tenant.remove(tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(per_tenant: usize, total: usize) -> FairQueue<u32> {
        FairQueue::new(Bounds {
            per_tenant,
            total,
            bytes: usize::MAX,
        })
    }

    fn joined<T>(joined: Joined<T>) -> bool {
        matches!(joined, Joined::Queued | Joined::QueuedPushing(_))
    }

    /// A band's requests all go before any of the band below, whatever order they came in
    /// and whoever sent them; within a lane, first come first served.
    #[test]
    fn bands_are_strict_and_lanes_are_fifo() {
        let mut q = room(100, 100);
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        for i in 0..5 {
            assert!(joined(q.join(Band::Sheddable, (&a, 1), 0, 300 + i)));
            assert!(joined(q.join(Band::Standard, (&b, 1), 0, 200 + i)));
        }
        assert!(joined(q.join(Band::Critical, (&a, 1), 0, 100)));
        let order: Vec<u32> = std::iter::from_fn(|| q.next().map(|(_, _, i)| i)).collect();
        assert_eq!(
            order,
            [100, 200, 201, 202, 203, 204, 300, 301, 302, 303, 304]
        );
        assert!(q.is_empty());
        assert!(q.per_tenant.is_empty() && q.bands.iter().all(|b| b.lanes.is_empty()));
    }

    /// Two tenants always waiting with weights 3 and 1 share the turns 3:1, within 10% over
    /// many dequeues (exactly, with unit costs), and a third tenant arriving later gets its
    /// share at once, not after the others' backlog.
    #[test]
    fn tenants_share_a_band_by_weight() {
        let mut q = room(1_000_000, 1_000_000);
        let (heavy, light, late): (Arc<str>, Arc<str>, Arc<str>) =
            ("heavy".into(), "light".into(), "late".into());
        for i in 0..10_000 {
            q.join(Band::Standard, (&heavy, 3), 0, i);
            q.join(Band::Standard, (&light, 1), 0, i);
        }
        let mut served = foldhash::HashMap::<Arc<str>, u32>::default();
        for _ in 0..8_000 {
            let (_, tenant, _) = q.next().unwrap();
            *served.entry(tenant).or_default() += 1;
        }
        let ratio = f64::from(served[&heavy]) / f64::from(served[&light]);
        assert!((ratio - 3.0).abs() < 0.3, "3:1 weights served {ratio:.3}:1");
        q.join(Band::Standard, (&late, 1), 0, 0);
        let within: Vec<Arc<str>> = (0..5).map(|_| q.next().unwrap().1).collect();
        assert!(within.contains(&late), "{within:?}");
    }

    /// A tenant's lane holds at most its bound; the room as a whole its own. A full room
    /// takes a higher band's request by pushing out the newest of the lowest band below it,
    /// and refuses one with nothing below it to push out.
    #[test]
    fn bounds_hold_and_a_full_room_sheds_the_lowest_band_first() {
        let mut q = room(2, 4);
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "c".into());
        assert!(joined(q.join(Band::Standard, (&a, 1), 0, 1)));
        assert!(joined(q.join(Band::Standard, (&a, 1), 0, 2)));
        assert!(matches!(
            q.join(Band::Critical, (&a, 1), 0, 3),
            Joined::Refused(Shed::TenantFull)
        ));
        assert!(joined(q.join(Band::Sheddable, (&b, 1), 0, 10)));
        assert!(joined(q.join(Band::Sheddable, (&b, 1), 0, 11)));
        assert!(matches!(
            q.join(Band::Sheddable, (&c, 1), 0, 20),
            Joined::Refused(Shed::Full)
        ));
        assert!(matches!(
            q.join(Band::Standard, (&c, 1), 0, 21),
            Joined::QueuedPushing(11)
        ));
        assert!(matches!(
            q.join(Band::Critical, (&c, 1), 0, 22),
            Joined::QueuedPushing(10)
        ));
        // Nothing below critical is left but standard: it goes next.
        assert!(matches!(
            q.join(Band::Critical, (&b, 1), 0, 12),
            Joined::QueuedPushing(21)
        ));
        assert_eq!(q.len(), 4);
        assert_eq!(
            (q.ahead_of(Band::Critical), q.ahead_of(Band::Standard)),
            (2, 4)
        );
        let order: Vec<u32> = std::iter::from_fn(|| q.next().map(|(_, _, i)| i)).collect();
        assert_eq!(order, [22, 12, 1, 2]);
    }
    /// Body bytes count against the room's byte bound: a body that does not fit beside
    /// those waiting is refused with `Bytes` (a small one still fits), and bytes leave the
    /// count with their request, however it leaves (served, taken out, pushed out).
    #[test]
    fn waiting_bodies_count_against_the_byte_bound() {
        let mut q: FairQueue<u32> = FairQueue::new(Bounds {
            per_tenant: 10,
            total: 3,
            bytes: 1000,
        });
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        assert!(joined(q.join(Band::Sheddable, (&a, 1), 600, 1)));
        assert!(matches!(
            q.join(Band::Critical, (&b, 1), 500, 2),
            Joined::Refused(Shed::Bytes)
        ));
        assert!(joined(q.join(Band::Standard, (&b, 1), 400, 3)));
        assert_eq!(q.bytes, 1000);
        assert!(matches!(
            q.join(Band::Standard, (&b, 1), 1, 4),
            Joined::Refused(Shed::Bytes)
        ));
        // Served: its bytes leave with it.
        assert_eq!(q.next().map(|(_, _, i)| i), Some(3));
        assert_eq!(q.bytes, 600);
        assert!(joined(q.join(Band::Standard, (&b, 1), 300, 5)));
        assert!(joined(q.join(Band::Standard, (&b, 1), 100, 6)));
        // A full room: the critical request pushes out the sheddable one, and its bytes.
        assert!(matches!(
            q.join(Band::Critical, (&a, 1), 0, 7),
            Joined::QueuedPushing(1)
        ));
        assert_eq!(q.bytes, 400);
        assert_eq!(q.remove(Band::Standard, "b", |i| *i == 6), Some(6));
        assert_eq!(q.bytes, 300);
        while q.next().is_some() {}
        assert_eq!(q.bytes, 0);
    }
}
