//! How much memory a model will take once loaded.
//!
//! In order: an explicit `size` from `[[models]]`; else the size learned when it was last
//! loaded (what Triton's statistics report in `memory_usage`, else the rise of the backend's
//! memory metric), or raised after a load that failed for lack of memory; else its size on disk (config plus the version
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
    /// What Triton reported in the model's statistics (`memory_usage`) after it was loaded.
    Reported,
    /// Raised after a load failed for lack of memory: the estimate was too small.
    LearnedFromFailure,
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
    /// For an ensemble: the estimates of the models it runs, which Triton loads with it on
    /// the same backend, so the group is placed where all of it fits.
    parts: u64,
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
            bytes: bytes + self.parts,
            source: self.source,
        }
    }

    /// The model alone, without the parts of an ensemble: what its own copy is counted for
    /// once its parts have copies of their own (`Table::hold_parts`).
    pub fn without_parts(&self) -> Self {
        Self {
            parts: 0,
            ..self.clone()
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
                parts: Arc::default(),
            })),
            multiplier: 1.0,
            parts: 0,
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
            parts: 0,
        }
    }
}

/// A model directory: bytes of config.pbtxt and of each numbered version directory, and
/// the models an ensemble's config names in its steps.
#[derive(Debug)]
struct OnDisk {
    config: u64,
    versions: BTreeMap<u64, u64>,
    parts: Arc<[String]>,
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
    /// Sizes per version learned from loads, and how.
    learned: Mutex<HashMap<String, (u64, SizeSource)>>,
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
        self.learn_from(model, bytes, SizeSource::Learned);
    }

    /// `learn`, saying how the size was found (`Learned`, `Reported`, `LearnedFromFailure`).
    pub fn learn_from(&self, model: &str, bytes: u64, source: SizeSource) {
        self.learned
            .lock()
            .expect("estimator lock")
            .insert(model.to_string(), (bytes, source));
    }

    /// Every learned size per version, by model (for sharing them across replicas).
    pub fn learned(&self) -> Vec<(String, u64)> {
        let learned = self.learned.lock().expect("estimator lock");
        learned.iter().map(|(m, (b, _))| (m.clone(), *b)).collect()
    }

    /// After a load of `versions` failed for lack of memory: the model's estimate was too
    /// small, so it is doubled, up to `largest` (the largest backend's usable bytes), and the
    /// next decision places it where that much fits. `None` when the estimate cannot rise:
    /// config names the size (the operator's word stands), or it is `largest` already.
    pub fn raise_after_out_of_memory(
        &self,
        model: &str,
        versions: &Versions,
        largest: u64,
    ) -> Option<Estimate> {
        let sizing = self.sizing(model);
        if sizing.source == SizeSource::Config {
            return None;
        }
        let before = sizing.estimate(versions).bytes;
        let raised = before.saturating_mul(2).min(largest);
        if raised <= before {
            return None;
        }
        let count = versions.resolve(sizing.newest()).len().max(1) as u64;
        self.learn_from(model, raised / count, SizeSource::LearnedFromFailure);
        Some(self.sizing(model).estimate(versions))
    }

    /// The estimate for the model's default version (one copy as a plain load makes it).
    pub fn estimate(&self, model: &str) -> Estimate {
        self.sizing(model).estimate(&Versions::latest())
    }

    /// The models an ensemble runs (its steps, as its config.pbtxt in the repository names
    /// them); empty for any other model, or without `placement.model_repository`.
    pub fn parts(&self, model: &str) -> Arc<[String]> {
        self.on_disk(model)
            .map(|d| d.parts.clone())
            .unwrap_or_default()
    }

    /// The model's directory, read the first time it is asked about.
    fn on_disk(&self, model: &str) -> Option<Arc<OnDisk>> {
        let cached = self
            .disk
            .lock()
            .expect("estimator lock")
            .get(model)
            .cloned();
        cached.or_else(|| self.read_disk(model))
    }

    /// How the model is sized, for any version set. Reads the disk the first time a model is
    /// asked about (a few `stat` calls), outside any placement lock. An ensemble counts the
    /// models it runs as well.
    pub fn sizing(&self, model: &str) -> Sizing {
        self.sizing_within(model, MAX_NESTING)
    }

    /// `sizing`, with ensembles of ensembles followed `depth` levels down at most (Triton
    /// refuses a cycle; a repository with one still gets an answer here).
    fn sizing_within(&self, model: &str, depth: u32) -> Sizing {
        let disk = self.on_disk(model);
        let explicit = self.explicit.get(model).copied();
        let learned = self
            .learned
            .lock()
            .expect("estimator lock")
            .get(model)
            .copied();
        let (source, per_version) = match (explicit, learned, &disk) {
            (Some(bytes), _, _) => (SizeSource::Config, bytes),
            (None, Some((bytes, source)), _) => (source, bytes),
            (None, None, Some(_)) => (SizeSource::Disk, 0),
            (None, None, None) => (SizeSource::Default, self.default),
        };
        let parts = match &disk {
            Some(disk) if depth > 0 => (disk.parts.iter())
                .filter(|part| part.as_str() != model)
                .map(|part| {
                    let sizing = self.sizing_within(part, depth - 1);
                    sizing.estimate(&Versions::latest()).bytes
                })
                .sum(),
            _ => 0,
        };
        Sizing {
            source,
            per_version,
            disk,
            multiplier: self.multiplier,
            parts,
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
            parts: 0,
        }
    }
}

/// Whether a load failure's message says the backend ran out of memory, in the words the
/// frameworks behind Triton use: CUDA and PyTorch ("out of memory", `CUDA_ERROR_OUT_OF_MEMORY`,
/// `OutOfMemoryError`), TensorFlow ("OOM when allocating"), ONNX Runtime ("Failed to
/// allocate memory"), TensorRT ("could not be allocated"), Python and NumPy (`MemoryError`,
/// "Unable to allocate"), C++ (`std::bad_alloc`). Such a load may succeed where more fits.
pub fn is_out_of_memory(reason: &str) -> bool {
    const SAYINGS: [&str; 10] = [
        "out of memory",
        "out_of_memory",
        "outofmemory",
        "failed to allocate",
        "unable to allocate",
        "could not be allocated",
        "cannot allocate memory",
        "memoryerror",
        "bad_alloc",
        "not enough memory",
    ];
    let lower = reason.to_ascii_lowercase();
    SAYINGS.iter().any(|s| lower.contains(s))
        || lower
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|word| word == "oom")
}

/// The bytes per version that a statistics answer (`GET /v2/models/{m}/stats`) reports for
/// `model` in `memory_usage` (Triton 2.35 and later), counting the kind of memory the
/// backend's capacity is measured in: GPU memory when `memory_metric` is a GPU metric, else
/// CPU and pinned CPU memory. Versions that report nothing are left out: backends that do
/// not measure themselves (the python backend) send `"memory_usage": []`.
pub fn reported_sizes(
    answer: &serde_json::Value,
    model: &str,
    memory_metric: &str,
) -> BTreeMap<u64, u64> {
    let gpu = memory_metric.contains("gpu");
    let counted = |kind: &str| {
        if gpu {
            kind == "GPU"
        } else {
            kind == "CPU" || kind == "CPU_PINNED"
        }
    };
    let number = |value: &serde_json::Value| {
        value
            .as_u64()
            .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
    };
    let mut sizes = BTreeMap::new();
    let stats = answer["model_stats"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    for stat in stats.iter().filter(|s| s["name"] == model) {
        let Some(version) = stat["version"].as_str().and_then(|v| v.parse().ok()) else {
            continue;
        };
        let usage = stat["memory_usage"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        let bytes: u64 = usage
            .iter()
            .filter(|u| u["type"].as_str().is_some_and(counted))
            .filter_map(|u| number(&u["byte_size"]))
            .sum();
        if bytes > 0 {
            *sizes.entry(version).or_insert(0) += bytes;
        }
    }
    sizes
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
    let config_path = dir.join("config.pbtxt");
    let config = std::fs::metadata(&config_path).map_or(0, |m| m.len());
    let parts = std::fs::read_to_string(&config_path)
        .map(|text| ensemble_steps(&text).into())
        .unwrap_or_default();
    Some(OnDisk {
        config,
        versions,
        parts,
    })
}

/// The models an ensemble's config (protobuf text format) runs, each once, in step order;
/// empty for a config whose platform is not `ensemble`. Read loosely, as a list of
/// `model_name: "..."` fields after `ensemble_scheduling`: no other field of a model config
/// has that name.
fn ensemble_steps(config: &str) -> Vec<String> {
    let text: String = config
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let is_ensemble = quoted_after(&text, "platform").is_some_and(|p| p.1 == "ensemble");
    let Some(scheduling) = text.find("ensemble_scheduling").filter(|_| is_ensemble) else {
        return Vec::new();
    };
    let mut steps: Vec<String> = Vec::new();
    let mut rest = &text[scheduling..];
    while let Some((after, name)) = quoted_after(rest, "model_name") {
        if !steps.iter().any(|s| s == name) {
            steps.push(name.to_string());
        }
        rest = after;
    }
    steps
}

/// The first `field: "value"` (or `field "value"`) in `text`: what follows it, and the value.
fn quoted_after<'t>(text: &'t str, field: &str) -> Option<(&'t str, &'t str)> {
    let at = text.find(field)?;
    let rest = text[at + field.len()..].trim_start();
    let rest = rest.strip_prefix(':').unwrap_or(rest).trim_start();
    let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let value = &rest[1..];
    let end = value.find(quote)?;
    Some((&value[end + 1..], &value[..end]))
}

/// Deeper than any model directory; a symbolic link loop ends here.
const MAX_DEPTH: u32 = 16;

/// Ensembles of ensembles deeper than this are sized without their deeper parts.
const MAX_NESTING: u32 = 4;

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
    /// The steps of an ensemble's config, in order and once each, as Triton's text format
    /// writes them (comments, either quote, with or without a colon); none for other models.
    #[test]
    fn reads_the_models_an_ensemble_runs() {
        let ensemble = r#"
            name: "e"  # model_name: "commented"
            platform : "ensemble"
            input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]
            ensemble_scheduling {
              step [
                { model_name: "pre" model_version: -1 input_map { key: "x" value: "IN" } },
                { model_name 'net' model_version: -1 },
                { model_name: "pre" model_version: 2 }
              ]
            }"#;
        assert_eq!(ensemble_steps(ensemble), ["pre", "net"]);
        let plain = r#"name: "m" backend: "python" # ensemble_scheduling { model_name: "x" }"#;
        assert!(ensemble_steps(plain).is_empty());
    }

    use super::*;

    /// `[[models]] name = "sized"` with `size = "1GiB"`.
    fn sized_1gib() -> config::Model {
        config::Model {
            name: "sized".into(),
            size: Some(config::ByteSize(1 << 30)),
            min_copies: 0,
            max_copies: None,
            preload: false,
            keep: false,
            cost_weight: None,
            max_in_flight: None,
            tokenizer: None,
            context_length: None,
        }
    }

    /// `padded`: a config of 100 bytes, version 1 of 5000, version 2 of 300 + 600 (in a
    /// subdirectory); returns the model's directory.
    fn write_padded_model(repo: &std::path::Path) -> std::path::PathBuf {
        let model = repo.join("padded");
        std::fs::create_dir_all(model.join("1")).unwrap();
        std::fs::create_dir_all(model.join("2/sub")).unwrap();
        std::fs::write(model.join("config.pbtxt"), vec![b'c'; 100]).unwrap();
        std::fs::write(model.join("1/weights.bin"), vec![0; 5000]).unwrap();
        std::fs::write(model.join("2/model.py"), vec![0; 300]).unwrap();
        std::fs::write(model.join("2/sub/weights.bin"), vec![0; 600]).unwrap();
        model
    }

    /// `linked`: version 1 holds 70 bytes and a link to itself (a loop), version 2 links
    /// to 1's file, version 3 is a link to version 1's directory.
    fn write_linked_model(repo: &std::path::Path) {
        let linked = repo.join("linked");
        std::fs::create_dir_all(linked.join("1")).unwrap();
        std::fs::write(linked.join("1/model.py"), vec![0; 70]).unwrap();
        std::fs::create_dir_all(linked.join("2")).unwrap();
        std::os::unix::fs::symlink("../1/model.py", linked.join("2/model.py")).unwrap();
        std::os::unix::fs::symlink("1", linked.join("3")).unwrap();
        std::os::unix::fs::symlink(".", linked.join("1/loop")).unwrap();
    }

    #[test]
    fn explicit_then_disk_then_default() {
        let repo = tempfile::tempdir().unwrap();
        let model = write_padded_model(repo.path());

        let placement = config::Placement {
            model_repository: Some(repo.path().to_path_buf()),
            size_multiplier: 2.0,
            ..Default::default()
        };
        let models = [sized_1gib()];
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
        write_linked_model(repo.path());
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

    /// An answer as Triton 2.51 writes it (`GET /v2/models/onnx_model/stats`), for a model
    /// with two versions on a GPU backend that measures itself, and another model beside it.
    const STATS: &str = r#"{"model_stats":[
        {"name":"onnx_model","version":"1","last_inference":0,"inference_count":0,
         "execution_count":0,"inference_stats":{"success":{"count":0,"ns":0}},
         "response_stats":{},"batch_stats":[],
         "memory_usage":[{"type":"GPU","id":0,"byte_size":1073741824},
                         {"type":"CPU","id":0,"byte_size":4096},
                         {"type":"GPU","id":1,"byte_size":"1024"}]},
        {"name":"onnx_model","version":"2","memory_usage":[{"type":"GPU","id":0,"byte_size":2147483648}]},
        {"name":"onnx_model","version":"3","memory_usage":[]},
        {"name":"other","version":"1","memory_usage":[{"type":"GPU","id":0,"byte_size":7}]}
    ]}"#;

    #[test]
    fn statistics_memory_usage_is_read_per_version_for_the_metrics_kind_of_memory() {
        let answer: serde_json::Value = serde_json::from_str(STATS).unwrap();
        let gpu = reported_sizes(&answer, "onnx_model", "nv_gpu_memory_used_bytes");
        assert_eq!(gpu, BTreeMap::from([(1, (1 << 30) + 1024), (2, 2 << 30)]));
        let cpu = reported_sizes(&answer, "onnx_model", "nv_cpu_memory_used_bytes");
        assert_eq!(cpu, BTreeMap::from([(1, 4096)]));
        // The python backend reports nothing: nothing is learned from it.
        let python: serde_json::Value = serde_json::from_str(
            r#"{"model_stats":[{"name":"add_sub","version":"1","memory_usage":[]}]}"#,
        )
        .unwrap();
        assert!(reported_sizes(&python, "add_sub", "nv_gpu_memory_used_bytes").is_empty());
        assert!(reported_sizes(&serde_json::json!({}), "m", "x").is_empty());
    }

    #[test]
    fn out_of_memory_is_told_by_the_frameworks_words() {
        let oom = [
            // The python backend, as Triton 2.51 words a MemoryError raised in initialize.
            "load failed for model 'm': version 1 is at UNAVAILABLE state: Internal: MemoryError: Unable to allocate 1.00 PiB for an array with shape (1125899906842624,) and data type uint8",
            "Internal: onnx runtime error 6: Exception during initialization: bfc_arena.cc:368 Failed to allocate memory for requested buffer of size 268435456",
            "failed to allocate 4.00G (4294967296 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
            "OOM when allocating tensor with shape[1024,1024]",
            "Requested amount of GPU memory (2359296 bytes) could not be allocated.",
            "std::bad_alloc",
        ];
        for message in oom {
            assert!(is_out_of_memory(message), "{message}");
        }
        let other = [
            "load failed for model 'failing_model': version 1 is at UNAVAILABLE state: Internal: RuntimeError: failing_model: initialize always fails (test fixture)",
            "no room for the model in the zoom room",
            "failed to open model file",
        ];
        for message in other {
            assert!(!is_out_of_memory(message), "{message}");
        }
    }

    #[test]
    fn an_out_of_memory_failure_doubles_the_estimate_up_to_the_largest_backend() {
        let placement = config::Placement {
            default_model_size: config::ByteSize(1 << 30),
            ..Default::default()
        };
        let models = [sized_1gib()];
        let estimator = Estimator::new(&placement, &models);
        let latest = Versions::latest();
        let raised = estimator.raise_after_out_of_memory("m", &latest, 3 << 30);
        let expected = Estimate {
            bytes: 2 << 30,
            source: SizeSource::LearnedFromFailure,
        };
        assert_eq!(raised, Some(expected));
        assert_eq!(estimator.estimate("m"), expected);
        // Bounded by the largest backend, and no further once there.
        let raised = estimator.raise_after_out_of_memory("m", &latest, 3 << 30);
        assert_eq!(raised.map(|e| e.bytes), Some(3 << 30));
        assert_eq!(
            estimator.raise_after_out_of_memory("m", &latest, 3 << 30),
            None
        );
        // A size config names stays.
        assert_eq!(
            estimator.raise_after_out_of_memory("sized", &latest, 8 << 30),
            None
        );
        assert_eq!(estimator.estimate("sized").source, SizeSource::Config);
        // A later measurement replaces it.
        estimator.learn_from("m", 5, SizeSource::Reported);
        assert_eq!(estimator.estimate("m").bytes, 5);
        assert_eq!(estimator.estimate("m").source, SizeSource::Reported);
    }
}
