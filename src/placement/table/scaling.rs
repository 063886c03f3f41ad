//! Scaling a model by demand: one more copy where it is busy (or below `min_copies`), and
//! the extra copies taken off once idle. Its own file so scaling reads apart from placing the
//! first copy.

use super::{BackendView, CopyState, LoadPlan, Table};
use crate::placement::estimate::Sizing;
use crate::placement::versions::Versions;
use foldhash::{HashMap, HashMapExt};
use std::time::Duration;
use tokio::time::Instant;

impl Table {
    /// Plans one more copy of a loaded model (its default versions) on a backend that lacks
    /// it, for demand or for `min_copies`. Scale-ups use free space only; pinned copies may
    /// evict.
    pub fn plan_extra_copy(
        &mut self,
        model: &str,
        sizing: &Sizing,
        view: &[BackendView],
        pinned: bool,
        now: Instant,
    ) -> Option<LoadPlan> {
        let lacking: Vec<usize> = (0..self.backends.len())
            .filter(|&b| {
                view[b].ready && view[b].knows && !self.backends[b].draining && self.lacks(b, model)
            })
            .collect();
        let allowed = self.not_backing_off(model, &lacking, now);
        let bytes = sizing.estimate(&Versions::latest()).bytes;
        self.rank_idle(&allowed, now);
        let (backend, victims, top) = self
            .choose(&allowed, model, &|_| bytes, view, pinned, now)
            .ok()?;
        Some(self.commit(
            backend,
            model,
            (Versions::latest(), sizing),
            (victims, top),
            pinned,
            now,
        ))
    }

    /// Per model: copies (ready or loading) and requests served by all of them so far.
    pub fn demand(&self) -> HashMap<String, (usize, u64)> {
        let mut demand: HashMap<String, (usize, u64)> = HashMap::new();
        for books in &self.backends {
            for (name, copy) in &books.copies {
                let entry = demand.entry(name.clone()).or_default();
                entry.0 += 1;
                entry.1 += copy.served;
            }
        }
        demand
    }

    /// Takes off the books the copies a model no longer needs: beyond `keep(model)` copies
    /// (at least one), idle for `idle`, with no request on them, least recently used first.
    pub fn take_idle_extra_copies(
        &mut self,
        idle: Duration,
        keep: &dyn Fn(&str) -> usize,
        now: Instant,
    ) -> Vec<(usize, String)> {
        let mut by_model: HashMap<String, Vec<(usize, Instant, bool)>> = HashMap::new();
        for (b, books) in self.backends.iter().enumerate() {
            for (name, copy) in &books.copies {
                if matches!(copy.state, CopyState::Ready) {
                    let removable =
                        !copy.busy() && now.saturating_duration_since(copy.last_used) >= idle;
                    by_model
                        .entry(name.clone())
                        .or_default()
                        .push((b, copy.last_used, removable));
                }
            }
        }
        let mut removed = Vec::new();
        for (name, mut copies) in by_model {
            let keep = keep(&name).max(1);
            copies.sort_by_key(|&(_, last_used, _)| last_used);
            let mut count = copies.len();
            for (b, _, removable) in copies {
                if count <= keep {
                    break;
                }
                if removable {
                    self.backends[b]
                        .depart(&name, (&mut self.located, b), now)
                        .expect("present");
                    removed.push((b, name.clone()));
                    count -= 1;
                }
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::*;

    #[tokio::test(start_paused = true)]
    async fn busy_models_get_extra_copies_that_go_when_idle() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB, 100 * MIB, 100 * MIB], policy(), start);
        let first = load(&mut table, "hot", 10, start);
        for _ in 0..5 {
            assert!(matches!(
                table.decide(&model("hot"), &est(10), &view(3), false, true, start),
                Decision::Serve(_)
            ));
            table.release(first, "hot", start);
        }
        assert_eq!(table.demand()["hot"], (1, 5));
        let plan = table
            .plan_extra_copy("hot", &est(10), &view(3), false, start)
            .unwrap();
        assert_ne!(plan.backend, first);
        table.finish_load(plan.backend, "hot", &Ok(()), start);
        assert_eq!(table.demand()["hot"].0, 2);
        // Not idle long enough: both stay; then the least recently used one goes.
        let soon = start + Duration::from_secs(10);
        assert!(
            table
                .take_idle_extra_copies(Duration::from_secs(60), &|_| 1, soon)
                .is_empty()
        );
        let later = start + Duration::from_secs(61);
        let removed = table.take_idle_extra_copies(Duration::from_secs(60), &|_| 1, later);
        assert_eq!(removed.len(), 1);
        assert_eq!(table.demand()["hot"].0, 1);
        // min_copies keeps copies however idle.
        assert!(
            table
                .take_idle_extra_copies(Duration::ZERO, &|_| 1, later)
                .is_empty()
        );
        assert_within_capacity(&table);
    }
}
