//! The listener limits (SLUICE_MAX_CONNECTIONS and friends), validated into [`net::Limits`].
//! The same limits apply to every port: gRPC, HTTP, debug, Prometheus and peer.

use std::time::Duration;

use super::{SettingsError, invalid};
use crate::net;

/// Raw listener limits, as typed by the operator.
#[derive(Clone, Debug, clap::Args)]
pub struct ListenerArgs {
    /// Open connections per listener; more wait in the kernel's backlog until one closes.
    #[arg(
        long,
        env = "SLUICE_MAX_CONNECTIONS",
        default_value_t = 4096,
        help_heading = "Listener limits"
    )]
    pub max_connections: usize,
    /// HTTP/2 streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(
        long,
        env = "SLUICE_MAX_CONCURRENT_STREAMS",
        default_value_t = 100,
        help_heading = "Listener limits"
    )]
    pub max_concurrent_streams: u32,
    /// envoyproxy/ratelimit's cap on gRPC streams per connection, for the gRPC listener
    /// (GRPC_PORT or GRPC_UDS) only: when set above 0 it replaces SLUICE_MAX_CONCURRENT_STREAMS
    /// there; 0 (Go's default, no cap in grpc-go) leaves SLUICE_MAX_CONCURRENT_STREAMS.
    #[arg(
        long,
        env = "GRPC_MAX_CONCURRENT_STREAMS",
        default_value_t = 0,
        help_heading = "Listener limits"
    )]
    pub grpc_max_concurrent_streams: u32,
    /// Requests a listener serves at once; more are refused at once (gRPC RESOURCE_EXHAUSTED,
    /// HTTP 503).
    #[arg(
        long,
        env = "SLUICE_MAX_INFLIGHT_REQUESTS",
        default_value_t = 10_000,
        help_heading = "Listener limits"
    )]
    pub max_inflight_requests: usize,
    /// A request's deadline in milliseconds, body included (gRPC: the client's grpc-timeout
    /// when shorter); past it gRPC answers DEADLINE_EXCEEDED and HTTP 408.
    #[arg(
        long,
        env = "SLUICE_REQUEST_TIMEOUT_MS",
        default_value_t = 5000,
        help_heading = "Listener limits"
    )]
    pub request_timeout_ms: u64,
    /// Milliseconds a client gets for its TLS handshake and for each HTTP/1 request head.
    #[arg(
        long,
        env = "SLUICE_HEADER_TIMEOUT_MS",
        default_value_t = 10_000,
        help_heading = "Listener limits"
    )]
    pub header_timeout_ms: u64,
    /// Seconds a connection may stay open with no request in flight before it is closed (a
    /// GOAWAY on HTTP/2); 0 never closes idle connections.
    #[arg(
        long,
        env = "SLUICE_IDLE_TIMEOUT_SECS",
        default_value_t = 300,
        help_heading = "Listener limits"
    )]
    pub idle_timeout_secs: u64,
    /// Seconds of silence on an HTTP/2 connection before Sluice sends a PING; 0 sends none.
    #[arg(
        long,
        env = "SLUICE_KEEPALIVE_INTERVAL_SECS",
        default_value_t = 60,
        help_heading = "Listener limits"
    )]
    pub keepalive_interval_secs: u64,
    /// Seconds a PING may go unanswered before the connection is closed as dead.
    #[arg(
        long,
        env = "SLUICE_KEEPALIVE_TIMEOUT_SECS",
        default_value_t = 20,
        help_heading = "Listener limits"
    )]
    pub keepalive_timeout_secs: u64,
    /// Largest HTTP/1 request head or HTTP/2 header list, in bytes (HTTP/1 heads get at least
    /// 8192).
    #[arg(
        long,
        env = "SLUICE_MAX_HEADER_BYTES",
        default_value_t = 65_536,
        help_heading = "Listener limits"
    )]
    pub max_header_bytes: u32,
    /// Bytes of gRPC messages being received at once, over every connection (each message's
    /// length is reserved from its prefix until it is read); more are refused with
    /// RESOURCE_EXHAUSTED. At least SLUICE_MAX_REQUEST_BYTES.
    #[arg(
        long,
        env = "SLUICE_MAX_PENDING_REQUEST_BYTES",
        default_value_t = 64 * 1024 * 1024,
        help_heading = "Listener limits"
    )]
    pub max_pending_request_bytes: usize,
}

impl ListenerArgs {
    /// `max_request_bytes` is SLUICE_MAX_REQUEST_BYTES, which the budget must be able to hold.
    pub fn validate(&self, max_request_bytes: usize) -> Result<net::Limits, SettingsError> {
        let at_least_one = |var: &'static str, value: u64| {
            if value == 0 {
                Err(invalid(var, 0, "must be at least 1"))
            } else {
                Ok(value)
            }
        };
        at_least_one("SLUICE_MAX_CONNECTIONS", self.max_connections as u64)?;
        at_least_one(
            "SLUICE_MAX_CONCURRENT_STREAMS",
            u64::from(self.max_concurrent_streams),
        )?;
        at_least_one(
            "SLUICE_MAX_INFLIGHT_REQUESTS",
            self.max_inflight_requests as u64,
        )?;
        let request_timeout = at_least_one("SLUICE_REQUEST_TIMEOUT_MS", self.request_timeout_ms)?;
        let header_timeout = at_least_one("SLUICE_HEADER_TIMEOUT_MS", self.header_timeout_ms)?;
        let keepalive_timeout =
            at_least_one("SLUICE_KEEPALIVE_TIMEOUT_SECS", self.keepalive_timeout_secs)?;
        if self.max_header_bytes < 1024 {
            return Err(invalid(
                "SLUICE_MAX_HEADER_BYTES",
                self.max_header_bytes,
                "must be at least 1024: gRPC and HTTP/2 clients send a few hundred bytes of headers with every call",
            ));
        }
        if self.max_pending_request_bytes < max_request_bytes {
            return Err(invalid(
                "SLUICE_MAX_PENDING_REQUEST_BYTES",
                self.max_pending_request_bytes,
                format!(
                    "must be at least SLUICE_MAX_REQUEST_BYTES ({max_request_bytes}), or a \
                     request of the largest allowed size could never be received"
                ),
            ));
        }
        let secs = |s: u64| (s > 0).then(|| Duration::from_secs(s));
        Ok(net::Limits {
            max_connections: self.max_connections,
            max_concurrent_streams: self.max_concurrent_streams,
            grpc_max_concurrent_streams: std::num::NonZeroU32::new(
                self.grpc_max_concurrent_streams,
            ),
            max_inflight_requests: self.max_inflight_requests,
            request_timeout: Duration::from_millis(request_timeout),
            header_read_timeout: Duration::from_millis(header_timeout),
            idle_timeout: secs(self.idle_timeout_secs),
            keepalive_interval: secs(self.keepalive_interval_secs),
            keepalive_timeout: Duration::from_secs(keepalive_timeout),
            max_header_bytes: self.max_header_bytes,
            max_pending_request_bytes: self.max_pending_request_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, settings};
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        assert_eq!(
            settings(&[]).unwrap().app.listener_limits,
            net::Limits::default()
        );
    }

    #[test]
    fn every_limit_is_read_and_zero_means_never_where_documented() {
        let s = settings(&[
            "--max-connections=7",
            "--max-concurrent-streams=3",
            "--grpc-max-concurrent-streams=5",
            "--max-inflight-requests=9",
            "--request-timeout-ms=250",
            "--header-timeout-ms=500",
            "--idle-timeout-secs=0",
            "--keepalive-interval-secs=0",
            "--keepalive-timeout-secs=2",
            "--max-header-bytes=2048",
            "--max-pending-request-bytes=1000000",
        ])
        .unwrap();
        assert_eq!(
            s.app.listener_limits,
            net::Limits {
                max_connections: 7,
                max_concurrent_streams: 3,
                grpc_max_concurrent_streams: std::num::NonZeroU32::new(5),
                max_inflight_requests: 9,
                request_timeout: Duration::from_millis(250),
                header_read_timeout: Duration::from_millis(500),
                idle_timeout: None,
                keepalive_interval: None,
                keepalive_timeout: Duration::from_secs(2),
                max_header_bytes: 2048,
                max_pending_request_bytes: 1_000_000,
            }
        );
    }

    #[test]
    fn grpc_max_concurrent_streams_is_the_grpc_listeners_and_zero_is_go_default() {
        let limits = |args: &[&str]| settings(args).unwrap().app.listener_limits;
        let set = limits(&[
            "--max-concurrent-streams=7",
            "--grpc-max-concurrent-streams=2",
        ]);
        assert_eq!(set.for_grpc_clients().max_concurrent_streams, 2);
        assert_eq!(set.max_concurrent_streams, 7, "the other listeners");
        for args in [&[][..], &["--grpc-max-concurrent-streams=0"]] {
            let go_default = limits(args);
            assert_eq!(go_default.grpc_max_concurrent_streams, None);
            assert_eq!(go_default.for_grpc_clients().max_concurrent_streams, 100);
        }
        // A uint32, as in Go: a negative or oversized value names the variable.
        for value in ["-1", "4294967296", "many"] {
            let err =
                super::super::tests::parse(&[&format!("--grpc-max-concurrent-streams={value}")])
                    .expect_err("not a uint32")
                    .to_string();
            assert!(
                err.contains("GRPC_MAX_CONCURRENT_STREAMS"),
                "{value}: {err}"
            );
        }
    }

    #[test]
    fn bad_limits_name_their_variable() {
        for (flag, var) in [
            ("--max-connections=0", "SLUICE_MAX_CONNECTIONS=0: "),
            (
                "--max-concurrent-streams=0",
                "SLUICE_MAX_CONCURRENT_STREAMS=0: ",
            ),
            (
                "--max-inflight-requests=0",
                "SLUICE_MAX_INFLIGHT_REQUESTS=0: ",
            ),
            ("--request-timeout-ms=0", "SLUICE_REQUEST_TIMEOUT_MS=0: "),
            ("--header-timeout-ms=0", "SLUICE_HEADER_TIMEOUT_MS=0: "),
            (
                "--keepalive-timeout-secs=0",
                "SLUICE_KEEPALIVE_TIMEOUT_SECS=0: ",
            ),
            ("--max-header-bytes=100", "SLUICE_MAX_HEADER_BYTES=100: "),
        ] {
            let err = error(&[flag]);
            assert!(err.starts_with(var), "{flag}: {err}");
        }
        let err = error(&[
            "--max-pending-request-bytes=1000",
            "--max-request-bytes=2000",
        ]);
        assert!(
            err.starts_with("SLUICE_MAX_PENDING_REQUEST_BYTES=1000: ")
                && err.contains("SLUICE_MAX_REQUEST_BYTES (2000)"),
            "{err}"
        );
    }
}
