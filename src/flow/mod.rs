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

/// `max_in_flight` when `[[models]]` does not set it: the gateway does not read the
/// model's instance count and batch size yet, so a constant, high enough that a pool that
/// worked before flow control (clients up to 32 at once per copy) never queues at the
/// gateway; set it lower (instance count × max batch size, or 1–2 for a model that runs
/// one request at a time) for isolation between tenants.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

/// The header (HTTP) and metadata key (gRPC) a request asks for its band with.
pub const PRIORITY_HEADER: &str = "x-infergate-priority";

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
        if let Some(gate) = self.gates.read().expect("flow gates").get(model) {
            return Some(gate.clone());
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
}
