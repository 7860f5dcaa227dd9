//! The envoyproxy/ratelimit variables that only concern compatibility: the gRPC connection
//! age, GRPC_UDS, PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS, and the Go options Sluice accepts
//! and ignores (pool sizes) or refuses because it cannot honour them.

use std::path::PathBuf;

use clap::ArgAction;

use super::parse::{go_duration, non_empty, parse_go_bool};
use super::{SettingsError, invalid};

/// envoyproxy/ratelimit variables Sluice either implements outside the groups above or
/// refuses at start-up when set to something it cannot honour, so none is silently ignored.
#[derive(Clone, Debug, clap::Args)]
pub struct CompatArgs {
    /// Serve gRPC on this unix socket path instead of GRPC_HOST:GRPC_PORT, as in Go. A stale
    /// socket file is replaced; a socket something still listens on, or another file, is not.
    #[arg(long, env = "GRPC_UDS", help_heading = "Listeners")]
    pub grpc_uds: Option<String>,
    /// A gRPC connection older than this gets a GOAWAY (Go duration; 0 never).
    #[arg(
        long,
        env = "GRPC_MAX_CONNECTION_AGE",
        default_value = "24h",
        help_heading = "Listeners"
    )]
    pub grpc_max_connection_age: String,
    /// After GRPC_MAX_CONNECTION_AGE's GOAWAY, how long calls in flight may take before the
    /// connection is closed (Go duration; 0 as long as they take).
    #[arg(
        long,
        env = "GRPC_MAX_CONNECTION_AGE_GRACE",
        default_value = "1h",
        help_heading = "Listeners"
    )]
    pub grpc_max_connection_age_grace: String,
    /// The Prometheus response-time histogram (ratelimit_service_response_time_seconds) in
    /// milliseconds, the Go service's units before its PR #1104; false: seconds.
    #[arg(
        long,
        env = "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Stats"
    )]
    pub prometheus_response_time_as_milliseconds: bool,
    /// A statsd-exporter mapping file. Not supported: Sluice's names are the default mapping's; a value stops start-up.
    #[arg(long, env = "PROMETHEUS_MAPPER_YAML", help_heading = "Stats")]
    pub prometheus_mapper_yaml: Option<String>,
    /// Constant tags on every stat (`k1:v1,k2:v2`). Not supported yet: a value stops start-up.
    #[arg(long, env = "EXTRA_TAGS", help_heading = "Stats")]
    pub extra_tags: Option<String>,
    /// DogStatsD tags. Not supported: true stops start-up.
    #[arg(
        long,
        env = "USE_DOG_STATSD",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Stats"
    )]
    pub use_dog_statsd: bool,
    /// A `unit: month` limit counted by UTC calendar month (envoyproxy/ratelimit's PR #1206):
    /// its window starts on the 1st at 00:00 UTC and its key is the Go service's.
    #[arg(
        long,
        env = "USE_CALENDAR_MONTH_RATE_LIMIT",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Behaviour"
    )]
    pub use_calendar_month_rate_limit: bool,
    /// DogStatsD mogrifiers; meaningful only with USE_DOG_STATSD, which is refused.
    #[arg(long, env = "USE_DOG_STATSD_MOGRIFIERS", help_heading = "Stats")]
    pub use_dog_statsd_mogrifiers: Option<String>,
}

impl CompatArgs {
    /// GRPC_UDS: where gRPC is served instead of GRPC_HOST:GRPC_PORT, as in Go.
    pub(super) fn grpc_uds(&self, grpc_tls: bool) -> Result<Option<PathBuf>, SettingsError> {
        let Some(path) = non_empty(self.grpc_uds.as_deref()) else {
            return Ok(None);
        };
        if grpc_tls {
            return Err(SettingsError::NotSupportedYet {
                var: "GRPC_UDS",
                value: path.to_owned(),
                reason: "TLS (GRPC_SERVER_USE_TLS) on the unix socket",
            });
        }
        Ok(Some(PathBuf::from(path)))
    }

    pub(super) fn validate(&self) -> Result<Option<crate::net::ConnectionAge>, SettingsError> {
        let not_yet = |var: &'static str, value: &str, reason: &'static str| {
            Err(SettingsError::NotSupportedYet {
                var,
                value: value.to_owned(),
                reason,
            })
        };
        if let Some(tags) = non_empty(self.extra_tags.as_deref()) {
            return not_yet("EXTRA_TAGS", tags, "constant tags on every stat");
        }
        if let Some(path) = non_empty(self.prometheus_mapper_yaml.as_deref()) {
            return Err(invalid(
                "PROMETHEUS_MAPPER_YAML",
                path,
                "not supported: Sluice exports the names envoyproxy/ratelimit's default \
                 mapping produces; unset it",
            ));
        }
        if self.use_dog_statsd {
            return Err(invalid(
                "USE_DOG_STATSD",
                true,
                "not supported: Sluice sends plain statsd (USE_STATSD); unset it",
            ));
        }
        let duration = |var, value| go_duration(var, value, "1h or 30m");
        let max_age = duration("GRPC_MAX_CONNECTION_AGE", &self.grpc_max_connection_age)?;
        let grace = duration(
            "GRPC_MAX_CONNECTION_AGE_GRACE",
            &self.grpc_max_connection_age_grace,
        )?;
        // grpc-go reads 0 as infinity, for both.
        Ok((!max_age.is_zero()).then_some(crate::net::ConnectionAge {
            max_age,
            grace: (!grace.is_zero()).then_some(grace),
        }))
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::super::tests::{error, parse, settings};
    use super::super::*;

    #[test]
    fn grpc_connection_age_defaults_to_go_and_parses_go_durations() {
        let s = settings(&[]).unwrap();
        assert_eq!(
            s.app.grpc_connection_age,
            Some(crate::net::ConnectionAge {
                max_age: Duration::from_secs(24 * 3600),
                grace: Some(Duration::from_secs(3600)),
            })
        );
        let s = settings(&[
            "--grpc-max-connection-age",
            "1m30s",
            "--grpc-max-connection-age-grace",
            "250ms",
        ])
        .unwrap();
        assert_eq!(
            s.app.grpc_connection_age,
            Some(crate::net::ConnectionAge {
                max_age: Duration::from_secs(90),
                grace: Some(Duration::from_millis(250)),
            })
        );
        // grpc-go reads 0 as "for ever", for both.
        let s = settings(&["--grpc-max-connection-age", "0"]).unwrap();
        assert_eq!(s.app.grpc_connection_age, None);
        let s = settings(&["--grpc-max-connection-age-grace", "0"]).unwrap();
        assert_eq!(s.app.grpc_connection_age.map(|a| a.grace), Some(None));
        let err = error(&["--grpc-max-connection-age", "24"]);
        assert!(err.starts_with("GRPC_MAX_CONNECTION_AGE=24: "), "{err}");
        let err = error(&["--grpc-max-connection-age-grace=-1s"]);
        assert!(
            err.starts_with("GRPC_MAX_CONNECTION_AGE_GRACE=-1s: "),
            "{err}"
        );
    }

    #[test]
    fn calendar_month_flag_reaches_the_config_loader() {
        // Go's PR #1206: with the flag, a MONTH limit counts UTC calendar months.
        for (arg, on) in [
            ("--use-calendar-month-rate-limit", true),
            ("--use-calendar-month-rate-limit=T", true),
            ("--use-calendar-month-rate-limit=0", false),
            ("--use-calendar-month-rate-limit=false", false),
            ("--use-calendar-month-rate-limit=F", false),
        ] {
            let s = settings(&[arg]).expect(arg);
            assert_eq!(s.config.load.calendar_month, on, "{arg}");
        }
        assert!(!settings(&[]).unwrap().config.load.calendar_month);
        // Not a Go boolean: refused by the parser, as the other Go booleans are.
        assert!(parse(&["--use-calendar-month-rate-limit=yes"]).is_err());
    }

    #[test]
    fn go_variables_sluice_cannot_honour_stop_start_up() {
        for (args, start) in [
            (&["--extra-tags", "env:prod"][..], "EXTRA_TAGS=env:prod: "),
            (
                &["--prometheus-mapper-yaml", "/etc/mapper.yaml"][..],
                "PROMETHEUS_MAPPER_YAML=/etc/mapper.yaml: ",
            ),
            (&["--use-dog-statsd"][..], "USE_DOG_STATSD=true: "),
        ] {
            let err = error(args);
            assert!(err.starts_with(start), "{args:?}: {err}");
            assert!(err.contains("not support"), "{args:?}: {err}");
        }
        // Their off values (and empty values) are the Go defaults and are fine.
        let s = settings(&[
            "--grpc-uds",
            "",
            "--redis-health-check-active-connection=false",
            "--prometheus-response-time-as-milliseconds=false",
            "--use-dog-statsd=false",
            "--use-dog-statsd-mogrifiers",
            "x",
        ]);
        assert!(s.is_ok(), "{s:?}");
    }

    #[test]
    fn the_response_time_can_be_in_milliseconds_as_go_had_it() {
        let millis = |args: &[&str]| {
            settings(args)
                .unwrap()
                .app
                .telemetry
                .stats
                .response_time_in_millis
        };
        assert!(!millis(&[]));
        assert!(millis(&["--prometheus-response-time-as-milliseconds"]));
        assert!(!millis(&[
            "--prometheus-response-time-as-milliseconds=false"
        ]));
    }

    #[test]
    fn grpc_uds_is_a_path_and_refused_with_tls() {
        assert_eq!(settings(&[]).unwrap().addrs.grpc_uds, None);
        assert_eq!(settings(&["--grpc-uds", ""]).unwrap().addrs.grpc_uds, None);
        assert_eq!(
            settings(&["--grpc-uds", "/tmp/rl.sock"])
                .unwrap()
                .addrs
                .grpc_uds,
            Some(PathBuf::from("/tmp/rl.sock"))
        );
        let err = error(&[
            "--grpc-uds",
            "/tmp/rl.sock",
            "--grpc-server-use-tls",
            "--grpc-server-tls-cert",
            "/c.pem",
            "--grpc-server-tls-key",
            "/k.pem",
        ]);
        assert!(
            err.starts_with("GRPC_UDS=/tmp/rl.sock: ") && err.contains("TLS"),
            "{err}"
        );
    }

    #[test]
    fn every_new_go_variable_is_a_flag_with_its_env_var() {
        let cmd = Cli::command();
        for var in [
            "GRPC_UDS",
            "GRPC_MAX_CONNECTION_AGE",
            "GRPC_MAX_CONNECTION_AGE_GRACE",
            "GRPC_MAX_CONCURRENT_STREAMS",
            "REDIS_STARTUP_INITIAL_INTERVAL",
            "REDIS_STARTUP_MAX_INTERVAL",
            "REDIS_STARTUP_MAX_ELAPSED_TIME",
            "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
            "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR",
            "REDIS_CLUSTER_PIPELINE_PARALLELISM",
            "REDIS_POOL_ON_EMPTY_BEHAVIOR",
            "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
            "REDIS_PERSECOND_POOL_SIZE",
            "REDIS_PERSECOND_PIPELINE_WINDOW",
            "REDIS_PERSECOND_PIPELINE_LIMIT",
            "REDIS_PIPELINE_LIMIT",
            "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
            "PROMETHEUS_MAPPER_YAML",
            "EXTRA_TAGS",
            "USE_DOG_STATSD",
            "USE_DOG_STATSD_MOGRIFIERS",
            "MEMCACHE_HOST_PORT",
            "MEMCACHE_MAX_IDLE_CONNS",
            "MEMCACHE_SRV",
            "MEMCACHE_SRV_REFRESH",
            "MEMCACHE_TLS",
            "MEMCACHE_TLS_CLIENT_CERT",
            "MEMCACHE_TLS_CLIENT_KEY",
            "MEMCACHE_TLS_CACERT",
            "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
        ] {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == var));
            let arg = arg.unwrap_or_else(|| panic!("{var} is not parsed"));
            assert!(arg.get_long().is_some() && !arg.is_hide_set(), "{var}");
        }
    }
}
