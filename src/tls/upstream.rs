//! TLS to backends: `https://` URLs in `backends[].http` and `backends[].grpc`, verified
//! against `backends[].tls_ca`, else `upstream.tls_ca`, else the system's roots.

use super::{load_certificates, provider};
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
        (true, Some(path)) => {
            let mut roots = RootCertStore::empty();
            let certs = load_certificates("tls_ca", path).map_err(|e| e.message)?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: unusable CA certificate: {e}", path.display()))?;
            }
            Arc::new(roots)
        }
    };
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http.enforce_http(false);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http();
    Ok(if http2 {
        builder.enable_http2().wrap_connector(http)
    } else {
        builder.enable_http1().wrap_connector(http)
    })
}
