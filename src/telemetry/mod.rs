//! Metric names and logging setup, in one place: names are user interface (dashboards and
//! alerts are built on them), so every one is declared and described here and nowhere else.

pub mod scope;
pub mod series;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::io::{BufWriter, Write};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use tracing_subscriber::fmt::MakeWriter;

/// Requests answered, by protocol, model, version, backend and status class.
pub const REQUESTS: &str = "infergate_requests_total";
/// Whole-request latency as the client sees it (until response headers).
pub const REQUEST_DURATION: &str = "infergate_request_duration_seconds";
/// Backend latency until response headers, so the gateway's own share is visible.
pub const UPSTREAM_DURATION: &str = "infergate_upstream_duration_seconds";
/// Requests being handled right now.
pub const IN_FLIGHT: &str = "infergate_requests_in_flight";
/// Errors answered by the gateway itself, by kind and source (client, upstream, gateway).
pub const ERRORS: &str = "infergate_errors_total";
/// 1 while a backend passes health checks, else 0.
pub const BACKEND_UP: &str = "infergate_backend_up";
/// Tokens of the OpenAI endpoints' answers, by tenant, model and kind (`prompt`,
/// `completion`), as the model's tokenizer counts them: what each tenant's use of each
/// model costs.
pub const TOKENS: &str = "infergate_tokens_total";
/// Time from a streamed answer's copy being placed to its first event (time to first
/// token), by model, version and route: Triton's `generate_stream` and the OpenAI
/// endpoints. Per target, so a canary's is seen beside the stable model's.
pub const TIME_TO_FIRST_TOKEN: &str = "infergate_time_to_first_token_seconds";
/// A streamed answer's time from its first event to its last, over the events after the
/// first (time per output token), by model, version and route; one sample per answer of
/// two events or more.
pub const TIME_PER_OUTPUT_TOKEN: &str = "infergate_time_per_output_token_seconds";
/// Inference requests refused by validation, by model and reason (`shape`, `datatype`, ...).
pub const VALIDATION_REJECTIONS: &str = "infergate_validation_rejections_total";

/// Requests for a model no backend had loaded.
pub const PLACEMENT_COLD_MISSES: &str = "infergate_placement_cold_misses_total";
/// How long cold requests waited for their model to load.
pub const PLACEMENT_COLD_WAIT: &str = "infergate_placement_cold_wait_seconds";
/// Loads by backend, reason (`new`, `version`, `reload`, `retire`) and result.
pub const PLACEMENT_LOADS: &str = "infergate_placement_loads_total";
/// Unloads by backend, reason (`evict`, `idle`, `request`, `drain`, `abandon`, `unrouted`)
/// and result.
pub const PLACEMENT_UNLOADS: &str = "infergate_placement_unloads_total";
/// How long loads took.
pub const PLACEMENT_LOAD_DURATION: &str = "infergate_placement_load_duration_seconds";
/// Models evicted to make room, by backend.
pub const PLACEMENT_EVICTIONS: &str = "infergate_placement_evictions_total";
/// How long an evicted model had been idle.
pub const PLACEMENT_EVICTED_IDLE: &str = "infergate_placement_evicted_idle_seconds";
/// Copies the books held that their backend, asked to serve one, said it did not have, by
/// backend: each such request was placed again and sent once more.
pub const PLACEMENT_STALE_COPIES: &str = "infergate_placement_stale_copies_total";
/// Requests refused because making room would evict a model in recent use.
pub const PLACEMENT_CHURN_REFUSALS: &str = "infergate_placement_churn_refusals_total";
/// Cold requests that waited for room (`placement.room_wait`), by result: `placed`, or
/// `refused` when the wait ended without room.
pub const PLACEMENT_ROOM_WAITS: &str = "infergate_placement_room_waits_total";
/// Usable bytes per backend (capacity minus the memory buffer).
pub const PLACEMENT_CAPACITY: &str = "infergate_placement_capacity_bytes";
/// Bytes committed to models loaded or loading, per backend.
pub const PLACEMENT_USED: &str = "infergate_placement_used_bytes";
/// Bytes of models loading, per backend.
pub const PLACEMENT_LOADING: &str = "infergate_placement_loading_bytes";
/// Model copies on the books, per backend.
pub const PLACEMENT_MODELS: &str = "infergate_placement_models";
/// Per backend, idle time of the least recently used copy eviction could take (pinned copies
/// left out; 0 with none): low means models leave soon after use, the backend is short of
/// memory (scale Triton replicas on it).
pub const PLACEMENT_LRU_AGE: &str = "infergate_placement_lru_age_seconds";

/// Canaries switched off by a route guard, by route, target and reason (automatic rollback).
pub const ROUTE_ROLLBACKS: &str = "infergate_route_rollbacks_total";

/// Copies of requests sent to mirror targets, by route, target and outcome (`sent`,
/// `failed`, `dropped` when too many copies were already in flight).
pub const MIRRORED: &str = "infergate_mirror_requests_total";
/// Authentication and authorization decisions, by tenant (empty when no credential was
/// valid) and outcome (`allowed`, `unauthenticated`, `forbidden`, `rate_limited`,
/// `concurrency_limited`).
pub const AUTH_DECISIONS: &str = "infergate_auth_decisions_total";

/// JWKS refreshes by result (`changed`, `unchanged`, `failed`: the last good keys stay).
pub const JWKS_REFRESHES: &str = "infergate_auth_jwks_refreshes_total";

/// Config reloads by result (`success`, `failure`).
pub const CONFIG_RELOADS: &str = "infergate_config_reload_total";

/// Listener certificate reloads by result (`success`, `failure`: the old one stays).
pub const TLS_RELOADS: &str = "infergate_tls_reloads_total";
/// TLS handshakes that failed or timed out, by listener (`http`, `grpc`, `admin`).
pub const TLS_HANDSHAKE_FAILURES: &str = "infergate_tls_handshake_failures_total";
/// 1 while this replica cannot reach etcd (`[cluster]`): it serves from its last view.
pub const CLUSTER_DEGRADED: &str = "infergate_cluster_degraded";
/// Round trips to etcd, by `op` (`grant`, `put`, `txn`, `get`, `keep_alive`, `revoke`).
pub const CLUSTER_ETCD_DURATION: &str = "infergate_cluster_etcd_duration_seconds";
/// Compare-and-set transactions another replica won (the key had changed), by `key` kind.
pub const CLUSTER_CONFLICTS: &str = "infergate_cluster_conflicts_total";
/// How long a placement change took to be agreed with the registry (or refused), by result.
pub const PLACEMENT_AGREE_DURATION: &str = "infergate_placement_agree_duration_seconds";
/// Revisions the local view of the registry is behind etcd's, read at every keep-alive.
pub const CLUSTER_WATCH_LAG: &str = "infergate_cluster_watch_lag_revisions";
/// Live replicas counted from the registry's replica records.
pub const CLUSTER_REPLICAS: &str = "infergate_cluster_replicas";
/// Client connections open, by listener, summed over workers.
pub const CONNECTIONS_OPEN: &str = "infergate_connections_open";
/// Connections closed at accept because the worker had `server.max_connections` open, by
/// listener.
pub const CONNECTIONS_SHED: &str = "infergate_connections_shed_total";
/// Backends taken out of traffic, by backend and `reason` (`health_check`: failed checks in
/// a row past `upstream.unhealthy_threshold`; `requests`: failed requests in a row past
/// `upstream.eject_after_failures`): what an autoscaler or an alert watches.
pub const BACKEND_EJECTIONS: &str = "infergate_backend_ejections_total";
/// Connections closed because the client was too slow, by listener and `phase` (`header`:
/// `server.header_read_timeout`, `body`: `server.body_read_timeout`, `body_rate`:
/// `server.min_body_rate`).
pub const CLIENT_TIMEOUTS: &str = "infergate_client_timeouts_total";
/// Requests held now because nothing could take them (no backend ready, the registry briefly
/// unreachable), by model: what an autoscaler scaling a pool from zero watches.
pub const REQUESTS_WAITING: &str = "infergate_requests_waiting";
/// Held requests by model and `outcome` (`served`, `timeout`: `server.ready_wait` or the
/// client's deadline ended the wait, `full`: `server.max_waiting` were waiting already).
pub const REQUESTS_HELD: &str = "infergate_requests_held_total";
/// Requests waiting at the gateway for a slot on a saturated model's copies, by model,
/// tenant and band (`[[models]].max_in_flight`).
pub const FLOW_QUEUE_DEPTH: &str = "infergate_flow_queue_depth";
/// How long requests that waited for a slot waited before they got one, by model, tenant
/// and band.
pub const FLOW_WAIT: &str = "infergate_flow_wait_seconds";
/// Requests let through to a saturated model's copies after waiting, by model, tenant and
/// band (requests that found a slot at once are `infergate_requests_total`).
pub const FLOW_ADMITTED: &str = "infergate_flow_admitted_total";
/// Requests refused by flow control, by model, tenant, band and reason (`deadline`: the
/// queue could not serve it in time, `tenant_full`, `full`, `pressure`: pushed out by a
/// higher band).
pub const FLOW_SHED: &str = "infergate_flow_shed_total";
/// Requests that asked for a band above their tenant's `max_priority` and were served at
/// that, by tenant.
pub const FLOW_PRIORITY_CAPPED: &str = "infergate_flow_priority_capped_total";
/// Instances a DNS group (`backends[].dns`) resolved to at its last answer, by group.
pub const DISCOVERED_BACKENDS: &str = "infergate_discovered_backends";
/// DNS rounds that got no answer for a group (it keeps its last instances), by group.
pub const DISCOVERY_FAILURES: &str = "infergate_discovery_failures_total";

const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Installs the Prometheus recorder once per process and returns its handle. Tests run many
/// gateways in one process; they share the one recorder.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
                .expect("valid buckets")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed by an embedding program; then ours
            // only renders what it sees, which is nothing — say so instead of failing.
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
            }
            describe();
            handle
        })
        .clone()
}

/// How often recorded histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Folds recorded histogram samples into buckets every `UPKEEP_INTERVAL` until shutdown.
/// The exporter keeps every sample of a histogram until a scrape or an upkeep folds it in:
/// without this, a gateway nobody scrapes grows by two samples per request.
pub async fn upkeep(handle: PrometheusHandle, shutdown: tokio_util::sync::CancellationToken) {
    let mut ticker = tokio::time::interval(UPKEEP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => handle.run_upkeep(),
        }
    }
}

/// Gives every metric its help text and unit, so `/metrics` explains itself. One function
/// per part of the gateway keeps each list short; the exporter looks descriptions up by name,
/// so their order does not matter.
fn describe() {
    describe_requests();
    describe_edge();
    describe_backends();
    describe_cluster();
    describe_placement();
}

/// Flow control: requests waiting for a saturated model, let through, and shed.
fn describe_flow() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        FLOW_QUEUE_DEPTH,
        "Requests waiting for a slot on a saturated model, by model, tenant and band."
    );
    describe_histogram!(
        FLOW_WAIT,
        Unit::Seconds,
        "Time requests waited for a slot on a saturated model, by model, tenant and band."
    );
    describe_counter!(
        FLOW_ADMITTED,
        "Requests let through to a saturated model after waiting, by model, tenant and band."
    );
    describe_counter!(
        FLOW_SHED,
        "Requests refused by flow control, by model, tenant, band and reason."
    );
    describe_counter!(
        FLOW_PRIORITY_CAPPED,
        "Requests that asked for a band above their tenant's max_priority, by tenant."
    );
}

/// Requests as clients see them: answered, refused, held, copied, rolled back.
fn describe_requests() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        REQUESTS,
        "Requests answered, by protocol, model, version, backend and status class."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Request latency seen by the client, until response headers."
    );
    describe_histogram!(
        UPSTREAM_DURATION,
        Unit::Seconds,
        "Backend latency until response headers."
    );
    describe_gauge!(IN_FLIGHT, "Requests being handled.");
    describe_counter!(
        ERRORS,
        "Errors answered by the gateway itself, by kind and source."
    );
    describe_counter!(
        VALIDATION_REJECTIONS,
        "Inference requests refused by validation before reaching a backend, by model and reason."
    );
    describe_histogram!(
        TIME_TO_FIRST_TOKEN,
        Unit::Seconds,
        "Time from placement to a streamed answer's first event, by model, version and route."
    );
    describe_histogram!(
        TIME_PER_OUTPUT_TOKEN,
        Unit::Seconds,
        "A streamed answer's time per event after its first, by model, version and route."
    );
    describe_counter!(
        TOKENS,
        "Tokens of OpenAI answers as the model's tokenizer counts them, by tenant, model and kind (prompt, completion)."
    );
    describe_gauge!(
        REQUESTS_WAITING,
        "Requests held now for a pool that could not take them, by model."
    );
    describe_counter!(
        REQUESTS_HELD,
        "Requests held for the pool, by model and outcome (served, timeout, full)."
    );
    describe_flow();
    describe_counter!(
        ROUTE_ROLLBACKS,
        "Canaries switched off by a route guard, by route, target and reason."
    );
    describe_counter!(
        MIRRORED,
        "Request copies for mirror targets, by route, target and outcome."
    );
}

/// The edge: listeners, their connections and certificates, config reloads and auth.
fn describe_edge() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(CONNECTIONS_OPEN, "Client connections open, by listener.");
    describe_counter!(
        CONNECTIONS_SHED,
        "Connections closed at accept past server.max_connections, by listener."
    );
    describe_counter!(
        CLIENT_TIMEOUTS,
        "Connections closed for a request head or body that came too slowly, by listener and phase."
    );
    describe_counter!(
        TLS_RELOADS,
        "Listener certificate reloads by result; on failure the running certificate stays."
    );
    describe_counter!(
        TLS_HANDSHAKE_FAILURES,
        "TLS handshakes that failed or timed out, by listener."
    );
    describe_counter!(CONFIG_RELOADS, "Config reloads by result.");
    describe_counter!(
        JWKS_REFRESHES,
        "JWKS refreshes by result; on failure the last good keys stay."
    );
    describe_counter!(
        AUTH_DECISIONS,
        "Authentication and authorization decisions, by tenant and outcome."
    );
}

/// Backends: health, ejection and DNS discovery.
fn describe_backends() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(BACKEND_UP, "1 while the backend passes health checks.");
    describe_counter!(
        BACKEND_EJECTIONS,
        "Backends taken out of traffic, by backend and reason (health_check, requests)."
    );
    describe_gauge!(
        DISCOVERED_BACKENDS,
        "Instances a DNS group resolved to at its last answer, by group."
    );
    describe_counter!(
        DISCOVERY_FAILURES,
        "DNS rounds that got no answer for a group, which keeps its last instances, by group."
    );
}

/// Several replicas sharing a registry in etcd.
fn describe_cluster() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        CLUSTER_DEGRADED,
        "1 while this replica cannot reach etcd and serves from its last view of the registry."
    );
    describe_histogram!(
        CLUSTER_ETCD_DURATION,
        Unit::Seconds,
        "Round trips to etcd, by operation."
    );
    describe_counter!(
        CLUSTER_CONFLICTS,
        "Compare-and-set transactions on the registry that another replica won."
    );
    describe_histogram!(
        PLACEMENT_AGREE_DURATION,
        Unit::Seconds,
        "Time to agree a cold miss's load, or an unload, with the pool's registry."
    );
    describe_gauge!(
        CLUSTER_WATCH_LAG,
        "Revisions the local view of the registry is behind etcd."
    );
    describe_gauge!(CLUSTER_REPLICAS, "Live replicas in the registry.");
}

/// Placement: cold misses, loads, unloads, evictions and the books per backend.
fn describe_placement() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        PLACEMENT_COLD_MISSES,
        "Requests for a model no backend had loaded."
    );
    describe_histogram!(
        PLACEMENT_COLD_WAIT,
        Unit::Seconds,
        "Time cold requests waited for their model to load."
    );
    describe_counter!(
        PLACEMENT_LOADS,
        "Model loads by backend, reason (new, version, reload) and result."
    );
    describe_counter!(
        PLACEMENT_UNLOADS,
        "Model unloads by backend, reason and result."
    );
    describe_histogram!(
        PLACEMENT_LOAD_DURATION,
        Unit::Seconds,
        "Model load duration."
    );
    describe_counter!(
        PLACEMENT_EVICTIONS,
        "Models evicted to make room, by backend."
    );
    describe_histogram!(
        PLACEMENT_EVICTED_IDLE,
        Unit::Seconds,
        "Idle time of evicted models."
    );
    describe_counter!(
        PLACEMENT_STALE_COPIES,
        "Copies on the books their backend did not have, found by a request that was then placed again."
    );
    describe_counter!(
        PLACEMENT_CHURN_REFUSALS,
        "Requests refused to avoid evicting recently used models."
    );
    describe_counter!(
        PLACEMENT_ROOM_WAITS,
        "Cold requests that waited for room, by result (placed, refused)."
    );
    describe_gauge!(PLACEMENT_CAPACITY, Unit::Bytes, "Usable bytes per backend.");
    describe_gauge!(
        PLACEMENT_USED,
        Unit::Bytes,
        "Bytes committed to loaded or loading models."
    );
    describe_gauge!(PLACEMENT_LOADING, Unit::Bytes, "Bytes of models loading.");
    describe_gauge!(PLACEMENT_MODELS, "Model copies per backend.");
    describe_gauge!(
        PLACEMENT_LRU_AGE,
        Unit::Seconds,
        "Per backend, idle time of the least recently used evictable model (pinned ones left out; 0 with none)."
    );
}

/// Records a backend's health.
pub fn backend_up(backend: &str, up: bool) {
    metrics::gauge!(BACKEND_UP, "backend" => backend.to_string()).set(if up { 1.0 } else { 0.0 });
}

/// A backend's series of `UPSTREAM_DURATION`: the backend keeps it, so a request records
/// its latency without building labels.
pub fn upstream_duration(backend: &str) -> metrics::Histogram {
    metrics::histogram!(UPSTREAM_DURATION, "backend" => backend.to_string())
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Sets up `tracing` for the process: `RUST_LOG` filters (default `info`). Lines go to
/// stdout through `LogSink`'s buffer.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(LogSink::global().clone());
    let installed = match format {
        LogFormat::Text => builder
            .fmt_fields(crate::log_text::PlainFields)
            .event_format(crate::log_text::PlainLine)
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    // A directive on span or field values (`[{model=x}]`) is decided per event, by its
    // values, which a line written straight does not go through.
    let by_values = std::env::var("RUST_LOG").is_ok_and(|directives| directives.contains('['));
    let plain = installed.is_ok() && format == LogFormat::Text && !ansi && !by_values;
    PLAIN_TEXT.store(plain, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the process logs in the plain text format (`init_logging`: text, no colours, no
/// `RUST_LOG` directive on values), the format `log_text::write_line` writes.
static PLAIN_TEXT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the process logs in the plain text format, which `log_text` writes itself.
pub fn plain_text() -> bool {
    PLAIN_TEXT.load(std::sync::atomic::Ordering::Relaxed)
}

/// Writes a line of the plain text format straight into the log's buffer: `write` formats it
/// (`log_text::write_line`) into a buffer of this thread's, which is then copied in under the
/// sink's lock in one piece; `urgent` writes it out at once, as warnings are. False when the
/// process does not log in that format, or `write` declined the line: the caller then logs it
/// through `tracing`.
pub fn write_plain(urgent: bool, write: impl FnOnce(&mut String) -> Option<()>) -> bool {
    thread_local! {
        static LINE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    if !plain_text() {
        return false;
    }
    LINE.with_borrow_mut(|line| {
        line.clear();
        if write(line).is_none() {
            return false;
        }
        let mut out = LogSink::global().lock();
        let _ = out.write_all(line.as_bytes());
        if urgent {
            let _ = out.flush();
        }
        true
    })
}

/// Writes out every buffered log line; call before the process exits.
pub fn flush_logs() {
    LogSink::global().flush();
}

/// How long an info line may wait in the buffer before it is written.
const LOG_FLUSH_INTERVAL: Duration = Duration::from_millis(100);

/// Log lines to stdout through one 64 KiB buffer: the access log is a line per request, and
/// a `write` per line (what stdout's line buffering does) cost more than the rest of the
/// logging. The buffer is written when full, every `LOG_FLUSH_INTERVAL` by a thread of its
/// own, at once after any warning or error, and by `flush_logs` at exit. (A killed process
/// loses at most the last interval's info lines.)
#[derive(Clone)]
pub struct LogSink(Arc<Mutex<BufWriter<std::io::Stdout>>>);

impl LogSink {
    /// The process's one sink, with its flushing thread started on first use.
    fn global() -> &'static LogSink {
        static SINK: OnceLock<LogSink> = OnceLock::new();
        SINK.get_or_init(|| {
            let sink = LogSink(Arc::new(Mutex::new(BufWriter::with_capacity(
                64 * 1024,
                std::io::stdout(),
            ))));
            let flusher = sink.clone();
            let _ = std::thread::Builder::new()
                .name("log-flush".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(LOG_FLUSH_INTERVAL);
                        flusher.flush();
                    }
                });
            sink
        })
    }

    fn lock(&self) -> MutexGuard<'_, BufWriter<std::io::Stdout>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn flush(&self) {
        let mut out = self.lock();
        if !out.buffer().is_empty() {
            let _ = out.flush();
        }
    }
}

/// One log line being written; warnings and errors are written out when it drops.
pub struct LogLine<'a> {
    out: MutexGuard<'a, BufWriter<std::io::Stdout>>,
    urgent: bool,
}

impl Write for LogLine<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.out.write(bytes)
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.out.write_all(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl Drop for LogLine<'_> {
    fn drop(&mut self) {
        if self.urgent {
            let _ = self.out.flush();
        }
    }
}

impl<'a> MakeWriter<'a> for LogSink {
    type Writer = LogLine<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LogLine {
            out: self.lock(),
            urgent: true,
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        LogLine {
            out: self.lock(),
            urgent: *meta.level() <= tracing::Level::WARN,
        }
    }
}
