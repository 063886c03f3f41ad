//! `fake-triton`: a fast fake Triton Inference Server for measuring proxy
//! overhead. See `infergate_load::fake` for what it answers.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Parser;
use infergate_load::fake::{FakeConfig, FakeTriton, serve};
use infergate_load::units::{fmt_duration, parse_duration};

/// Fake Triton Inference Server answering KServe v2 HTTP requests from
/// precomputed bodies (health, metadata, config, repository index, metrics,
/// infer in JSON or binary form).
#[derive(Debug, Parser)]
#[command(name = "fake-triton", version)]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stderr).
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: String,

    /// Model name to serve (repeatable); each has version 1 and add_sub's
    /// signature (INPUT0/INPUT1 -> OUTPUT0/OUTPUT1, FP32 [4]). Default:
    /// add_sub, unless --dynamic-model is given.
    #[arg(long = "model", value_name = "NAME")]
    models: Vec<String>,

    /// Model name to serve with a signature that takes any length (repeatable):
    /// INPUT0 FP32 [-1] -> OUTPUT0 FP32 [-1], max_batch_size 0, for body-size
    /// benchmarks through a validating gateway. Its answer is fixed (OUTPUT0 [1]).
    #[arg(long = "dynamic-model", value_name = "NAME")]
    dynamic_models: Vec<String>,

    /// Fixed latency added to every infer request (e.g. 0ms, 5ms).
    #[arg(long, default_value = "0ms", value_name = "DURATION")]
    delay: String,

    /// Fraction of infer requests answered 500 {"error":"injected failure"} (0.0 to 1.0).
    #[arg(long, default_value_t = 0.0, value_name = "FRACTION")]
    fail_rate: f64,

    /// Time a repository load takes before it answers (e.g. 0ms, 20ms).
    #[arg(long, default_value = "0ms", value_name = "DURATION")]
    load_delay: String,

    /// Start with no model loaded: each is UNAVAILABLE in the index, and answers 400
    /// "Request for unknown model", until a repository load.
    #[arg(long)]
    unloaded: bool,

    /// Tokio worker threads (default: all cores).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake-triton: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<()> {
    if !(0.0..=1.0).contains(&args.fail_rate) {
        bail!("--fail-rate must be between 0.0 and 1.0");
    }
    if args.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    if let Some(m) = args.models.iter().find(|m| args.dynamic_models.contains(m)) {
        bail!("model '{m}' is given both as --model and --dynamic-model");
    }
    let cfg = FakeConfig {
        models: if args.models.is_empty() && args.dynamic_models.is_empty() {
            vec!["add_sub".to_string()]
        } else {
            args.models
        },
        dynamic_models: args.dynamic_models,
        delay: parse_duration(&args.delay).context("--delay")?,
        fail_rate: args.fail_rate,
        load_delay: parse_duration(&args.load_delay).context("--load-delay")?,
        unloaded: args.unloaded,
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = args.threads {
        rt.worker_threads(n);
    }
    let rt = rt.build().context("starting the tokio runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "fake-triton listening on http://{addr} (models: {}; delay {}; fail-rate {})",
            cfg.models
                .iter()
                .cloned()
                .chain(cfg.dynamic_models.iter().map(|m| format!("{m} (dynamic)")))
                .collect::<Vec<_>>()
                .join(","),
            fmt_duration(cfg.delay),
            cfg.fail_rate
        );
        let state = Arc::new(FakeTriton::new(&cfg));
        tokio::select! {
            _ = serve(listener, state.clone()) => {}
            r = tokio::signal::ctrl_c() => {
                r.context("waiting for Ctrl-C")?;
                eprintln!("fake-triton: shutting down after {} infer requests", state.infer_count());
            }
        }
        Ok(())
    })
}
