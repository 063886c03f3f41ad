//! A model's signature (what its inputs and outputs are), read from the backend that serves
//! it, and the cache that keeps it per model and version.

use super::datatype::DataType;
use crate::config;
use crate::model::ModelRef;
use crate::upstream::{Backend, TritonClient, TritonError};
use bytes::Bytes;
use foldhash::{HashMap, HashMapExt};
use serde::Deserialize;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// What the checker needs to know about a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The model's name (Triton's messages use it).
    pub name: String,
    /// Triton's platform (`python`, `onnxruntime_onnx`, `tensorrt_plan`, `ensemble`, ...).
    pub platform: String,
    /// 0 when the model does not batch; else the largest batch, and every (non shape-tensor)
    /// input carries a leading batch dimension that `dims` leaves out.
    pub max_batch_size: i32,
    /// Execution instances the copy runs (the sum of the served config's
    /// `instance_group[].count`, at least 1): with `max_batch_size`, how many requests one
    /// copy works on at once (`capacity`).
    pub instances: u32,
    /// Whether the model is decoupled (`model_transaction_policy.decoupled`): it answers a
    /// request with any number of responses, on its own time (`capacity`).
    pub decoupled: bool,
    /// Inputs in config order.
    pub inputs: Vec<InputSpec>,
    /// Output names.
    pub outputs: Vec<String>,
}

/// One input of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputSpec {
    /// Its name.
    pub name: String,
    /// Its datatype.
    pub datatype: DataType,
    /// Its dimensions without the batch dimension; -1 matches any size.
    pub dims: Vec<i64>,
    /// May be left out of a request.
    pub optional: bool,
    /// Requests in one batch may differ in its size (Triton 2.51 still checks each request
    /// on its own, so this changes no check; kept to describe the model).
    pub allow_ragged_batch: bool,
    /// A shape tensor (TensorRT): its shape carries no batch dimension.
    pub is_shape_tensor: bool,
}

impl Signature {
    /// The input named `name`.
    pub fn input(&self, name: &str) -> Option<&InputSpec> {
        self.inputs.iter().find(|i| i.name == name)
    }

    /// Whether the model has an output named `name`.
    pub fn has_output(&self, name: &str) -> bool {
        self.outputs.iter().any(|o| o == name)
    }

    /// Requests one copy works on at once: its instances × its largest batch (1 for a model
    /// that does not batch). Flow control's default `max_in_flight` (docs/flow.md): more
    /// would only wait in Triton's queue, where the gateway cannot order them.
    /// `None` for a decoupled model: its `execute` may return before its answers, so one
    /// instance can serve many streams at once, and its instances bound nothing.
    pub fn capacity(&self) -> Option<usize> {
        if self.decoupled {
            return None;
        }
        let batch = usize::try_from(self.max_batch_size.max(1)).unwrap_or(1);
        Some(usize::try_from(self.instances.max(1)).unwrap_or(1) * batch)
    }

    /// Builds a signature from Triton's model metadata (`GET /v2/models/{m}`) and model
    /// config (`GET /v2/models/{m}/config`). The two must agree on every input and output.
    pub fn from_triton(metadata: &[u8], config: &[u8]) -> Result<Self, String> {
        let metadata: Metadata = serde_json::from_slice(metadata)
            .map_err(|e| format!("model metadata is not valid: {e}"))?;
        let config: ModelConfig = serde_json::from_slice(config)
            .map_err(|e| format!("model config is not valid: {e}"))?;
        if metadata.inputs.len() != config.input.len() {
            return Err(format!(
                "metadata lists {} inputs, config {}",
                metadata.inputs.len(),
                config.input.len()
            ));
        }
        let mut inputs = Vec::with_capacity(config.input.len());
        for input in config.input {
            let datatype = DataType::from_config(&input.data_type).ok_or_else(|| {
                format!(
                    "input '{}' has unknown datatype {}",
                    input.name, input.data_type
                )
            })?;
            let listed = metadata.inputs.iter().find(|m| m.name == input.name);
            match listed {
                Some(m) if m.datatype == datatype.as_str() => {}
                _ => {
                    return Err(format!(
                        "input '{}' differs between metadata and config",
                        input.name
                    ));
                }
            }
            inputs.push(InputSpec {
                name: input.name,
                datatype,
                dims: input.dims,
                optional: input.optional,
                allow_ragged_batch: input.allow_ragged_batch,
                is_shape_tensor: input.is_shape_tensor,
            });
        }
        let outputs: Vec<String> = metadata.outputs.into_iter().map(|o| o.name).collect();
        if outputs.len() != config.output.len()
            || config.output.iter().any(|o| !outputs.contains(&o.name))
        {
            return Err("outputs differ between metadata and config".into());
        }
        Ok(Self {
            name: metadata.name,
            platform: metadata.platform,
            max_batch_size: config.max_batch_size,
            instances: config
                .instance_group
                .iter()
                .map(|g| g.count)
                .sum::<u32>()
                .max(1),
            decoupled: config.model_transaction_policy.decoupled,
            inputs,
            outputs,
        })
    }
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
    #[serde(default)]
    platform: String,
    #[serde(default)]
    inputs: Vec<TensorMetadata>,
    #[serde(default)]
    outputs: Vec<TensorMetadata>,
}

#[derive(Deserialize)]
struct TensorMetadata {
    name: String,
    #[serde(default)]
    datatype: String,
}

#[derive(Deserialize)]
struct ModelConfig {
    #[serde(default)]
    max_batch_size: i32,
    #[serde(default)]
    input: Vec<ConfigInput>,
    #[serde(default)]
    output: Vec<ConfigOutput>,
    /// Triton fills in `count` for every group of the config it serves (1 where
    /// config.pbtxt names none).
    #[serde(default)]
    instance_group: Vec<InstanceGroup>,
    #[serde(default)]
    model_transaction_policy: TransactionPolicy,
}

#[derive(Deserialize, Default)]
struct TransactionPolicy {
    #[serde(default)]
    decoupled: bool,
}

#[derive(Deserialize)]
struct InstanceGroup {
    #[serde(default = "one")]
    count: u32,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
struct ConfigInput {
    name: String,
    data_type: String,
    #[serde(default)]
    dims: Vec<i64>,
    #[serde(default)]
    optional: bool,
    #[serde(default)]
    allow_ragged_batch: bool,
    #[serde(default)]
    is_shape_tensor: bool,
}

#[derive(Deserialize)]
struct ConfigOutput {
    name: String,
}

/// How long a failed fetch is remembered: requests for that model go unvalidated meanwhile
/// instead of each waiting for another failing fetch.
const RETRY_AFTER: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    model: String,
    version: Option<String>,
}

struct Entry {
    signature: Arc<Signature>,
    description: Arc<Description>,
    /// The model's generation when the fetch began: an entry from before the latest
    /// `invalidate` is stale even if it was stored after it.
    generation: u64,
}

/// What is known of one model: its generation (bumped by every `invalidate`) and the
/// signatures fetched in that generation, by version asked for. Read on every validated
/// request, so a hit is one read lock and a short scan, with nothing allocated.
#[derive(Default)]
struct Known {
    generation: u64,
    signatures: Vec<(Option<String>, Arc<Signature>)>,
}

/// A model's metadata and config as a copy of it answered them (Triton's JSON): what a
/// client asking for them is told while the model is loaded nowhere, instead of a load.
#[derive(Debug, PartialEq, Eq)]
pub struct Description {
    /// `GET /v2/models/{m}[/versions/{v}]`.
    pub metadata: Bytes,
    /// `GET /v2/models/{m}[/versions/{v}]/config`.
    pub config: Bytes,
}

/// Signatures per (model, version or latest), each fetched once from a backend that serves
/// the model. Concurrent misses for one key share one fetch; other models never wait on it.
pub struct SignatureCache {
    /// Hits: the current generation's signatures (at most `capacity` of them).
    known: RwLock<HashMap<String, Known>>,
    capacity: usize,
    /// Misses: one fetch per key (`try_get_with`), bounded; and the failures of the last
    /// `RETRY_AFTER`.
    entries: moka::future::Cache<Key, Arc<Entry>>,
    unavailable: moka::future::Cache<Key, u64>,
    fetch_timeout: Duration,
    /// The descriptions fetched with the signatures, kept when the model is unloaded (its
    /// files have not changed) and forgotten when it is loaded again (they may have).
    described: RwLock<HashMap<Key, Arc<Description>>>,
}

impl SignatureCache {
    /// An empty cache sized by `[validation]`.
    pub fn new(config: &config::Validation) -> Self {
        Self {
            entries: moka::future::Cache::builder()
                .max_capacity(config.signature_cache_capacity)
                .support_invalidation_closures()
                .build(),
            unavailable: moka::future::Cache::builder()
                .max_capacity(config.signature_cache_capacity)
                .time_to_live(RETRY_AFTER)
                .build(),
            known: RwLock::new(HashMap::new()),
            capacity: usize::try_from(config.signature_cache_capacity).unwrap_or(usize::MAX),
            fetch_timeout: config.signature_fetch_timeout.0,
            described: RwLock::new(HashMap::new()),
        }
    }

    /// What a copy answered for `model`'s metadata and config, if a fetch has seen it since
    /// the model was last loaded.
    pub fn described(&self, model: &ModelRef) -> Option<Arc<Description>> {
        let key = Key {
            model: model.name.clone(),
            version: model.version.clone(),
        };
        let described = self.described.read().unwrap_or_else(|e| e.into_inner());
        described.get(&key).cloned()
    }

    /// Forgets `model`'s descriptions: it was loaded again, maybe from other files or with
    /// a config override.
    pub fn forget_described(&self, model: &str) {
        let mut described = self.described.write().unwrap_or_else(|e| e.into_inner());
        described.retain(|key, _| key.model != model);
    }

    /// Keeps a fetched description (within the cache's capacity).
    fn describe(&self, key: &Key, description: &Arc<Description>) {
        let mut described = self.described.write().unwrap_or_else(|e| e.into_inner());
        if described.len() < self.capacity || described.contains_key(key) {
            described.insert(key.clone(), description.clone());
        }
    }

    /// Forgets every cached signature of `model`, all versions.
    ///
    /// Must be called whenever `model` is loaded, unloaded or reloaded on any backend: its
    /// inputs, outputs or versions may have changed, and a stale signature would refuse
    /// requests the new model accepts. A fetch already under way when this is called does
    /// not count: its result is dropped and fetched again.
    pub fn invalidate(&self, model: &str) {
        {
            let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
            let known = known.entry(model.to_owned()).or_default();
            known.generation += 1;
            known.signatures.clear();
        }
        // Frees the memory soon; correctness comes from the generation check in `get`.
        let model = model.to_owned();
        let _ = self
            .entries
            .invalidate_entries_if(move |key, _| key.model == model);
    }

    fn generation(&self, model: &str) -> u64 {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        known.get(model).map_or(0, |k| k.generation)
    }

    /// Requests one copy of `model` works on at once (`Signature::capacity`), by a
    /// signature of its current generation (the default version's first): flow control's
    /// default `max_in_flight`. `None` until one is fetched. One read lock, no allocation.
    pub fn capacity(&self, model: &str) -> Option<usize> {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        let signatures = &known.get(model)?.signatures;
        let default = signatures.iter().find(|(version, _)| version.is_none());
        let (_, signature) = default.or(signatures.first())?;
        signature.capacity()
    }

    /// The signature of `model` fetched in its current generation, if any: `get` without a
    /// fetch. The validate phase asks this first, so that it knows when a fetch taught it
    /// something new (a model's capacity, for flow control).
    pub fn hit(&self, model: &ModelRef) -> Option<Arc<Signature>> {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        let (_, signature) = known
            .get(model.name.as_str())?
            .signatures
            .iter()
            .find(|(version, _)| *version == model.version)?;
        Some(signature.clone())
    }

    /// Keeps a fetched signature for `hit`, unless the model was invalidated since the fetch
    /// began (`generation`) or `capacity` signatures are kept already.
    fn remember(&self, model: &ModelRef, generation: u64, signature: &Arc<Signature>) {
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        let kept: usize = known.values().map(|k| k.signatures.len()).sum();
        if kept >= self.capacity {
            return;
        }
        let known = known.entry(model.name.clone()).or_default();
        if known.generation == generation
            && !known.signatures.iter().any(|(v, _)| *v == model.version)
        {
            known
                .signatures
                .push((model.version.clone(), signature.clone()));
        }
    }

    /// The signature of `model`, fetched from `backend` if not cached; `None` when it cannot
    /// be had (the failure is logged once per `RETRY_AFTER`, and the caller forwards the
    /// request unvalidated: never refuse what Triton might accept).
    pub async fn get(&self, backend: &Arc<Backend>, model: &ModelRef) -> Option<Arc<Signature>> {
        if let Some(signature) = self.hit(model) {
            return Some(signature);
        }
        // The miss's state (moka's loader, the fetch) is some 7 KB: boxed, so the future of
        // every request, which holds this one, stays small for the warm hit.
        Box::pin(self.miss(backend, model)).await
    }

    /// `get` when the signature is not in `known`: the cache, then one fetch per key.
    async fn miss(&self, backend: &Arc<Backend>, model: &ModelRef) -> Option<Arc<Signature>> {
        let key = Key {
            model: model.name.clone(),
            version: model.version.clone(),
        };
        for _ in 0..3 {
            let generation = self.generation(&model.name);
            if let Some(entry) = self.entries.get(&key).await {
                if entry.generation == generation {
                    self.remember(model, generation, &entry.signature);
                    return Some(entry.signature.clone());
                }
                self.entries.invalidate(&key).await;
            }
            if self.unavailable.get(&key).await == Some(generation) {
                return None;
            }
            let fetched = self
                .entries
                .try_get_with(key.clone(), async {
                    fetch(backend, model, self.fetch_timeout).await.map(
                        |(signature, description)| {
                            Arc::new(Entry {
                                signature: Arc::new(signature),
                                description: Arc::new(description),
                                generation,
                            })
                        },
                    )
                })
                .await;
            match fetched {
                Ok(entry) if entry.generation == self.generation(&model.name) => {
                    self.remember(model, entry.generation, &entry.signature);
                    self.describe(&key, &entry.description);
                    return Some(entry.signature.clone());
                }
                // Invalidated while fetching: drop it and fetch again.
                Ok(_) => self.entries.invalidate(&key).await,
                Err(error) => {
                    let recorded = self
                        .unavailable
                        .entry(key.clone())
                        .or_insert(generation)
                        .await;
                    if recorded.is_fresh() {
                        tracing::warn!(
                            model = %model.name,
                            version = model.version.as_deref().unwrap_or(""),
                            backend = %backend.name,
                            error = %error,
                            "model signature unavailable; its requests are forwarded unvalidated"
                        );
                    }
                    return None;
                }
            }
        }
        None
    }
}

/// Fetches metadata and config concurrently and builds the signature; the answers are kept
/// as the model's description.
async fn fetch(
    backend: &Backend,
    model: &ModelRef,
    timeout: Duration,
) -> Result<(Signature, Description), String> {
    let triton = TritonClient::new(backend, timeout);
    let version = model.version.as_deref();
    let (metadata, config) = tokio::join!(
        triton.model_metadata(&model.name, version),
        triton.model_config(&model.name, version)
    );
    let failed = |error: TritonError| error.to_string();
    let description = Description {
        metadata: metadata.map_err(failed)?,
        config: config.map_err(failed)?,
    };
    let signature = Signature::from_triton(&description.metadata, &description.config)?;
    Ok((signature, description))
}

#[cfg(test)]
mod tests {
    use super::*;

    const METADATA: &str = r#"{"name":"ragged_sum","versions":["1"],"platform":"python",
        "inputs":[{"name":"INPUT0","datatype":"FP32","shape":[-1,-1]},
                  {"name":"LENGTHS","datatype":"INT32","shape":[-1,1]}],
        "outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[-1,1]}]}"#;
    const CONFIG: &str = r#"{"name":"ragged_sum","platform":"","backend":"python",
        "max_batch_size":8,
        "input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[-1],
                  "is_shape_tensor":false,"allow_ragged_batch":true,"optional":false},
                 {"name":"LENGTHS","data_type":"TYPE_INT32","dims":[1],"optional":true}],
        "output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[1]}],
        "instance_group":[{"name":"ragged_sum_0","kind":"KIND_CPU","count":2},
                          {"name":"ragged_sum_1","kind":"KIND_CPU","count":1}]}"#;

    #[test]
    fn reads_triton_metadata_and_config() {
        let signature = Signature::from_triton(METADATA.as_bytes(), CONFIG.as_bytes()).unwrap();
        assert_eq!(signature.name, "ragged_sum");
        assert_eq!(signature.platform, "python");
        assert_eq!(signature.max_batch_size, 8);
        assert_eq!(signature.inputs[0].dims, [-1]);
        assert!(signature.inputs[0].allow_ragged_batch);
        assert!(signature.inputs[1].optional);
        assert_eq!(signature.inputs[1].datatype, DataType::Int32);
        assert!(signature.has_output("OUTPUT0"));
        assert!(!signature.has_output("OUTPUT1"));
    }

    /// A copy works on its instances × its largest batch at once: 3 × 8 here; a model that
    /// does not batch, on one per instance; a config with no instance group (not one Triton
    /// serves, but possible in a fixture) counts one instance.
    #[test]
    fn capacity_is_instances_times_the_largest_batch() {
        let signature = Signature::from_triton(METADATA.as_bytes(), CONFIG.as_bytes()).unwrap();
        assert_eq!((signature.instances, signature.capacity()), (3, Some(24)));
        let unbatched = CONFIG.replace("\"max_batch_size\":8", "\"max_batch_size\":0");
        let signature = Signature::from_triton(METADATA.as_bytes(), unbatched.as_bytes()).unwrap();
        assert_eq!(signature.capacity(), Some(3));
        let (groups, _) = unbatched
            .split_once(",\n        \"instance_group\"")
            .unwrap();
        let bare = format!("{groups}}}");
        let signature = Signature::from_triton(METADATA.as_bytes(), bare.as_bytes()).unwrap();
        assert_eq!(signature.capacity(), Some(1));
    }

    /// A decoupled model's instances bound nothing (its `execute` may return before its
    /// answers): no capacity, so flow control keeps its constant default.
    #[test]
    fn a_decoupled_model_has_no_capacity() {
        let decoupled = CONFIG.replacen(
            "{",
            "{\"model_transaction_policy\":{\"decoupled\":true},",
            1,
        );
        let signature = Signature::from_triton(METADATA.as_bytes(), decoupled.as_bytes()).unwrap();
        assert!(signature.decoupled);
        assert_eq!(signature.capacity(), None);
    }

    #[test]
    fn refuses_metadata_and_config_that_disagree() {
        let other = CONFIG.replace("TYPE_INT32", "TYPE_INT64");
        assert!(Signature::from_triton(METADATA.as_bytes(), other.as_bytes()).is_err());
        assert!(Signature::from_triton(b"{}", CONFIG.as_bytes()).is_err());
        assert!(Signature::from_triton(METADATA.as_bytes(), b"not json").is_err());
    }
}
