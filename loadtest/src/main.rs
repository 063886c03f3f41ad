//! `infergate-load` command-line entry point: parse, validate, run each step,
//! print the table (and the JSON document with `--json`).
//!
//! Exit status: 0 when the run completed and at least one request succeeded,
//! 1 when no request succeeded at all, 2 on invalid arguments or when the
//! server cannot be reached.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use infergate_load::cli::{Args, Plan};
use infergate_load::outcome::ErrorKind;
use infergate_load::report::{
    ConfigSummary, Report, TABLE_HEADER, footer_lines, header_lines, print_json, summary_lines,
    table_row,
};
use infergate_load::runner::{Progress, run_step};
use infergate_load::stats::StepSummary;
use infergate_load::transport::{Protocol, Transport};

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("infergate-load: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<ExitCode> {
    let plan = args.into_plan()?;
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = plan.threads {
        rt.worker_threads(n);
    }
    let rt = rt.build().context("starting the tokio runtime")?;
    rt.block_on(run_plan(plan))
}

/// Where table lines go: stdout normally; stderr when stdout carries the
/// JSON document; nowhere with `--json --quiet`.
struct Out {
    json: bool,
    quiet: bool,
}

impl Out {
    fn line(&self, s: &str) {
        if !self.json {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{s}");
            let _ = o.flush();
        } else if !self.quiet {
            eprintln!("{s}");
        }
    }
}

/// Sends one request before measuring, to fail fast with a clear message
/// when nothing listens at `--url`, and to warn when the model refuses the
/// request (wrong name or shape) instead of silently measuring errors.
async fn preflight(plan: &Plan) -> Result<()> {
    match plan.protocol {
        Protocol::Http => preflight_with(plan, plan.http_transport(1)?).await,
        Protocol::Grpc => preflight_with(plan, plan.grpc_transport(1)?).await,
    }
}

async fn preflight_with<T: Transport>(plan: &Plan, t: T) -> Result<()> {
    // In sequence mode, a sequence of one request (start and end), as a plain request to a
    // sequence model is refused.
    let first = plan.sequences.as_ref().and_then(|(sequences, _)| {
        infergate_load::sequence::Sequences {
            length: 1,
            ..*sequences
        }
        .requests(0)
        .next()
    });
    let request = async {
        match &first {
            Some(request) => t.infer_sequence(request).await,
            None => t.infer(0).await,
        }
    };
    let r = tokio::time::timeout(plan.timing.timeout, request).await;
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(ErrorKind::Connect)) => bail!(
            "cannot connect to {} (is the server running?)",
            plan.endpoint.uri
        ),
        Ok(Err(kind)) => {
            eprintln!(
                "infergate-load: warning: first request to {} failed ({kind}); measuring anyway",
                plan.endpoint.uri
            );
            Ok(())
        }
        Err(_) => {
            eprintln!(
                "infergate-load: warning: first request to {} timed out; measuring anyway",
                plan.endpoint.uri
            );
            Ok(())
        }
    }
}

async fn run_plan(plan: Plan) -> Result<ExitCode> {
    let out = Out {
        json: plan.json,
        quiet: plan.quiet,
    };
    for l in header_lines(&ConfigSummary::from_plan(&plan)) {
        out.line(&l);
    }
    preflight(&plan).await?;
    out.line(TABLE_HEADER);

    let n = plan.steps.len();
    let mut summaries: Vec<StepSummary> = Vec::with_capacity(n);
    for (i, step) in plan.steps.iter().enumerate() {
        let progress = Progress {
            enabled: !plan.quiet,
            prefix: format!("[{}/{} {}]", i + 1, n, step.load.label()),
        };
        let result = match plan.protocol {
            Protocol::Http => {
                let transport = Arc::new(plan.http_transport(step.connections)?);
                run_step(transport, *step, plan.timing, progress).await
            }
            Protocol::Grpc => {
                let transport = Arc::new(plan.grpc_transport(step.connections)?);
                run_step(transport, *step, plan.timing, progress).await
            }
        };
        let summary = StepSummary::from_result(&result, plan.stability);
        out.line(&table_row(&summary));
        summaries.push(summary);
        // Let the previous step's connections close before the next opens its own.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let report = Report::new(&plan, summaries);
    for l in footer_lines(&report) {
        out.line(&l);
    }
    out.line("");
    for l in summary_lines(&report) {
        out.line(&l);
    }
    if plan.json {
        print_json(&report).context("writing the JSON report")?;
    }
    let any_ok = report.steps.iter().any(|s| s.ok > 0);
    Ok(if any_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
