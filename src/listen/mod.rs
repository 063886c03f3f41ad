//! The listeners and the workers that accept on them.
//!
//! `server.workers` shared-nothing workers, as nginx's worker processes and Envoy's worker
//! threads: each is a single-threaded tokio runtime on its own thread, with its own
//! `SO_REUSEPORT` socket on every listening address (the kernel spreads new connections over
//! them) and the connections it accepted, so a request never crosses threads on its way
//! through the gateway. What must be shared (the `Gateway`: placement books, limits, the
//! config snapshot) is shared; background work (health checks, reconcile, reload triggers)
//! stays on the runtime that called `serve`.
//!
//! Each connection is served by hyper (HTTP/1.1, or h2c/h2 picked per connection) in a task
//! of its own, bounded against hostile clients: `server.header_read_timeout`,
//! `server.body_read_timeout`, `server.min_body_rate` and `server.max_connections` (see
//! `connection`).

mod connection;
mod head_timer;
mod read_timeout;
mod woken;

use crate::config::{self, Config};
use crate::telemetry;
use crate::tls::ServerTls;
use connection::Limits;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Sockets the gateway serves on, bound by the caller (tests bind port 0 and read the ports
/// from here). With several workers they are bound with `SO_REUSEPORT`, and `serve` binds
/// each further worker's socket to the same address.
pub struct Listeners {
    /// KServe v2 HTTP/REST.
    pub http: TcpListener,
    /// Prometheus metrics, if enabled.
    pub metrics: Option<TcpListener>,
    /// Admin API, if enabled.
    pub admin: Option<TcpListener>,
    /// KServe v2 gRPC, if enabled.
    pub grpc: Option<TcpListener>,
}

impl Listeners {
    /// Binds every address in the config's `[listen]` table.
    pub async fn bind(config: &Config) -> anyhow::Result<Self> {
        let reuse_port = config.server.worker_count() > 1;
        let bind = |addr: Option<SocketAddr>| -> anyhow::Result<Option<TcpListener>> {
            match addr {
                Some(addr) => Ok(Some(TcpListener::from_std(bind_socket(addr, reuse_port)?)?)),
                None => Ok(None),
            }
        };
        Ok(Self {
            http: bind(Some(config.listen.http))?.expect("given"),
            metrics: bind(config.listen.metrics)?,
            admin: bind(config.listen.admin)?,
            grpc: bind(config.listen.grpc)?,
        })
    }
}

/// A listening socket, non-blocking, with `SO_REUSEPORT` when workers share the address.
fn bind_socket(addr: SocketAddr, reuse_port: bool) -> anyhow::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let bound = (|| {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        // As tokio's own bind: a restarted gateway rebinds while old connections linger.
        socket.set_reuse_address(true)?;
        if reuse_port {
            socket.set_reuse_port(true)?;
        }
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        std::io::Result::Ok(socket.into())
    })();
    bound.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))
}

/// One listener's service: what it is called (metric labels), what answers its requests,
/// and its TLS state when it speaks TLS.
#[derive(Clone)]
pub struct Endpoint {
    /// `http`, `grpc`, `admin` or `metrics`.
    pub name: &'static str,
    /// What answers its requests.
    pub answers: Answers,
    /// Certificates for a TLS listener; `None` for plain TCP.
    pub tls: Option<Arc<ServerTls>>,
    /// Its answers carry a `date` header, as RFC 9110 asks of a server with a clock. gRPC
    /// answers carry none, as no gRPC server's do (Triton's included): over HTTP/2 the
    /// field is encoded into every answer's header block for no reader, 1.6% of a gRPC
    /// inference's instructions (`loadtest/instructions.sh`).
    pub dated: bool,
}

/// What answers a listener's requests.
#[derive(Clone)]
pub enum Answers {
    /// An axum router (metrics; gRPC, under tonic).
    Router(axum::Router),
    /// A front-end's own edge and endpoints over the gateway (the KServe HTTP and admin
    /// listeners): one boxed future per request, no router in between.
    Edge(crate::gateway::Gateway, Answer),
}

/// A front-end's answer to one request (`frontend::http::serve`, `frontend::admin::serve`).
pub type Answer = fn(
    crate::gateway::Gateway,
    axum::extract::Request,
) -> std::pin::Pin<Box<dyn Future<Output = axum::response::Response> + Send>>;

/// The running workers: how `serve` stops them.
pub struct Workers {
    /// Shutdown has begun: connections are told to close after their next answer.
    drain: CancellationToken,
    /// Stop accepting and shut every connection down gracefully.
    stop: CancellationToken,
    /// Drop whatever is still open (the drain took too long, or `serve` itself was dropped).
    abort: CancellationToken,
    /// A token per accept loop and per open connection, on every worker.
    open: TaskTracker,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    /// Starts `server.workers` workers on these listeners (the given sockets go to the
    /// first; the others bind their own to the same addresses).
    pub fn start(
        server: &config::Server,
        endpoints: Vec<(Endpoint, TcpListener)>,
    ) -> anyhow::Result<Self> {
        let count = server.worker_count();
        let mut sockets: Vec<Vec<(Endpoint, std::net::TcpListener)>> =
            (0..count).map(|_| Vec::new()).collect();
        for (endpoint, listener) in endpoints {
            let addr = listener.local_addr()?;
            for socket in sockets.iter_mut().skip(1) {
                socket.push((endpoint.clone(), bind_socket(addr, true)?));
            }
            sockets[0].push((endpoint, listener.into_std()?));
        }
        let limits = Arc::new(Limits::from(server));
        let mut this = Self {
            drain: CancellationToken::new(),
            stop: CancellationToken::new(),
            abort: CancellationToken::new(),
            open: TaskTracker::new(),
            threads: Vec::with_capacity(count),
        };
        for (index, sockets) in sockets.into_iter().enumerate() {
            let worker = Worker {
                index,
                sockets,
                limits: limits.clone(),
                drain: this.drain.clone(),
                stop: this.stop.clone(),
                abort: this.abort.clone(),
                open: this.open.clone(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("infergate-worker-{index}"))
                .spawn(move || worker.run())?;
            this.threads.push(thread);
        }
        this.open.close();
        Ok(this)
    }

    /// Shutdown begins while the listeners still accept: each HTTP/1 answer from now on
    /// carries `connection: close`, each HTTP/2 connection gets a GOAWAY, so clients and load
    /// balancers move their keep-alive connections away before any is closed under them
    /// (as Envoy's and nginx's drains do).
    pub fn begin_drain(&self) {
        self.drain.cancel();
    }

    /// Closes every listening socket and asks each connection to finish: HTTP/1 after the
    /// request in flight, HTTP/2 with a GOAWAY.
    pub fn stop_accepting(&self) {
        self.drain.cancel();
        self.stop.cancel();
    }

    /// Resolves once every connection has closed (after `stop_accepting`).
    pub async fn drained(&self) {
        self.open.wait().await
    }

    /// Drops every connection still open and waits for the worker threads to end.
    pub async fn abort(mut self) {
        self.abort.cancel();
        let threads = std::mem::take(&mut self.threads);
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.abort.cancel();
    }
}

/// One worker's share: its sockets (one per listener) and the tokens that stop it.
struct Worker {
    index: usize,
    sockets: Vec<(Endpoint, std::net::TcpListener)>,
    limits: Arc<Limits>,
    drain: CancellationToken,
    stop: CancellationToken,
    abort: CancellationToken,
    open: TaskTracker,
}

impl Worker {
    /// The worker thread: a current-thread runtime running an accept loop per listener until
    /// aborted; then whatever is left is dropped.
    fn run(self) {
        crate::worker::enter(self.index);
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::error!(%error, "cannot start a worker runtime");
                return;
            }
        };
        runtime.block_on(async {
            for (endpoint, socket) in self.sockets {
                let listener = match TcpListener::from_std(socket) {
                    Ok(listener) => listener,
                    Err(error) => {
                        tracing::error!(%error, listener = endpoint.name, "cannot register a listening socket");
                        continue;
                    }
                };
                let accept = AcceptLoop {
                    listener,
                    endpoint,
                    limits: self.limits.clone(),
                    open_here: Arc::new(AtomicUsize::new(0)),
                    drain: self.drain.clone(),
                    stop: self.stop.clone(),
                    abort: self.abort.clone(),
                    open: self.open.clone(),
                };
                tokio::spawn(self.open.track_future(accept.run()));
            }
            self.abort.cancelled().await;
        });
        runtime.shutdown_timeout(Duration::from_millis(100));
    }
}

/// Accepts on one worker's socket for one listener.
struct AcceptLoop {
    listener: TcpListener,
    endpoint: Endpoint,
    limits: Arc<Limits>,
    /// Connections this worker has open on this listener.
    open_here: Arc<AtomicUsize>,
    drain: CancellationToken,
    stop: CancellationToken,
    abort: CancellationToken,
    open: TaskTracker,
}

impl AcceptLoop {
    async fn run(self) {
        let name = self.endpoint.name;
        let shed = metrics::counter!(telemetry::CONNECTIONS_SHED, "listener" => name);
        let gauge = metrics::gauge!(telemetry::CONNECTIONS_OPEN, "listener" => name);
        let builder = Arc::new(connection::builder(&self.limits, self.endpoint.dated));
        loop {
            let (stream, remote) = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors and the like: back off rather than spin.
                        tracing::warn!(%error, listener = name, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            if self.open_here.load(Ordering::Relaxed) >= self.limits.max_connections {
                shed.increment(1);
                tracing::debug!(%remote, listener = name, "connection shed: server.max_connections reached");
                continue;
            }
            // An answer goes out as a few small writes (HTTP/1 headers and a streamed body,
            // HTTP/2 frames, gRPC trailers); with Nagle on the last one waits for the client's
            // delayed ACK. (nginx sets `tcp_nodelay` for the same reason.)
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "could not set TCP_NODELAY");
            }
            let counted = Counted::new(self.open_here.clone(), gauge.clone());
            let connection = connection::Connection {
                endpoint: self.endpoint.clone(),
                limits: self.limits.clone(),
                builder: builder.clone(),
                drain: self.drain.clone(),
                stop: self.stop.clone(),
                abort: self.abort.clone(),
            };
            tokio::spawn(self.open.track_future(async move {
                let _counted = counted;
                connection.serve(stream, remote).await
            }));
        }
    }
}

/// An open connection, counted for `server.max_connections` and the gauge while it lives.
struct Counted {
    open_here: Arc<AtomicUsize>,
    gauge: metrics::Gauge,
}

impl Counted {
    fn new(open_here: Arc<AtomicUsize>, gauge: metrics::Gauge) -> Self {
        open_here.fetch_add(1, Ordering::Relaxed);
        gauge.increment(1.0);
        Self { open_here, gauge }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.open_here.fetch_sub(1, Ordering::Relaxed);
        self.gauge.decrement(1.0);
    }
}
