//! The `infergate` command: run the gateway, check a config file, or hash an API key. (The
//! placement simulator is a binary of its own, `infergate-simulate`, in `simulator/`.)

use clap::{Parser, Subcommand};
use infergate::LogFormat;
use infergate::config::Config;
use std::path::PathBuf;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

mod allocator;

/// mimalloc instead of glibc's malloc: a request makes some seventy small allocations, and
/// with mimalloc's thread-local free lists it costs 6–9% fewer instructions
/// (`loadtest/instructions.sh`, docs/performance.md); `allocator` says how it is called.
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

#[derive(Parser)]
#[command(
    version,
    about = "A KServe v2 gateway in front of a pool of Triton Inference Servers"
)]
struct Cli {
    /// Config file.
    #[arg(
        long,
        short,
        env = "INFERGATE_CONFIG",
        default_value = "config/gateway.toml",
        global = true
    )]
    config: PathBuf,
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Run,
    /// Validate a config file and print every error with its key; exit 1 on error.
    Check,
    /// Print the SHA-256 of an API key, for `[[auth.api_keys]] sha256`. Reads the key from
    /// standard input (one line) when not given, so it stays out of shell history.
    HashKey {
        /// The key; omit to read it from standard input.
        key: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::Check => check(&cli.config),
        Command::HashKey { key } => hash_key(key),
        Command::Run => {
            let code = run(&cli.config, cli.log_format);
            infergate::flush_logs();
            code
        }
    }
}

fn hash_key(key: Option<String>) -> ExitCode {
    let key = match key {
        Some(key) => key,
        None => {
            let mut line = String::new();
            if let Err(error) = std::io::stdin().read_line(&mut line) {
                eprintln!("hash-key: cannot read the key from standard input: {error}");
                return ExitCode::FAILURE;
            }
            line.trim_end_matches(['\r', '\n']).to_owned()
        }
    };
    if key.is_empty() {
        eprintln!("hash-key: the key is empty");
        return ExitCode::FAILURE;
    }
    println!("{}", infergate::hash_key(&key));
    ExitCode::SUCCESS
}

fn check(path: &std::path::Path) -> ExitCode {
    // Certificate files, key files, secrets and JWKS files are read too: a gateway that
    // would not start fails the check.
    let checked = Config::load(path).and_then(check_files).and_then(|config| {
        infergate::internals::Auth::new(&config.auth)
            .map(|_| config)
            .map_err(infergate::config::ConfigErrors)
    });
    match checked {
        Ok(config) => {
            println!(
                "{}: ok ({} backends)",
                path.display(),
                config.backends.len()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for error in &errors.0 {
                eprintln!("{}: {error}", path.display());
            }
            ExitCode::FAILURE
        }
    }
}

/// What the file names beyond itself: certificates, keys and CA bundles must load.
fn check_files(config: Config) -> Result<Config, infergate::config::ConfigErrors> {
    let mut errors = Vec::new();
    if let Some(tls) = &config.listen.tls
        && let Err(error) = infergate::internals::ServerTls::new(tls)
    {
        errors.push(error);
    }
    if let Some(cluster) = &config.cluster
        && let Err(error) = infergate::internals::etcd_connector(
            cluster.tls.as_ref(),
            std::time::Duration::from_secs(1),
        )
    {
        errors.push(error);
    }
    for (i, backend) in config.backends.iter().enumerate() {
        if let Err(message) = infergate::internals::Pool::build(backend, &config) {
            let key = if backend.tls_ca.is_some() {
                format!("backends[{i}].tls_ca")
            } else {
                "upstream.tls_ca".into()
            };
            errors.push(infergate::config::ConfigError { key, message });
        }
    }
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(infergate::config::ConfigErrors(errors))
    }
}

/// The runtime of the main thread: signals, health checks, reconcile, reload triggers and
/// the other background work. Requests are served on `server.workers` workers of their own
/// (`infergate::listen`), so this one needs no more than one thread.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn run(path: &std::path::Path, log_format: LogFormat) -> ExitCode {
    infergate::init_logging(log_format);
    let gateway = match infergate::Gateway::from_file(path) {
        Ok(gateway) => gateway,
        Err(errors) => {
            for error in &errors.0 {
                tracing::error!(config = %path.display(), "{error}");
            }
            return ExitCode::FAILURE;
        }
    };
    let runtime = runtime();
    let result = runtime.block_on(async move {
        let listeners = infergate::Listeners::bind(gateway.fixed_config()).await?;
        let shutdown = CancellationToken::new();
        infergate::cancel_on_signal(shutdown.clone());
        infergate::serve(gateway, listeners, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}
