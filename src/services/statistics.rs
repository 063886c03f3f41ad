//! A model's statistics through the gateway: what every copy that serves it has counted,
//! summed, for HTTP and gRPC alike.
//!
//! Triton counts per server; a model served by two copies has two sets of numbers. Tools
//! that read the statistics (perf_analyzer's server-side columns) ask one server, so the
//! gateway asks every copy and answers one set per model and version: counts and durations
//! are summed, `last_inference` is the latest, rows of `batch_stats` are summed per
//! `batch_size`, rows of `memory_usage` per `type` and `id`, and `response_stats` per key.
//! A copy that is unloaded takes its counts with it, as an unload does on Triton.
//!
//! The rows are typed (the fields of Triton's statistics extension, as its gRPC messages
//! name them), read from Triton's JSON answers and encoded by each front-end: HTTP writes
//! them back as JSON, gRPC as `ModelStatisticsResponse`. A field Triton leaves out stays
//! out of the JSON answer (each is optional), as it was.

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::model::{Ask, ModelRef};
use crate::pipeline::{self, RequestCtx};
use crate::services::repository::{ask_all, ready_backends};
use crate::upstream::{Backend, TritonError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;

/// Triton's `{"model_stats": [...]}`: one row per model and version. The answer of every
/// statistics question, summed over copies.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct Statistics {
    /// One row per model and version.
    #[serde(default)]
    pub model_stats: Vec<ModelStatistics>,
}

/// One model version's counts.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ModelStatistics {
    /// The model's name.
    #[serde(default)]
    pub name: String,
    /// The version the row counts.
    #[serde(default)]
    pub version: String,
    /// When the last inference was, in ms since the epoch: the latest of the copies'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_inference: Option<u64>,
    /// Inferences, each batch row counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_count: Option<u64>,
    /// Executions of the model (a batch is one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<u64>,
    /// Where the inferences' time went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_stats: Option<InferStatistics>,
    /// Per response of a decoupled model, by Triton's key (the response's index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_stats: Option<BTreeMap<String, ResponseStatistics>>,
    /// Per batch size the model executed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_stats: Option<Vec<BatchStatistics>>,
    /// The memory the model holds, per kind of memory and device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_usage: Option<Vec<MemoryUsage>>,
}

/// A count and the nanoseconds it took, Triton's unit of every duration statistic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct StatisticDuration {
    /// How many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Their nanoseconds, summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns: Option<u64>,
}

/// Where a model's inferences spent their time, and how they ended.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct InferStatistics {
    /// Inferences that succeeded (their whole time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success: Option<StatisticDuration>,
    /// Inferences that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail: Option<StatisticDuration>,
    /// Time waiting in the scheduler's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<StatisticDuration>,
    /// Time preparing the inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_input: Option<StatisticDuration>,
    /// Time in the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_infer: Option<StatisticDuration>,
    /// Time writing the outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_output: Option<StatisticDuration>,
    /// Answers from the response cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_hit: Option<StatisticDuration>,
    /// Lookups the response cache missed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_miss: Option<StatisticDuration>,
}

/// One response index of a decoupled model.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ResponseStatistics {
    /// Time in the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_infer: Option<StatisticDuration>,
    /// Time writing the outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_output: Option<StatisticDuration>,
    /// Responses that succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success: Option<StatisticDuration>,
    /// Responses that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail: Option<StatisticDuration>,
    /// Empty final responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_response: Option<StatisticDuration>,
    /// Cancelled responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<StatisticDuration>,
}

/// Executions of one batch size.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct BatchStatistics {
    /// The batch size: the row's identity, never summed.
    #[serde(default)]
    pub batch_size: u64,
    /// Time preparing the inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_input: Option<StatisticDuration>,
    /// Time in the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_infer: Option<StatisticDuration>,
    /// Time writing the outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_output: Option<StatisticDuration>,
}

/// Memory a model holds on one device.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct MemoryUsage {
    /// The kind of memory (`CPU`, `CPU_PINNED`, `GPU`): with `id`, the row's identity.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// The device.
    #[serde(default)]
    pub id: i64,
    /// Bytes held, summed over copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub byte_size: Option<u64>,
}

/// A model's statistics: admitted and routed like any model request (the pipeline's own
/// phases, so the same caller may ask about the same model, and a route means the same
/// target), then summed over the copies that serve the target (`of_model`). `header` reads
/// the request's headers or metadata (a pinned target).
pub async fn of_routed<'h>(
    ctx: &mut RequestCtx,
    header: impl Fn(&http::HeaderName) -> Option<&'h [u8]>,
) -> Result<Statistics, GatewayError> {
    pipeline::admit::model(ctx)?;
    pipeline::route(ctx, header)?;
    let target = &ctx.routed.as_ref().expect("routed").target;
    of_model(&ctx.gateway, target).await
}

/// The statistics of one model (one version, when `model` names one), from every copy that
/// serves it. A model with no copy loaded is `NotLoaded`: nothing is loaded to answer.
pub async fn of_model(gateway: &Gateway, model: &ModelRef) -> Result<Statistics, GatewayError> {
    let backends = gateway.placement().holders(model, Ask::Statistics)?;
    let model = Some((model.name.as_str(), model.version.as_deref()));
    gather(gateway, &backends, model).await
}

/// The statistics of every model on every ready backend.
pub async fn of_all(gateway: &Gateway) -> Result<Statistics, GatewayError> {
    let backends = ready_backends(gateway)?;
    gather(gateway, &backends, None).await
}

/// Every backend's answer, summed; when every backend refused (a copy unloaded meanwhile,
/// say), the first refusal, passed on as Triton worded it.
async fn gather(
    gateway: &Gateway,
    backends: &[Arc<Backend>],
    model: Option<(&str, Option<&str>)>,
) -> Result<Statistics, GatewayError> {
    let mut answers = Vec::with_capacity(backends.len());
    let mut refused = None;
    let asked = ask_all(gateway, backends, |triton| async move {
        triton.model_statistics::<Statistics>(model).await
    });
    for answer in asked.await {
        match answer {
            Ok(parsed) => answers.push(parsed),
            Err(error @ TritonError::Refused { .. }) => {
                refused.get_or_insert(error.passed_on());
            }
            Err(error) => return Err(error.passed_on()),
        }
    }
    match (answers.is_empty(), refused) {
        (true, Some(refused)) => Err(refused),
        _ => Ok(merge(answers)),
    }
}

/// Triton statistics answers merged: one row per (name, version), summed as the module says.
pub fn merge(answers: Vec<Statistics>) -> Statistics {
    let mut rows: BTreeMap<(String, String), ModelStatistics> = BTreeMap::new();
    for row in answers.into_iter().flat_map(|answer| answer.model_stats) {
        match rows.entry((row.name.clone(), row.version.clone())) {
            Entry::Occupied(mut existing) => existing.get_mut().add(row),
            Entry::Vacant(place) => {
                place.insert(row);
            }
        }
    }
    Statistics {
        model_stats: rows.into_values().collect(),
    }
}

/// Adding one copy's counts into another's: counts and durations summed, identities kept.
trait Add {
    fn add(&mut self, other: Self);
}

impl Add for u64 {
    fn add(&mut self, other: Self) {
        *self = self.saturating_add(other);
    }
}

/// A field one copy lacks is the other's.
impl<T: Add> Add for Option<T> {
    fn add(&mut self, other: Self) {
        match (self.as_mut(), other) {
            (Some(into), Some(other)) => into.add(other),
            (None, other @ Some(_)) => *self = other,
            (_, None) => {}
        }
    }
}

impl Add for StatisticDuration {
    fn add(&mut self, other: Self) {
        self.count.add(other.count);
        self.ns.add(other.ns);
    }
}

impl Add for ModelStatistics {
    fn add(&mut self, other: Self) {
        // The latest inference of any copy, not a sum.
        self.last_inference = match (self.last_inference, other.last_inference) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.inference_count.add(other.inference_count);
        self.execution_count.add(other.execution_count);
        self.inference_stats.add(other.inference_stats);
        self.response_stats.add(other.response_stats);
        self.batch_stats.add(other.batch_stats);
        self.memory_usage.add(other.memory_usage);
    }
}

impl Add for InferStatistics {
    fn add(&mut self, other: Self) {
        self.success.add(other.success);
        self.fail.add(other.fail);
        self.queue.add(other.queue);
        self.compute_input.add(other.compute_input);
        self.compute_infer.add(other.compute_infer);
        self.compute_output.add(other.compute_output);
        self.cache_hit.add(other.cache_hit);
        self.cache_miss.add(other.cache_miss);
    }
}

impl Add for ResponseStatistics {
    fn add(&mut self, other: Self) {
        self.compute_infer.add(other.compute_infer);
        self.compute_output.add(other.compute_output);
        self.success.add(other.success);
        self.fail.add(other.fail);
        self.empty_response.add(other.empty_response);
        self.cancel.add(other.cancel);
    }
}

/// Responses summed per key; a key one copy lacks is added.
impl Add for BTreeMap<String, ResponseStatistics> {
    fn add(&mut self, other: Self) {
        for (key, row) in other {
            match self.get_mut(&key) {
                Some(existing) => existing.add(row),
                None => {
                    self.insert(key, row);
                }
            }
        }
    }
}

/// A row that names something (a batch size, a device): one row per identity.
trait Row: Add {
    fn same(&self, other: &Self) -> bool;
}

impl Row for BatchStatistics {
    fn same(&self, other: &Self) -> bool {
        self.batch_size == other.batch_size
    }
}

impl Add for BatchStatistics {
    fn add(&mut self, other: Self) {
        self.compute_input.add(other.compute_input);
        self.compute_infer.add(other.compute_infer);
        self.compute_output.add(other.compute_output);
    }
}

impl Row for MemoryUsage {
    fn same(&self, other: &Self) -> bool {
        (&self.kind, self.id) == (&other.kind, other.id)
    }
}

impl Add for MemoryUsage {
    fn add(&mut self, other: Self) {
        self.byte_size.add(other.byte_size);
    }
}

/// Rows matched by identity and summed; a row one copy lacks is added, in its order.
impl<T: Row> Add for Vec<T> {
    fn add(&mut self, other: Self) {
        for row in other {
            match self.iter_mut().find(|r| r.same(&row)) {
                Some(existing) => existing.add(row),
                None => self.push(row),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn copy(count: u64, ns: u64, last: u64, batch: u64) -> Value {
        json!({"model_stats": [{
            "name": "m", "version": "1", "last_inference": last,
            "inference_count": count, "execution_count": count,
            "inference_stats": {"success": {"count": count, "ns": ns}, "fail": {"count": 0, "ns": 0}},
            "response_stats": {},
            "batch_stats": [{"batch_size": batch, "compute_infer": {"count": count, "ns": ns}}],
            "memory_usage": []
        }]})
    }

    /// Triton's JSON answers, read, merged and written back as HTTP answers them.
    fn merge_json(answers: Vec<Value>) -> Value {
        let answers = answers
            .into_iter()
            .map(|answer| serde_json::from_value(answer).unwrap())
            .collect();
        serde_json::to_value(merge(answers)).unwrap()
    }

    #[test]
    fn copies_are_summed_and_the_latest_inference_kept() {
        let merged = merge_json(vec![
            copy(3, 300, 1000, 1),
            copy(2, 50, 2000, 1),
            copy(1, 7, 1500, 4),
            json!({"model_stats": [{"name": "other", "version": "2", "inference_count": 9}]}),
        ]);
        assert_eq!(
            merged,
            json!({"model_stats": [
                {
                    "name": "m", "version": "1", "last_inference": 2000,
                    "inference_count": 6, "execution_count": 6,
                    "inference_stats": {"success": {"count": 6, "ns": 357}, "fail": {"count": 0, "ns": 0}},
                    "response_stats": {},
                    "batch_stats": [
                        {"batch_size": 1, "compute_infer": {"count": 5, "ns": 350}},
                        {"batch_size": 4, "compute_infer": {"count": 1, "ns": 7}}
                    ],
                    "memory_usage": []
                },
                {"name": "other", "version": "2", "inference_count": 9}
            ]})
        );
    }

    #[test]
    fn responses_and_memory_are_summed_per_key_and_device() {
        let copy = |bytes: u64, responses: u64| {
            json!({"model_stats": [{
                "name": "d", "version": "1",
                "response_stats": {"0": {"success": {"count": responses, "ns": 10}}},
                "memory_usage": [{"type": "CPU", "id": 0, "byte_size": bytes}]
            }]})
        };
        let mut other_device = copy(5, 1);
        other_device["model_stats"][0]["memory_usage"][0]["id"] = json!(1);
        other_device["model_stats"][0]["response_stats"] =
            json!({"1": {"cancel": {"count": 1, "ns": 2}}});
        let merged = merge_json(vec![copy(100, 2), copy(20, 3), other_device]);
        assert_eq!(
            merged,
            json!({"model_stats": [{
                "name": "d", "version": "1",
                "response_stats": {
                    "0": {"success": {"count": 5, "ns": 20}},
                    "1": {"cancel": {"count": 1, "ns": 2}}
                },
                "memory_usage": [
                    {"type": "CPU", "id": 0, "byte_size": 120},
                    {"type": "CPU", "id": 1, "byte_size": 5}
                ]
            }]})
        );
    }
}
