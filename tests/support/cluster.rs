//! Real parts for the replicas' tests: an `etcd` server (Debian's `etcd-server`, v3 API)
//! and an `haproxy` in front of the gateway replicas, as a load balancer health-checking
//! `/v2/health/ready` would be. Both run on free loopback ports in their own process
//! group, and are killed on drop, also when a test panics (and with the test process,
//! through `spawn_in_own_group`).

use super::pki::Pki;
use super::{free_ports, spawn_in_own_group, tail};
use anyhow::{Context, bail};
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One etcd member with its data in a temporary directory; `stop` and `start_again` give
/// outages on the same ports and data.
pub struct Etcd {
    pub client_port: u16,
    peer_port: u16,
    /// A second, plain client listener next to the TLS one, for the test's own setup and
    /// health checks (the same as `client_port` without TLS).
    plain_port: u16,
    /// With TLS: clients must present a certificate signed by this CA.
    tls: Option<EtcdTls>,
    child: Option<Child>,
    log_path: PathBuf,
    dir: tempfile::TempDir,
}

/// etcd's own TLS files (`--cert-file`, `--key-file`, `--trusted-ca-file`).
struct EtcdTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

impl Etcd {
    /// Starts etcd and waits until `/health` says so.
    pub async fn start() -> anyhow::Result<Etcd> {
        Self::start_with(None).await
    }

    /// Starts etcd serving TLS with a certificate from `pki` for 127.0.0.1, and requiring
    /// client certificates signed by `pki`'s CA (`--client-cert-auth`), as a secured
    /// production etcd does; plus a plain listener for the test itself (`plain_endpoint`).
    pub async fn start_tls(pki: &Pki) -> anyhow::Result<Etcd> {
        let issued = pki.server("etcd");
        let tls = EtcdTls {
            cert: pki.write("etcd.crt", &issued.cert),
            key: pki.write("etcd.key", &issued.key),
            ca: pki.path("ca.pem"),
        };
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<EtcdTls>) -> anyhow::Result<Etcd> {
        let [client_port, peer_port, plain_port] = free_ports::<3>()?;
        let dir = tempfile::Builder::new()
            .prefix("infergate-etcd-")
            .tempdir()?;
        let mut etcd = Etcd {
            client_port,
            peer_port,
            plain_port: if tls.is_some() {
                plain_port
            } else {
                client_port
            },
            tls,
            child: None,
            log_path: dir.path().join("etcd.log"),
            dir,
        };
        etcd.start_again().await?;
        Ok(etcd)
    }

    /// `http://127.0.0.1:port` (`https://` with TLS), for `cluster.etcd`.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The plain listener, for the test's own calls (health, setting up users).
    pub fn plain_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.plain_port)
    }

    /// (Re)starts the server on the same ports and data directory.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        assert!(self.child.is_none(), "etcd is running");
        let (mut client, peer) = (
            self.endpoint(),
            format!("http://127.0.0.1:{}", self.peer_port),
        );
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        let mut cmd = Command::new("etcd");
        if let Some(tls) = &self.tls {
            cmd.arg(format!("--cert-file={}", tls.cert.display()))
                .arg(format!("--key-file={}", tls.key.display()))
                .arg(format!("--trusted-ca-file={}", tls.ca.display()))
                .arg("--client-cert-auth");
            cmd.arg(format!("--advertise-client-urls={client}"));
            client = format!("{client},{}", self.plain_endpoint());
        } else {
            cmd.arg(format!("--advertise-client-urls={client}"));
        }
        cmd.arg("--name=test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg("--log-level=warn")
            .arg("--logger=zap")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(
            spawn_in_own_group(cmd)
                .context("cannot start etcd (scripts/setup.sh installs etcd-server)")?,
        );
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let health = client
                .get(format!("{}/health", self.plain_endpoint()))
                .timeout(Duration::from_secs(1))
                .send()
                .await;
            if let Ok(answer) = health
                && answer.text().await.is_ok_and(|t| t.contains("\"true\""))
            {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("etcd exited with {status}:\n{}", self.log_tail());
            }
            if Instant::now() > deadline {
                bail!("etcd not healthy after 30s:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGSTOPs the server: its sockets stay, nothing answers, as etcd on a busy host or in
    /// a long pause. `resume` undoes it.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONTs a server stopped by `pause`.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("etcd is running").id();
        let sent = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill {signal} {pid}");
    }

    /// Kills the server (SIGKILL: an outage, not a goodbye).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_tail(&self) -> String {
        tail(
            &std::fs::read_to_string(&self.log_path).unwrap_or_default(),
            20,
        )
    }
}

/// The test's own calls to etcd, as JSON through etcd's HTTP gateway on the plain listener
/// (`/v3/...`): reading what the replicas wrote, revoking their leases, setting up users.
/// Another road to etcd than the gateway's gRPC client, so a test checks that client
/// against etcd itself, not against itself.
pub struct EtcdJson {
    url: String,
    http: reqwest::Client,
    /// After `login`: sent as `Authorization` on every call.
    token: Option<String>,
}

impl Etcd {
    /// A JSON client of this etcd, without a user.
    pub fn json(&self) -> EtcdJson {
        EtcdJson {
            url: self.plain_endpoint(),
            http: reqwest::Client::new(),
            token: None,
        }
    }
}

impl EtcdJson {
    /// The same client, authenticated as `user`.
    pub async fn login(mut self, user: &str, password: &str) -> anyhow::Result<Self> {
        let answer = self
            .call(
                "auth/authenticate",
                serde_json::json!({"name": user, "password": password}),
            )
            .await?;
        let token = answer["token"].as_str().context("no token")?;
        self.token = Some(token.to_string());
        Ok(self)
    }

    /// Posts `body` to `/v3/{path}`: etcd's answer, or an error with its message.
    pub async fn call(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        let mut request = self
            .http
            .post(format!("{}/v3/{path}", self.url))
            .json(&body);
        if let Some(token) = &self.token {
            request = request.header("Authorization", token);
        }
        let answer = request.send().await?;
        let status = answer.status();
        let text = answer.text().await?;
        if !status.is_success() {
            bail!("etcd {path}: {status}: {text}");
        }
        Ok(serde_json::from_str(&text)?)
    }

    /// The JSON value of `key`, if it exists.
    pub async fn get(&self, key: &str) -> anyhow::Result<Option<serde_json::Value>> {
        let answer = self
            .call(
                "kv/range",
                serde_json::json!({"key": base64(key.as_bytes())}),
            )
            .await?;
        Ok(values(&answer)?.into_iter().next())
    }

    /// The JSON values of every key under `prefix`.
    pub async fn get_prefix(&self, prefix: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let (key, range_end) = prefix_range(prefix);
        let range = serde_json::json!({"key": key, "range_end": range_end});
        values(&self.call("kv/range", range).await?)
    }

    /// Revokes every lease etcd holds (the replicas' records go with them).
    pub async fn revoke_every_lease(&self) -> anyhow::Result<()> {
        let leases = self.call("lease/leases", serde_json::json!({})).await?;
        for lease in leases["leases"].as_array().into_iter().flatten() {
            self.call("lease/revoke", serde_json::json!({"ID": lease["ID"]}))
                .await?;
        }
        Ok(())
    }
}

/// `bytes` fields travel as base64 in etcd's JSON.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The key range of every key under `prefix` (ASCII, as every prefix the tests use), as the
/// JSON's base64 `key` and `range_end`.
pub fn prefix_range(prefix: &str) -> (String, String) {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("a prefix is not empty") += 1;
    (base64(prefix.as_bytes()), base64(&end))
}

/// The values of a range answer's keys, parsed as JSON.
fn values(answer: &serde_json::Value) -> anyhow::Result<Vec<serde_json::Value>> {
    use base64::Engine;
    let kvs = answer["kvs"].as_array().into_iter().flatten();
    kvs.map(|kv| {
        let value = kv["value"].as_str().unwrap_or_default();
        let bytes = base64::engine::general_purpose::STANDARD.decode(value)?;
        Ok(serde_json::from_slice(&bytes)?)
    })
    .collect()
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            eprintln!(
                "--- etcd on port {}, last lines:\n{}",
                self.client_port,
                self.log_tail()
            );
        }
        self.stop();
    }
}

/// HAProxy balancing HTTP over gateway replicas, taking a replica out while its
/// `/v2/health/ready` fails (checked every 200 ms).
pub struct Haproxy {
    pub port: u16,
    /// Its runtime API (`stats socket`), for what its health checks concluded.
    socket: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// Starts HAProxy over these gateway addresses and waits until it answers readiness.
    pub async fn start(backends: &[std::net::SocketAddr]) -> anyhow::Result<Haproxy> {
        let [port] = free_ports::<1>()?;
        let dir = tempfile::Builder::new()
            .prefix("infergate-haproxy-")
            .tempdir()?;
        let socket = dir.path().join("admin.sock");
        let mut config = format!(
            "global\n  maxconn 512\n  stats socket {}\n\
             defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n  \
             retries 2\n  option redispatch\n\
             frontend gateways\n  bind 127.0.0.1:{port}\n  default_backend replicas\n\
             backend replicas\n  balance roundrobin\n  option httpchk GET /v2/health/ready\n  \
             default-server inter 200ms fall 2 rise 1\n",
            socket.display()
        );
        for (i, addr) in backends.iter().enumerate() {
            config.push_str(&format!("  server gw{i} {addr} check\n"));
        }
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, config)?;
        let log = File::create(dir.path().join("haproxy.log"))?;
        let mut cmd = Command::new("haproxy");
        cmd.arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = spawn_in_own_group(cmd)
            .context("cannot start haproxy (scripts/setup.sh installs it)")?;
        let haproxy = Haproxy {
            port,
            socket,
            child: Some(child),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(
            reqwest::get(format!("{}/v2/health/ready", haproxy.url())).await,
            Ok(answer) if answer.status() == 200
        ) {
            if Instant::now() > deadline {
                bail!("haproxy never reached a ready replica");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(haproxy)
    }

    /// `http://127.0.0.1:port` of the frontend.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Whether HAProxy's checks have each replica up, in the order given to `start`
    /// (`show stat` on its runtime API).
    pub async fn servers_up(&self) -> anyhow::Result<Vec<bool>> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::UnixStream::connect(&self.socket).await?;
        stream.write_all(b"show stat\n").await?;
        let mut csv = String::new();
        stream.read_to_string(&mut csv).await?;
        let mut lines = csv.lines();
        let header: Vec<&str> = lines
            .next()
            .and_then(|h| h.strip_prefix("# "))
            .context("show stat: no header")?
            .split(',')
            .collect();
        let column = |name: &str| header.iter().position(|c| *c == name);
        let (Some(proxy), Some(server), Some(status)) =
            (column("pxname"), column("svname"), column("status"))
        else {
            bail!("show stat: unexpected header {header:?}");
        };
        Ok(lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|row| row.get(proxy) == Some(&"replicas"))
            .filter(|row| row.get(server).is_some_and(|s| s.starts_with("gw")))
            .map(|row| row.get(status) == Some(&"UP"))
            .collect())
    }

    /// Waits until HAProxy's checks have every replica up.
    pub async fn wait_all_up(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let up = self.servers_up().await?;
            if up.iter().all(|&u| u) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("haproxy still has replicas down: {up:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
