//! A model's statistics through the gateway: what every copy that serves it has counted,
//! summed, for HTTP and gRPC alike.
//!
//! Triton counts per server; a model served by two copies has two sets of numbers. Tools
//! that read the statistics (perf_analyzer's server-side columns) ask one server, so the
//! gateway asks every copy and answers one set per model and version: counts and durations
//! are summed, `last_inference` is the latest, rows of `batch_stats` are summed per
//! `batch_size` and rows of `memory_usage` per `type` and `id`. A copy that is unloaded takes
//! its counts with it, as an unload does on Triton.

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::model::{Ask, ModelRef};
use crate::pipeline::repository::{ask_all, ready_backends};
use crate::upstream::Backend;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the statistics question came to.
#[derive(Debug)]
pub enum Statistics {
    /// `{"model_stats": [...]}`, one row per model and version, summed over copies.
    Merged(Value),
    /// Every backend asked refused (a copy unloaded meanwhile, say): the first answer, to
    /// pass on as Triton wrote it.
    Refused {
        /// The backend's status.
        status: StatusCode,
        /// The backend's body.
        body: Bytes,
    },
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

async fn gather(
    gateway: &Gateway,
    backends: &[Arc<Backend>],
    model: Option<(&str, Option<&str>)>,
) -> Result<Statistics, GatewayError> {
    let mut answers = Vec::with_capacity(backends.len());
    let mut refused = None;
    let asked = ask_all(gateway, backends, |triton| async move {
        triton.model_statistics(model).await
    });
    for answer in asked.await {
        match answer {
            Ok(parsed) => answers.push(parsed),
            Err(error) => {
                let (status, body) = error.refusal()?;
                refused.get_or_insert(Statistics::Refused { status, body });
            }
        }
    }
    match (answers.is_empty(), refused) {
        (true, Some(refused)) => Ok(refused),
        _ => Ok(Statistics::Merged(merge(answers))),
    }
}

/// Triton statistics answers merged: one row per (name, version), summed as the module says.
pub fn merge(answers: Vec<Value>) -> Value {
    let mut rows: BTreeMap<(String, String), Value> = BTreeMap::new();
    for answer in answers {
        let Some(Value::Array(stats)) = answer.get("model_stats").cloned() else {
            continue;
        };
        for row in stats {
            let key = (text(&row, "name"), text(&row, "version"));
            match rows.get_mut(&key) {
                Some(existing) => add(existing, row, ""),
                None => {
                    rows.insert(key, row);
                }
            }
        }
    }
    serde_json::json!({ "model_stats": rows.into_values().collect::<Vec<_>>() })
}

fn text(row: &Value, key: &str) -> String {
    row.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Fields that name a row of a list rather than count something.
const IDENTITY: [&str; 4] = ["batch_size", "type", "id", "kind"];

/// Adds `other` into `into`: numbers summed (the latest for `last_inference`), objects
/// field by field, lists row by row (rows matched by their `IDENTITY` fields), anything
/// else kept as it was.
fn add(into: &mut Value, other: Value, key: &str) {
    match (into, other) {
        (Value::Number(a), Value::Number(b)) => {
            if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
                let sum = if key == "last_inference" {
                    x.max(y)
                } else {
                    x.saturating_add(y)
                };
                *a = sum.into();
            }
        }
        (Value::Object(a), Value::Object(b)) => add_fields(a, b),
        (Value::Array(a), Value::Array(b)) => {
            for row in b {
                match a.iter_mut().find(|r| same_row(r, &row)) {
                    Some(existing) => add(existing, row, ""),
                    None => a.push(row),
                }
            }
        }
        _ => {}
    }
}

fn add_fields(into: &mut Map<String, Value>, other: Map<String, Value>) {
    for (key, value) in other {
        match into.get_mut(&key) {
            Some(existing) if !IDENTITY.contains(&key.as_str()) => add(existing, value, &key),
            Some(_) => {}
            None => {
                into.insert(key, value);
            }
        }
    }
}

fn same_row(a: &Value, b: &Value) -> bool {
    IDENTITY.iter().all(|key| a.get(key) == b.get(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    #[test]
    fn copies_are_summed_and_the_latest_inference_kept() {
        let merged = merge(vec![
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
}
