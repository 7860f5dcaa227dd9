//! SLUICE_PEER_TLS and its files: mutual TLS between the peers of a cluster (Sluice only; the
//! Go service has no peers). Validated into [`crate::tls::PeerTlsFiles`], whose files
//! [`crate::tls::PeerTls::load`] reads and checks before any port is bound.
//!
//! Refused rather than ignored, since each would leave the peer port open while the operator
//! believes it closed: TLS without a CA (peer TLS is always mutual), any SLUICE_PEER_TLS_* file
//! or name without SLUICE_PEER_TLS=true, and SLUICE_PEER_TLS without PEERS or PEERS_DNS.

use std::path::PathBuf;

use clap::ArgAction;

use super::parse::{Named, non_empty, parse_go_bool};
use super::tls::tls_name;
use super::{SettingsError, invalid};
use crate::tls::{KeyPairFiles, PeerTlsFiles, PemFile};

/// Raw SLUICE_PEER_TLS* flags.
#[derive(Clone, Debug, clap::Args)]
pub struct PeerTlsArgs {
    /// Mutual TLS on the peer port and on every call to a peer: each side presents
    /// SLUICE_PEER_TLS_CERT and must show a certificate from SLUICE_PEER_TLS_CACERT, so only
    /// holders of one can send hits. The files are re-read when they change.
    #[arg(
        long,
        env = "SLUICE_PEER_TLS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Peer cluster"
    )]
    pub peer_tls: bool,
    /// PEM certificate chain of this node, served on the peer port and presented as the client
    /// certificate of its calls to peers (SLUICE_PEER_TLS).
    #[arg(long, env = "SLUICE_PEER_TLS_CERT", help_heading = "Peer cluster")]
    pub peer_tls_cert: Option<String>,
    /// PEM private key of SLUICE_PEER_TLS_CERT (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "SLUICE_PEER_TLS_KEY", help_heading = "Peer cluster")]
    pub peer_tls_key: Option<String>,
    /// PEM CA certificate(s) every peer's certificate must chain to, server and client alike.
    #[arg(long, env = "SLUICE_PEER_TLS_CACERT", help_heading = "Peer cluster")]
    pub peer_tls_cacert: Option<String>,
    /// The DNS name or IP address every peer's certificate must carry (e.g. the headless
    /// Service's name on a certificate all replicas share), checked both ways. Unset: a peer's
    /// certificate is checked against the host of its address (an IP SAN for PEERS_DNS), and
    /// any client certificate from the CA is taken.
    #[arg(long, env = "SLUICE_PEER_TLS_SAN", help_heading = "Peer cluster")]
    pub peer_tls_san: Option<String>,
}

impl PeerTlsArgs {
    /// `cluster`: PEERS or PEERS_DNS is set, so there is a peer port to protect.
    pub fn validate(&self, cluster: bool) -> Result<Option<PeerTlsFiles>, SettingsError> {
        let files = [
            Named::new("SLUICE_PEER_TLS_CERT", self.peer_tls_cert.as_deref()),
            Named::new("SLUICE_PEER_TLS_KEY", self.peer_tls_key.as_deref()),
            Named::new("SLUICE_PEER_TLS_CACERT", self.peer_tls_cacert.as_deref()),
            Named::new("SLUICE_PEER_TLS_SAN", self.peer_tls_san.as_deref()),
        ];
        if !self.peer_tls {
            let set = files
                .iter()
                .find_map(|f| Some(Named::new(f.var, non_empty(f.value)?)));
            return match set {
                None => Ok(None),
                Some(set) => Err(invalid(
                    set.var,
                    set.value,
                    "peer TLS is off (SLUICE_PEER_TLS is false), so the peer port would serve \
                     in clear; set SLUICE_PEER_TLS=true, or unset this",
                )),
            };
        }
        if !cluster {
            return Err(invalid(
                "SLUICE_PEER_TLS",
                true,
                "needs PEERS or PEERS_DNS: without peers there is no peer port to protect",
            ));
        }
        let required = |var: &'static str, value: Option<&str>, why: &str| {
            non_empty(value)
                .map(|path| PemFile::new(var, PathBuf::from(path)))
                .ok_or_else(|| invalid(var, "", format!("must name a PEM file {why}")))
        };
        let on = "when SLUICE_PEER_TLS is true";
        Ok(Some(PeerTlsFiles {
            identity: KeyPairFiles {
                cert: required("SLUICE_PEER_TLS_CERT", self.peer_tls_cert.as_deref(), on)?,
                key: required("SLUICE_PEER_TLS_KEY", self.peer_tls_key.as_deref(), on)?,
            },
            ca: required(
                "SLUICE_PEER_TLS_CACERT",
                self.peer_tls_cacert.as_deref(),
                "when SLUICE_PEER_TLS is true: peer TLS is always mutual, so that only peers \
                 with a certificate from this CA can send hits",
            )?,
            san: non_empty(self.peer_tls_san.as_deref())
                .map(|san| tls_name("SLUICE_PEER_TLS_SAN", san))
                .transpose()?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::settings::tests::settings;
    use crate::tls::{KeyPairFiles, PeerTlsFiles, PemFile};

    fn error(args: &[&str]) -> String {
        settings(args).expect_err("refused").to_string()
    }

    const PEERS: &[&str] = &[
        "--peers",
        "a:8082,b:8082",
        "--peer-advertise-address",
        "a:8082",
    ];
    const FILES: &[&str] = &[
        "--peer-tls-cert",
        "/tls/tls.crt",
        "--peer-tls-key",
        "/tls/tls.key",
        "--peer-tls-cacert",
        "/tls/ca.crt",
    ];

    #[test]
    fn off_by_default() {
        assert_eq!(settings(PEERS).unwrap().peer_tls, None);
    }

    #[test]
    fn on_names_the_files_and_the_san() {
        let args = [
            PEERS,
            &["--peer-tls"],
            FILES,
            &["--peer-tls-san", "peers.ns.svc"],
        ]
        .concat();
        let expected = PeerTlsFiles {
            identity: KeyPairFiles {
                cert: PemFile::new("SLUICE_PEER_TLS_CERT", "/tls/tls.crt"),
                key: PemFile::new("SLUICE_PEER_TLS_KEY", "/tls/tls.key"),
            },
            ca: PemFile::new("SLUICE_PEER_TLS_CACERT", "/tls/ca.crt"),
            san: Some("peers.ns.svc".into()),
        };
        assert_eq!(settings(&args).unwrap().peer_tls, Some(expected));
        // Go-style booleans; no SAN means each peer's address is verified.
        let args = [PEERS, &["--peer-tls=1"], FILES].concat();
        assert_eq!(settings(&args).unwrap().peer_tls.unwrap().san, None);
    }

    #[test]
    fn every_file_is_required_and_the_ca_above_all() {
        for missing in ["--peer-tls-cert", "--peer-tls-key", "--peer-tls-cacert"] {
            let mut args = [PEERS, &["--peer-tls"], FILES].concat();
            let at = args.iter().position(|a| *a == missing).unwrap();
            args.drain(at..at + 2);
            let var = missing
                .trim_start_matches("--")
                .replace('-', "_")
                .to_uppercase();
            let e = error(&args);
            assert!(
                e.starts_with(&format!("SLUICE_{var}=: must name a PEM file")),
                "{e}"
            );
        }
        let e = error(
            &[
                PEERS,
                &["--peer-tls", "--peer-tls-cert", "c", "--peer-tls-key", "k"],
            ]
            .concat(),
        );
        assert!(e.contains("always mutual"), "{e}");
    }

    #[test]
    fn files_without_tls_are_refused_rather_than_ignored() {
        let e = error(&[PEERS, FILES].concat());
        assert_eq!(
            e,
            "SLUICE_PEER_TLS_CERT=/tls/tls.crt: peer TLS is off (SLUICE_PEER_TLS is false), so \
             the peer port would serve in clear; set SLUICE_PEER_TLS=true, or unset this"
        );
        let e = error(&[PEERS, &["--peer-tls=false", "--peer-tls-san", "x"]].concat());
        assert!(
            e.starts_with("SLUICE_PEER_TLS_SAN=x: peer TLS is off"),
            "{e}"
        );
    }

    #[test]
    fn tls_without_peers_is_refused() {
        let e = error(&[&["--peer-tls"], FILES].concat());
        assert!(
            e.starts_with("SLUICE_PEER_TLS=true: needs PEERS or PEERS_DNS"),
            "{e}"
        );
    }

    #[test]
    fn a_san_must_be_a_dns_name_or_an_ip() {
        let e = error(
            &[
                PEERS,
                &["--peer-tls"],
                FILES,
                &["--peer-tls-san", "not a name"],
            ]
            .concat(),
        );
        assert_eq!(
            e,
            "SLUICE_PEER_TLS_SAN=not a name: expected a DNS name or an IP address"
        );
        let args = [
            PEERS,
            &["--peer-tls"],
            FILES,
            &["--peer-tls-san", "10.0.0.7"],
        ]
        .concat();
        assert_eq!(
            settings(&args).unwrap().peer_tls.unwrap().san.as_deref(),
            Some("10.0.0.7")
        );
    }
}
