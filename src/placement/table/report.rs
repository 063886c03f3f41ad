//! What the books report: per-backend usage, LRU age, loading and pinned copies, for the
//! admin view, the metrics and the controller. Its own file so the read-only views read
//! apart from the decisions.

use super::{CopyState, Table};
use std::time::Duration;
use tokio::time::Instant;

impl Table {
    /// Pinned models with a ready copy on a backend.
    pub fn pinned_on(&self, backend: usize) -> Vec<String> {
        let mut names: Vec<String> = self.backends[backend]
            .copies
            .iter()
            .filter(|(_, c)| c.pinned && matches!(c.state, CopyState::Ready))
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    /// Whether a copy is loading on a backend: this replica's load, or (`[cluster]`) one
    /// another replica runs, which the registry's mirror books as loading too.
    pub fn loading_on(&self, backend: usize) -> bool {
        self.backends.get(backend).is_some_and(|books| {
            books
                .copies
                .values()
                .any(|c| matches!(c.state, CopyState::Loading(_) | CopyState::Reloading(_)))
        })
    }

    /// Bytes committed and loading on a backend, and copies held.
    pub fn usage(&self, backend: usize) -> (u64, u64, usize) {
        let books = &self.backends[backend];
        (books.committed, books.loading_bytes(), books.copies.len())
    }

    /// A backend's LRU age: time since the least recently used copy eviction could take
    /// there was used. Small means models leave soon after their last use: the backend is
    /// short of memory. Pinned copies never leave, so their idle time says nothing and is
    /// left out; copies in use count as just used; with nothing evictable it is 0.
    pub fn lru_age(&self, backend: usize, now: Instant) -> Duration {
        self.backends[backend]
            .oldest_idle()
            .map_or(Duration::ZERO, |used| now.saturating_duration_since(used))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::*;

    #[tokio::test(start_paused = true)]
    async fn lru_age_is_per_backend_and_leaves_out_pinned_and_busy_copies() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB, 100 * MIB], policy(), start);
        let later = start + Duration::from_secs(90);
        assert_eq!(table.lru_age(0, later), Duration::ZERO, "nothing loaded");
        let a = load(&mut table, "a", 10, start);
        let other = 1 - a;
        assert_eq!(table.lru_age(a, later), Duration::from_secs(90));
        assert_eq!(table.lru_age(other, later), Duration::ZERO);
        // A pinned copy, however long idle, is not what eviction would take.
        match table.decide(&model("p"), &est(10), &view(2), true, true, start) {
            Decision::Load(plan) => {
                assert_eq!(plan.backend, other);
                table.finish_load(plan.backend, "p", &Ok(()), start);
            }
            unexpected => panic!("{unexpected:?}"),
        }
        assert_eq!(table.lru_age(other, later), Duration::ZERO);
        // In use: just used. Released: its age starts again from then.
        assert!(matches!(
            table.decide(&model("a"), &est(10), &view(2), false, true, later),
            Decision::Serve(b) if b == a
        ));
        assert_eq!(
            table.lru_age(a, later + Duration::from_secs(5)),
            Duration::ZERO
        );
        table.release(a, "a", later + Duration::from_secs(5));
        assert_eq!(
            table.lru_age(a, later + Duration::from_secs(7)),
            Duration::from_secs(2)
        );
    }
}
