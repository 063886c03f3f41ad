//! An in-process gateway for integration tests: bound on port 0, stopped on drop.

use super::Triton;
use infergate::config::Config;
use infergate::{Gateway, Listeners};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running gateway and its addresses.
pub struct TestGateway {
    pub http: SocketAddr,
    pub metrics: SocketAddr,
    pub admin: SocketAddr,
    /// The KServe v2 gRPC listener.
    pub grpc: SocketAddr,
    /// How the helpers below reach the admin API (a client trusting the test CA over TLS).
    admin_client: reqwest::Client,
    admin_scheme: &'static str,
    shutdown: CancellationToken,
    backends: usize,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    /// An admin API key sent with the helpers' admin calls, for gateways with auth on.
    admin_key: Option<String>,
}

/// Config text for a gateway over these Tritons, with fast health checks, backends named
/// `{name}-0`, `{name}-1`, ... (metrics are per process, so each test picks its own name),
/// and extra keys for the `[upstream]` and `[server]` tables. The gRPC listener is on, and
/// each backend's `grpc` URL set.
pub fn config_for(name: &str, tritons: &[&Triton], upstream: &str, server: &str) -> String {
    config_with_capacity(name, tritons, "1GiB", upstream, server)
}

/// [`config_for`] with each backend's `capacity`: room for the models a test keeps loaded.
pub fn config_with_capacity(
    name: &str,
    tritons: &[&Triton],
    capacity: &str,
    upstream: &str,
    server: &str,
) -> String {
    let mut text = format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\n\
         [server]\n{server}\n[upstream]\nhealth_interval = \"200ms\"\nhealth_timeout = \"3s\"\n{upstream}\n"
    );
    text.push_str(&backends(name, tritons, capacity));
    text
}

/// The `[[backends]]` tables for `tritons`, named `{name}-i`, each with its HTTP, gRPC and
/// metrics URL and `capacity`: what every test config says about its Tritons.
pub fn backends(name: &str, tritons: &[&Triton], capacity: &str) -> String {
    let mut text = String::new();
    for (i, triton) in tritons.iter().enumerate() {
        text.push_str(&format!(
            "[[backends]]\nname = \"{name}-{i}\"\nhttp = \"{}\"\ngrpc = \"{}\"\nmetrics = \"{}\"\ncapacity = \"{capacity}\"\n",
            triton.http_url(),
            triton.grpc_url(),
            triton.metrics_url()
        ));
    }
    text
}

/// Config text for placement tests: backends named `{name}-i` with the given capacity, the
/// test model repository for disk sizes, and `tables` (raw TOML: `[placement]` keys,
/// `[[models]]`, ...) appended.
pub fn pool_config(
    name: &str,
    tritons: &[&Triton],
    capacity: &str,
    placement: &str,
    tables: &str,
) -> String {
    pool_config_in(
        &super::model_repository(),
        name,
        tritons,
        capacity,
        placement,
        tables,
    )
}

/// `pool_config` for routing tests: 1 GiB per backend and no scaling on demand, so every
/// model a route names fits and no copy appears that the test did not ask for. `routes` is
/// raw TOML (`[[routes]]`, ...).
pub fn routes_config(name: &str, tritons: &[&Triton], routes: &str) -> String {
    pool_config(name, tritons, "1GiB", "scale_up_rps = 0.0", routes)
}

/// `pool_config` over a model repository of the test's own (the Tritons must use it too).
pub fn pool_config_in(
    repository: &std::path::Path,
    name: &str,
    tritons: &[&Triton],
    capacity: &str,
    placement: &str,
    tables: &str,
) -> String {
    // The placement tests were written for LRU's victims, the default until `tinylfu`;
    // they keep it unless they choose a policy themselves.
    let lru = if placement.contains("policy") {
        ""
    } else {
        "policy = \"lru\"\n"
    };
    let mut text = format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\n\
         [upstream]\nhealth_interval = \"200ms\"\nhealth_timeout = \"3s\"\n\
         [placement]\nmodel_repository = \"{}\"\n{lru}{placement}\n",
        repository.display()
    );
    text.push_str(&backends(name, tritons, capacity));
    text.push_str(tables);
    text
}

/// A `[[models]]` table keeping `copies` copies of `model` from the start, for tests about
/// one model on several backends: the gateway loads them, the Tritons start empty.
pub fn min_copies(model: &str, copies: usize) -> String {
    format!("[[models]]\nname = \"{model}\"\nmin_copies = {copies}\n")
}

impl TestGateway {
    /// Starts a gateway from config text and waits until every backend is ready.
    pub async fn start(config_text: &str) -> Self {
        let config = Config::parse(config_text).unwrap_or_else(|e| panic!("test config: {e}"));
        let this = Self::serve(Gateway::new(config).expect("gateway"), None).await;
        this.wait_for_ready_backends(this.backends).await;
        this
    }

    /// Starts a gateway from config text without waiting for its backends; with
    /// `admin_client`, the admin API is reached over https with that client (`[listen.tls]`).
    pub async fn start_unready(config_text: &str, admin_client: Option<reqwest::Client>) -> Self {
        let config = Config::parse(config_text).unwrap_or_else(|e| panic!("test config: {e}"));
        Self::serve(Gateway::new(config).expect("gateway"), admin_client).await
    }

    /// Starts a gateway with auth on; `admin_key` (an API key with the admin role) is sent
    /// with the helpers' admin API calls.
    pub async fn start_with_admin_key(config_text: &str, admin_key: &str) -> Self {
        let config = Config::parse(config_text).unwrap_or_else(|e| panic!("test config: {e}"));
        let mut this = Self::serve(Gateway::new(config).expect("gateway"), None).await;
        this.admin_key = Some(admin_key.into());
        this.wait_for_ready_backends(this.backends).await;
        this
    }

    /// Like `start_from_file`, with an admin API key for the helpers.
    pub async fn start_from_file_with_admin_key(path: &std::path::Path, admin_key: &str) -> Self {
        let gateway = Gateway::from_file(path).unwrap_or_else(|e| panic!("test config: {e}"));
        let mut this = Self::serve(gateway, None).await;
        this.admin_key = Some(admin_key.into());
        this.wait_for_ready_backends(this.backends).await;
        this
    }

    /// A GET on the admin listener, with the admin key when there is one.
    async fn admin_get(&self, path: &str) -> reqwest::Result<reqwest::Response> {
        let mut request = self
            .admin_client
            .get(format!("{}://{}{path}", self.admin_scheme, self.admin));
        if let Some(key) = &self.admin_key {
            request = request.header("x-api-key", key);
        }
        request.send().await
    }

    /// A GET on the admin listener, its body as JSON (panics when unreachable or not JSON).
    async fn admin_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> T {
        let answer = self.admin_get(path).await.expect("admin reachable");
        answer.json().await.expect("admin JSON")
    }

    /// An admin API call (with the admin key when there is one): its status and JSON body.
    pub async fn admin_call(
        &self,
        method: reqwest::Method,
        path: &str,
    ) -> (u16, serde_json::Value) {
        let mut request = self.admin_client.request(
            method,
            format!("{}://{}{path}", self.admin_scheme, self.admin),
        );
        if let Some(key) = &self.admin_key {
            request = request.header("x-api-key", key);
        }
        let response = request.send().await.expect("admin reachable");
        (
            response.status().as_u16(),
            response.json().await.expect("admin JSON"),
        )
    }

    /// Starts a gateway from a config file, which then reloads like the binary's.
    pub async fn start_from_file(path: &std::path::Path) -> Self {
        let gateway = Gateway::from_file(path).unwrap_or_else(|e| panic!("test config: {e}"));
        let this = Self::serve(gateway, None).await;
        this.wait_for_ready_backends(this.backends).await;
        this
    }

    /// Starts a gateway from a config file without waiting for its backends, the admin API
    /// reached with `admin_client` over https when given.
    pub async fn start_from_file_unready(
        path: &std::path::Path,
        admin_client: Option<reqwest::Client>,
    ) -> Self {
        let gateway = Gateway::from_file(path).unwrap_or_else(|e| panic!("test config: {e}"));
        Self::serve(gateway, admin_client).await
    }

    async fn serve(gateway: Gateway, admin_client: Option<reqwest::Client>) -> Self {
        // `INFERGATE_TEST_LOG=1 cargo test ...`: the gateways' logs, to see what a failing
        // test's gateway did (once per test process; later calls change nothing).
        if std::env::var_os("INFERGATE_TEST_LOG").is_some() {
            infergate::init_logging(infergate::LogFormat::Text);
        }
        let backends = gateway.fixed_config().backends.len();
        let listeners = Listeners::bind(gateway.fixed_config()).await.expect("bind");
        let http = listeners.http.local_addr().unwrap();
        let metrics = listeners.metrics.as_ref().unwrap().local_addr().unwrap();
        let admin = listeners.admin.as_ref().unwrap().local_addr().unwrap();
        let grpc = listeners.grpc.as_ref().unwrap().local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(infergate::serve(gateway, listeners, shutdown.clone()));
        let admin_scheme = if admin_client.is_some() {
            "https"
        } else {
            "http"
        };
        Self {
            http,
            metrics,
            admin,
            grpc,
            admin_client: admin_client.unwrap_or_default(),
            admin_scheme,
            backends,
            shutdown,
            task: Some(task),
            admin_key: None,
        }
    }

    /// `http://addr` of the KServe v2 listener.
    pub fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// `http://addr` of the gRPC listener, for tonic clients.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// Waits until the admin API shows `count` ready backends.
    pub async fn wait_for_ready_backends(&self, count: usize) {
        let what = format!("{count} backends ready");
        super::eventually(Duration::from_secs(20), &what, async || {
            let backends = self.admin_backends().await;
            let ready = backends.iter().filter(|b| b["ready"] == true).count();
            if ready == count {
                Ok(())
            } else {
                Err(backends)
            }
        })
        .await
    }

    /// `GET /admin/backends` as JSON.
    pub async fn admin_backends(&self) -> Vec<serde_json::Value> {
        self.admin_json("/admin/backends").await
    }

    /// `GET /admin/placement` as JSON.
    pub async fn placement(&self) -> serde_json::Value {
        self.admin_json("/admin/placement").await
    }

    /// `GET /admin/routes`: each route's targets, weights, guard figures and trips.
    pub async fn routes(&self) -> serde_json::Value {
        self.admin_json("/admin/routes").await
    }

    /// Models on each backend's books, sorted, in pool order.
    pub async fn placed(&self) -> Vec<Vec<String>> {
        let placement = self.placement().await;
        placement["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                let mut names: Vec<String> = b["models"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["name"].as_str().unwrap().to_string())
                    .collect();
                names.sort();
                names
            })
            .collect()
    }

    /// (model, versions served) on each backend's books, sorted, in pool order.
    pub async fn placed_versions(&self) -> Vec<Vec<(String, Vec<u64>)>> {
        let placement = self.placement().await;
        placement["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                let mut copies: Vec<(String, Vec<u64>)> = b["models"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        let versions = m["versions"].as_array().unwrap();
                        let versions = versions.iter().map(|v| v.as_u64().unwrap()).collect();
                        (m["name"].as_str().unwrap().to_string(), versions)
                    })
                    .collect();
                copies.sort();
                copies
            })
            .collect()
    }

    /// Pool indexes of the backends with a ready copy of `model` on the books: where the
    /// gateway placed it, for tests that then ask that Triton directly.
    pub async fn ready_copies(&self, model: &str) -> Vec<usize> {
        let placement = self.placement().await;
        let backends = placement["backends"].as_array().unwrap();
        (0..backends.len())
            .filter(|&b| {
                backends[b]["models"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["name"] == model && m["state"] == "ready")
            })
            .collect()
    }

    /// Pool index of a backend with a ready copy of `model`; panics if there is none.
    pub async fn holder(&self, model: &str) -> usize {
        let copies = self.ready_copies(model).await;
        *copies
            .first()
            .unwrap_or_else(|| panic!("no ready copy of {model}"))
    }

    /// Waits until `model` has a ready copy on `count` backends (`min_copies` loading).
    pub async fn wait_for_copies(&self, model: &str, count: usize) {
        let what = format!("{model}: {count} ready copies");
        super::eventually(Duration::from_secs(60), &what, async || {
            if self.ready_copies(model).await.len() >= count {
                Ok(())
            } else {
                Err(self.placed().await)
            }
        })
        .await
    }

    /// Text of the gateway's own `/metrics`.
    pub async fn metrics_text(&self, path: &str) -> String {
        reqwest::get(format!("http://{}{path}", self.metrics))
            .await
            .expect("metrics reachable")
            .text()
            .await
            .unwrap()
    }

    /// The sum of metric `name` on the gateway's own `/metrics` over the series matching every
    /// one of `filters` ([`crate::support::metric_sum`]): the one metrics reader tests use for
    /// what a dashboard would show.
    pub async fn metric_sum(&self, name: &str, filters: &[&str]) -> f64 {
        super::metric_sum(&self.metrics_text("/metrics").await, name, filters)
    }

    /// Begins shutdown and returns the serve task to await.
    pub fn begin_shutdown(&mut self) -> JoinHandle<anyhow::Result<()>> {
        self.shutdown.cancel();
        self.task.take().expect("not yet stopped")
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
