//! Where each model's copies are: model → the backends whose books hold a copy (loading,
//! reloading or ready). A warm request reads one entry instead of asking every backend's
//! books, so its cost does not grow with the pool.

use foldhash::HashMap;
use std::sync::Arc;

/// The index of copies by model. `Table` keeps it in step with every `Books::put` and
/// `Books::take`; its tests check that it always names exactly the copies on the books.
#[derive(Debug, Default)]
pub(super) struct Located {
    by_model: HashMap<Arc<str>, Holders>,
}

/// The backends holding one model, in pool order. Nearly every model has one copy or two,
/// kept inline (no second allocation to chase on a warm hit); more spill to a vector.
#[derive(Debug)]
enum Holders {
    Inline { len: u8, backends: [u32; 2] },
    Spilled(Vec<u32>),
}

impl Holders {
    fn as_slice(&self) -> &[u32] {
        match self {
            Self::Inline { len, backends } => &backends[..usize::from(*len)],
            Self::Spilled(backends) => backends,
        }
    }

    fn insert(&mut self, backend: u32) {
        let mut all = self.as_slice().to_vec();
        if let Err(at) = all.binary_search(&backend) {
            all.insert(at, backend);
        }
        *self = Self::from(all);
    }

    fn remove(&mut self, backend: u32) {
        let all = self.as_slice().iter().copied().filter(|&b| b != backend);
        *self = Self::from(all.collect::<Vec<_>>());
    }
}

impl From<Vec<u32>> for Holders {
    fn from(all: Vec<u32>) -> Self {
        match all[..] {
            [] => Self::Inline {
                len: 0,
                backends: [0; 2],
            },
            [one] => Self::Inline {
                len: 1,
                backends: [one, 0],
            },
            [one, two] => Self::Inline {
                len: 2,
                backends: [one, two],
            },
            _ => Self::Spilled(all),
        }
    }
}

impl Located {
    /// The backends holding a copy of `model`, in pool order (empty if none).
    pub(super) fn of(&self, model: &str) -> impl Iterator<Item = usize> + '_ {
        let backends = self.by_model.get(model).map_or(&[][..], Holders::as_slice);
        backends.iter().map(|&b| b as usize)
    }

    /// Records a copy of `model` on `backend`.
    pub(super) fn add(&mut self, model: &Arc<str>, backend: usize) {
        let holders = self
            .by_model
            .entry(model.clone())
            .or_insert(Holders::Inline {
                len: 0,
                backends: [0; 2],
            });
        holders.insert(backend as u32);
    }

    /// Forgets the copy of `model` on `backend`.
    pub(super) fn remove(&mut self, model: &str, backend: usize) {
        if let Some(holders) = self.by_model.get_mut(model) {
            holders.remove(backend as u32);
            if holders.as_slice().is_empty() {
                self.by_model.remove(model);
            }
        }
    }

    /// Every (model, backend) pair, for the tests' consistency check.
    #[cfg(test)]
    pub(super) fn pairs(&self) -> std::collections::BTreeSet<(String, usize)> {
        self.by_model
            .iter()
            .flat_map(|(model, holders)| {
                (holders.as_slice().iter()).map(|&b| (model.to_string(), b as usize))
            })
            .collect()
    }
}
