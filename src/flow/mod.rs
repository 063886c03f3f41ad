//! Flow control: fair under overload. Each model's copies take at most `max_in_flight`
//! requests each (`[[models]]`); past that, requests wait at the gateway, not in Triton's
//! queue, in one queue per (model, tenant) and priority band (`Band`), and leave as slots
//! free: bands strictly in order, tenants within a band by weight (`queue`). A request whose
//! deadline the queue cannot meet is refused at once, with `Retry-After` from the queue's
//! drain rate. Below saturation a request costs one map read and one atomic update
//! (`gate`). The pipeline's `flow` phase drives it; `/admin/flow` shows it (`snapshot`);
//! docs/flow.md tells the user.

pub mod gate;
pub mod queue;
pub mod snapshot;

pub use gate::{Entry, Gate, Permit};
pub use queue::Shed;

pub use crate::config::Band;
use foldhash::HashMap;
use std::sync::{Arc, RwLock};

/// `max_in_flight` when `[[models]]` does not set it and the model's config gives no
/// capacity: not known yet (it is read from the first copy that serves a validated request,
/// with its signature; never with validation off), or a decoupled model, whose instances
/// bound nothing. High enough that a pool that worked before flow control (clients up to
/// 32 at once per copy) does not queue at the gateway.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

/// The default `max_in_flight` of a copy: twice what its config says it works on at once
/// (`capacity`, instances × max batch size), so one batch runs while the next waits in
/// Triton's queue, and never below `DEFAULT_MAX_IN_FLIGHT`. The floor is for fast models:
/// a slot is held for the gateway's whole round trip, not only for the model's work, so a
/// python identity model (well under a millisecond a request) held to 2 slots ran at 2 ÷
/// the round trip, far below what its Triton serves from its own queue; a burst of 1,000
/// requests then looked like a slow drain and was shed by deadline (tests/reload.rs). The
/// config raises the default for copies that work on many at once (a TensorRT-LLM model
/// batching 64 gets 128); `[[models]] max_in_flight` sets it lower for a slow model.
/// `DEFAULT_MAX_IN_FLIGHT` without a capacity.
pub fn default_per_copy(capacity: Option<usize>) -> usize {
    capacity.map_or(DEFAULT_MAX_IN_FLIGHT, |c| {
        c.saturating_mul(2).max(DEFAULT_MAX_IN_FLIGHT)
    })
}

/// One copy's slots: `per_copy`, less the requests its Triton reports waiting (`pending`)
/// that this gateway did not send (another replica's, clients calling Triton directly),
/// never below 1: a Triton whose queue others fill gets fewer of this gateway's requests,
/// which wait at the gateway instead, in their order. `capacity` (requests the copy works
/// on at once, from its config) tells the gateway's own share of the reading: of its
/// `in_flight` requests on the copy, those beyond `capacity` are the ones waiting there.
/// Without a reading, or without the config to split it by, `per_copy` as it is.
pub fn copy_slots(
    per_copy: usize,
    capacity: Option<usize>,
    in_flight: usize,
    pending: Option<u64>,
) -> usize {
    let (Some(capacity), Some(pending)) = (capacity, pending) else {
        return per_copy;
    };
    let ours_waiting = in_flight.saturating_sub(capacity);
    let others = usize::try_from(pending)
        .unwrap_or(usize::MAX)
        .saturating_sub(ours_waiting);
    per_copy.saturating_sub(others).max(1)
}

/// The header (HTTP) and metadata key (gRPC) a request asks for its band with.
pub const PRIORITY_HEADER: http::HeaderName = http::HeaderName::from_static("x-infergate-priority");

/// A tenant's flow policy, from `[[auth.tenants]]`: what its requests get, and what they
/// may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantFlow {
    /// The band of a request that asks for none.
    pub priority: Band,
    /// The highest band a request may ask for; a request asking for more gets this.
    pub max_priority: Band,
    /// Its share of a band's turns against other tenants (deficit round robin).
    pub weight: u32,
    /// Requests of this tenant waiting at once per model, all bands; `None`: only the
    /// model's bound (`server.max_queued`).
    pub max_queued: Option<usize>,
}

impl Default for TenantFlow {
    /// Anonymous traffic and tenants without flow settings: `standard`, and no asking for
    /// more.
    fn default() -> Self {
        Self {
            priority: Band::Standard,
            max_priority: Band::Standard,
            weight: 1,
            max_queued: None,
        }
    }
}

/// Every model's gate, made on a model's first inference. One per gateway, kept across
/// reloads: a reload's new `max_in_flight` or bounds apply from the gate's next full moment.
#[derive(Debug, Default)]
pub struct Flow {
    gates: RwLock<HashMap<Arc<str>, Arc<Gate>>>,
}

impl Flow {
    /// The gate of `model`, made with `max_in_flight` per copy if it has none yet and the
    /// model is `known` (asked only then): a gate is never made for a name no backend has,
    /// so clients naming models at random cannot grow the map; such a request goes on
    /// ungated to placement, which refuses it.
    pub fn gate(
        &self,
        model: &str,
        max_in_flight: impl FnOnce() -> usize,
        known: impl FnOnce() -> bool,
    ) -> Option<Arc<Gate>> {
        if let Some(gate) = self.existing(model) {
            return Some(gate);
        }
        if !known() {
            return None;
        }
        let mut gates = self.gates.write().expect("flow gates");
        let gate = gates
            .entry(Arc::from(model))
            .or_insert_with(|| Arc::new(Gate::new(model, max_in_flight())));
        Some(gate.clone())
    }

    /// The gate of `model`, if a request made one.
    pub fn existing(&self, model: &str) -> Option<Arc<Gate>> {
        self.gates.read().expect("flow gates").get(model).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_parse_exactly_and_cap_at_the_highest_allowed() {
        assert_eq!(Band::parse(b"critical"), Some(Band::Critical));
        assert_eq!(Band::parse(b"sheddable"), Some(Band::Sheddable));
        assert_eq!(Band::parse(b"Critical"), None);
        assert_eq!(Band::parse(b"high"), None);
        assert_eq!(Band::Critical.capped(Band::Standard), Band::Standard);
        assert_eq!(Band::Sheddable.capped(Band::Standard), Band::Sheddable);
        assert_eq!(Band::Critical.capped(Band::Critical), Band::Critical);
    }

    /// Twice the capacity, never below 32; 32 without one.
    #[test]
    fn the_default_keeps_one_batch_waiting_in_triton() {
        assert_eq!(default_per_copy(Some(64)), 128);
        assert_eq!(default_per_copy(Some(17)), 34);
        assert_eq!(
            default_per_copy(Some(1)),
            DEFAULT_MAX_IN_FLIGHT,
            "the floor"
        );
        assert_eq!(default_per_copy(None), DEFAULT_MAX_IN_FLIGHT);
    }

    /// A copy's slots shrink by what its Triton has waiting that this gateway did not send,
    /// never below 1; the gateway's own requests beyond the copy's capacity, which wait
    /// there too, are not counted against it; without a reading or a config, nothing
    /// changes.
    #[test]
    fn a_copy_loses_the_slots_others_fill_in_its_triton() {
        // 4 slots, capacity 4, 4 of ours working: all 3 waiting are others'.
        assert_eq!(copy_slots(4, Some(4), 4, Some(3)), 1);
        assert_eq!(copy_slots(4, Some(4), 4, Some(2)), 2);
        assert_eq!(copy_slots(4, Some(4), 4, Some(0)), 4);
        // Never below one, however long their queue.
        assert_eq!(copy_slots(4, Some(4), 4, Some(1000)), 1);
        // 32 slots on a copy that works on 1 at once: 31 of ours wait in its queue, so a
        // reading of 33 is 2 of others'.
        assert_eq!(copy_slots(32, Some(1), 32, Some(33)), 30);
        assert_eq!(copy_slots(32, Some(1), 32, Some(31)), 32);
        // Nothing to read, or nothing to split the reading by.
        assert_eq!(copy_slots(4, Some(4), 4, None), 4);
        assert_eq!(copy_slots(32, None, 32, Some(40)), 32);
    }
}
