//! `hyper-floor`: the least a reverse proxy built on hyper and tokio can do, measured beside
//! infergate and nginx (`loadtest/compare.sh`, stage `floor`).
//!
//! It has infergate's shape and nothing else: shared-nothing workers (a single-threaded tokio
//! runtime each, with its own `SO_REUSEPORT` listening socket), hyper's HTTP/1 server in
//! front, and hyper's pooled keep-alive client behind, one pool per worker. Each request goes
//! to the backend as it came (its URI made absolute), and the answer streams back. No
//! routing, no auth, no validation, no metrics, no log line, no timers.
//!
//! What infergate spends beyond this floor is the gateway's own work; what the floor spends
//! beyond nginx is the price of hyper and tokio, which infergate keeps (its HTTP parsing is
//! hyper's on purpose: a private parser would be a request-smuggling risk).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpSocket;

/// A bare hyper reverse proxy: the floor under infergate's per-request cost.
#[derive(Debug, Parser)]
#[command(name = "hyper-floor", version)]
struct Args {
    /// Address to listen on.
    #[arg(long)]
    listen: SocketAddr,

    /// The backend, as `host:port`.
    #[arg(long)]
    backend: String,

    /// Worker threads, each with its own listening socket (default: the cores this process
    /// may run on).
    #[arg(long)]
    workers: Option<usize>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hyper-floor: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let threads: Vec<_> = (0..workers)
        .map(|index| {
            let (listen, backend) = (args.listen, args.backend.clone());
            std::thread::Builder::new()
                .name(format!("floor-{index}"))
                .spawn(move || worker(listen, &backend))
                .context("starting a worker")
        })
        .collect::<Result<_>>()?;
    eprintln!("hyper-floor: {workers} workers on {}", args.listen);
    for thread in threads {
        thread.join().expect("workers do not panic")?;
    }
    Ok(())
}

/// One worker: its runtime, its listening socket, its client pool.
fn worker(listen: SocketAddr, backend: &str) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let backend: Uri = format!("http://{backend}").parse()?;
    runtime.block_on(async move {
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(listen)?;
        let listener = socket.listen(1024)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Client<_, Incoming> = Client::builder(TokioExecutor::new()).build(connector);
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let (client, backend) = (client.clone(), backend.clone());
            tokio::spawn(async move {
                let service =
                    service_fn(move |request| forward(client.clone(), backend.clone(), request));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// Sends `request` to the backend and hands back its answer (a 502 when it cannot be sent).
async fn forward(
    client: Client<HttpConnector, Incoming>,
    backend: Uri,
    mut request: Request<Incoming>,
) -> Result<Response<http_body_util::Either<Incoming, String>>, Infallible> {
    let mut parts = backend.into_parts();
    parts.path_and_query = request.uri().path_and_query().cloned();
    *request.uri_mut() = Uri::from_parts(parts).expect("the backend's URI with a path");
    Ok(match client.request(request).await {
        Ok(answer) => answer.map(http_body_util::Either::Left),
        Err(error) => Response::builder()
            .status(502)
            .body(http_body_util::Either::Right(error.to_string()))
            .expect("a valid answer"),
    })
}
