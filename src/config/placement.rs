//! `[placement]` and `[[models]]`: how infergate decides which Triton loads which model.

use super::{ByteSize, ConfigError, HumanDuration};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

/// Memory accounting and load policy for the pool.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Placement {
    /// A read-only view of the model repository the Tritons use, to size models on disk.
    pub model_repository: Option<PathBuf>,
    /// Memory kept free on every backend, off its capacity.
    pub mem_buffer: ByteSize,
    /// Size on disk times this is a model's estimate when nothing better is known.
    pub size_multiplier: f64,
    /// Estimate for a model whose size on disk cannot be read.
    pub default_model_size: ByteSize,
    /// Capacity assumed for a backend with no `capacity` key.
    pub default_capacity: ByteSize,
    /// A model used more recently than this is never evicted: the request that would need it
    /// is answered 503 with Retry-After instead, so the pool does not thrash.
    pub min_churn_age: HumanDuration,
    /// Loads running at once on one backend; more wait their turn in arrival order.
    pub max_loading_concurrency: usize,
    /// How long a load may take; past it the waiting requests get 504 and the load is undone.
    pub load_timeout: HumanDuration,
    /// Backends one request may try a failing load on before it is answered 503.
    pub max_load_attempts: usize,
    /// First pause before a model that failed to load on a backend is tried there again;
    /// doubles with each failure up to `load_failure_backoff_max`.
    pub load_failure_backoff: HumanDuration,
    /// Longest pause between retries of a failing load on one backend.
    pub load_failure_backoff_max: HumanDuration,
    /// Requests per second per copy (over the last `rebalance_interval`) above which a model
    /// gets another copy on another backend, up to `max_copies`; 0 turns scaling off.
    pub scale_up_rps: f64,
    /// Most copies of one model (per-model `max_copies` overrides).
    pub max_copies: usize,
    /// Copies beyond a model's first (or its `min_copies`) unused this long are unloaded.
    pub scale_down_idle: HumanDuration,
    /// How often copies are scaled up and down.
    pub rebalance_interval: HumanDuration,
    /// How often each backend's repository index is read and the books brought in line with
    /// it (models loaded or unloaded behind infergate's back, newer versions on disk); also
    /// on start, and at once for a backend that fails or passes a health check anew.
    pub reconcile_interval: HumanDuration,
    /// Backend metric whose rise during a load is the model's learned size (summed over its
    /// series, e.g. one per GPU). Read from each backend's `metrics` URL.
    pub memory_metric: String,
    /// Which idle copy a backend gives up first when a load needs room.
    pub policy: EvictionPolicy,
    /// How old a backend's queue reading (Triton's `nv_inference_pending_request_count`,
    /// read from its `metrics` URL with each health check) may be and still steer a request
    /// to the copy with the shorter queue; 0 turns queue readings off (copies are then chosen
    /// by this gateway's own requests in flight alone).
    pub queue_max_age: HumanDuration,
    /// Requests waiting per copy in the backends' own queues (by fresh readings) above which
    /// a model gets another copy, like `scale_up_rps`; 0 turns it off.
    pub scale_up_queue: f64,
    /// How long a cold request that finds no room (every copy that could make room in use,
    /// loading or pinned) waits for some, in a fair queue per backend, before it is answered
    /// 503 with Retry-After; a gRPC deadline ends the wait sooner. 0s refuses at once.
    pub room_wait: HumanDuration,
}

/// `placement.policy`: the order in which idle copies are evicted. Users pick the rule that
/// suits their traffic (see docs/placement.md, "Choosing a policy"); every rule keeps the
/// capacity invariant, never evicts a copy in use, loading or pinned, and honours
/// `min_churn_age`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EvictionPolicy {
    /// Least recently used first (ModelMesh's rule).
    Lru,
    /// Least frequently used first, with dynamic ageing (LFU-DA): a copy's worth is its uses
    /// plus the worth of the last copy evicted when it was ranked, so a model that was hot
    /// yesterday falls behind the models in use today.
    Lfu,
    /// GreedyDual-Size-Frequency: uses × reload cost (learned load time, × the model's
    /// `cost_weight`) / size, with the same ageing clock: small, often used, slow to load
    /// models stay; big, rarely used ones go first.
    Gdsf,
    /// GDSF whose frequency is a TinyLFU sketch's (a count-min sketch of 8-bit counters,
    /// halved every "window" requests): how often the model was asked for lately,
    /// remembered across evictions, instead of the uses of the copy now loaded. Worth is
    /// frequency × reload cost / GiB^1.15, aged by the halvings; the window tunes itself by
    /// hill climbing on the hit ratio (short when popularity drifts fast). A model asked
    /// for once goes first, whatever it displaced to be loaded. The default: it had the
    /// best hit ratio, and loaded fewer bytes than `gdsf`, on every trace of the
    /// simulator's suite (docs/placement.md).
    #[default]
    Tinylfu,
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            model_repository: None,
            mem_buffer: ByteSize(128 << 20),
            size_multiplier: 1.25,
            default_model_size: ByteSize(100 << 20),
            default_capacity: ByteSize(16 << 30),
            min_churn_age: HumanDuration(Duration::from_secs(60)),
            room_wait: HumanDuration(Duration::from_secs(3)),
            max_loading_concurrency: 2,
            load_timeout: HumanDuration(Duration::from_secs(90)),
            max_load_attempts: 3,
            load_failure_backoff: HumanDuration(Duration::from_secs(5)),
            load_failure_backoff_max: HumanDuration(Duration::from_secs(300)),
            memory_metric: "nv_gpu_memory_used_bytes".into(),
            policy: EvictionPolicy::Tinylfu,
            queue_max_age: HumanDuration(Duration::from_secs(5)),
            scale_up_queue: 8.0,
            scale_up_rps: 50.0,
            max_copies: 2,
            scale_down_idle: HumanDuration(Duration::from_secs(300)),
            rebalance_interval: HumanDuration(Duration::from_secs(1)),
            reconcile_interval: HumanDuration(Duration::from_secs(10)),
        }
    }
}

/// Per-model settings.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// Triton model name.
    pub name: String,
    /// Explicit memory estimate; wins over every other estimate.
    pub size: Option<ByteSize>,
    /// Copies loaded at start and kept: never evicted, never scaled below this. 0 (the
    /// default) leaves the model to demand.
    #[serde(default)]
    pub min_copies: usize,
    /// Most copies of this model; overrides `placement.max_copies`.
    pub max_copies: Option<usize>,
    /// Loaded at start into free space (never evicting anything), then evictable.
    #[serde(default)]
    pub preload: bool,
    /// Evicted last, under every policy: only when no backend can make room without evicting
    /// a kept copy. For the model a team cannot afford to cold-start but need not pin.
    #[serde(default)]
    pub keep: bool,
    /// Multiplies what a use of this model is worth under `lfu` and `gdsf` (2: it stays as
    /// if used twice as often); `lru` orders by time alone and ignores it.
    pub cost_weight: Option<f64>,
    /// Requests one copy takes at once before more wait at the gateway, fairly by tenant
    /// and band (docs/flow.md); absent: `flow::default_per_copy`, twice the model's
    /// instances × max batch size from the config its copies serve, at least 32 (32 while
    /// that is not known, or for a decoupled model).
    pub max_in_flight: Option<usize>,
    /// The directory holding the model's `tokenizer.json` and `tokenizer_config.json`, for
    /// the OpenAI endpoints (chat template, token counts). Triton's API cannot hand out a
    /// model's files, so they are read from disk: this directory, else the model's own
    /// directory under `placement.model_repository`.
    pub tokenizer: Option<std::path::PathBuf>,
    /// The model's context, in tokens, for the OpenAI endpoints: a prompt whose tokens
    /// plus its `max_tokens` pass it is refused before any backend work. Wins over
    /// `tokenizer_config.json`'s `model_max_length` (a model served with a shorter context
    /// than its tokenizer was made for).
    pub context_length: Option<u64>,
}

impl Model {
    /// Pinned models are loaded at start and never evicted.
    pub fn pinned(&self) -> bool {
        self.min_copies > 0
    }
}

impl Placement {
    /// Checks what serde cannot.
    pub(super) fn validate(&self, models: &[Model], errors: &mut Vec<ConfigError>) {
        let mut error = |key: String, message: String| errors.push(ConfigError { key, message });
        if !(self.size_multiplier.is_finite() && self.size_multiplier > 0.0) {
            error(
                "placement.size_multiplier".into(),
                "must be a positive number".into(),
            );
        }
        if self.max_loading_concurrency == 0 {
            error(
                "placement.max_loading_concurrency".into(),
                "must be at least 1".into(),
            );
        }
        if self.max_load_attempts == 0 {
            error(
                "placement.max_load_attempts".into(),
                "must be at least 1".into(),
            );
        }
        if let Some(repository) = &self.model_repository
            && !repository.is_dir()
        {
            error(
                "placement.model_repository".into(),
                format!("{} is not a directory", repository.display()),
            );
        }
        for (key, value) in [
            ("placement.scale_up_rps", self.scale_up_rps),
            ("placement.scale_up_queue", self.scale_up_queue),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                error(key.into(), "must be 0 (off) or a positive number".into());
            }
        }
        if self.max_copies == 0 {
            error("placement.max_copies".into(), "must be at least 1".into());
        }
        for (key, interval) in [
            ("placement.rebalance_interval", self.rebalance_interval),
            ("placement.reconcile_interval", self.reconcile_interval),
        ] {
            if interval.0.is_zero() {
                error(key.into(), "must be greater than 0".into());
            }
        }
        let mut names = HashSet::new();
        for (i, model) in models.iter().enumerate() {
            if let Some(max) = model.max_copies
                && (max == 0 || max < model.min_copies)
            {
                error(
                    format!("models[{i}].max_copies"),
                    "must be at least 1 and at least min_copies".into(),
                );
            }
            if let Some(weight) = model.cost_weight
                && !(weight.is_finite() && weight > 0.0)
            {
                error(
                    format!("models[{i}].cost_weight"),
                    "must be a positive number".into(),
                );
            }
            if model.max_in_flight == Some(0) {
                error(
                    format!("models[{i}].max_in_flight"),
                    "must be at least 1".into(),
                );
            }
            if model.context_length == Some(0) {
                error(
                    format!("models[{i}].context_length"),
                    "must be at least 1".into(),
                );
            }
            if model.name.trim().is_empty() {
                error(format!("models[{i}].name"), "must not be empty".into());
            } else if !names.insert(model.name.as_str()) {
                error(
                    format!("models[{i}].name"),
                    format!("duplicate model {:?}", model.name),
                );
            }
        }
    }
}
