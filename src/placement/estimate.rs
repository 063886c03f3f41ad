//! How much memory a model will take once loaded.
//!
//! In order: an explicit `size` from `[[models]]`; else the size learned from the backend's
//! memory metric when it was last loaded; else its size on disk (config plus the version
//! directories loaded: the newest one for "latest") times `size_multiplier`, as KServe
//! ModelMesh does; else `default_model_size`. The first three are per version: a copy
//! serving two versions counts twice. Disk sizes are read once per version directory and
//! kept; reconciliation rescans a loaded model's directory for new versions.

use super::versions::Versions;
use crate::config;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where an estimate came from, shown in the admin API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SizeSource {
    /// `[[models]] size`.
    Config,
    /// The rise of the backend's memory metric when it was loaded.
    Learned,
    /// Bytes on disk × multiplier.
    Disk,
    /// `placement.default_model_size`.
    Default,
}

/// A model's estimated size and how it was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// Bytes.
    pub bytes: u64,
    /// Why this number.
    pub source: SizeSource,
}

/// What a model costs per version set. Made outside the placement lock (it may read the
/// disk), then asked under it for any set without touching the disk: a request for one more
/// version of a loaded model is sized as the union the copy is reloaded with.
#[derive(Clone, Debug)]
pub struct Sizing {
    /// Why these numbers.
    pub source: SizeSource,
    /// Bytes per version, for every source but the disk.
    per_version: u64,
    /// The model on disk, when the repository has it: what "latest" means, and disk sizes.
    disk: Option<Arc<OnDisk>>,
    multiplier: f64,
}

impl Sizing {
    /// The estimate for a copy serving `versions`: for disk sizes, config.pbtxt plus those
    /// version directories times the multiplier; else the per-version size times their count.
    pub fn estimate(&self, versions: &Versions) -> Estimate {
        let resolved = versions.resolve(self.newest());
        let bytes = match (&self.disk, self.source) {
            (Some(disk), SizeSource::Disk) => {
                let raw = disk.config
                    + resolved
                        .iter()
                        .map(|v| disk.versions.get(v).copied().unwrap_or(0))
                        .sum::<u64>();
                (raw as f64 * self.multiplier).ceil() as u64
            }
            _ => self.per_version * resolved.len().max(1) as u64,
        };
        Estimate {
            bytes,
            source: self.source,
        }
    }

    /// The newest version directory in the repository: what "latest" loads.
    pub fn newest(&self) -> Option<u64> {
        self.disk.as_ref()?.versions.keys().next_back().copied()
    }

    /// False only when the repository is known and has no directory for `version`.
    pub fn has_version(&self, version: u64) -> bool {
        self.disk
            .as_ref()
            .is_none_or(|d| d.versions.contains_key(&version))
    }
}

#[cfg(test)]
impl Sizing {
    /// A model on disk with these version directories (bytes each), multiplier 1.
    pub(crate) fn on_disk(config: u64, versions: &[(u64, u64)]) -> Self {
        Self {
            source: SizeSource::Disk,
            per_version: 0,
            disk: Some(Arc::new(OnDisk {
                config,
                versions: versions.iter().copied().collect(),
            })),
            multiplier: 1.0,
        }
    }
}

/// One size for every version set: the simulator and unit tests, which know no repository.
impl From<Estimate> for Sizing {
    fn from(estimate: Estimate) -> Self {
        Self {
            source: estimate.source,
            per_version: estimate.bytes,
            disk: None,
            multiplier: 1.0,
        }
    }
}

/// A model directory: bytes of config.pbtxt and of each numbered version directory.
#[derive(Debug)]
struct OnDisk {
    config: u64,
    versions: BTreeMap<u64, u64>,
}

/// Sizes models; cheap to call repeatedly.
#[derive(Debug)]
pub struct Estimator {
    explicit: HashMap<String, u64>,
    repository: Option<PathBuf>,
    multiplier: f64,
    default: u64,
    /// Models found on disk (only those), as last read.
    disk: Mutex<HashMap<String, Arc<OnDisk>>>,
    learned: Mutex<HashMap<String, u64>>,
}

impl Estimator {
    /// Builds the estimator from config.
    pub fn new(placement: &config::Placement, models: &[config::Model]) -> Self {
        Self {
            explicit: models
                .iter()
                .filter_map(|m| Some((m.name.clone(), m.size?.bytes())))
                .collect(),
            repository: placement.model_repository.clone(),
            multiplier: placement.size_multiplier,
            default: placement.default_model_size.bytes(),
            disk: Mutex::new(HashMap::new()),
            learned: Mutex::new(HashMap::new()),
        }
    }

    /// Keeps a measured size of one version: from now on it is the model's estimate per
    /// version (unless config names one), so a small file that fills a GPU is counted as what
    /// it fills.
    pub fn learn(&self, model: &str, bytes: u64) {
        self.learned
            .lock()
            .expect("estimator lock")
            .insert(model.to_string(), bytes);
    }

    /// Every learned size per version, by model (for sharing them across replicas).
    pub fn learned(&self) -> Vec<(String, u64)> {
        let learned = self.learned.lock().expect("estimator lock");
        learned.iter().map(|(m, b)| (m.clone(), *b)).collect()
    }

    /// The estimate for the model's default version (one copy as a plain load makes it).
    pub fn estimate(&self, model: &str) -> Estimate {
        self.sizing(model).estimate(&Versions::latest())
    }

    /// How the model is sized, for any version set. Reads the disk the first time a model is
    /// asked about (a few `stat` calls), outside any placement lock.
    pub fn sizing(&self, model: &str) -> Sizing {
        let cached = self
            .disk
            .lock()
            .expect("estimator lock")
            .get(model)
            .cloned();
        let disk = cached.or_else(|| self.read_disk(model));
        let explicit = self.explicit.get(model).copied();
        let learned = self
            .learned
            .lock()
            .expect("estimator lock")
            .get(model)
            .copied();
        let (source, per_version) = match (explicit, learned, &disk) {
            (Some(bytes), _, _) => (SizeSource::Config, bytes),
            (None, Some(bytes), _) => (SizeSource::Learned, bytes),
            (None, None, Some(_)) => (SizeSource::Disk, 0),
            (None, None, None) => (SizeSource::Default, self.default),
        };
        Sizing {
            source,
            per_version,
            disk,
            multiplier: self.multiplier,
        }
    }

    /// Reads the model's directory again and returns its newest version: reconciliation
    /// looks for new versions this way.
    pub fn rescan(&self, model: &str) -> Option<u64> {
        let disk = self.read_disk(model)?;
        disk.versions.keys().next_back().copied()
    }

    /// Reads the model's directory into the cache; version directories already sized are not
    /// walked again.
    fn read_disk(&self, model: &str) -> Option<Arc<OnDisk>> {
        let known = self
            .disk
            .lock()
            .expect("estimator lock")
            .get(model)
            .cloned();
        let scanned = self
            .repository
            .as_deref()
            .and_then(|repo| scan(repo, model, known.as_deref()))
            .map(Arc::new);
        // Only models on disk are kept: names that are not (a typo, a client trying names)
        // must not grow the cache.
        let mut disk = self.disk.lock().expect("estimator lock");
        match &scanned {
            Some(found) => disk.insert(model.to_string(), found.clone()),
            None => disk.remove(model),
        };
        scanned
    }

    /// The sizing of a model no backend knows: such a request is refused before its size
    /// matters, so the disk is not read for it.
    pub fn unread(&self) -> Sizing {
        Sizing {
            source: SizeSource::Default,
            per_version: self.default,
            disk: None,
            multiplier: self.multiplier,
        }
    }
}

/// The model's directory: config.pbtxt's size and each numbered version directory's (those
/// in `known` taken from it). `None` when the repository has no such model or no version.
fn scan(repository: &Path, model: &str, known: Option<&OnDisk>) -> Option<OnDisk> {
    if model.contains(['/', '\\']) || model == ".." || model == "." {
        return None;
    }
    let dir = repository.join(model);
    let versions: BTreeMap<u64, u64> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.is_dir()))
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .map(|v| {
            let size = known
                .and_then(|k| k.versions.get(&v).copied())
                .unwrap_or_else(|| tree_size(&dir.join(v.to_string()), MAX_DEPTH));
            (v, size)
        })
        .collect();
    if versions.is_empty() {
        return None;
    }
    let config = std::fs::metadata(dir.join("config.pbtxt")).map_or(0, |m| m.len());
    Some(OnDisk { config, versions })
}

/// Deeper than any model directory; a symbolic link loop ends here.
const MAX_DEPTH: u32 = 16;

/// Bytes of every file under `path`. Symbolic links are followed, as Triton follows them
/// when it loads the model (repositories mounted by Kubernetes, or versions linked to one
/// another, are made of them).
fn tree_size(path: &Path, depth: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| match std::fs::metadata(entry.path()) {
            Ok(m) if m.is_dir() && depth > 0 => tree_size(&entry.path(), depth - 1),
            Ok(m) if m.is_file() => m.len(),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_then_disk_then_default() {
        let repo = tempfile::tempdir().unwrap();
        let model = repo.path().join("padded");
        std::fs::create_dir_all(model.join("1")).unwrap();
        std::fs::create_dir_all(model.join("2/sub")).unwrap();
        std::fs::write(model.join("config.pbtxt"), vec![b'c'; 100]).unwrap();
        std::fs::write(model.join("1/weights.bin"), vec![0; 5000]).unwrap();
        std::fs::write(model.join("2/model.py"), vec![0; 300]).unwrap();
        std::fs::write(model.join("2/sub/weights.bin"), vec![0; 600]).unwrap();

        let placement = config::Placement {
            model_repository: Some(repo.path().to_path_buf()),
            size_multiplier: 2.0,
            ..Default::default()
        };
        let models = [config::Model {
            name: "sized".into(),
            size: Some(config::ByteSize(1 << 30)),
            min_copies: 0,
            max_copies: None,
            preload: false,
            keep: false,
            cost_weight: None,
        }];
        let estimator = Estimator::new(&placement, &models);
        assert_eq!(
            estimator.estimate("sized"),
            Estimate {
                bytes: 1 << 30,
                source: SizeSource::Config
            }
        );
        // Newest version only: (100 + 300 + 600) × 2.
        assert_eq!(
            estimator.estimate("padded"),
            Estimate {
                bytes: 2000,
                source: SizeSource::Disk
            }
        );
        // Versions asked for by number count their own directories; 3 is not on disk.
        let sizing = estimator.sizing("padded");
        let both = Versions::requested(Some(1)).union(&Versions::latest());
        assert_eq!(sizing.estimate(&both).bytes, (100 + 5000 + 900) * 2);
        assert_eq!(sizing.newest(), Some(2));
        assert!(sizing.has_version(1) && !sizing.has_version(3));
        // A version directory added later is found by a rescan.
        std::fs::create_dir_all(model.join("3")).unwrap();
        std::fs::write(model.join("3/model.py"), vec![0; 50]).unwrap();
        assert_eq!(estimator.sizing("padded").newest(), Some(2), "cached");
        assert_eq!(estimator.rescan("padded"), Some(3));
        assert_eq!(estimator.estimate("padded").bytes, 150 * 2);
        assert_eq!(estimator.estimate("absent").source, SizeSource::Default);
        assert!(
            !estimator.disk.lock().unwrap().contains_key("absent"),
            "a name not on disk is not kept"
        );
        // Linked files and directories count as what they point at; a link loop ends.
        let linked = repo.path().join("linked");
        std::fs::create_dir_all(linked.join("1")).unwrap();
        std::fs::write(linked.join("1/model.py"), vec![0; 70]).unwrap();
        std::fs::create_dir_all(linked.join("2")).unwrap();
        std::os::unix::fs::symlink("../1/model.py", linked.join("2/model.py")).unwrap();
        std::os::unix::fs::symlink("1", linked.join("3")).unwrap();
        std::os::unix::fs::symlink(".", linked.join("1/loop")).unwrap();
        let sizing = estimator.sizing("linked");
        assert_eq!(
            sizing.newest(),
            Some(3),
            "a linked version directory is a version"
        );
        let all = Versions::requested(Some(2)).union(&Versions::requested(Some(3)));
        assert_eq!(
            sizing.estimate(&all).bytes,
            (70 + 70 * (MAX_DEPTH as u64 + 1)) * 2
        );
        // A learned size wins over the disk, not over config.
        estimator.learn("padded", 5 << 30);
        assert_eq!(
            estimator.estimate("padded"),
            Estimate {
                bytes: 5 << 30,
                source: SizeSource::Learned
            }
        );
        // Per version: two versions count twice.
        assert_eq!(
            estimator.sizing("padded").estimate(&both).bytes,
            2 * (5 << 30)
        );
        estimator.learn("sized", 1);
        assert_eq!(estimator.estimate("sized").source, SizeSource::Config);
        assert_eq!(estimator.estimate("../etc").source, SizeSource::Default);
    }
}
