//! The TLS files, without sockets: every way a certificate, key or CA file can be unusable is
//! refused with the variable and the file named, and the gRPC certificate's reload takes a good
//! new pair, ignores an unchanged one and keeps the old one over a bad one; peer TLS names each
//! peer by its address, or by SLUICE_PEER_TLS_SAN.

use std::path::{Path, PathBuf};

use sluice::tls::{ClientTls, KeyPairFiles, PeerTls, PeerTlsFiles, PemFile, ServerTls, TlsError};
use sluice::tls::{GrpcTlsFiles, XdsTlsFiles};
use sluice_test_support::pki;

fn server(cert: &Path, key: &Path, ca: Option<&Path>) -> Result<ServerTls, TlsError> {
    ServerTls::load(&GrpcTlsFiles {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        client_ca: ca.map(Path::to_path_buf),
        client_san: None,
    })
}

fn message(r: Result<ServerTls, TlsError>) -> String {
    r.expect_err("refused").to_string()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn good_files_load() {
    let pki = pki::TestPki::new();
    let leaf = pki.leaf("server", &["localhost", "127.0.0.1"]);
    server(&leaf.cert, &leaf.key, None).expect("server TLS");
    server(&leaf.cert, &leaf.key, Some(&pki.ca)).expect("server mTLS");
    let client = ClientTls::load(&XdsTlsFiles {
        client_identity: Some((leaf.cert.clone(), leaf.key.clone())),
        server_ca: Some(pki.ca.clone()),
        server_name: Some("localhost".into()),
    })
    .expect("xDS client TLS");
    // The key never shows in logs.
    let debug = format!("{client:?}");
    assert!(!debug.contains("PRIVATE"), "{debug}");
}

#[test]
fn unusable_files_are_refused_naming_the_variable_and_the_file() {
    let pki = pki::TestPki::new();
    let leaf = pki.leaf("server", &["localhost"]);
    let other = pki.leaf("other", &["localhost"]);
    let dir = pki.dir();
    let missing = dir.join("missing.pem");
    let text = write(dir, "text.pem", "hello\n");
    let broken = write(
        dir,
        "broken.pem",
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    );
    let garbage_der = write(
        dir,
        "garbage.pem",
        "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
    );

    let m = message(server(&missing, &leaf.key, None));
    assert!(
        m.starts_with(&format!(
            "GRPC_SERVER_TLS_CERT={}: cannot read the file",
            missing.display()
        )),
        "{m}"
    );
    let m = message(server(&text, &leaf.key, None));
    assert_eq!(
        m,
        format!(
            "GRPC_SERVER_TLS_CERT={}: no PEM certificate (BEGIN CERTIFICATE) in the file",
            text.display()
        )
    );
    let m = message(server(&broken, &leaf.key, None));
    assert!(m.contains("broken.pem: not valid PEM"), "{m}");
    let m = message(server(&garbage_der, &leaf.key, None));
    assert!(
        m.contains("garbage.pem: not a valid X.509 certificate"),
        "{m}"
    );
    // A certificate where the key should be.
    let m = message(server(&leaf.cert, &leaf.cert, None));
    assert!(
        m.starts_with(&format!(
            "GRPC_SERVER_TLS_KEY={}: no PEM private key",
            leaf.cert.display()
        )),
        "{m}"
    );
    let m = message(server(&leaf.cert, &other.key, None));
    assert_eq!(
        m,
        format!(
            "GRPC_SERVER_TLS_KEY={}: the private key does not match the certificate in \
             GRPC_SERVER_TLS_CERT={}",
            other.key.display(),
            leaf.cert.display()
        )
    );
    let m = message(server(&leaf.cert, &leaf.key, Some(&text)));
    assert!(m.starts_with("GRPC_CLIENT_TLS_CACERT="), "{m}");
    let m = message(server(&leaf.cert, &leaf.key, Some(&missing)));
    assert!(m.starts_with("GRPC_CLIENT_TLS_CACERT="), "{m}");

    let client = |cert: &Path, key: &Path, ca: &Path| {
        ClientTls::load(&XdsTlsFiles {
            client_identity: Some((cert.to_path_buf(), key.to_path_buf())),
            server_ca: Some(ca.to_path_buf()),
            server_name: None,
        })
        .expect_err("refused")
        .to_string()
    };
    assert!(
        client(&leaf.cert, &leaf.key, &broken).starts_with("CONFIG_GRPC_XDS_SERVER_TLS_CACERT="),
    );
    assert!(client(&text, &leaf.key, &pki.ca).starts_with("CONFIG_GRPC_XDS_CLIENT_TLS_CERT="));
    assert!(client(&leaf.cert, &other.key, &pki.ca).starts_with("CONFIG_GRPC_XDS_CLIENT_TLS_KEY="),);
}

#[test]
fn reload_takes_a_good_new_pair_and_keeps_the_old_one_over_a_bad_one() {
    let pki = pki::TestPki::new();
    let first = pki.leaf("first", &["localhost"]);
    let second = pki.leaf("second", &["localhost"]);
    let dir = pki.dir();
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    std::fs::copy(&first.cert, &cert).unwrap();
    std::fs::copy(&first.key, &key).unwrap();
    let tls = server(&cert, &key, None).unwrap();
    assert!(!tls.reload_if_changed().unwrap(), "nothing changed");

    // Half-way through a rotation: new certificate, old key. Refused; the old pair serves.
    std::fs::copy(&second.cert, &cert).unwrap();
    let e = tls.reload_if_changed().expect_err("mismatch");
    assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e}");
    // The key arrives: taken.
    std::fs::copy(&second.key, &key).unwrap();
    assert!(tls.reload_if_changed().unwrap());
    assert!(!tls.reload_if_changed().unwrap());

    // A file gone (mid-swap) or emptied is refused, and the certificate stays.
    std::fs::remove_file(&key).unwrap();
    assert!(matches!(
        tls.reload_if_changed(),
        Err(TlsError::Read { .. })
    ));
    std::fs::write(&key, "").unwrap();
    assert!(matches!(
        tls.reload_if_changed(),
        Err(TlsError::Invalid { .. })
    ));
    std::fs::copy(&second.key, &key).unwrap();
    assert!(
        !tls.reload_if_changed().unwrap(),
        "back to the serving pair"
    );
}

fn peer_files(leaf: &pki::Leaf, ca: &Path, san: Option<&str>) -> PeerTlsFiles {
    PeerTlsFiles {
        identity: KeyPairFiles {
            cert: PemFile::new("SLUICE_PEER_TLS_CERT", &leaf.cert),
            key: PemFile::new("SLUICE_PEER_TLS_KEY", &leaf.key),
        },
        ca: PemFile::new("SLUICE_PEER_TLS_CACERT", ca),
        san: san.map(str::to_owned),
    }
}

#[test]
fn peer_tls_verifies_each_peer_by_its_address_unless_a_san_is_set() {
    let pki = pki::TestPki::new();
    let leaf = pki.leaf("peer", &["10.0.0.7"]);
    let by_address = PeerTls::load(&peer_files(&leaf, &pki.ca, None)).expect("peer TLS");
    for addr in [
        "10.0.0.7:8082",
        "[fd00::7]:8082",
        "sluice-0.sluice-peers:8082",
    ] {
        by_address.connector(addr).expect(addr);
    }
    let e = by_address
        .connector("not a host:8082")
        .unwrap_err()
        .to_string();
    assert!(e.contains("set SLUICE_PEER_TLS_SAN"), "{e}");
    // With a SAN, every peer is verified against it, whatever its address.
    let named = PeerTls::load(&peer_files(&leaf, &pki.ca, Some("peers.test"))).unwrap();
    named
        .connector("not a host:8082")
        .expect("the SAN is verified");
    let debug = format!("{named:?}");
    assert!(!debug.contains("PRIVATE"), "{debug}");

    // The files are checked like the gRPC listener's, naming the peer variables.
    let other = pki.leaf("other", &["10.0.0.7"]);
    let mut mismatched = peer_files(&leaf, &pki.ca, None);
    mismatched.identity.key = PemFile::new("SLUICE_PEER_TLS_KEY", &other.key);
    let e = PeerTls::load(&mismatched).unwrap_err().to_string();
    assert!(e.starts_with("SLUICE_PEER_TLS_KEY="), "{e}");
    let e = PeerTls::load(&peer_files(&leaf, &leaf.key, None))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("SLUICE_PEER_TLS_CACERT="), "{e}");
}
