//! A read-only picture of every model's gate, for `GET /admin/flow`: an operator asking
//! "who is waiting, and for what" while a model is saturated. Each gate is read under its
//! room's lock only long enough to copy its lanes' lengths; nothing is held across an
//! await, and the request path never builds one.

use super::{Band, Flow};
use serde::Serialize;

/// One model's gate as it stands: its slots, and who waits behind them.
#[derive(Clone, Debug, Serialize)]
pub struct GateView {
    /// The model the gate is for.
    pub model: String,
    /// Its slots on the model's copies.
    pub slots: Slots,
    /// Requests waiting, all tenants and bands.
    pub queued: usize,
    /// Requests leaving the queue per second, measured while it last had a backlog;
    /// `None` until measured (what `Retry-After` and refusals on arrival are computed from).
    pub drain_per_second: Option<f64>,
    /// One entry per tenant and band with requests waiting: bands highest first, then by
    /// tenant.
    pub queues: Vec<LaneView>,
}

/// A gate's slots: how many requests are on the model's copies, and how many may be.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Slots {
    /// Requests holding a slot now.
    pub in_use: usize,
    /// `max_in_flight` × copies, as computed at the gate's last full moment.
    pub limit: usize,
}

/// One tenant's queue in one band.
#[derive(Clone, Debug, Serialize)]
pub struct LaneView {
    /// The tenant ("" for anonymous traffic).
    pub tenant: String,
    /// The band.
    pub band: Band,
    /// Requests waiting in it.
    pub depth: usize,
    /// The tenant's weight in the band's turns.
    pub weight: u32,
}

impl Flow {
    /// Every gate's view, by model name. The map's lock is held only to copy the gates'
    /// handles; each gate is then read on its own.
    pub fn snapshot(&self) -> Vec<GateView> {
        let gates: Vec<_> = (self.gates.read().expect("flow gates").values())
            .cloned()
            .collect();
        let mut views: Vec<GateView> = gates.iter().map(|gate| gate.snapshot()).collect();
        views.sort_by(|a, b| a.model.cmp(&b.model));
        views
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::Entry;
    use crate::flow::queue::Bounds;
    use std::time::Duration;

    /// A request that waits up to a minute.
    fn entry(band: Band, tenant: &str, weight: u32) -> Entry {
        crate::flow::gate::tests::entry(band, tenant, weight, Duration::from_secs(60))
    }

    /// A saturated gate shows its slot in use, each tenant's depth per band (highest band
    /// first) and the total; once the waiters have gone, nothing waits and the slot is free.
    #[tokio::test(start_paused = true)]
    async fn shows_slots_and_each_lane_of_a_saturated_gate() {
        let flow = Flow::default();
        let gate = flow.gate("m", || 1, || true).unwrap();
        let roomy = Bounds {
            per_tenant: 100,
            total: 100,
            bytes: usize::MAX,
        };
        let enter = |entry: Entry| {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter(|| (entry, 1, roomy)).await.map(drop) })
        };
        let held = gate
            .enter(|| (entry(Band::Standard, "a", 1), 1, roomy))
            .await
            .unwrap();
        let mut waiting = Vec::new();
        for (band, tenant, weight) in [
            (Band::Standard, "a", 1),
            (Band::Standard, "a", 1),
            (Band::Standard, "b", 3),
            (Band::Critical, "b", 3),
        ] {
            waiting.push(enter(entry(band, tenant, weight)));
            tokio::task::yield_now().await;
        }
        let views = flow.snapshot();
        assert_eq!(views.len(), 1);
        let view = &views[0];
        assert_eq!((view.model.as_str(), view.queued), ("m", 4));
        assert_eq!((view.slots.in_use, view.slots.limit), (1, 1));
        assert_eq!(view.drain_per_second, None);
        let lanes: Vec<(&str, Band, usize, u32)> = (view.queues.iter())
            .map(|l| (l.tenant.as_str(), l.band, l.depth, l.weight))
            .collect();
        assert_eq!(
            lanes,
            [
                ("b", Band::Critical, 1, 3),
                ("a", Band::Standard, 2, 1),
                ("b", Band::Standard, 1, 3),
            ]
        );
        drop(held);
        for w in waiting {
            w.await.unwrap().unwrap();
        }
        let view = &flow.snapshot()[0];
        assert_eq!((view.queued, view.slots.in_use), (0, 0));
        assert!(view.queues.is_empty());
    }
}
