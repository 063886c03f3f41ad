//! `/metrics/backends`: every backend's own Triton metrics in one scrape, each sample labelled
//! with `backend`, so one Prometheus target covers the whole pool.

use super::{Backend, Pool, TritonClient};
use std::collections::HashMap;
use std::time::Duration;

/// Scrapes every backend that has a metrics URL (concurrently, each within `timeout`) and
/// merges the texts. A backend that fails to answer is left out and named in a comment.
pub async fn scrape_all(pool: &Pool, timeout: Duration) -> String {
    let backends = pool.backends();
    let scrapes = backends.iter().map(|backend| async move {
        let answer = TritonClient::new(backend, timeout).metrics_text().await?;
        let name = backend.name.as_str();
        Some(
            answer
                .map(|text| (name, text))
                .map_err(|error| error.describe(&format!("backend '{name}' metrics"))),
        )
    });
    let results = futures_util::future::join_all(scrapes)
        .await
        .into_iter()
        .flatten();
    let mut merged = Merged::default();
    let mut failures = Vec::new();
    for result in results {
        match result {
            Ok((name, text)) => merged.add(name, &text),
            Err(reason) => failures.push(reason),
        }
    }
    let mut out = String::new();
    for reason in failures {
        out.push_str("# scrape failed: ");
        out.push_str(&reason.replace('\n', " "));
        out.push('\n');
    }
    merged.render(&mut out);
    out
}

/// The sum of every sample of `metric` in a backend's metrics (e.g. memory used on each of
/// its GPUs), or `None` when the backend has no metrics URL, does not answer, or has no such
/// series (a CPU-only Triton has no `nv_gpu_memory_used_bytes`).
pub async fn read_sum(backend: &Backend, metric: &str, timeout: Duration) -> Option<f64> {
    let text = TritonClient::new(backend, timeout)
        .metrics_text()
        .await?
        .ok()?;
    sum_of(&text, metric)
}

fn sum_of(text: &str, metric: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|line| !line.starts_with('#') && sample_name(line) == metric)
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Metric families in first-seen order, each with its samples from every backend.
#[derive(Default)]
struct Merged {
    order: Vec<String>,
    families: HashMap<String, Family>,
}

#[derive(Default)]
struct Family {
    help: Option<String>,
    kind: Option<String>,
    samples: Vec<String>,
}

impl Merged {
    fn family(&mut self, name: &str) -> &mut Family {
        if !self.families.contains_key(name) {
            self.order.push(name.to_string());
        }
        self.families.entry(name.to_string()).or_default()
    }

    /// Adds one backend's exposition text. Samples belong to the family of the `# TYPE` or
    /// `# HELP` line before them, which keeps histogram `_bucket`/`_sum`/`_count` together.
    fn add(&mut self, backend: &str, text: &str) {
        let mut current: Option<String> = None;
        for line in text.lines() {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
            {
                let name = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let family = self.family(&name);
                if line.starts_with("# HELP ") {
                    family.help.get_or_insert_with(|| line.to_string());
                } else {
                    family.kind.get_or_insert_with(|| line.to_string());
                }
                current = Some(name);
            } else if !line.starts_with('#') {
                let sample = with_backend_label(line, backend);
                let name = match &current {
                    Some(name) if sample_name(line).starts_with(name.as_str()) => name.clone(),
                    _ => sample_name(line).to_string(),
                };
                self.family(&name).samples.push(sample);
            }
        }
    }

    fn render(&self, out: &mut String) {
        for name in &self.order {
            let family = &self.families[name];
            for meta in [&family.help, &family.kind].into_iter().flatten() {
                out.push_str(meta);
                out.push('\n');
            }
            for sample in &family.samples {
                out.push_str(sample);
                out.push('\n');
            }
        }
    }
}

fn sample_name(line: &str) -> &str {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    &line[..end]
}

fn with_backend_label(line: &str, backend: &str) -> String {
    let name = sample_name(line);
    let rest = &line[name.len()..];
    let label = format!(
        "backend=\"{}\"",
        backend.replace('\\', "\\\\").replace('"', "\\\"")
    );
    match rest.strip_prefix('{') {
        Some(labels) if labels.starts_with('}') => format!("{name}{{{label}{labels}"),
        Some(labels) => format!("{name}{{{label},{labels}"),
        None => format!("{name}{{{label}}}{rest}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_a_metric_over_its_series() {
        let text = "# TYPE nv_gpu_memory_used_bytes gauge\nnv_gpu_memory_used_bytes{gpu_uuid=\"a\"} 1e9\nnv_gpu_memory_used_bytes{gpu_uuid=\"b\"} 5e8\nnv_gpu_memory_total_bytes{gpu_uuid=\"a\"} 8e9\n";
        assert_eq!(sum_of(text, "nv_gpu_memory_used_bytes"), Some(1.5e9));
        assert_eq!(sum_of(text, "nv_cpu_memory_used_bytes"), None);
    }

    #[test]
    fn merges_families_and_labels_samples() {
        let a = "# HELP nv_inference_count Number of inferences\n# TYPE nv_inference_count counter\nnv_inference_count{model=\"add_sub\",version=\"1\"} 3\n# TYPE nv_up gauge\nnv_up 1\n";
        let b = "# HELP nv_inference_count Number of inferences\n# TYPE nv_inference_count counter\nnv_inference_count{model=\"add_sub\",version=\"1\"} 5\nnv_empty{} 2\n";
        let mut merged = Merged::default();
        merged.add("t0", a);
        merged.add("t1", b);
        let mut out = String::new();
        merged.render(&mut out);
        assert_eq!(
            out,
            "# HELP nv_inference_count Number of inferences\n# TYPE nv_inference_count counter\n\
             nv_inference_count{backend=\"t0\",model=\"add_sub\",version=\"1\"} 3\n\
             nv_inference_count{backend=\"t1\",model=\"add_sub\",version=\"1\"} 5\n\
             # TYPE nv_up gauge\nnv_up{backend=\"t0\"} 1\n\
             nv_empty{backend=\"t1\"} 2\n"
        );
    }
}
