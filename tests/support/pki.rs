//! A test certificate authority (rcgen): a CA, server certificates for 127.0.0.1/localhost
//! and client certificates, written as PEM files into a temporary directory, for the TLS
//! tests of the listeners, the backends and etcd.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use std::path::PathBuf;

/// A test CA that issues server and client certificates into a temporary directory.
pub struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
pub struct Issued {
    pub cert: String,
    pub key: String,
}

impl Pki {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pki = Self {
            dir: tempfile::tempdir().unwrap(),
            ca,
        };
        pki.write("ca.pem", &pki.ca.pem());
        pki
    }

    pub fn issue(&self, cn: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Issued {
        let key = KeyPair::generate().unwrap();
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.ca).unwrap();
        Issued {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self, cn: &str) -> Issued {
        self.issue(
            cn,
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    pub fn client(&self, cn: &str) -> Issued {
        self.issue(cn, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Writes `server.crt` and `server.key`.
    pub fn install_server(&self, issued: &Issued) {
        self.write("server.crt", &issued.cert);
        self.write("server.key", &issued.key);
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }
}
