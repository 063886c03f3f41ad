//! Each backend's queue per model, as its Triton reports it
//! (`nv_inference_pending_request_count`): what this gateway cannot count by itself, the
//! requests other replicas (or clients calling Triton directly) have waiting there. Read with
//! the health checks, kept with the time it was read, and trusted only while fresh
//! (`placement.queue_max_age`).

use foldhash::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// Triton's gauge of requests waiting in a model's scheduler queue.
const PENDING: &str = "nv_inference_pending_request_count";

/// One reading of a backend's queues.
#[derive(Debug)]
pub struct Queues {
    read_at: Instant,
    /// Requests waiting, per model (summed over its versions).
    pending: HashMap<String, u64>,
}

impl Queues {
    /// The queues in a Triton metrics text read at `read_at`.
    pub fn parse(text: &str, read_at: Instant) -> Self {
        let mut pending: HashMap<String, u64> = HashMap::default();
        for line in text.lines() {
            let Some(labels) = line.strip_prefix(PENDING).and_then(|l| l.strip_prefix('{')) else {
                continue;
            };
            let Some((labels, value)) = labels.rsplit_once("} ") else {
                continue;
            };
            let (Some(model), Ok(value)) = (label(labels, "model"), value.trim().parse::<f64>())
            else {
                continue;
            };
            *pending.entry(model.to_owned()).or_default() += value.max(0.0) as u64;
        }
        Self { read_at, pending }
    }

    /// Requests waiting for `model`, when this reading is younger than `max_age` (0 when the
    /// model has no queue there, `None` when the reading is too old to trust).
    pub fn pending(&self, model: &str, max_age: Duration, now: Instant) -> Option<u64> {
        (now.saturating_duration_since(self.read_at) <= max_age)
            .then(|| self.pending.get(model).copied().unwrap_or(0))
    }
}

/// The value of label `name` in a Prometheus label set (`a="x",b="y"`); Triton's model
/// names carry no quotes or escapes.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then(|| value.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tritons_pending_gauge_per_model() {
        let text = "\
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model=\"slow_model\",version=\"1\"} 7
nv_inference_pending_request_count{model=\"slow_model\",version=\"2\"} 1
nv_inference_pending_request_count{model=\"add_sub\",version=\"1\"} 0
nv_inference_pending_request_count_other{model=\"x\",version=\"1\"} 9
nv_inference_count{model=\"add_sub\",version=\"1\"} 120
";
        let now = Instant::now();
        let queues = Queues::parse(text, now);
        let fresh = Duration::from_secs(5);
        assert_eq!(queues.pending("slow_model", fresh, now), Some(8));
        assert_eq!(queues.pending("add_sub", fresh, now), Some(0));
        assert_eq!(queues.pending("unknown", fresh, now), Some(0));
        assert_eq!(queues.pending("x", fresh, now), Some(0), "another metric");
        let later = now + Duration::from_secs(6);
        assert_eq!(queues.pending("slow_model", fresh, later), None, "stale");
    }
}
