//! TLS at both ends of the gateway, with rustls (ring provider).
//!
//! Listeners: `ServerTls` holds the server certificate in a `ResolvesServerCert` backed by an
//! `ArcSwap`, so a rotated certificate is used by the next handshake while connections that
//! are already open keep the session they made. The client-CA verifier (mTLS) can change too:
//! then the `ServerConfig` is rebuilt around the same resolver and swapped the same way.
//! Files are re-read when they change (`spawn_watch`) and on config reload; a file that does
//! not load (unreadable, not PEM, key not matching the certificate) keeps the old material,
//! with a warning and `infergate_tls_reloads_total{result="failure"}`.
//!
//! A verified client certificate names the peer: `PeerIdentity` is put on every request of
//! the connection (HTTP and gRPC alike, as a request extension) for the auth stage to map to
//! a tenant. This module only says who the peer is, never what it may do.
//!
//! Backends: `upstream::https_connector` builds the connector the HTTP pools and gRPC
//! channels use for `https://` URLs, trusting a configured CA bundle or the system's roots.
//! etcd: `upstream::etcd_connector` does the same for `[cluster.tls]`, with this replica's
//! client certificate when etcd asks for one.

mod listener;
mod upstream;

pub use listener::handshake;
pub use upstream::{HttpsConnector, etcd_connector, https_connector};

use crate::config::{ClientAuth, ClientIdentity, ConfigError, ListenTls};
use crate::telemetry;
use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Who a client is, from the certificate it presented and the gateway verified against
/// `listen.tls.client_ca`. On every request of that connection as an extension (HTTP:
/// `request.extensions()`, gRPC: `tonic::Request::extensions()`); absent without mTLS or
/// when the client sent no certificate (`client_auth = "optional"`). Mapping it to a tenant
/// is the auth stage's job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The field chosen by `listen.tls.client_identity` (the common name by default).
    /// Shared, so each request of the connection holds it without a copy.
    pub subject: Arc<str>,
}

/// The one crypto provider used everywhere, so no process-wide default has to be installed.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// The current certificate, handed to every new handshake.
#[derive(Debug)]
struct CertResolver(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// What was last loaded: the settings it came from and the CA bundle's bytes, to tell
/// whether the verifier must be rebuilt.
struct Loaded {
    settings: ListenTls,
    client_ca: Option<Vec<u8>>,
}

/// Certificate, key and client verifier read from files and checked, not yet served.
pub struct StagedTls {
    key: CertifiedKey,
    verifier: Arc<dyn ClientCertVerifier>,
    loaded: Loaded,
}

/// The listeners' TLS state: swapped in place on reload, read once per handshake.
pub struct ServerTls {
    resolver: Arc<CertResolver>,
    config: ArcSwap<ServerConfig>,
    identity: ArcSwap<ClientIdentity>,
    loaded: Mutex<Loaded>,
    sessions: Arc<dyn rustls::server::StoresServerSessions>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the certificate, key and client CAs; the error names the key whose file failed.
    pub fn new(settings: &ListenTls) -> Result<Self, ConfigError> {
        let key = load_certified_key(settings)?;
        let client_ca = read_client_ca(settings)?;
        let verifier = verifier(settings, client_ca.as_deref())?;
        let resolver = Arc::new(CertResolver(ArcSwap::from_pointee(key)));
        let sessions = rustls::server::ServerSessionMemoryCache::new(1024);
        let config = server_config(resolver.clone(), verifier, sessions.clone());
        Ok(Self {
            resolver,
            config: ArcSwap::from_pointee(config),
            identity: ArcSwap::from_pointee(settings.client_identity()),
            loaded: Mutex::new(Loaded {
                settings: settings.clone(),
                client_ca,
            }),
            sessions,
        })
    }

    /// The config for the next handshake.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.config.load_full()
    }

    /// The peer's identity from the certificate it presented (verified in the handshake).
    pub fn peer_identity(&self, connection: &rustls::ServerConnection) -> Option<PeerIdentity> {
        let leaf = connection.peer_certificates()?.first()?;
        let subject = certificate_identity(leaf, **self.identity.load())?;
        Some(PeerIdentity {
            subject: subject.into(),
        })
    }

    /// Re-reads the files of `settings` (the running ones, or a reloaded config's). On any
    /// error nothing changes; counted and logged either way.
    pub fn reload(&self, settings: &ListenTls) -> Result<(), ConfigError> {
        let staged = self.stage(settings)?;
        self.commit(staged);
        Ok(())
    }

    /// Reads and checks the files of `settings` without serving them yet, so that a config
    /// reload can build everything before it changes anything. A failure is counted and
    /// logged here; `commit` counts the success.
    pub fn stage(&self, settings: &ListenTls) -> Result<StagedTls, ConfigError> {
        let staged = (|| {
            let key = load_certified_key(settings)?;
            let client_ca = read_client_ca(settings)?;
            let verifier = verifier(settings, client_ca.as_deref())?;
            Ok(StagedTls {
                key,
                verifier,
                loaded: Loaded {
                    settings: settings.clone(),
                    client_ca,
                },
            })
        })();
        if let Err(error) = &staged {
            metrics::counter!(telemetry::TLS_RELOADS, "result" => "failure").increment(1);
            tracing::warn!(%error, "TLS reload refused; the running certificate stays");
        }
        staged
    }

    /// Serves what `stage` read from the next handshake on.
    pub fn commit(&self, staged: StagedTls) {
        let mut loaded = self.loaded.lock().expect("tls lock");
        self.resolver.0.store(Arc::new(staged.key));
        // A new verifier only when the client CAs or the policy changed: sessions resume
        // across a reload that only rotates the certificate.
        let verifier_changed = staged.loaded.client_ca != loaded.client_ca
            || staged.loaded.settings.client_auth() != loaded.settings.client_auth();
        if verifier_changed {
            let config = server_config(
                self.resolver.clone(),
                staged.verifier,
                self.sessions.clone(),
            );
            self.config.store(Arc::new(config));
        }
        self.identity
            .store(Arc::new(staged.loaded.settings.client_identity()));
        tracing::info!(cert = %staged.loaded.settings.cert.display(), "TLS certificate reloaded");
        *loaded = staged.loaded;
        metrics::counter!(telemetry::TLS_RELOADS, "result" => "success").increment(1);
    }

    /// The files now in use.
    fn watched(&self) -> Vec<PathBuf> {
        let loaded = self.loaded.lock().expect("tls lock");
        let settings = &loaded.settings;
        let mut paths = vec![settings.cert.clone(), settings.key.clone()];
        paths.extend(settings.client_ca.clone());
        paths
    }

    fn settings(&self) -> ListenTls {
        self.loaded.lock().expect("tls lock").settings.clone()
    }

    /// Reloads when the files change: checked every `poll`, acted on once they have stopped
    /// changing for one more poll (a certificate and its key are rarely written at the same
    /// instant), until `shutdown`.
    pub fn spawn_watch(
        self: &Arc<Self>,
        poll: Duration,
        tasks: &TaskTracker,
        shutdown: &CancellationToken,
    ) {
        let (tls, shutdown) = (self.clone(), shutdown.clone());
        tasks.spawn(async move {
            let stamps = |paths: &[PathBuf]| -> Vec<Option<SystemTime>> {
                paths
                    .iter()
                    .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
                    .collect()
            };
            let mut seen = stamps(&tls.watched());
            let mut pending: Option<Vec<Option<SystemTime>>> = None;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(poll) => {}
                }
                let now = stamps(&tls.watched());
                if now == seen {
                    pending = None;
                } else if pending.as_ref() == Some(&now) {
                    let _ = tls.reload(&tls.settings());
                    // Stamps of the files as now configured (a reload may change paths).
                    seen = stamps(&tls.watched());
                    pending = None;
                } else {
                    pending = Some(now);
                }
            }
        });
    }
}

fn server_config(
    resolver: Arc<CertResolver>,
    verifier: Arc<dyn ClientCertVerifier>,
    sessions: Arc<dyn rustls::server::StoresServerSessions>,
) -> ServerConfig {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    // h2 for gRPC (and HTTP/2 clients), HTTP/1.1 for the rest; hyper serves either.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.session_storage = sessions;
    config
}

fn read(key: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| ConfigError {
        key: key.into(),
        message: format!("cannot read {}: {e}", path.display()),
    })
}

/// Every certificate in a PEM file; the error names `key` and says what was wrong.
pub(crate) fn load_certificates(
    key: &str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    parse_certificates(key, path, &read(key, path)?)
}

fn parse_certificates(
    key: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError {
            key: key.into(),
            message: format!("{}: not a PEM certificate file: {e}", path.display()),
        })?;
    if certs.is_empty() {
        return Err(ConfigError {
            key: key.into(),
            message: format!(
                "{}: no certificate (BEGIN CERTIFICATE) in it",
                path.display()
            ),
        });
    }
    Ok(certs)
}

fn load_certified_key(settings: &ListenTls) -> Result<CertifiedKey, ConfigError> {
    let (chain, key) = load_key_pair(
        ("listen.tls.cert", &settings.cert),
        ("listen.tls.key", &settings.key),
    )?;
    Ok(CertifiedKey::from_der(chain, key, &provider()).expect("load_key_pair checked the pair"))
}

/// A certificate chain and its private key from two PEM files, checked to go together;
/// each error names the config key of the file it is about.
pub(crate) fn load_key_pair(
    (cert_key, cert): (&str, &Path),
    (key_key, key): (&str, &Path),
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ConfigError> {
    let chain = load_certificates(cert_key, cert)?;
    let pem = read(key_key, key)?;
    let private = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| ConfigError {
        key: key_key.into(),
        message: format!("{}: no PEM private key in it: {e}", key.display()),
    })?;
    CertifiedKey::from_der(chain.clone(), private.clone_key(), &provider()).map_err(|e| {
        ConfigError {
            key: key_key.into(),
            message: format!(
                "{} does not go with the certificate in {}: {e}",
                key.display(),
                cert.display()
            ),
        }
    })?;
    Ok((chain, private))
}

/// The CA bundle's bytes, when `listen.tls.client_ca` is set.
fn read_client_ca(settings: &ListenTls) -> Result<Option<Vec<u8>>, ConfigError> {
    settings
        .client_ca
        .as_deref()
        .map(|path| read("listen.tls.client_ca", path))
        .transpose()
}

/// The client verifier for `settings`, from the CA bundle's bytes (`None`: no mTLS).
fn verifier(
    settings: &ListenTls,
    client_ca: Option<&[u8]>,
) -> Result<Arc<dyn ClientCertVerifier>, ConfigError> {
    let (Some(path), Some(pem)) = (&settings.client_ca, client_ca) else {
        return Ok(WebPkiClientVerifier::no_client_auth());
    };
    let key = "listen.tls.client_ca";
    let mut roots = RootCertStore::empty();
    for cert in parse_certificates(key, path, pem)? {
        roots.add(cert).map_err(|e| ConfigError {
            key: key.into(),
            message: format!("{}: unusable CA certificate: {e}", path.display()),
        })?;
    }
    let mut builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
    if settings.client_auth() == ClientAuth::Optional {
        builder = builder.allow_unauthenticated();
    }
    builder.build().map_err(|e| ConfigError {
        key: key.into(),
        message: format!("{}: {e}", path.display()),
    })
}

/// The field `from` of a DER certificate: its subject's common name or its first subject
/// alternative name of a kind.
pub fn certificate_identity(der: &[u8], from: ClientIdentity) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    if from == ClientIdentity::Cn {
        return cert
            .subject()
            .iter_common_name()
            .next()?
            .as_str()
            .ok()
            .map(str::to_owned);
    }
    let names = cert.subject_alternative_name().ok()??;
    names
        .value
        .general_names
        .iter()
        .find_map(|name| match (from, name) {
            (ClientIdentity::DnsSan, GeneralName::DNSName(s))
            | (ClientIdentity::UriSan, GeneralName::URI(s))
            | (ClientIdentity::EmailSan, GeneralName::RFC822Name(s)) => Some((*s).to_owned()),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    /// A self-signed certificate and key, PEM, with a CN and SANs of every kind.
    fn self_signed(cn: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["svc.example".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names.push(SanType::URI(
            "spiffe://example/ns/a/sa/ranker".try_into().unwrap(),
        ));
        params
            .subject_alt_names
            .push(SanType::Rfc822Name("ops@example.com".try_into().unwrap()));
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    fn settings(dir: &Path) -> ListenTls {
        ListenTls {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            client_ca: None,
            client_auth: None,
            client_identity: None,
        }
    }

    fn served(tls: &ServerTls) -> String {
        let key = tls.resolver.0.load_full();
        certificate_identity(key.end_entity_cert().unwrap(), ClientIdentity::Cn).unwrap()
    }

    #[test]
    fn the_identity_comes_from_the_configured_field() {
        let (cert, _) = self_signed("alice");
        let der = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let field = |from| certificate_identity(&der, from);
        assert_eq!(field(ClientIdentity::Cn).as_deref(), Some("alice"));
        assert_eq!(
            field(ClientIdentity::DnsSan).as_deref(),
            Some("svc.example")
        );
        assert_eq!(
            field(ClientIdentity::UriSan).as_deref(),
            Some("spiffe://example/ns/a/sa/ranker")
        );
        assert_eq!(
            field(ClientIdentity::EmailSan).as_deref(),
            Some("ops@example.com")
        );
        assert_eq!(certificate_identity(b"not der", ClientIdentity::Cn), None);
    }

    #[test]
    fn a_good_certificate_is_swapped_in_and_a_bad_one_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let settings = settings(dir.path());
        let install = |(cert, key): (String, String)| {
            std::fs::write(&settings.cert, cert).unwrap();
            std::fs::write(&settings.key, key).unwrap();
        };
        install(self_signed("first"));
        let tls = ServerTls::new(&settings).unwrap();
        assert_eq!(served(&tls), "first");
        let config_before = tls.server_config();

        install(self_signed("second"));
        tls.reload(&settings).unwrap();
        assert_eq!(served(&tls), "second");
        // Only the certificate changed: the same ServerConfig (and session cache) serves on.
        assert!(Arc::ptr_eq(&config_before, &tls.server_config()));

        // A key from another pair: refused by key, and the second certificate stays.
        let (third, _) = self_signed("third");
        let (_, other_key) = self_signed("other");
        install((third, other_key));
        let error = tls.reload(&settings).unwrap_err();
        assert_eq!(error.key, "listen.tls.key");
        assert!(error.message.contains("does not go with"), "{error}");
        assert_eq!(served(&tls), "second");
    }

    #[test]
    fn a_missing_file_is_named_by_its_key() {
        let settings = ListenTls {
            cert: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
            client_ca: None,
            client_auth: None,
            client_identity: None,
        };
        let error = ServerTls::new(&settings).unwrap_err();
        assert_eq!(error.key, "listen.tls.cert");
        assert!(error.message.contains("/nonexistent/cert.pem"), "{error}");
    }

    #[test]
    fn a_file_without_pem_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "hello").unwrap();
        let error = load_certificates("listen.tls.cert", &cert).unwrap_err();
        assert!(error.message.contains("no certificate"), "{error}");
    }
}
