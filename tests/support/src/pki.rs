//! A throw-away certificate authority for TLS tests: one CA, and leaf certificates it signs,
//! written as PEM files into a temporary directory that lives as long as the `TestPki`.
//!
//! Shared by `tests/` and `integration/`, so every TLS test (gRPC server, xDS client, Redis)
//! trusts certificates made the same way.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// A leaf certificate and its key, as PEM files.
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA in a temporary directory. Dropping it deletes every file it wrote.
pub struct TestPki {
    dir: tempfile::TempDir,
    ca_cert: Certificate,
    ca_key: KeyPair,
    /// The CA certificate, PEM: what a peer is told to trust.
    pub ca: PathBuf,
}

impl TestPki {
    #[expect(
        clippy::new_without_default,
        reason = "a new CA generates keys and writes files: `new` says so, a `default` would not"
    )]
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory for test certificates");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "sluice test CA");
        let ca_cert = params.self_signed(&ca_key).expect("self-signed CA");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_cert.pem()).expect("write CA certificate");
        TestPki {
            dir,
            ca_cert,
            ca_key,
            ca,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A certificate signed by this CA for `names` (DNS names or IP addresses), usable both as a
    /// server and as a client certificate, written as `<file>.pem` and `<file>-key.pem`.
    pub fn leaf(&self, file: &str, names: &[&str]) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, file);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.ca_cert, &self.ca_key)
            .expect("sign leaf certificate");
        let leaf = Leaf {
            cert: self.dir.path().join(format!("{file}.pem")),
            key: self.dir.path().join(format!("{file}-key.pem")),
        };
        std::fs::write(&leaf.cert, cert.pem()).expect("write leaf certificate");
        std::fs::write(&leaf.key, key.serialize_pem()).expect("write leaf key");
        leaf
    }
}

/// A gRPC channel to 127.0.0.1:`port` over TLS, trusting `ca`, expecting the server's
/// certificate to carry `name`, and presenting `identity` if given; `Err` if the connection or
/// the handshake fails. Calls on it time out after 5 s.
pub async fn tls_channel(
    port: u16,
    ca: &Path,
    name: &str,
    identity: Option<&Leaf>,
) -> Result<tonic::transport::Channel, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .domain_name(name);
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&leaf.cert).unwrap(),
            std::fs::read(&leaf.key).unwrap(),
        ));
    }
    Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(std::time::Duration::from_secs(5))
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

/// Writes a Kubernetes secret volume's layout: `dir/..data -> ..vN` (swapped atomically) and
/// `dir/tls.crt -> ..data/tls.crt`, `dir/tls.key -> ..data/tls.key`.
pub fn secret_version(dir: &Path, version: u32, cert: &Path, key: &Path) {
    let versioned = dir.join(format!("..v{version}"));
    std::fs::create_dir_all(&versioned).unwrap();
    std::fs::copy(cert, versioned.join("tls.crt")).unwrap();
    std::fs::copy(key, versioned.join("tls.key")).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..v{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key"] {
        let link = dir.join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
}
