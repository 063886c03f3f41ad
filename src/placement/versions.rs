//! Which versions of a model a copy is loaded to serve.
//!
//! A request without a version gets the model's default policy ("latest": what config.pbtxt
//! says, Triton's newest version unless it says otherwise); a request for version `v` needs a
//! copy that serves `v`. A copy loaded for `v` is loaded with a `specific` version policy
//! (`model_config::load_body`), and a copy asked for one more version is reloaded with the
//! union, so the versions it served keep serving.

use std::collections::BTreeSet;

/// The versions a copy was loaded for: the default policy, numbered versions, or both.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Versions {
    /// Serves what a request without a version gets.
    pub latest: bool,
    /// Versions asked for by number.
    pub pinned: BTreeSet<u64>,
}

impl Versions {
    /// The default policy alone: a plain load.
    pub fn latest() -> Self {
        Self {
            latest: true,
            pinned: BTreeSet::new(),
        }
    }

    /// What a request asks for: its version, or the default policy without one.
    pub fn requested(version: Option<u64>) -> Self {
        match version {
            None => Self::latest(),
            Some(v) => Self {
                latest: false,
                pinned: BTreeSet::from([v]),
            },
        }
    }

    /// Whether a copy loaded for `self` also serves everything `other` asks for.
    pub fn covers(&self, other: &Versions) -> bool {
        (self.latest || !other.latest) && other.pinned.is_subset(&self.pinned)
    }

    /// Both sets: what a copy is reloaded for when it must serve one more version.
    pub fn union(&self, other: &Versions) -> Versions {
        Versions {
            latest: self.latest || other.latest,
            pinned: self.pinned.union(&other.pinned).copied().collect(),
        }
    }

    /// True for the default policy alone, which a plain load (no config override) gives.
    pub fn is_default(&self) -> bool {
        self.latest && self.pinned.is_empty()
    }

    /// The version numbers to load, "latest" taken as `newest` (the newest on disk).
    pub fn resolve(&self, newest: Option<u64>) -> BTreeSet<u64> {
        let mut all = self.pinned.clone();
        if self.latest {
            all.extend(newest);
        }
        all
    }
}

impl std::fmt::Display for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = self.pinned.iter().map(u64::to_string).collect();
        if self.latest {
            parts.insert(0, "latest".into());
        }
        f.write_str(&parts.join("+"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unions_cover_what_each_side_served() {
        let latest = Versions::latest();
        let one = Versions::requested(Some(1));
        let both = latest.union(&one);
        assert!(both.covers(&latest) && both.covers(&one));
        assert!(!one.covers(&latest) && !latest.covers(&one));
        assert_eq!(both.resolve(Some(3)), BTreeSet::from([1, 3]));
        assert_eq!(one.resolve(Some(3)), BTreeSet::from([1]));
        assert!(latest.is_default() && !both.is_default());
        assert_eq!(both.to_string(), "latest+1");
    }
}
