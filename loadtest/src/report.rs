//! The report: the `--json` document and the human-readable table.
//!
//! Both are built from the same [`Report`] value so that what a script reads
//! and what a person reads can never disagree. Field names are documented in
//! `loadtest/README.md`; change them only together with that file.

use std::io::{self, Write};

use serde::Serialize;

use crate::body::Encoding;
use crate::cli::{BodySource, Plan};
use crate::stats::{StepSummary, max_rps_at_p95};
use crate::units::{fmt_bytes, fmt_duration, fmt_ms};

/// The run's settings as echoed in the report (`config`).
#[derive(Debug, Clone, Serialize)]
pub struct ConfigSummary {
    /// Base URL.
    pub url: String,
    /// Full infer URI requests went to.
    pub endpoint: String,
    /// Model / route name.
    pub model: String,
    /// Pinned model version, or `null`.
    pub model_version: Option<String>,
    /// `http` (only transport so far).
    pub protocol: &'static str,
    /// Whether h2c was used.
    pub http2: bool,
    /// `closed` (concurrency sweep) or `open` (fixed rates).
    pub mode: &'static str,
    /// `json`, `binary` or `request_file`.
    pub encoding: &'static str,
    /// The `--input` specs actually sent (after `--body-size`), e.g. `INPUT0:FP32:4`.
    pub inputs: Vec<String>,
    /// Size of the (first) request body in bytes.
    pub body_bytes: usize,
    /// Number of distinct pre-built bodies rotated through.
    pub body_variants: usize,
    /// Warmup per step, seconds.
    pub warmup_s: f64,
    /// Length of one measurement window, seconds.
    pub window_s: f64,
    /// Windows per step.
    pub windows: usize,
    /// Allowed window spread, percent.
    pub stability_pct: f64,
    /// Per-request timeout, seconds.
    pub timeout_s: f64,
    /// Whether `--check` validated responses.
    pub check: bool,
    /// The tenant the requests were sent as (`--tenant NAME=...`), or `null`.
    pub tenant: Option<String>,
    /// The priority band asked for (`--priority`), or `null`.
    pub priority: Option<&'static str>,
    /// Sequence mode: requests per sequence, or `null`.
    pub sequence_length: Option<usize>,
    /// Sequence mode: `number` or `string` ids, or `null`.
    pub sequence_ids: Option<&'static str>,
}

/// The headline figure (`max_rps_at_p95_target`).
#[derive(Debug, Clone, Serialize)]
pub struct MaxRps {
    /// The p95 objective, microseconds.
    pub target_p95_us: u64,
    /// Error-rate ceiling a step must respect to qualify, as a fraction.
    pub max_error_rate: f64,
    /// Highest qualifying throughput, or `null` if no step qualified.
    pub throughput_rps: Option<f64>,
    /// Label of that step (`c=16`), or `null`.
    pub step: Option<String>,
    /// Index of that step in `steps`, or `null`.
    pub step_index: Option<usize>,
    /// That step's p95 latency, microseconds, or `null`.
    pub p95_us: Option<u64>,
}

/// The whole report: what `--json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Always `infergate-load`.
    pub tool: &'static str,
    /// The tool's version.
    pub version: &'static str,
    /// Settings of the run.
    pub config: ConfigSummary,
    /// One entry per step, in the order they ran.
    pub steps: Vec<StepSummary>,
    /// Highest throughput meeting the p95 target.
    pub max_rps_at_p95_target: MaxRps,
}

impl ConfigSummary {
    /// Echoes a plan's settings.
    pub fn from_plan(plan: &Plan) -> Self {
        let (encoding, inputs) = match &plan.body_source {
            BodySource::File(_) => ("request_file", vec![]),
            BodySource::Generated { specs, encoding } => (
                match encoding {
                    Encoding::Json => "json",
                    Encoding::Binary => "binary",
                },
                specs
                    .iter()
                    .map(|s| {
                        let dims: Vec<String> = s.shape.iter().map(|d| d.to_string()).collect();
                        format!("{}:{}:{}", s.name, s.datatype, dims.join("x"))
                    })
                    .collect(),
            ),
        };
        let sequences = plan.sequences.as_ref().map(|(s, _)| s);
        let mode = match plan.steps.first().map(|s| s.load) {
            Some(crate::stats::Load::Open { .. }) => "open",
            _ if sequences.is_some() => "sequence",
            _ => "closed",
        };
        ConfigSummary {
            url: plan.url.clone(),
            endpoint: plan.endpoint.uri.to_string(),
            model: plan.model.clone(),
            model_version: plan.model_version.clone(),
            protocol: plan.protocol.as_str(),
            http2: plan.http2,
            mode,
            encoding,
            inputs,
            body_bytes: plan.bodies.first().map_or(0, |b| b.bytes.len()),
            body_variants: plan.bodies.len(),
            warmup_s: plan.timing.warmup.as_secs_f64(),
            window_s: plan.timing.window.as_secs_f64(),
            windows: plan.timing.windows,
            stability_pct: plan.stability * 100.0,
            timeout_s: plan.timing.timeout.as_secs_f64(),
            check: plan.check,
            tenant: plan.identity.tenant.clone(),
            priority: plan.identity.priority.map(|p| p.as_str()),
            sequence_length: sequences.map(|s| s.length),
            sequence_ids: sequences.map(|s| if s.string_ids { "string" } else { "number" }),
        }
    }
}

impl Report {
    /// Assembles the report and computes the headline figure.
    pub fn new(plan: &Plan, steps: Vec<StepSummary>) -> Self {
        let target_us = plan.p95_target.as_micros() as u64;
        let best = max_rps_at_p95(&steps, target_us, plan.max_error_rate);
        let max = MaxRps {
            target_p95_us: target_us,
            max_error_rate: plan.max_error_rate,
            throughput_rps: best.map(|i| steps[i].throughput_rps),
            step: best.map(|i| steps[i].label.clone()),
            step_index: best,
            p95_us: best.map(|i| steps[i].latency_us.p95),
        };
        Report {
            tool: "infergate-load",
            version: env!("CARGO_PKG_VERSION"),
            config: ConfigSummary::from_plan(plan),
            steps,
            max_rps_at_p95_target: max,
        }
    }
}

/// Open-loop p99 send lag (µs) above which the report warns that the
/// generator, not only the server, shaped the latency figures.
pub const LAG_WARN_US: u64 = 1_000;

/// Column headings of the step table.
pub const TABLE_HEADER: &str = "step          conns     infer/s   p50 ms   p90 ms   p95 ms   p99 ms   max ms    errors  stable";

/// One row of the step table, printed as soon as the step finishes.
pub fn table_row(s: &StepSummary) -> String {
    let stable = match s.stable {
        None => "n/a".to_string(),
        Some(true) => format!("yes ±{:.1}%", s.window_spread_pct),
        Some(false) => format!("NO ±{:.1}%", s.window_spread_pct),
    };
    let l = &s.latency_us;
    format!(
        "{:<12} {:>6} {:>11.1} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}  {}",
        s.label,
        s.connections,
        s.throughput_rps,
        fmt_ms(l.p50),
        fmt_ms(l.p90),
        fmt_ms(l.p95),
        fmt_ms(l.p99),
        fmt_ms(l.max),
        s.errors,
        stable
    )
}

/// The lines printed before the table: what is being measured.
pub fn header_lines(c: &ConfigSummary) -> Vec<String> {
    let inputs = if c.inputs.is_empty() {
        String::new()
    } else {
        format!(" inputs={}", c.inputs.join(","))
    };
    vec![
        format!(
            "infergate-load {} -> {} ({}{}{}{})",
            c.mode,
            c.endpoint,
            c.protocol,
            if c.http2 { ", h2c" } else { "" },
            if c.check { ", --check" } else { "" },
            identity_note(c),
        ),
        format!(
            "body: {} {} B{} ({} variant{}){inputs}",
            c.encoding,
            c.body_bytes,
            if c.body_bytes >= 10_000 {
                format!(" = {}", fmt_bytes(c.body_bytes as u64))
            } else {
                String::new()
            },
            c.body_variants,
            if c.body_variants == 1 { "" } else { "s" }
        ),
        format!(
            "warmup {} then {} x {} window{} per step, timeout {}",
            fmt_duration(std::time::Duration::from_secs_f64(c.warmup_s)),
            c.windows,
            fmt_duration(std::time::Duration::from_secs_f64(c.window_s)),
            if c.windows == 1 { "" } else { "s" },
            fmt_duration(std::time::Duration::from_secs_f64(c.timeout_s)),
        ),
    ]
}

/// `, tenant flood, critical`: who the requests were sent as, if said.
fn identity_note(c: &ConfigSummary) -> String {
    let tenant = c.tenant.as_ref().map(|t| format!(", tenant {t}"));
    let band = c.priority.map(|p| format!(", {p}"));
    format!("{}{}", tenant.unwrap_or_default(), band.unwrap_or_default())
}

/// The lines printed after the table: per-window throughput, errors by
/// kind, open-loop send lag, and the headline figure.
pub fn footer_lines(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    if r.config.windows > 1 {
        out.push("windows (infer/s):".to_string());
        for s in &r.steps {
            let w: Vec<String> = s
                .windows
                .iter()
                .map(|w| format!("{:.1}", w.throughput_rps))
                .collect();
            out.push(format!("  {:<12} {}", s.label, w.join("  ")));
        }
    }
    let with_errors: Vec<&StepSummary> = r.steps.iter().filter(|s| s.errors > 0).collect();
    if !with_errors.is_empty() {
        out.push("errors by kind:".to_string());
        for s in with_errors {
            let kinds: Vec<String> = s
                .errors_by_kind
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            out.push(format!(
                "  {:<12} {} ({:.2}% of requests)",
                s.label,
                kinds.join(" "),
                s.error_rate * 100.0
            ));
        }
    }
    let lagged: Vec<&StepSummary> = r.steps.iter().filter(|s| s.send_lag_us.is_some()).collect();
    if !lagged.is_empty() {
        out.push("open-loop send lag behind schedule (ms):".to_string());
        for s in lagged {
            let l = s.send_lag_us.expect("filtered");
            out.push(format!(
                "  {:<12} p50 {}  p99 {}  max {}",
                s.label,
                fmt_ms(l.p50),
                fmt_ms(l.p99),
                fmt_ms(l.max)
            ));
        }
    }
    for s in &r.steps {
        if let Some(l) = s.send_lag_us.filter(|l| l.p99 > LAG_WARN_US) {
            out.push(format!(
                "warning: {}: 1% of requests left more than {} ms behind schedule; the load \
                 generator (or its CPU) could not keep up, and its lag is part of the latency",
                s.label,
                fmt_ms(l.p99)
            ));
        }
    }
    let m = &r.max_rps_at_p95_target;
    let target = fmt_duration(std::time::Duration::from_micros(m.target_p95_us));
    out.push(match (m.throughput_rps, &m.step, m.p95_us) {
        (Some(rps), Some(step), Some(p95)) => format!(
            "max RPS at p95 <= {target}: {rps:.1} infer/s ({step}, p95 {} ms)",
            fmt_ms(p95)
        ),
        _ => format!(
            "max RPS at p95 <= {target}: none (no step met the target with <= {:.2}% errors)",
            m.max_error_rate * 100.0
        ),
    });
    out
}

/// The closing summary, in the columns perf_analyzer users read (its `-f` CSV's
/// `Concurrency` or `Request Rate`, `Inferences/Second` and the latency percentiles, in
/// microseconds), one row per step, so figures from the two tools line up side by side.
pub fn summary_lines(r: &Report) -> Vec<String> {
    let open = r.steps.iter().any(|s| s.rate.is_some());
    let first = if open { "Request Rate" } else { "Concurrency" };
    let mut out = vec![format!(
        "{first:>12}  {:>17}  {:>11}  {:>11}  {:>11}  {:>11}",
        "Inferences/Second", "p50 usec", "p90 usec", "p95 usec", "p99 usec"
    )];
    for s in &r.steps {
        let load = match (s.concurrency, s.rate) {
            (Some(c), _) => c.to_string(),
            (None, Some(rate)) => format!("{rate}"),
            (None, None) => s.label.clone(),
        };
        let l = &s.latency_us;
        out.push(format!(
            "{load:>12}  {:>17.1}  {:>11}  {:>11}  {:>11}  {:>11}",
            s.throughput_rps, l.p50, l.p90, l.p95, l.p99
        ));
    }
    out
}

/// Prints the JSON document on stdout.
pub fn print_json(r: &Report) -> io::Result<()> {
    let mut out = io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, r)?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{LatencySummary, WindowSummary};
    use std::collections::BTreeMap;

    fn step(label: &str, rps: f64, p95: u64) -> StepSummary {
        StepSummary {
            label: label.into(),
            concurrency: Some(1),
            rate: None,
            connections: 1,
            measured_s: 10.0,
            requests: 10,
            ok: 10,
            errors: 0,
            error_rate: 0.0,
            errors_by_kind: BTreeMap::new(),
            throughput_rps: rps,
            latency_us: LatencySummary {
                count: 10,
                p95,
                ..Default::default()
            },
            windows: vec![WindowSummary {
                throughput_rps: rps,
                ok: 10,
                errors: 0,
                p50_us: 1,
                p95_us: p95,
                p99_us: p95,
            }],
            window_spread_pct: 0.0,
            stable: None,
            send_lag_us: None,
        }
    }

    fn plan() -> Plan {
        use clap::Parser;
        crate::cli::Args::try_parse_from([
            "x",
            "-i",
            "INPUT0:FP32:4",
            "-c",
            "1,2",
            "--p95-target",
            "5ms",
            "--windows",
            "1",
        ])
        .unwrap()
        .into_plan()
        .unwrap()
    }

    #[test]
    fn json_document_has_documented_fields() {
        let r = Report::new(
            &plan(),
            vec![step("c=1", 100.0, 1_000), step("c=2", 150.0, 9_000)],
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["tool"], "infergate-load");
        assert_eq!(v["config"]["mode"], "closed");
        assert_eq!(v["config"]["encoding"], "json");
        assert_eq!(v["config"]["inputs"][0], "INPUT0:FP32:4");
        assert_eq!(v["steps"][0]["latency_us"]["p95"], 1_000);
        assert_eq!(v["steps"][1]["throughput_rps"], 150.0);
        let m = &v["max_rps_at_p95_target"];
        assert_eq!(m["target_p95_us"], 5_000);
        assert_eq!(m["throughput_rps"], 100.0);
        assert_eq!(m["step"], "c=1");
        assert_eq!(m["step_index"], 0);
    }

    #[test]
    fn footer_reports_headline_or_none() {
        let r = Report::new(&plan(), vec![step("c=1", 100.0, 1_000)]);
        let f = footer_lines(&r).join("\n");
        assert!(
            f.contains("max RPS at p95 <= 5ms: 100.0 infer/s (c=1"),
            "{f}"
        );
        let r = Report::new(&plan(), vec![step("c=1", 100.0, 6_000)]);
        let f = footer_lines(&r).join("\n");
        assert!(f.contains("none"), "{f}");
    }

    #[test]
    fn footer_warns_when_the_generator_lags() {
        let mut late = step("rate=500", 500.0, 1_000);
        late.send_lag_us = Some(crate::stats::LagSummary {
            p50: 50,
            p99: 2_500,
            max: 4_000,
        });
        let mut on_time = step("rate=100", 100.0, 1_000);
        on_time.send_lag_us = Some(crate::stats::LagSummary {
            p50: 30,
            p99: 200,
            max: 900,
        });
        let f = footer_lines(&Report::new(&plan(), vec![late, on_time])).join("\n");
        assert!(f.contains("warning: rate=500"), "{f}");
        assert!(!f.contains("warning: rate=100"), "{f}");
        assert!(f.contains("open-loop send lag"), "{f}");
    }

    #[test]
    fn summary_has_perf_analyzers_columns_and_a_row_per_step() {
        let plan = plan();
        let report = Report::new(
            &plan,
            vec![step("c=1", 100.0, 900), step("c=16", 1500.5, 2000)],
        );
        let lines = summary_lines(&report);
        assert_eq!(lines.len(), 3);
        for column in [
            "Concurrency",
            "Inferences/Second",
            "p50 usec",
            "p90 usec",
            "p95 usec",
            "p99 usec",
        ] {
            assert!(lines[0].contains(column), "{column}: {}", lines[0]);
        }
        assert!(lines[2].contains("1500.5"), "{}", lines[2]);
        assert!(lines[2].contains("2000"), "{}", lines[2]);
    }

    #[test]
    fn row_lines_up_with_header() {
        let row = table_row(&step("c=64", 12345.6, 1_500));
        assert!(row.starts_with("c=64"));
        assert!(row.contains("12345.6"));
        assert!(row.contains("1.500"));
        assert!(TABLE_HEADER.starts_with("step"));
    }
}
