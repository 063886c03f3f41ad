//! TLS to what the gateway calls: backends (`https://` URLs in `backends[].http` and
//! `backends[].grpc`, verified against `backends[].tls_ca`, else `upstream.tls_ca`, else the
//! system's roots) and etcd (`[cluster.tls]`).

use super::{load_certificates, load_key_pair, provider};
use crate::config::{ClusterTls, ConfigError};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::{ClientConfig, RootCertStore};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A connector that speaks TLS to `https://` URLs and plain TCP to `http://` ones.
pub type HttpsConnector = hyper_rustls::HttpsConnector<HttpConnector>;

/// The system's trust store, read once per process (only when some backend needs it).
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for error in &found.errors {
                tracing::warn!(%error, "reading the system's CA certificates");
            }
            let mut roots = RootCertStore::empty();
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            tracing::debug!(added, ignored, "system CA certificates loaded");
            Arc::new(roots)
        })
        .clone()
}

/// The connector for one backend. `tls` is false for plain backends: then no trust store is
/// read and the connector passes `http://` through untouched. `http2` sets ALPN to `h2`
/// (gRPC), else `http/1.1`.
pub fn https_connector(
    tls: bool,
    ca: Option<&Path>,
    http2: bool,
    connect_timeout: Duration,
) -> Result<HttpsConnector, String> {
    let roots = match (tls, ca) {
        (false, _) => Arc::new(RootCertStore::empty()),
        (true, None) => system_roots(),
        (true, Some(path)) => ca_roots("tls_ca", path).map_err(|e| e.message)?,
    };
    let config = config_builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(connector(config, http2, connect_timeout))
}

/// The connector to etcd (gRPC): plain for `http://` endpoints, and with `[cluster.tls]`
/// verified against its CA, presenting this replica's certificate when one is configured
/// (etcd's `--client-cert-auth`). Errors name the `cluster.tls` key of the file at fault.
pub fn etcd_connector(
    tls: Option<&ClusterTls>,
    connect_timeout: Duration,
) -> Result<HttpsConnector, ConfigError> {
    let Some(tls) = tls else {
        return Ok(connector(
            config_builder()
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth(),
            true,
            connect_timeout,
        ));
    };
    let builder = config_builder().with_root_certificates(ca_roots("cluster.tls.ca", &tls.ca)?);
    let config = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let (chain, key) = load_key_pair(("cluster.tls.cert", cert), ("cluster.tls.key", key))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| ConfigError {
                    key: "cluster.tls.key".into(),
                    message: format!("unusable client key: {e}"),
                })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(connector(config, true, connect_timeout))
}

fn config_builder() -> rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier> {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
}

/// The CAs in the PEM bundle at `path` (the config key `key` names it in errors).
fn ca_roots(key: &str, path: &Path) -> Result<Arc<RootCertStore>, ConfigError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certificates(key, path)? {
        roots.add(cert).map_err(|e| ConfigError {
            key: key.into(),
            message: format!("{}: unusable CA certificate: {e}", path.display()),
        })?;
    }
    Ok(Arc::new(roots))
}

fn connector(config: ClientConfig, http2: bool, connect_timeout: Duration) -> HttpsConnector {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http.enforce_http(false);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http();
    if http2 {
        builder.enable_http2().wrap_connector(http)
    } else {
        builder.enable_http1().wrap_connector(http)
    }
}
