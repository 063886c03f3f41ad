//! Where each model's copies are: model → the backends whose books hold a copy (loading,
//! reloading or ready). A warm request reads one entry instead of asking every backend's
//! books, so its cost does not grow with the pool.

use std::collections::HashMap;
use std::sync::Arc;

/// The index of copies by model. `Table` keeps it in step with every `Books::put` and
/// `Books::take`; its tests check that it always names exactly the copies on the books.
#[derive(Debug, Default)]
pub(super) struct Located {
    /// Backend indexes in pool order (a model has a copy or two: a short vector beats a set).
    by_model: HashMap<Arc<str>, Vec<usize>>,
}

impl Located {
    /// The backends holding a copy of `model`, in pool order (empty if none).
    pub(super) fn of(&self, model: &str) -> &[usize] {
        self.by_model.get(model).map_or(&[], Vec::as_slice)
    }

    /// Records a copy of `model` on `backend`.
    pub(super) fn add(&mut self, model: &Arc<str>, backend: usize) {
        let backends = self.by_model.entry(model.clone()).or_default();
        if let Err(at) = backends.binary_search(&backend) {
            backends.insert(at, backend);
        }
    }

    /// Forgets the copy of `model` on `backend`.
    pub(super) fn remove(&mut self, model: &str, backend: usize) {
        if let Some(backends) = self.by_model.get_mut(model) {
            backends.retain(|&b| b != backend);
            if backends.is_empty() {
                self.by_model.remove(model);
            }
        }
    }

    /// Every (model, backend) pair, for the tests' consistency check.
    #[cfg(test)]
    pub(super) fn pairs(&self) -> std::collections::BTreeSet<(String, usize)> {
        self.by_model
            .iter()
            .flat_map(|(model, backends)| backends.iter().map(|&b| (model.to_string(), b)))
            .collect()
    }
}
