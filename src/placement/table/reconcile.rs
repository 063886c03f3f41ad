//! Agreement with what each backend reports: reconciliation adopts READY models the books
//! lack, drops ready copies the backend no longer has, and takes the versions it serves. Its
//! own file so the books' correction from the backends' indexes reads in one place.

use super::{CopyEntry, CopyState, Table};
use crate::placement::estimate::Estimate;
use crate::placement::versions::Versions;
use std::collections::BTreeSet;
use tokio::time::Instant;

impl Table {
    /// Brings one backend's books in line with what it reports. A backend that is not ready
    /// holds nothing; otherwise READY models it has that the books lack are adopted (counted,
    /// evictable, serving the default policy), ready copies it no longer has are dropped, and
    /// ready copies take the versions it reports. An index read before the books last
    /// changed is stale and ignored.
    pub fn reconcile(
        &mut self,
        backend: usize,
        ready: bool,
        index_ready: &[Indexed],
        index_read_at: Option<Instant>,
        pinned: &dyn Fn(&str) -> bool,
        now: Instant,
    ) -> Reconciled {
        let books = &mut self.backends[backend];
        let mut result = Reconciled::default();
        let fresh = index_read_at.is_some_and(|t| t > books.changed);
        if ready && !fresh {
            return result;
        }
        let gone: Vec<String> = books
            .copies
            .iter()
            .filter(|(name, c)| {
                matches!(c.state, CopyState::Ready)
                    && !(ready && index_ready.iter().any(|i| &i.name == *name))
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            let copy = books
                .take(&name, (&mut self.located, backend))
                .expect("present");
            books.committed -= copy.size;
            result.dropped.push(name);
        }
        if !ready {
            return result;
        }
        for found in index_ready {
            if books.departing.contains_key(&found.name) {
                // Placement is unloading it: READY until Triton has let it go.
                continue;
            }
            let adopted = books.modify(&found.name, |copy| {
                if matches!(copy.state, CopyState::Ready) {
                    copy.serving = found.serving.clone();
                }
            });
            if adopted.is_none() {
                books.put(
                    adopt(found, pinned(&found.name), now),
                    (&mut self.located, backend),
                );
                books.committed += found.estimate.bytes;
                result.adopted.push(found.name.clone());
            }
        }
        result
    }

    /// Ready copies serving the default policy on a backend, with the newest version each
    /// serves: reconciliation compares them with the repository to find newer versions.
    pub fn latest_copies(&self, backend: usize) -> Vec<(String, Option<u64>)> {
        self.backends[backend]
            .copies
            .iter()
            .filter(|(_, c)| c.versions.latest && matches!(c.state, CopyState::Ready))
            .map(|(name, c)| (name.clone(), c.serving.last().copied()))
            .collect()
    }
}

/// A model a backend's index shows READY, as reconciliation reads it.
#[derive(Clone, Debug)]
pub struct Indexed {
    /// Model name.
    pub name: String,
    /// Its estimate, should the books adopt it.
    pub estimate: Estimate,
    /// The versions READY.
    pub serving: BTreeSet<u64>,
}

/// A copy for a model a backend already had: taken to serve the default policy, as a load
/// made outside infergate most likely does.
pub(super) fn adopt(found: &Indexed, pinned: bool, now: Instant) -> CopyEntry {
    CopyEntry::new(
        &found.name,
        (found.estimate.bytes, found.estimate.source),
        CopyState::Ready,
        (Versions::latest(), found.serving.clone()),
        pinned,
        now,
    )
}

/// What reconciliation changed on one backend.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// Models found READY and taken onto the books.
    pub adopted: Vec<String>,
    /// Models taken off the books because the backend no longer has them.
    pub dropped: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::*;

    #[tokio::test(start_paused = true)]
    async fn reconcile_adopts_drops_and_ignores_stale_indexes() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB], policy(), start);
        let later = start + Duration::from_secs(1);
        let index = vec![Indexed {
            name: "adopted".into(),
            estimate: Estimate {
                bytes: 10 * MIB,
                source: SizeSource::Disk,
            },
            serving: BTreeSet::from([1]),
        }];
        let result = table.reconcile(0, true, &index, Some(later), &|_| false, later);
        assert_eq!(result.adopted, ["adopted"]);
        // A load changes the books; an index read before that is ignored.
        let loaded_at = later + Duration::from_secs(1);
        load(&mut table, "mine", 10, loaded_at);
        let stale = table.reconcile(0, true, &index, Some(later), &|_| false, loaded_at);
        assert!(stale.dropped.is_empty());
        // A fresh index without "mine" means it was unloaded out of band.
        let fresh = loaded_at + Duration::from_secs(1);
        let result = table.reconcile(0, true, &index, Some(fresh), &|_| false, fresh);
        assert_eq!(result.dropped, ["mine"]);
        // A backend that is down holds nothing.
        let result = table.reconcile(0, false, &[], None, &|_| false, fresh);
        assert_eq!(result.dropped, ["adopted"]);
        assert_eq!(table.usage(0), (0, 0, 0));
    }
}
