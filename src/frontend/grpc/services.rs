//! The services' protocol-neutral answers (`crate::services`) as the gRPC messages Triton's
//! gRPC server answers with, field for field and straight into protobuf: statistics summed
//! over copies, the pool's repository index, the server's identity.

use crate::protocol::inference::repository_index_response::ModelIndex;
use crate::protocol::inference::{
    self as proto, ModelStatisticsResponse, RepositoryIndexResponse, ServerMetadataResponse,
};
use crate::services::statistics as stats;
use crate::upstream::ModelEntry;
use crate::upstream::identity::ServerMetadata;

impl From<stats::Statistics> for ModelStatisticsResponse {
    fn from(answer: stats::Statistics) -> Self {
        Self {
            model_stats: answer.model_stats.into_iter().map(model).collect(),
        }
    }
}

/// A field Triton left out is protobuf's default, as Triton's gRPC server leaves it.
fn model(row: stats::ModelStatistics) -> proto::ModelStatistics {
    proto::ModelStatistics {
        name: row.name,
        version: row.version,
        last_inference: row.last_inference.unwrap_or_default(),
        inference_count: row.inference_count.unwrap_or_default(),
        execution_count: row.execution_count.unwrap_or_default(),
        inference_stats: row.inference_stats.map(|s| proto::InferStatistics {
            success: duration(s.success),
            fail: duration(s.fail),
            queue: duration(s.queue),
            compute_input: duration(s.compute_input),
            compute_infer: duration(s.compute_infer),
            compute_output: duration(s.compute_output),
            cache_hit: duration(s.cache_hit),
            cache_miss: duration(s.cache_miss),
        }),
        batch_stats: (row.batch_stats.into_iter().flatten())
            .map(|b| proto::InferBatchStatistics {
                batch_size: b.batch_size,
                compute_input: duration(b.compute_input),
                compute_infer: duration(b.compute_infer),
                compute_output: duration(b.compute_output),
            })
            .collect(),
        memory_usage: (row.memory_usage.into_iter().flatten())
            .map(|m| proto::MemoryUsage {
                r#type: m.kind,
                id: m.id,
                byte_size: m.byte_size.unwrap_or_default(),
            })
            .collect(),
        response_stats: (row.response_stats.into_iter().flatten())
            .map(|(key, r)| {
                let response = proto::InferResponseStatistics {
                    compute_infer: duration(r.compute_infer),
                    compute_output: duration(r.compute_output),
                    success: duration(r.success),
                    fail: duration(r.fail),
                    empty_response: duration(r.empty_response),
                    cancel: duration(r.cancel),
                };
                (key, response)
            })
            .collect(),
    }
}

fn duration(d: Option<stats::StatisticDuration>) -> Option<proto::StatisticDuration> {
    d.map(|d| proto::StatisticDuration {
        count: d.count.unwrap_or_default(),
        ns: d.ns.unwrap_or_default(),
    })
}

/// The merged index: a row's missing version, state or reason is protobuf's empty string.
pub fn repository_index(rows: Vec<ModelEntry>) -> RepositoryIndexResponse {
    RepositoryIndexResponse {
        models: rows
            .into_iter()
            .map(|row| ModelIndex {
                name: row.name,
                version: row.version.unwrap_or_default(),
                state: row.state.unwrap_or_default(),
                reason: row.reason.unwrap_or_default(),
            })
            .collect(),
    }
}

impl From<ServerMetadata> for ServerMetadataResponse {
    fn from(ours: ServerMetadata) -> Self {
        Self {
            name: ours.name,
            version: ours.version,
            extensions: ours.extensions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Triton's JSON statistics, read as the statistics service reads them, become the gRPC
    /// message field for field (a field gRPC does not know is left out).
    #[test]
    fn statistics_json_becomes_the_grpc_message() {
        let json = serde_json::json!({"model_stats": [{
            "name": "m", "version": "1", "last_inference": 1796156218584u64,
            "inference_count": 3, "execution_count": 3,
            "inference_stats": {"success": {"count": 3, "ns": 21016483}},
            "response_stats": {},
            "batch_stats": [{"batch_size": 1, "compute_infer": {"count": 3, "ns": 9}}],
            "memory_usage": [], "some_future_field": true
        }]});
        let read: stats::Statistics = serde_json::from_value(json).unwrap();
        let message = ModelStatisticsResponse::from(read);
        let row = &message.model_stats[0];
        assert_eq!((row.name.as_str(), row.version.as_str()), ("m", "1"));
        assert_eq!(row.last_inference, 1796156218584);
        assert_eq!(row.inference_count, 3);
        let success = row
            .inference_stats
            .as_ref()
            .unwrap()
            .success
            .as_ref()
            .unwrap();
        assert_eq!((success.count, success.ns), (3, 21016483));
        assert_eq!(row.batch_stats[0].compute_infer.as_ref().unwrap().ns, 9);
    }
}
