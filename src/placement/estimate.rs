//! How much memory a model will take once loaded.
//!
//! In order: an explicit `size` from `[[models]]`; else the size learned from the backend's
//! memory metric when it was last loaded; else its size on disk (config plus the newest
//! version directory) times `size_multiplier`, as KServe ModelMesh does; else
//! `default_model_size`. Disk sizes are read once per model and kept.

use crate::config;
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

/// Sizes models; cheap to call repeatedly.
#[derive(Debug)]
pub struct Estimator {
    explicit: HashMap<String, u64>,
    repository: Option<PathBuf>,
    multiplier: f64,
    default: u64,
    disk: Mutex<HashMap<String, Option<u64>>>,
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

    /// Keeps a measured size: from now on it is the model's estimate (unless config names
    /// one), so a small file that fills a GPU is counted as what it fills.
    pub fn learn(&self, model: &str, bytes: u64) {
        self.learned
            .lock()
            .expect("estimator lock")
            .insert(model.to_string(), bytes);
    }

    /// The estimate for a model. Reads the disk the first time a model is asked about (a
    /// few `stat` calls), outside any placement lock.
    pub fn estimate(&self, model: &str) -> Estimate {
        if let Some(&bytes) = self.explicit.get(model) {
            return Estimate {
                bytes,
                source: SizeSource::Config,
            };
        }
        if let Some(&bytes) = self.learned.lock().expect("estimator lock").get(model) {
            return Estimate {
                bytes,
                source: SizeSource::Learned,
            };
        }
        let cached = self
            .disk
            .lock()
            .expect("estimator lock")
            .get(model)
            .copied();
        let on_disk = match cached {
            Some(size) => size,
            None => {
                let size = self
                    .repository
                    .as_deref()
                    .and_then(|repo| disk_size(repo, model));
                self.disk
                    .lock()
                    .expect("estimator lock")
                    .insert(model.to_string(), size);
                size
            }
        };
        match on_disk {
            Some(bytes) => Estimate {
                bytes: (bytes as f64 * self.multiplier).ceil() as u64,
                source: SizeSource::Disk,
            },
            None => Estimate {
                bytes: self.default,
                source: SizeSource::Default,
            },
        }
    }
}

/// Bytes of `config.pbtxt` plus every file under the newest numbered version directory.
/// `None` when the model is not in the repository or has no version directory.
fn disk_size(repository: &Path, model: &str) -> Option<u64> {
    if model.contains(['/', '\\']) || model == ".." || model == "." {
        return None;
    }
    let dir = repository.join(model);
    let newest = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .max()?;
    let config = std::fs::metadata(dir.join("config.pbtxt")).map_or(0, |m| m.len());
    Some(config + tree_size(&dir.join(newest.to_string())))
}

fn tree_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.file_type() {
            Ok(t) if t.is_dir() => tree_size(&entry.path()),
            Ok(t) if t.is_file() => entry.metadata().map_or(0, |m| m.len()),
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
        assert_eq!(estimator.estimate("absent").source, SizeSource::Default);
        // A learned size wins over the disk, not over config.
        estimator.learn("padded", 5 << 30);
        assert_eq!(
            estimator.estimate("padded"),
            Estimate {
                bytes: 5 << 30,
                source: SizeSource::Learned
            }
        );
        estimator.learn("sized", 1);
        assert_eq!(estimator.estimate("sized").source, SizeSource::Config);
        assert_eq!(estimator.estimate("../etc").source, SizeSource::Default);
    }
}
