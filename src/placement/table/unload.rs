//! Taking copies off the books to be unloaded, other than by eviction: an explicit unload,
//! a copy the backend says it lost, versions a reload took out of every route. Its own file
//! so the ways a copy leaves read in one place.

use super::plan::start_reload;
use super::{CopyState, LoadReason, Narrowed, Table};
use crate::placement::estimate::Sizing;
use crate::placement::versions::Versions;
use std::collections::BTreeSet;
use tokio::time::Instant;

impl Table {
    /// Takes every copy of a model off the books once no request holds one and no load of
    /// it runs (a reload took it out of every route); returns the backends to unload it
    /// from, or `None` while it is busy.
    pub fn take_if_idle(&mut self, model: &str, now: Instant) -> Option<Vec<usize>> {
        let busy = self.backends.iter().any(|books| {
            books
                .copies
                .get(model)
                .is_some_and(|c| c.busy() || !matches!(c.state, CopyState::Ready))
        });
        (!busy).then(|| self.remove_everywhere(model, now))
    }

    /// Plans, for each copy of a model that was loaded for one of the numbered versions
    /// `leaving` (a reload took them out of every route), a load without them: at once, so
    /// requests for them stop reaching the copy. A copy left with nothing to serve comes
    /// off the books instead, to be unloaded. `None` while a request holds one of those
    /// versions or a load of the model runs: nothing is planned then.
    pub fn narrow(
        &mut self,
        model: &str,
        leaving: &BTreeSet<u64>,
        sizing: &Sizing,
        now: Instant,
    ) -> Option<Vec<Narrowed>> {
        let mut affected = Vec::new();
        for (b, books) in self.backends.iter().enumerate() {
            let Some(copy) = books.copies.get(model) else {
                continue;
            };
            if !matches!(copy.state, CopyState::Ready) {
                return None;
            }
            if copy.versions.pinned.is_disjoint(leaving) {
                continue;
            }
            if copy
                .in_flight_versions
                .iter()
                .any(|(v, _)| leaving.contains(v))
            {
                return None;
            }
            affected.push(b);
        }
        let mut narrowed = Vec::new();
        for b in affected {
            let books = &mut self.backends[b];
            let copy = &books.copies[model];
            let to = Versions {
                latest: copy.versions.latest,
                pinned: copy.versions.pinned.difference(leaving).copied().collect(),
            };
            if !to.latest && to.pinned.is_empty() {
                // No request holds it: it served only leaving versions, and none holds one.
                books
                    .depart(model, (&mut self.located, b), now)
                    .expect("present");
                narrowed.push(Narrowed::Unload(b));
                continue;
            }
            // Requests for the leaving versions stop here: they wait for this load and then,
            // should one still be asked for by name, load it again.
            books.modify(model, |copy| copy.serving.retain(|v| !leaving.contains(v)));
            let plan = start_reload(books, b, model, to, sizing, LoadReason::Retire, now);
            narrowed.push(Narrowed::Load(plan));
        }
        for step in &mut narrowed {
            if let Narrowed::Load(plan) = step {
                self.stamp(plan);
            }
        }
        Some(narrowed)
    }

    /// Takes a model off the books everywhere (an explicit unload); returns the backends that
    /// had a ready copy, to send the unload to.
    pub fn remove_everywhere(&mut self, model: &str, now: Instant) -> Vec<usize> {
        let mut held = Vec::new();
        for (b, books) in self.backends.iter_mut().enumerate() {
            if books
                .copies
                .get(model)
                .is_some_and(|copy| matches!(copy.state, CopyState::Ready))
            {
                books.depart(model, (&mut self.located, b), now);
                held.push(b);
            }
        }
        held
    }

    /// Takes off the books a ready copy that the backend, asked to serve it, said it does not
    /// have (unloaded behind the gateway's back, or lost): requests stop going there at once,
    /// and reconciliation adopts it again should the backend still report it READY. Returns
    /// whether there was one.
    pub fn copy_gone(&mut self, backend: usize, model: &str, now: Instant) -> bool {
        let books = &mut self.backends[backend];
        let ready = books
            .copies
            .get(model)
            .is_some_and(|c| matches!(c.state, CopyState::Ready));
        if ready {
            let copy = books
                .take(model, (&mut self.located, backend))
                .expect("present");
            books.committed -= copy.size;
            books.changed = now;
        }
        ready
    }

    /// Takes one ready copy off the books (in-flight requests finish on the backend, which
    /// waits for them before unloading); false if there was none.
    pub fn remove_copy(&mut self, backend: usize, model: &str, now: Instant) -> bool {
        let books = &mut self.backends[backend];
        match books.copies.get(model) {
            Some(copy) if matches!(copy.state, CopyState::Ready) => {
                books.depart(model, (&mut self.located, backend), now);
                true
            }
            _ => false,
        }
    }
}
