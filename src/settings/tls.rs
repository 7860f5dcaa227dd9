//! GRPC_SERVER_USE_TLS's files, and the checks every TLS setting shares (gRPC, xDS, Redis,
//! OTLP): a name a certificate can be verified against, and a client certificate that comes
//! with its key. The files themselves are read by [`crate::tls`].

use std::path::PathBuf;

use clap::ArgAction;

use super::parse::{Named, non_empty, parse_go_bool};
use super::{SettingsError, invalid};
use crate::tls::{GrpcTlsFiles, KeyPairFiles, PemFile};

/// A name a certificate can be verified against: a DNS name or an IP address.
pub(super) fn tls_name(var: &'static str, value: &str) -> Result<String, SettingsError> {
    rustls::pki_types::ServerName::try_from(value)
        .map(|_| value.to_owned())
        .map_err(|_| invalid(var, value, "expected a DNS name or an IP address"))
}

/// The gRPC listener's TLS settings, raw.
#[derive(Clone, Debug, clap::Args)]
pub struct GrpcTlsArgs {
    /// TLS on the gRPC listener, with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (both
    /// re-read when the files change, without a restart).
    #[arg(
        long,
        env = "GRPC_SERVER_USE_TLS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Listeners"
    )]
    pub grpc_server_use_tls: bool,
    /// PEM certificate chain of the gRPC listener (GRPC_SERVER_USE_TLS).
    #[arg(long, env = "GRPC_SERVER_TLS_CERT", help_heading = "Listeners")]
    pub grpc_server_tls_cert: Option<String>,
    /// PEM private key of the gRPC listener (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "GRPC_SERVER_TLS_KEY", help_heading = "Listeners")]
    pub grpc_server_tls_key: Option<String>,
    /// PEM CA certificate(s): when set, gRPC clients must present a certificate signed by one
    /// of them (mTLS).
    #[arg(long, env = "GRPC_CLIENT_TLS_CACERT", help_heading = "Listeners")]
    pub grpc_client_tls_cacert: Option<String>,
    /// With GRPC_CLIENT_TLS_CACERT: the DNS name or IP address the client certificate must
    /// carry as a subject alternative name.
    #[arg(long, env = "GRPC_CLIENT_TLS_SAN", help_heading = "Listeners")]
    pub grpc_client_tls_san: Option<String>,
}

impl GrpcTlsArgs {
    /// `None` without GRPC_SERVER_USE_TLS: as in the Go service, the file variables mean
    /// nothing without it.
    pub(super) fn validate(&self) -> Result<Option<GrpcTlsFiles>, SettingsError> {
        if !self.grpc_server_use_tls {
            return Ok(None);
        }
        grpc_server_tls(
            self.grpc_server_tls_cert.as_deref(),
            self.grpc_server_tls_key.as_deref(),
            self.grpc_client_tls_cacert.as_deref(),
            self.grpc_client_tls_san.as_deref(),
        )
        .map(Some)
    }
}

fn grpc_server_tls(
    cert: Option<&str>,
    key: Option<&str>,
    client_ca: Option<&str>,
    client_san: Option<&str>,
) -> Result<GrpcTlsFiles, SettingsError> {
    let required = |var: &'static str, value: Option<&str>| {
        non_empty(value).map(PathBuf::from).ok_or_else(|| {
            invalid(
                var,
                "",
                "must name a PEM file when GRPC_SERVER_USE_TLS is true",
            )
        })
    };
    let cert = required("GRPC_SERVER_TLS_CERT", cert)?;
    let key = required("GRPC_SERVER_TLS_KEY", key)?;
    let client_ca = non_empty(client_ca).map(PathBuf::from);
    let client_san = match non_empty(client_san) {
        None => None,
        // The Go service accepts a SAN without a CA and then checks nothing, since no client
        // certificate is asked for; a security check that silently does nothing is refused.
        Some(san) if client_ca.is_none() => {
            return Err(invalid(
                "GRPC_CLIENT_TLS_SAN",
                san,
                "needs GRPC_CLIENT_TLS_CACERT: client certificates are only asked for with it",
            ));
        }
        Some(san) => Some(tls_name("GRPC_CLIENT_TLS_SAN", san)?),
    };
    Ok(GrpcTlsFiles {
        cert,
        key,
        client_ca,
        client_san,
    })
}

/// A client certificate and its key: both files, or neither. The Go service silently connects
/// without a client certificate when only one of the two is set; that is almost certainly a typo,
/// so it stops start-up here.
pub(super) fn key_pair(
    cert: Named<&str>,
    key: Named<&str>,
) -> Result<Option<(PathBuf, PathBuf)>, SettingsError> {
    let (cert_var, key_var) = (cert.var, key.var);
    match (non_empty(Some(cert.value)), non_empty(Some(key.value))) {
        (Some(c), Some(k)) => Ok(Some((PathBuf::from(c), PathBuf::from(k)))),
        (None, None) => Ok(None),
        (Some(c), None) => Err(invalid(
            cert_var,
            c,
            format!("needs {key_var}, the certificate's private key"),
        )),
        (None, Some(k)) => Err(invalid(
            key_var,
            k,
            format!("needs {cert_var}, the certificate of this key"),
        )),
    }
}

/// [`key_pair`] as the files a TLS client reads, each named by its variable.
pub(super) fn key_pair_files(
    cert: Named<&str>,
    key: Named<&str>,
) -> Result<Option<KeyPairFiles>, SettingsError> {
    Ok(
        key_pair(cert, key)?.map(|(cert_path, key_path)| KeyPairFiles {
            cert: PemFile::new(cert.var, cert_path),
            key: PemFile::new(key.var, key_path),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, settings};
    use super::super::*;

    #[test]
    fn grpc_server_tls_names_its_files_and_checks_the_san() {
        assert_eq!(settings(&[]).unwrap().grpc_tls, None);
        // Files without GRPC_SERVER_USE_TLS are ignored, as in the Go service.
        assert_eq!(
            settings(&["--grpc-server-tls-cert", "/nowhere"])
                .unwrap()
                .grpc_tls,
            None
        );
        let tls = settings(&[
            "--grpc-server-use-tls=true",
            "--grpc-server-tls-cert",
            "/certs/tls.crt",
            "--grpc-server-tls-key",
            "/certs/tls.key",
            "--grpc-client-tls-cacert",
            "/certs/ca.crt",
            "--grpc-client-tls-san",
            "envoy.example",
        ])
        .unwrap()
        .grpc_tls;
        assert_eq!(
            tls,
            Some(GrpcTlsFiles {
                cert: "/certs/tls.crt".into(),
                key: "/certs/tls.key".into(),
                client_ca: Some("/certs/ca.crt".into()),
                client_san: Some("envoy.example".into()),
            })
        );
        assert_eq!(
            error(&["--grpc-server-use-tls=true"]),
            "GRPC_SERVER_TLS_CERT=: must name a PEM file when GRPC_SERVER_USE_TLS is true"
        );
        assert_eq!(
            error(&[
                "--grpc-server-use-tls=true",
                "--grpc-server-tls-cert",
                "c.pem"
            ]),
            "GRPC_SERVER_TLS_KEY=: must name a PEM file when GRPC_SERVER_USE_TLS is true"
        );
        let base = [
            "--grpc-server-use-tls=true",
            "--grpc-server-tls-cert",
            "c.pem",
            "--grpc-server-tls-key",
            "k.pem",
        ];
        let with = |extra: &[&str]| {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            error(&args)
        };
        assert!(
            with(&["--grpc-client-tls-san", "envoy"])
                .starts_with("GRPC_CLIENT_TLS_SAN=envoy: needs GRPC_CLIENT_TLS_CACERT"),
        );
        assert_eq!(
            with(&[
                "--grpc-client-tls-cacert",
                "ca.pem",
                "--grpc-client-tls-san",
                "a b"
            ]),
            "GRPC_CLIENT_TLS_SAN=a b: expected a DNS name or an IP address"
        );
    }
}
