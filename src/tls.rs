//! TLS material, from PEM files to what the listeners and clients use: certificates and keys
//! read and checked once, before any port is bound (errors name the variable and the file);
//! the gRPC and peer listeners' certificates, re-read when their files change, as
//! [`TlsAcceptor`]s (the handshake itself happens in [`crate::net`], bounded like every
//! listener's work); the peer cluster's mutual TLS ([`PeerTls`]: one reloading certificate for
//! the peer listener and the calls to other peers); and the clients' trust and identity
//! ([`ClientTls`]: xDS, Redis, the OTLP exporters), turned into tonic's client config or a
//! rustls one.
//!
//! rustls on ring only. The pieces of tonic here are [`ClientTls::tonic_config`], shared by the
//! xDS client and OTLP/gRPC, and [`PeerConnector`], the peer client's dialer.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ParsedCertificate, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// A file that cannot be used. Each message names the variable and the file, since the
/// operator set them through the environment.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{var}={}: cannot read the file: {source}", .path.display())]
    Read {
        var: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{var}={}: {reason}", .path.display())]
    Invalid {
        var: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error(
        "{key_var}={}: the private key does not match the certificate in {cert_var}={}",
        .key.display(),
        .cert.display()
    )]
    KeyMismatch {
        cert_var: &'static str,
        cert: PathBuf,
        key_var: &'static str,
        key: PathBuf,
    },
    /// No certificate was given to trust and the system's trust store is empty or unreadable.
    #[error("no CA certificate given and none found in the system's trust store: {0}")]
    NoSystemRoots(String),
    /// A client config could not be built from files that were checked at start-up.
    #[error("TLS client setup: {0}")]
    ClientSetup(String),
}

/// A file named by a variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PemFile {
    pub var: &'static str,
    pub path: PathBuf,
}

impl PemFile {
    pub fn new(var: &'static str, path: impl Into<PathBuf>) -> Self {
        PemFile {
            var,
            path: path.into(),
        }
    }

    fn read(&self) -> Result<Vec<u8>, TlsError> {
        std::fs::read(&self.path).map_err(|source| TlsError::Read {
            var: self.var,
            path: self.path.clone(),
            source,
        })
    }

    fn invalid(&self, reason: impl Into<String>) -> TlsError {
        TlsError::Invalid {
            var: self.var,
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    /// Every certificate in `pem`, in order (leaf first, for a chain); at least one, and the
    /// first must parse as an X.509 certificate.
    fn certificates(&self, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.invalid(format!("not valid PEM: {e}")))?;
        let Some(first) = certs.first() else {
            return Err(self.invalid("no PEM certificate (BEGIN CERTIFICATE) in the file"));
        };
        ParsedCertificate::try_from(first)
            .map_err(|e| self.invalid(format!("not a valid X.509 certificate: {e}")))?;
        Ok(certs)
    }

    fn private_key(&self, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
            rustls::pki_types::pem::Error::NoItemsFound => self.invalid(
                "no PEM private key (PKCS#8, PKCS#1 or SEC1 \"BEGIN ... PRIVATE KEY\") in the file",
            ),
            e => self.invalid(format!("not valid PEM: {e}")),
        })
    }

    /// The CA certificates in `pem`, as trust anchors.
    fn roots(&self, pem: &[u8]) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in self.certificates(pem)? {
            roots
                .add(cert)
                .map_err(|e| self.invalid(format!("not a usable CA certificate: {e}")))?;
        }
        Ok(roots)
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and its private key, from two files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPairFiles {
    pub cert: PemFile,
    pub key: PemFile,
}

/// What was read from a [`KeyPairFiles`]: the bytes (to notice changes) and the usable key.
struct LoadedPair {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    certified: Arc<CertifiedKey>,
}

impl KeyPairFiles {
    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
        Ok((self.cert.read()?, self.key.read()?))
    }

    /// Parses and cross-checks the pair: the certificate parses, the key is one ring can sign
    /// with, and the key is the certificate's.
    fn certified(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
        let chain = self.cert.certificates(cert_pem)?;
        let key = self.key.private_key(key_pem)?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| self.key.invalid(format!("unsupported private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signing);
        match certified.keys_match() {
            Ok(()) => Ok(certified),
            // ring could not derive the key's public half; the handshake will tell.
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
                Ok(certified)
            }
            Err(_) => Err(TlsError::KeyMismatch {
                cert_var: self.cert.var,
                cert: self.cert.path.clone(),
                key_var: self.key.var,
                key: self.key.path.clone(),
            }),
        }
    }

    fn load(&self) -> Result<LoadedPair, TlsError> {
        let (cert_pem, key_pem) = self.read()?;
        let certified = Arc::new(self.certified(&cert_pem, &key_pem)?);
        Ok(LoadedPair {
            cert_pem,
            key_pem,
            certified,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The listeners: gRPC, and the peer port's server side.

/// GRPC_SERVER_USE_TLS's files and name, validated by the settings and read by
/// [`ServerTls::load`], before any port is bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcTlsFiles {
    /// GRPC_SERVER_TLS_CERT.
    pub cert: PathBuf,
    /// GRPC_SERVER_TLS_KEY.
    pub key: PathBuf,
    /// GRPC_CLIENT_TLS_CACERT: client certificates are required and verified against it.
    pub client_ca: Option<PathBuf>,
    /// GRPC_CLIENT_TLS_SAN: a name the client certificate must carry (only with `client_ca`).
    pub client_san: Option<String>,
}

/// CONFIG_GRPC_XDS_SERVER_USE_TLS's files and name (or an `https://` server URL's), read by
/// [`ClientTls::load`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdsTlsFiles {
    /// CONFIG_GRPC_XDS_CLIENT_TLS_CERT and _KEY: the certificate Sluice presents, if any.
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// CONFIG_GRPC_XDS_SERVER_TLS_CACERT; `None` trusts the system's roots.
    pub server_ca: Option<PathBuf>,
    /// CONFIG_GRPC_XDS_SERVER_TLS_SAN: the name the server's certificate is verified against;
    /// `None` verifies the URL's host.
    pub server_name: Option<String>,
}

/// A listener's TLS (the gRPC port's, or the peer port's through [`PeerTls`]): a rustls server
/// config whose certificate is re-read from disk by [`ServerTls::watch`], and, with a client CA
/// (GRPC_CLIENT_TLS_CACERT, SLUICE_PEER_TLS_CACERT), a required client certificate.
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<ServerConfig>,
    cert: Arc<ReloadingCert>,
    /// Which listener the log lines are about: "gRPC" or "peer".
    label: &'static str,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("listener", &self.label)
            .field("files", &self.cert.files)
            .field("alpn", &self.config.alpn_protocols)
            .finish()
    }
}

impl ServerTls {
    /// Reads and checks every file now, so a bad one stops start-up before a port is bound.
    pub fn load(settings: &GrpcTlsFiles) -> Result<Self, TlsError> {
        let cert = Arc::new(ReloadingCert::load(KeyPairFiles {
            cert: PemFile::new("GRPC_SERVER_TLS_CERT", &settings.cert),
            key: PemFile::new("GRPC_SERVER_TLS_KEY", &settings.key),
        })?);
        let clients = match &settings.client_ca {
            None => None,
            Some(ca) => {
                let ca = PemFile::new("GRPC_CLIENT_TLS_CACERT", ca);
                let roots = Arc::new(ca.roots(&ca.read()?)?);
                let san = settings.client_san.as_deref();
                Some(client_verifier(
                    &ca,
                    roots,
                    san.map(|san| ("GRPC_CLIENT_TLS_SAN", san)),
                )?)
            }
        };
        Self::build("gRPC", cert, clients)
    }

    /// The server config around `cert`; `clients` verifies the required client certificates,
    /// `None` asks for none.
    fn build(
        label: &'static str,
        cert: Arc<ReloadingCert>,
        clients: Option<Arc<dyn ClientCertVerifier>>,
    ) -> Result<Self, TlsError> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| cert.files.cert.invalid(format!("TLS setup: {e}")))?;
        let builder = match clients {
            None => builder.with_no_client_auth(),
            Some(verifier) => builder.with_client_cert_verifier(verifier),
        };
        let mut config = builder.with_cert_resolver(cert.clone());
        // gRPC is HTTP/2; a client that offers ALPN must be able to agree on h2.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(ServerTls {
            config: Arc::new(config),
            cert,
            label,
        })
    }

    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.clone())
    }

    /// Re-reads the certificate and key if either file changed (contents compared, so a
    /// Kubernetes symlink swap counts). `Ok(true)`: new certificate in use for new
    /// connections; `Ok(false)`: unchanged; `Err`: the new files are unusable and the previous
    /// certificate keeps serving.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        self.cert.reload_if_changed()
    }

    /// Polls the files every `poll` until the guard drops. A rejected change is logged at
    /// warn once (not on every poll) and the previous certificate keeps serving.
    ///
    /// Must be called within a tokio runtime.
    pub fn watch(&self, poll: Duration) -> TaskGuard {
        let (cert, label) = (self.cert.clone(), self.label);
        TaskGuard(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(poll);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                // Reading two small files is quick; a blocking thread would cost more.
                match cert.reload_if_changed() {
                    Ok(false) => {}
                    Ok(true) => tracing::info!(
                        cert = %cert.files.cert.path.display(),
                        key = %cert.files.key.path.display(),
                        "{label} TLS certificate reloaded; new connections use it"
                    ),
                    Err(e) => {
                        let message = e.to_string();
                        let mut state = cert.state.lock().unwrap_or_else(|p| p.into_inner());
                        if state.last_error.as_deref() != Some(message.as_str()) {
                            tracing::warn!(
                                error = %message,
                                "{label} TLS certificate not reloaded; the previous one keeps serving"
                            );
                            state.last_error = Some(message);
                        }
                    }
                }
            }
        }))
    }
}

/// Aborts its task when dropped.
#[derive(Debug)]
#[must_use = "the task stops when the guard is dropped"]
pub struct TaskGuard(JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the poller last read.
struct WatchState {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    /// The last rejection logged, so an unchanged bad file is not logged every poll.
    last_error: Option<String>,
}

/// The certificate every new handshake gets; swapped whole, so a handshake never sees a new
/// certificate with an old key.
struct ReloadingCert {
    current: ArcSwap<CertifiedKey>,
    files: KeyPairFiles,
    state: Mutex<WatchState>,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("files", &self.files)
            .finish()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl ResolvesClientCert for ReloadingCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl ReloadingCert {
    /// Reads and checks the pair now (start-up); later changes are picked up by
    /// [`Self::reload_if_changed`].
    fn load(files: KeyPairFiles) -> Result<Self, TlsError> {
        let loaded = files.load()?;
        Ok(ReloadingCert {
            current: ArcSwap::new(loaded.certified),
            files,
            state: Mutex::new(WatchState {
                cert_pem: loaded.cert_pem,
                key_pem: loaded.key_pem,
                last_error: None,
            }),
        })
    }

    fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let (cert_pem, key_pem) = self.files.read()?;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.cert_pem == cert_pem && state.key_pem == key_pem {
            // Back to the serving files (a half-written swap finished): forget the rejection.
            state.last_error = None;
            return Ok(false);
        }
        let certified = self.files.certified(&cert_pem, &key_pem)?;
        self.current.store(Arc::new(certified));
        *state = WatchState {
            cert_pem,
            key_pem,
            last_error: None,
        };
        Ok(true)
    }
}

/// Requires a client certificate that chains to `roots`, read from `ca` (only that CA: the Go
/// service adds the system's roots too, which would let any publicly issued client certificate
/// in) and, with `san` (its variable and value), is valid for that name.
fn client_verifier(
    ca: &PemFile,
    roots: Arc<RootCertStore>,
    san: Option<(&'static str, &str)>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| ca.invalid(format!("cannot verify clients with it: {e}")))?;
    let Some((var, san)) = san else {
        return Ok(verifier);
    };
    let san = ServerName::try_from(san.to_owned())
        .map_err(|_| PemFile::new(var, san).invalid("expected a DNS name or an IP address"))?;
    Ok(Arc::new(SanVerifier {
        inner: verifier,
        san,
    }))
}

/// GRPC_CLIENT_TLS_SAN or SLUICE_PEER_TLS_SAN: the chain is verified by `inner`, then the
/// end-entity certificate must be valid for `san` (a DNS or IP subject alternative name), as
/// the Go service's `x509.VerifyOptions{DNSName}` checks.
#[derive(Debug)]
struct SanVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    san: ServerName<'static>,
}

impl ClientCertVerifier for SanVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, &self.san)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

// ---------------------------------------------------------------------------------------------
// The peer port: mutual TLS both ways.

/// SLUICE_PEER_TLS's files and name, validated by the settings and read by [`PeerTls::load`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTlsFiles {
    /// SLUICE_PEER_TLS_CERT and SLUICE_PEER_TLS_KEY: this node's certificate, presented as the
    /// peer listener's and as the client certificate of its calls to other peers.
    pub identity: KeyPairFiles,
    /// SLUICE_PEER_TLS_CACERT: the CA every peer's certificate must chain to, both ways.
    pub ca: PemFile,
    /// SLUICE_PEER_TLS_SAN: the name every peer's certificate must carry, both ways; `None`
    /// verifies each peer's certificate against the host of its address (an IP SAN, for
    /// PEERS_DNS) and takes any client certificate from the CA.
    pub san: Option<String>,
}

/// The peer cluster's TLS, loaded: the listener's side ([`Self::server`]) and the client's
/// ([`Self::connector`]) share one certificate, so the one watcher the listener starts reloads
/// both: new connections, accepted or made, use the new certificate.
///
/// Both sides always verify: peer TLS is mutual, since the point is that only a holder of a
/// certificate from SLUICE_PEER_TLS_CACERT can send hits.
#[derive(Clone)]
pub struct PeerTls {
    server: ServerTls,
    client: Arc<rustls::ClientConfig>,
    san: Option<ServerName<'static>>,
}

impl fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerTls")
            .field("server", &self.server)
            .field("san", &self.san)
            .finish()
    }
}

impl PeerTls {
    /// Reads and checks every file now, so a bad one stops start-up before a port is bound.
    pub fn load(files: &PeerTlsFiles) -> Result<Self, TlsError> {
        let san = match &files.san {
            None => None,
            Some(name) => Some(ServerName::try_from(name.clone()).map_err(|_| {
                PemFile::new("SLUICE_PEER_TLS_SAN", name)
                    .invalid("expected a DNS name or an IP address")
            })?),
        };
        let cert = Arc::new(ReloadingCert::load(files.identity.clone())?);
        // One CA both ways: it vouches for the peers that call and for the peers called.
        let roots = Arc::new(files.ca.roots(&files.ca.read()?)?);
        let clients = client_verifier(
            &files.ca,
            roots.clone(),
            files.san.as_deref().map(|san| ("SLUICE_PEER_TLS_SAN", san)),
        )?;
        let server = ServerTls::build("peer", cert.clone(), Some(clients))?;
        let mut client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| files.ca.invalid(format!("TLS setup: {e}")))?
            .with_root_certificates(roots)
            .with_client_cert_resolver(cert);
        client.alpn_protocols = vec![b"h2".to_vec()];
        // A resumed session skips the client certificate, and the peer would go on seeing the
        // one the session began with: every new connection does a full handshake instead, so
        // it presents the certificate as last reloaded (peer connections are long-lived HTTP/2,
        // so this costs a handshake per reconnect).
        client.resumption = rustls::client::Resumption::disabled();
        Ok(PeerTls {
            server,
            client: Arc::new(client),
            san,
        })
    }

    /// The peer listener's side: its acceptor, and the watcher that reloads the certificate
    /// (for both sides).
    pub fn server(&self) -> &ServerTls {
        &self.server
    }

    /// What tonic dials the peer at `addr` (`host:port`) with: TCP, then a TLS handshake that
    /// presents this node's current certificate and verifies the peer's against
    /// SLUICE_PEER_TLS_SAN, or else against `addr`'s host.
    pub fn connector(&self, addr: &str) -> Result<PeerConnector, TlsError> {
        let name = match &self.san {
            Some(san) => san.clone(),
            None => {
                let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                ServerName::try_from(host.to_owned()).map_err(|_| {
                    TlsError::ClientSetup(format!(
                        "peer {addr}: {host} is neither a DNS name nor an IP address, so its \
                         certificate cannot be verified; set SLUICE_PEER_TLS_SAN"
                    ))
                })?
            }
        };
        Ok(PeerConnector {
            connector: tokio_rustls::TlsConnector::from(self.client.clone()),
            name,
        })
    }
}

/// Dials one peer over TLS, for `tonic::transport::Endpoint::connect_with_connector_lazy`: the
/// endpoint's `connect_timeout` bounds the TCP connect and the handshake together.
#[derive(Clone)]
pub struct PeerConnector {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl fmt::Debug for PeerConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerConnector")
            .field("name", &self.name)
            .finish()
    }
}

type PeerStream = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

impl tonic::codegen::Service<tonic::codegen::http::Uri> for PeerConnector {
    type Response = PeerStream;
    type Error = io::Error;
    type Future = tonic::codegen::BoxFuture<PeerStream, io::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), io::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: tonic::codegen::http::Uri) -> Self::Future {
        let (connector, name) = (self.connector.clone(), self.name.clone());
        Box::pin(async move {
            let authority = uri.authority().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("no host:port in {uri}"),
                )
            })?;
            let tcp = tokio::net::TcpStream::connect(authority.as_str()).await?;
            // As on the listeners: no Nagle delay before a small call's last frame.
            tcp.set_nodelay(true)?;
            let tls = connector.connect(name, tcp).await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The clients: xDS, Redis and the OTLP exporters.

/// A TLS client's files (xDS, Redis, OTLP), read and checked at start-up: whom to trust, what
/// name to expect and which certificate to present. The default trusts the system's roots,
/// expects the URL's host and presents no certificate.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// The CA to trust (CONFIG_GRPC_XDS_SERVER_TLS_CACERT, REDIS_TLS_CACERT,
    /// OTEL_EXPORTER_OTLP_CERTIFICATE), PEM; `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// The client certificate chain and key (CONFIG_GRPC_XDS_CLIENT_TLS_CERT and _KEY, ...), PEM.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// CONFIG_GRPC_XDS_SERVER_TLS_SAN; `None`: the URL's host.
    pub server_name: Option<String>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("ClientTls")
            .field("custom_ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity_pem.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl ClientTls {
    pub fn load(settings: &XdsTlsFiles) -> Result<Self, TlsError> {
        Self::from_files(
            settings
                .server_ca
                .as_ref()
                .map(|path| PemFile::new("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path)),
            settings
                .client_identity
                .as_ref()
                .map(|(cert, key)| KeyPairFiles {
                    cert: PemFile::new("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert),
                    key: PemFile::new("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key),
                }),
            settings.server_name.clone(),
        )
    }

    /// Reads and checks a client's files, whichever client it is (xDS, Redis): the CA must
    /// hold usable trust anchors, and the key must be the certificate's.
    pub fn from_files(
        ca: Option<PemFile>,
        identity: Option<KeyPairFiles>,
        server_name: Option<String>,
    ) -> Result<Self, TlsError> {
        let ca_pem = match ca {
            None => None,
            Some(ca) => {
                let pem = ca.read()?;
                ca.roots(&pem)?;
                Some(pem)
            }
        };
        let identity_pem = match identity {
            None => None,
            Some(files) => {
                let loaded = files.load()?;
                Some((loaded.cert_pem, loaded.key_pem))
            }
        };
        Ok(ClientTls {
            ca_pem,
            identity_pem,
            server_name,
        })
    }
    /// tonic's client config, for the xDS client and OTLP/gRPC. The trust is `ca_pem` alone
    /// when set (the Go service adds the system's roots to a CA it is given), else the
    /// system's roots, loaded when the channel is built.
    pub(crate) fn tonic_config(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        // A server that negotiates no ALPN still gets HTTP/2: it is gRPC either way.
        let mut config = ClientTlsConfig::new().assume_http2(true);
        config = match &self.ca_pem {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity_pem {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        config
    }

    /// A rustls client config with the same trust and identity as [`Self::tonic_config`], for
    /// clients that are not tonic (OTLP/HTTP). ALPN is left to the connector. `server_name`
    /// is not applied here: it belongs to the connector too.
    pub(crate) fn rustls_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let setup = |e: &dyn fmt::Display| TlsError::ClientSetup(e.to_string());
        let roots = self.roots()?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| setup(&e))?
            .with_root_certificates(roots);
        match &self.identity_pem {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| setup(&e))?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| setup(&e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| setup(&e))
            }
        }
    }
}

impl ClientTls {
    /// The roots a server's chain must end at: `ca_pem`'s alone when set, else the system's.
    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let setup = |e: &dyn fmt::Display| TlsError::ClientSetup(e.to_string());
        let mut roots = RootCertStore::empty();
        match &self.ca_pem {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    roots
                        .add(cert.map_err(|e| setup(&e))?)
                        .map_err(|e| setup(&e))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    let why = match found.errors.first() {
                        Some(e) => e.to_string(),
                        None => "no certificates".to_owned(),
                    };
                    return Err(TlsError::NoSystemRoots(why));
                }
                if !found.errors.is_empty() {
                    tracing::debug!(errors = ?found.errors, "some system CA certificates could not be read");
                }
            }
        }
        Ok(roots)
    }
}

/// A server verifier that checks the chain against `client`'s roots but accepts a certificate
/// issued for another name: MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION, as the Go service's
/// verification callback, which checks the chain and not the name, does.
pub(crate) fn any_name_verifier(
    client: &ClientTls,
) -> Result<Arc<dyn rustls::client::danger::ServerCertVerifier>, TlsError> {
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(client.roots()?),
        provider(),
    )
    .build()
    .map_err(|e| TlsError::ClientSetup(e.to_string()))?;
    Ok(Arc::new(AnyName { inner }))
}

#[derive(Debug)]
struct AnyName {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl rustls::client::danger::ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                NotValidForName | NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
