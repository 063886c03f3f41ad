//! How a planned load ends on the books: finished (the copy serves, or a failed new copy
//! leaves and backs off), abandoned (the registry did not agree to it), an ensemble's parts
//! held, a departing copy gone, a copy resized or told what it serves. Its own file so what
//! follows a load reads apart from planning it.

use super::reconcile::adopt;
use super::{CopyEntry, CopyState, Indexed, LoadPlan, Table};
use crate::placement::estimate::{Estimate, Sizing};
use crate::placement::versions::Versions;
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::time::Instant;

impl Table {
    /// A plan the registry did not agree to (unreachable, or another replica's change won):
    /// the new copy it booked leaves the books, unless the registry's records replaced it
    /// meanwhile, so no request waits on a load that will never run.
    pub fn abandon(&mut self, plan: &LoadPlan, now: Instant) {
        let books = &mut self.backends[plan.backend];
        let ours = books.copies.get(&plan.model).is_some_and(|copy| {
            matches!(&copy.state, CopyState::Loading(waiting)
                if waiting.same_channel(&plan.done.subscribe()))
        });
        if ours && let Some(copy) = books.take(&plan.model, (&mut self.located, plan.backend)) {
            books.committed -= copy.size;
            books.changed = now;
        }
    }

    /// A departing copy has gone from the backend: its bytes are free, and requests waiting
    /// to place the model there decide again. Reconciliation ignores index reads from before.
    pub fn departed(&mut self, backend: usize, model: &str, now: Instant) {
        let books = &mut self.backends[backend];
        if let Some(departing) = books.departing.remove(model) {
            books.departing_bytes -= departing.bytes;
            books.changed = now;
            let _ = departing.done.send(Some(Ok(())));
        }
    }

    /// Records how a load ended: the copy turns ready (serving its new versions, after a
    /// reload); a new copy that failed leaves the books, a reloaded one goes back to what it
    /// served. A failure backs off exponentially for that (model, backend).
    pub fn finish_load(
        &mut self,
        backend: usize,
        model: &str,
        outcome: &Result<(), Arc<str>>,
        now: Instant,
    ) {
        let books = &mut self.backends[backend];
        books.changed = now;
        let reloading = books
            .copies
            .get(model)
            .is_some_and(|c| matches!(c.state, CopyState::Reloading(_)));
        if outcome.is_err() && !reloading {
            if let Some(copy) = books.take(model, (&mut self.located, backend)) {
                books.committed -= copy.size;
            }
        } else if let Some((before, after)) =
            books.modify(model, |copy| settle(copy, outcome.is_ok(), now))
        {
            books.committed = books.committed - before + after;
        }
        match outcome {
            Ok(()) => {
                self.failures.remove(&(model.to_string(), backend));
            }
            Err(reason) => self.back_off(backend, model, reason, now),
        }
    }

    /// After an ensemble's load on `backend`: the models it runs, which Triton loaded with it
    /// (or found there), are on the books as copies of their own, held while the ensemble is
    /// there; the ensemble, planned for the whole group, is counted for its own bytes from
    /// then on. Returns the parts that were not on the books before.
    pub fn hold_parts(
        &mut self,
        backend: usize,
        ensemble: (&str, Estimate),
        parts: &[(String, Sizing)],
        now: Instant,
    ) -> Vec<String> {
        let books = &mut self.backends[backend];
        let (name, own) = ensemble;
        let names: Arc<[String]> = parts.iter().map(|(part, _)| part.clone()).collect();
        let Some((before, held_already)) = books.modify(name, |copy| {
            let held_already = !copy.parts.is_empty();
            copy.parts = names.clone();
            (std::mem::replace(&mut copy.size, own.bytes), held_already)
        }) else {
            return Vec::new();
        };
        books.committed = books.committed - before + own.bytes;
        let mut added = Vec::new();
        if held_already {
            // A reload of the ensemble: its parts are held since its first load.
            return added;
        }
        for (part, sizing) in parts {
            if books.modify(part, |copy| copy.held += 1).is_some() {
                continue;
            }
            let found = Indexed {
                name: part.clone(),
                estimate: sizing.estimate(&Versions::latest()),
                serving: Versions::latest().resolve(sizing.newest()),
            };
            let mut copy = adopt(&found, false, now);
            copy.held = 1;
            books.committed += copy.size;
            books.put(copy, (&mut self.located, backend));
            added.push(part.clone());
        }
        books.changed = now;
        added
    }

    /// Records the version numbers a backend reports READY for a copy (after its load).
    pub fn set_serving(&mut self, backend: usize, model: &str, serving: BTreeSet<u64>) {
        self.backends[backend].modify(model, |copy| copy.serving = serving);
    }

    /// Replaces a copy's size with a measured one. The books may then exceed capacity until
    /// eviction catches up: they follow what the backend really holds.
    pub fn resize(&mut self, backend: usize, model: &str, estimate: Estimate) {
        let books = &mut self.backends[backend];
        if let Some(old) = books.modify(model, |copy| {
            let old = copy.size;
            copy.size = estimate.bytes;
            copy.source = estimate.source;
            old
        }) {
            books.committed = books.committed - old + estimate.bytes;
        }
    }
}

/// Puts a copy whose load ended back to serving: a reload's new versions when it succeeded,
/// its old size when it failed. Returns its size before and after.
fn settle(copy: &mut CopyEntry, ok: bool, now: Instant) -> (u64, u64) {
    let before = copy.size;
    if let CopyState::Reloading(reload) = std::mem::replace(&mut copy.state, CopyState::Ready) {
        if ok {
            copy.versions = reload.to;
            copy.serving = reload.to_serving;
        } else {
            copy.size = reload.from.bytes;
            copy.source = reload.from.source;
        }
    }
    copy.last_used = now;
    (before, copy.size)
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::*;

    /// A part the ensemble found on the backend (a direct request loaded it first) is held,
    /// not booked twice, and stays when the ensemble leaves.
    #[tokio::test(start_paused = true)]
    async fn an_ensemble_holds_a_part_that_was_there_and_lets_it_go() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB], policy(), start);
        load(&mut table, "net", 30, start);
        load(&mut table, "ensemble", 61, start);
        let parts = [("pre".to_string(), est(30)), ("net".to_string(), est(30))];
        let own = est(1).estimate(&Versions::latest());
        assert_eq!(
            table.hold_parts(0, ("ensemble", own), &parts, start),
            ["pre"]
        );
        assert_eq!(table.backends[0].committed, 61 * MIB);
        assert_eq!(table.backends[0].copies["net"].held, 1);
        assert!(table.remove_copy(0, "ensemble", start));
        assert_eq!(table.backends[0].copies["net"].held, 0);
        assert_eq!(table.backends[0].copies["pre"].held, 0);
        assert_within_capacity(&table);
    }

    /// A plan the registry did not agree to leaves no loading copy behind for requests to
    /// wait on; a copy that is not the plan's own stays.
    #[tokio::test(start_paused = true)]
    async fn an_abandoned_plan_leaves_no_copy_loading() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB], policy(), start);
        let plan = plan_of(table.decide(&model("m"), &est(10), &view(1), false, true, start));
        assert_eq!(table.backends[0].committed, 10 * MIB);
        table.abandon(&plan, start);
        assert!(table.backends[0].copies.is_empty());
        assert_eq!(table.backends[0].committed, 0);
        // Another plan's copy (here, the next decision's) is not this plan's to take.
        let next = plan_of(table.decide(&model("m"), &est(10), &view(1), false, true, start));
        table.abandon(&plan, start);
        assert!(table.backends[0].copies.contains_key("m"));
        drop(next);
    }
}
