//! Helpers for integration tests that need real Triton Inference Servers.
//!
//! Include with `mod support;` from a file in `tests/`. Triton comes from the
//! `nvidia-pytriton` wheel in `<repo>/.venv` (CPU only, python backend), prepared by
//! `scripts/setup.sh`, which [`Triton::start`] runs once per test binary (fast when done).
//!
//! Every server runs in explicit model-control mode on free loopback ports, in its own
//! process group, and is SIGKILLed (with its python backend stubs) when the [`Triton`]
//! value is dropped, including on panic. If the test binary itself dies, the kernel
//! kills the servers too (`PR_SET_PDEATHSIG`, armed from a thread that lives as long as
//! the test process).
#![allow(dead_code)]

pub mod cluster;
pub mod dns;
pub mod gateway;
pub mod grpc;
pub mod pki;
pub mod wire;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

/// How long [`Triton::start`] waits for `/v2/health/ready` before giving up: generous, since
/// a test binary starts several Tritons at once on two shared cores.
pub const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How many times [`Triton::start`] retries with fresh ports when one was taken meanwhile.
const START_ATTEMPTS: usize = 5;

/// The target that served an answer, as the gateway names it (`infergate-target`).
pub fn served_target(answer: &reqwest::Response) -> String {
    answer.headers()["infergate-target"]
        .to_str()
        .expect("an ASCII target name")
        .to_owned()
}

/// The repository root (where `Cargo.toml` of the infergate crate lives).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The test model repository, `tests/models`.
pub fn model_repository() -> PathBuf {
    repo_root().join("tests").join("models")
}

/// Copies a model directory (without `__pycache__`), for tests that change a repository of
/// their own.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() != "__pycache__" {
                copy_dir(&entry.path(), &target);
            }
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The virtualenv created by `scripts/setup.sh`.
pub fn venv_dir() -> PathBuf {
    repo_root().join(".venv")
}

/// The virtualenv's python interpreter.
pub fn venv_python() -> PathBuf {
    venv_dir().join("bin").join("python")
}

/// `<site-packages>/pytriton/tritonserver` inside the virtualenv.
pub fn tritonserver_dir() -> anyhow::Result<PathBuf> {
    let lib = venv_dir().join("lib");
    let entries = std::fs::read_dir(&lib)
        .with_context(|| format!("no virtualenv at {}: run scripts/setup.sh", lib.display()))?;
    for entry in entries.flatten() {
        let dir = entry
            .path()
            .join("site-packages")
            .join("pytriton")
            .join("tritonserver");
        if dir.join("bin").join("tritonserver").is_file() {
            return Ok(dir);
        }
    }
    bail!(
        "no pytriton/tritonserver under {}: run scripts/setup.sh",
        lib.display()
    )
}

/// Runs `scripts/setup.sh` once per test process (venv, backend stub, model padding).
pub fn ensure_setup() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo_root().join("scripts").join("setup.sh"))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run scripts/setup.sh: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "scripts/setup.sh failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// `PATH` with the virtualenv's `bin` first.
fn venv_path_var() -> OsString {
    let mut paths = vec![venv_dir().join("bin")];
    if let Some(old) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(paths).expect("PATH entries contain no ':'")
}

/// Runs `script` with the virtualenv's python (VIRTUAL_ENV set, its `bin` first on PATH).
/// Panics if the interpreter cannot be started at all.
pub async fn run_python(
    script: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(venv_python());
    cmd.arg(script)
        .args(args)
        .env("VIRTUAL_ENV", venv_dir())
        .env("PATH", venv_path_var())
        .env_remove("PYTHONHOME")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().await.unwrap_or_else(|e| {
        panic!(
            "cannot run {} {}: {e} (run scripts/setup.sh)",
            venv_python().display(),
            script.display()
        )
    })
}

/// Runs the pytest `suite` (more pytest args in `extra`) with the virtualenv's python and
/// fails the test unless it ran and passed, with pytest's output and `what` in the message:
/// the Python clients' suites (tritonclient over HTTP, gRPC, TLS) all run so. Returns
/// pytest's stdout for further checks (skips, counts).
pub async fn run_pytest(suite: &Path, extra: &[&str], envs: &[(&str, &str)], what: &str) -> String {
    let mut args = vec![
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rs",
        suite.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    // `python -m pytest FILE`: run_python's script argument is the `-m` flag here.
    let output = run_python(Path::new("-m"), &args, envs).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what}:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(" passed"), "{stdout}");
    stdout
}

/// How to start a [`Triton`].
#[derive(Debug, Clone, Default)]
pub struct TritonOptions {
    /// Triton as a user runs it on its own: its default model control (`none`, no flag),
    /// which loads every model of its repository at start (each must load, or Triton exits)
    /// and has no load or unload API. Only for a reference Triton that answers direct
    /// requests, where nothing else would load a model (`standalone`). Otherwise Triton runs
    /// in explicit mode, as the gateway's pool does, and starts empty: the gateway loads
    /// each model on its first request.
    pub standalone: bool,
    /// `--log-verbose=1`: Triton logs every HTTP request (`HTTP request: 2 /v2/...`).
    pub verbose: bool,
    /// Model repository; default [`model_repository()`].
    pub repository: Option<PathBuf>,
    /// Extra tritonserver arguments, e.g. `--log-verbose=2`. Tests keep Triton's defaults
    /// otherwise: when a backend's real behaviour trips the gateway, the gateway is wrong.
    pub args: Vec<String>,
    /// The loopback address it listens on (default 127.0.0.1): Tritons on 127.0.0.2 and
    /// 127.0.0.3 at the same ports are two pods of one headless Service.
    pub address: Option<std::net::Ipv4Addr>,
    /// Its ports (http, grpc, metrics); default free ones.
    pub ports: Option<[u16; 3]>,
}

impl TritonOptions {
    /// A reference Triton over `repository` (`standalone`): what a client talking to Triton
    /// directly meets. A gateway test starts its Tritons with `TritonOptions::default()` and
    /// lets the gateway load each model on its first request, as users run it.
    pub fn standalone(repository: PathBuf) -> Self {
        TritonOptions {
            standalone: true,
            repository: Some(repository),
            ..Default::default()
        }
    }
}

/// One running tritonserver. Killed (with its whole process group) on drop.
pub struct Triton {
    pub address: std::net::Ipv4Addr,
    pub http_port: u16,
    pub grpc_port: u16,
    pub metrics_port: u16,
    child: Option<Child>,
    pid: u32,
    log_path: PathBuf,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Triton {
    /// Starts a tritonserver on free loopback ports and waits until `/v2/health/ready`
    /// answers 200. Fails after [`START_TIMEOUT`] (or when the server exits) with the
    /// tail of its log in the error.
    pub async fn start(opts: TritonOptions) -> anyhow::Result<Triton> {
        ensure_setup()?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(&opts).await? {
                Ok(triton) => return Ok(triton),
                // Another process grabbed one of the ports between picking and binding.
                Err(port_taken) => last_err = Some(port_taken),
            }
        }
        Err(last_err
            .unwrap()
            .context("no free ports after several attempts"))
    }

    /// Outer error: start failed. Inner error: a port was taken, retry with others.
    async fn try_start(opts: &TritonOptions) -> anyhow::Result<Result<Triton, anyhow::Error>> {
        Self::start_on(opts, opts.ports.map_or_else(free_ports::<3>, Ok)?).await
    }

    /// Kills this server and starts another with `opts` on the same ports, as a restarted
    /// pod comes back at its address: what a client holding connections to it must survive.
    pub async fn restart(&mut self, opts: TritonOptions) -> anyhow::Result<()> {
        self.kill();
        let ports = [self.http_port, self.grpc_port, self.metrics_port];
        let opts = TritonOptions {
            address: Some(self.address),
            ..opts
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match Self::start_on(&opts, ports).await? {
                Ok(triton) => {
                    *self = triton;
                    return Ok(());
                }
                // The old server's sockets may linger a moment.
                Err(taken) if Instant::now() > deadline => return Err(taken),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Starts on the given ports (http, grpc, metrics); the inner error as for `try_start`.
    async fn start_on(
        opts: &TritonOptions,
        [http_port, grpc_port, metrics_port]: [u16; 3],
    ) -> anyhow::Result<Result<Triton, anyhow::Error>> {
        let server_dir = tritonserver_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("infergate-triton-")
            .tempdir()?;
        let log_path = dir.path().join("tritonserver.log");
        let log = File::create(&log_path)?;

        let address = opts.address.unwrap_or(std::net::Ipv4Addr::LOCALHOST);
        let mut cmd = Command::new(server_dir.join("bin").join("tritonserver"));
        let repository = opts.repository.clone().unwrap_or_else(model_repository);
        cmd.arg(flag("--model-repository=", &repository))
            .arg(flag("--backend-directory=", &server_dir.join("backends")))
            .arg(format!("--http-address={address}"))
            .arg(format!("--http-port={http_port}"))
            .arg(format!("--grpc-address={address}"))
            .arg(format!("--grpc-port={grpc_port}"))
            .arg(format!("--metrics-address={address}"))
            .arg(format!("--metrics-port={metrics_port}"))
            .arg("--allow-metrics=true")
            .args((!opts.standalone).then_some("--model-control-mode=explicit"))
            .args(&opts.args)
            .env("VIRTUAL_ENV", venv_dir())
            .env("PATH", venv_path_var())
            .env_remove("PYTHONHOME")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if opts.verbose {
            cmd.arg("--log-verbose=1");
        }
        let child = spawn_in_own_group(cmd).context("cannot start tritonserver")?;
        let pid = child.id();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()?;
        let mut triton = Triton {
            address,
            http_port,
            grpc_port,
            metrics_port,
            child: Some(child),
            pid,
            log_path,
            client,
            _dir: dir,
        };
        match triton.wait_ready().await {
            Ok(()) => Ok(Ok(triton)),
            Err(e) => {
                triton.kill();
                let log = triton.log();
                let err = e.context(format!(
                    "tritonserver (ports {http_port}/{grpc_port}/{metrics_port}) did not become ready; log tail:\n{}",
                    tail(&without_option_table(&log), 30)
                ));
                if log.contains("already in use") {
                    Ok(Err(err))
                } else {
                    Err(err)
                }
            }
        }
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let url = format!("{}/v2/health/ready", self.http_url());
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("tritonserver exited with {status}");
            }
            let ready = matches!(
                self.client.get(&url).timeout(Duration::from_secs(2)).send().await,
                Ok(r) if r.status().is_success()
            );
            // Make sure the answer came from our process, not from whoever else owns the port.
            if ready && listens_on(self.pid, self.http_port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("not ready after {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn http_url(&self) -> String {
        format!("http://{}:{}", self.address, self.http_port)
    }

    /// `host:port` form is `grpc_url()` without the scheme.
    pub fn grpc_url(&self) -> String {
        format!("http://{}:{}", self.address, self.grpc_port)
    }

    pub fn metrics_url(&self) -> String {
        format!("http://{}:{}/metrics", self.address, self.metrics_port)
    }

    /// The sum of metric `name` on this server's `/metrics` over the series matching every one
    /// of `filters` ([`metric_sum`]): what Triton itself counted, to compare with the gateway.
    pub async fn metric_sum(&self, name: &str, filters: &[&str]) -> f64 {
        let text = reqwest::get(self.metrics_url())
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metric_sum(&text, name, filters)
    }

    /// `GET /v2/models/{model}/stats` straight from this server: what Triton itself saw of a
    /// model (counts, memory), to compare with what the gateway sent or reports.
    pub async fn model_stats(&self, model: &str) -> serde_json::Value {
        let url = format!("{}/v2/models/{model}/stats", self.http_url());
        reqwest::get(url).await.unwrap().json().await.unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Path of the server's log file (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The whole server log so far.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Number of live `triton_python_backend_stub` processes whose parent is this server
    /// (one per loaded python model instance).
    pub fn stub_count(&self) -> usize {
        if self.child.is_none() {
            return 0;
        }
        stub_pids(self.pid).len()
    }

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGKILLs the server and its process group (the python stubs), reaps it and removes
    /// the stubs' shared-memory regions. Idempotent.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let shm = stub_pids(self.pid)
            .into_iter()
            .filter_map(stub_shm_region)
            .collect::<Vec<_>>();
        kill_group(&mut child);
        for region in shm {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(region));
        }
    }

    /// SIGSTOPs the server and its python stubs: the process and its sockets stay, but
    /// nothing answers, as with a server wedged or a host paused. [`Triton::resume`] undoes
    /// it; dropping a paused server still kills it (SIGKILL works on stopped processes).
    pub fn pause(&self) {
        self.signal_group(sys::SIGSTOP);
    }

    /// SIGCONTs a server stopped by [`Triton::pause`].
    pub fn resume(&self) {
        self.signal_group(sys::SIGCONT);
    }

    /// SIGSTOPs the python stub of model instance `instance` (`add_sub_0_0`) alone, as a
    /// stub starved of CPU: the server answers on, but hears nothing from the stub. The
    /// stub runs again when the returned guard is resumed or dropped.
    pub fn pause_stub(&self, instance: &str) -> PausedStub {
        let pid = stub_pids(self.pid)
            .into_iter()
            .find(|&pid| cmdline(pid).iter().any(|arg| arg == instance))
            .unwrap_or_else(|| panic!("no python stub for {instance}"));
        let sent = unsafe { sys::kill(pid as i32, sys::SIGSTOP) };
        assert_eq!(sent, 0, "kill: {}", io::Error::last_os_error());
        PausedStub { pid }
    }

    fn signal_group(&self, signal: std::ffi::c_int) {
        assert!(self.child.is_some(), "tritonserver is not running");
        // The group id is the server's pid (process_group(0)).
        let sent = unsafe { sys::kill(-(self.pid as i32), signal) };
        assert_eq!(sent, 0, "kill: {}", io::Error::last_os_error());
    }

    /// Names of the models in state READY, from `POST /v2/repository/index`.
    pub async fn loaded_models(&self) -> anyhow::Result<Vec<String>> {
        let url = format!("{}/v2/repository/index", self.http_url());
        let resp = self
            .client
            .post(&url)
            .json(&serde_json::json!({}))
            .send()
            .await?;
        let status = resp.status();
        let body: serde_json::Value = resp
            .json()
            .await
            .with_context(|| format!("POST {url}: {status}, body is not JSON"))?;
        if !status.is_success() {
            bail!("POST {url}: {status} {body}");
        }
        let models = body
            .as_array()
            .ok_or_else(|| anyhow!("POST {url}: expected a JSON array, got {body}"))?;
        Ok(models
            .iter()
            .filter(|m| m["state"] == "READY")
            .filter_map(|m| m["name"].as_str().map(str::to_owned))
            .collect())
    }

    /// (model, version) of every row in state READY, from `POST /v2/repository/index`.
    pub async fn ready_versions(&self) -> anyhow::Result<Vec<(String, u64)>> {
        let url = format!("{}/v2/repository/index", self.http_url());
        let body: serde_json::Value = self
            .client
            .post(&url)
            .json(&serde_json::json!({}))
            .send()
            .await?
            .json()
            .await?;
        let mut rows: Vec<(String, u64)> = body
            .as_array()
            .ok_or_else(|| anyhow!("POST {url}: expected a JSON array, got {body}"))?
            .iter()
            .filter(|m| m["state"] == "READY")
            .filter_map(|m| {
                Some((
                    m["name"].as_str()?.to_owned(),
                    m["version"].as_str()?.parse().ok()?,
                ))
            })
            .collect();
        rows.sort();
        Ok(rows)
    }

    /// `POST /v2/repository/models/{model}/load`; Err carries Triton's error message.
    pub async fn load_model(&self, model: &str) -> anyhow::Result<()> {
        self.repository_call(model, "load").await
    }

    /// `POST /v2/repository/models/{model}/unload`.
    pub async fn unload_model(&self, model: &str) -> anyhow::Result<()> {
        self.repository_call(model, "unload").await
    }

    async fn repository_call(&self, model: &str, action: &str) -> anyhow::Result<()> {
        let url = format!("{}/v2/repository/models/{model}/{action}", self.http_url());
        let resp = self.client.post(&url).send().await?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let body = resp.text().await.unwrap_or_default();
        let msg = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or(body);
        bail!("{action} {model}: HTTP {status}: {msg}")
    }
}

impl Drop for Triton {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            eprintln!(
                "--- tritonserver on port {} (log {}), last lines:\n{}",
                self.http_port,
                self.log_path.display(),
                tail(&self.log(), 40)
            );
        }
        self.kill();
    }
}

fn flag(name: &str, path: &Path) -> OsString {
    let mut s = OsString::from(name);
    s.push(path.as_os_str());
    s
}

/// Triton's start-up log carries a large option table; drop it from error messages.
fn without_option_table(log: &str) -> String {
    log.lines()
        .filter(|l| !(l.starts_with('|') || l.starts_with("+-")))
        .collect::<Vec<_>>()
        .join("\n")
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A metrics endpoint standing in for a GPU Triton's: memory used rises by 3 GiB for every
/// model the real (CPU) Triton has loaded, as a GPU would show a model's weights.
pub async fn gpu_memory_stub(triton_http: String) -> std::net::SocketAddr {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let triton_http = triton_http.clone();
            async move {
                let index: serde_json::Value = reqwest::Client::new()
                    .post(format!("{triton_http}/v2/repository/index"))
                    .json(&serde_json::json!({"ready": true}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let loaded = index.as_array().unwrap().len() as u64;
                let used = (1u64 << 30) + loaded * (3u64 << 30);
                format!(
                    "# TYPE nv_gpu_memory_used_bytes gauge\nnv_gpu_memory_used_bytes{{gpu_uuid=\"GPU-0\"}} {used}\n"
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// An HTTP front for a real (CPU) Triton that answers as a Triton whose backend measures
/// its models would: every statistics answer (`GET .../stats`) reports `gpu_bytes` of GPU
/// memory per model version in `memory_usage`, which the python backend leaves empty.
/// Everything else passes through unchanged.
pub async fn reporting_memory(triton_http: String, gpu_bytes: u64) -> std::net::SocketAddr {
    use axum::body::Bytes;
    use axum::http::{Method, StatusCode, Uri, header};
    let client = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |method: Method, uri: Uri, body: Bytes| {
        let (client, triton_http) = (client.clone(), triton_http.clone());
        async move {
            let method = reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap();
            let answer = client
                .request(method, format!("{triton_http}{uri}"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = StatusCode::from_u16(answer.status().as_u16()).unwrap();
            let mut body = answer.bytes().await.unwrap().to_vec();
            if uri.path().ends_with("/stats") && status == StatusCode::OK {
                let mut stats: serde_json::Value = serde_json::from_slice(&body).unwrap();
                for stat in stats["model_stats"].as_array_mut().unwrap() {
                    stat["memory_usage"] =
                        serde_json::json!([{"type": "GPU", "id": 0, "byte_size": gpu_bytes}]);
                }
                body = serde_json::to_vec(&stats).unwrap();
            }
            (status, [(header::CONTENT_TYPE, "application/json")], body)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The request every identity test model (`sized_a`, `sized_b`, `sized_c`: FP32 [4]) takes.
pub fn identity_request() -> serde_json::Value {
    serde_json::json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
}

/// The request every `add_sub` test model takes (FP32 [4] twice), for tests that only need
/// some valid add_sub inference: OUTPUT0 is `[2, 3, 4, 5]`.
pub fn add_sub_request() -> serde_json::Value {
    serde_json::json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]}]})
}

/// The JSON inference POST of `model` at `base_url` (a gateway or a Triton), not yet sent:
/// the one place the infer path is spelled, for tests that add headers or read the whole
/// response (headers, TLS peer, timing) rather than [`infer`]'s status and text.
pub fn infer_post(
    client: &reqwest::Client,
    base_url: &str,
    model: &str,
    request: &serde_json::Value,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{base_url}/v2/models/{model}/infer"))
        .json(request)
}

/// One JSON inference of `model` at `base_url` (a gateway or a Triton), as a client sends
/// it: the status, and the body as text (an error's message, or the outputs). No answer at
/// all (refused, reset) is status 0, for tests that count failures while servers come and go.
pub async fn infer(
    client: &reqwest::Client,
    base_url: &str,
    model: &str,
    request: &serde_json::Value,
) -> (u16, String) {
    match infer_post(client, base_url, model, request).send().await {
        Ok(response) => (
            response.status().as_u16(),
            response.text().await.unwrap_or_default(),
        ),
        Err(e) => (0, format!("no answer: {e}")),
    }
}

/// [`infer`] with an API key (`x-api-key`) when `key` is given, for gateways with auth on;
/// and, unlike [`infer`], a request that gets no answer at all fails the test: these tests
/// expect every request to be answered, even with an error.
pub async fn infer_with_key(
    client: &reqwest::Client,
    base_url: &str,
    model: &str,
    request: &serde_json::Value,
    key: Option<&str>,
) -> (u16, String) {
    let mut post = infer_post(client, base_url, model, request);
    if let Some(key) = key {
        post = post.header("x-api-key", key);
    }
    let answer = post.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap())
}

/// The sum of a metric's samples, in Prometheus text, over the series whose line contains
/// every one of `filters` (labels as written, e.g. `model="add_sub"`): what a user reads off
/// `/metrics`.
pub fn metric_sum(text: &str, name: &str, filters: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// What a poll in [`eventually`] may return: `true`, `Some(value)` or `Ok(value)` when what
/// was awaited has come; `false`, `None` or `Err(state)` while not yet (an `Err`'s state, as
/// last seen, goes into the failure message).
pub trait Settled {
    type Value;
    fn settled(self) -> Result<Self::Value, Option<String>>;
}

impl Settled for bool {
    type Value = ();
    fn settled(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Settled for Option<T> {
    type Value = T;
    fn settled(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: std::fmt::Debug> Settled for Result<T, E> {
    type Value = T;
    fn settled(self) -> Result<T, Option<String>> {
        self.map_err(|state| Some(format!("{state:?}")))
    }
}

/// Polls `check` every 50 ms until it settles (see [`Settled`]) and returns its value; panics
/// naming `what` once `limit` has passed. Tests wait on servers that change on their own time
/// (loads, health checks, watches): one poll loop, so every wait fails the same readable way.
pub async fn eventually<S: Settled>(
    limit: Duration,
    what: &str,
    check: impl AsyncFnMut() -> S,
) -> S::Value {
    eventually_every(Duration::from_millis(50), limit, what, check).await
}

/// [`eventually`], polling every `every`: shorter to catch a passing state (a copy loading),
/// longer where each poll costs (a burst of requests).
pub async fn eventually_every<S: Settled>(
    every: Duration,
    limit: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> S,
) -> S::Value {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let last = match check().await.settled() {
            Ok(value) => return value,
            Err(last) => last,
        };
        if tokio::time::Instant::now() >= deadline {
            match last {
                Some(state) => panic!("{what}: not within {limit:?}; last seen: {state}"),
                None => panic!("{what}: not within {limit:?}"),
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// A CPU hog on every core (Debian's `stress-ng`), for tests that must hold on a busy
/// machine, as production has slow moments; stopped when dropped, also when a test fails.
pub struct Stress(Child);

impl Stress {
    /// Starts one busy worker per core.
    pub fn start() -> anyhow::Result<Stress> {
        let mut cmd = Command::new("stress-ng");
        cmd.args(["--cpu", "0", "--timeout", "600s", "--quiet"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_in_own_group(cmd).map_err(|e| {
            anyhow::anyhow!("cannot start stress-ng (scripts/setup.sh installs it): {e}")
        })?;
        Ok(Stress(child))
    }
}

impl Drop for Stress {
    fn drop(&mut self) {
        kill_group(&mut self.0); // stress-ng's workers are in its group
    }
}

/// SIGKILLs a child started by [`spawn_in_own_group`] with everything in its process group
/// (the group id is its pid), and reaps it.
pub fn kill_group(child: &mut Child) {
    unsafe {
        sys::kill(-(child.id() as i32), sys::SIGKILL);
    }
    let _ = child.wait();
}

/// `N` distinct free loopback ports for a server the test starts (Triton, etcd, HAProxy).
/// They are taken below the kernel's ephemeral range (32768 and up), in turn from a counter
/// this process shares: a port the kernel hands out for an outgoing connection or a port-0
/// bind (the gateway's listeners, a client's socket) can then never be the one a server
/// binds a moment later. Port-0 picks did collide so: a Triton that lost its metrics port to
/// another socket exits.
pub fn free_ports<const N: usize>() -> io::Result<[u16; N]> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(7919) % SPAN;
    let mut ports = [0u16; N];
    for port in &mut ports {
        *port = (0..SPAN)
            .map(|_| (FIRST + (seed + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16)
            .find(|&candidate| TcpListener::bind(("127.0.0.1", candidate)).is_ok())
            .ok_or_else(|| io::Error::other("no free port below the ephemeral range"))?;
    }
    Ok(ports)
}

/// Spawns `cmd` in its own process group with `PR_SET_PDEATHSIG = SIGKILL`.
///
/// The death signal fires when the *thread* that forked exits, so all spawns happen on
/// one helper thread that lives as long as the test process.
pub fn spawn_in_own_group(mut cmd: Command) -> io::Result<Child> {
    type Job = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("triton-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn triton-spawner thread");
        Mutex::new(tx)
    });
    cmd.process_group(0);
    unsafe {
        cmd.pre_exec(|| {
            if sys::prctl(sys::PR_SET_PDEATHSIG, sys::SIGKILL as std::ffi::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, tx))
        .map_err(|_| io::Error::other("triton-spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("triton-spawner thread is gone"))?
}

/// Pids of live (non-zombie) `triton_python_backend_stub` processes whose parent is `ppid`.
fn stub_pids(ppid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // "pid (comm) state ppid ..."; comm may contain spaces, so split after ')'.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            let parent = fields.next().and_then(|p| p.parse::<u32>().ok());
            if parent != Some(ppid) || matches!(state, Some("Z" | "X")) {
                return false;
            }
            cmdline(pid).first().is_some_and(|exe| {
                Path::new(exe).file_name() == Some(OsStr::new("triton_python_backend_stub"))
            })
        })
        .collect()
}

/// A python stub stopped by [`Triton::pause_stub`]; SIGCONTed by `resume` or when dropped.
pub struct PausedStub {
    pid: u32,
}

impl PausedStub {
    /// Lets the stub run again.
    pub fn resume(self) {}
}

impl Drop for PausedStub {
    fn drop(&mut self) {
        unsafe { sys::kill(self.pid as i32, sys::SIGCONT) };
    }
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The shared-memory region a stub was started with (its 2nd argument).
fn stub_shm_region(pid: u32) -> Option<String> {
    cmdline(pid)
        .into_iter()
        .find(|a| a.starts_with("triton_python_backend_shm_region_") && !a.contains('/'))
}

/// Whether process `pid` owns a TCP socket listening on `port` (any address).
fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return true; // cannot check; trust the health answer
    };
    let suffix = format!(":{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address rem_address st ... inode is field 9
            (f.len() > 9 && f[1].ends_with(&suffix) && f[3] == "0A").then(|| f[9].to_owned())
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let t = target.to_string_lossy();
            inodes.iter().any(|i| t == format!("socket:[{i}]"))
        })
    })
}

mod sys {
    use std::ffi::c_int;

    pub const SIGKILL: c_int = 9;
    pub const SIGCONT: c_int = 18;
    pub const SIGSTOP: c_int = 19;
    pub const PR_SET_PDEATHSIG: c_int = 1;

    unsafe extern "C" {
        pub fn kill(pid: c_int, sig: c_int) -> c_int;
        pub fn prctl(option: c_int, ...) -> c_int;
    }
}
