//! Failing fast while Redis is down: how often an open breaker probes Redis, how many missed
//! deadlines in a row open it, REDIS_HEALTH_CHECK_ACTIVE_CONNECTION (health that follows it)
//! and REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR (a READONLY reply opens it). Validated into [`BreakerSettings`], which every Redis the service uses gets: the
//! backend's (REDIS_URL, REDIS_PERSECOND_URL) and the peer cluster's write-behind copy.

use std::num::NonZeroU32;
use std::time::Duration;

use clap::ArgAction;

use super::parse::{Named, in_range, parse_go_bool};
use super::{SettingsError, invalid};
use crate::app::Backend;
use crate::cluster::WriteBehind;
use crate::store::redis::BreakerSettings;

/// Raw breaker flags; see [`BreakerSettings`].
#[derive(Clone, Debug, clap::Args)]
pub struct RedisBreakerArgs {
    /// While Redis is down (calls fail at once), how often it is probed (a new connection and
    /// a PING), in milliseconds; the first probe that answers restores service.
    #[arg(
        long,
        env = "SLUICE_REDIS_PROBE_INTERVAL_MS",
        default_value_t = 250,
        help_heading = "Redis"
    )]
    pub redis_probe_interval_ms: u64,
    /// Calls in a row that miss REDIS_TIMEOUT, with no answer in between, after which Redis is
    /// taken for down and calls fail at once (a refused or closed connection does it at once).
    #[arg(
        long,
        env = "SLUICE_REDIS_BREAKER_TIMEOUTS",
        default_value_t = 3,
        help_heading = "Redis"
    )]
    pub redis_breaker_timeouts: u32,
    /// Fail health while Redis is down (calls failing at once), not only until it first answers.
    #[arg(
        long,
        env = "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Redis"
    )]
    pub redis_health_check_active_connection: bool,
    /// After a READONLY reply (a failover demoted the Redis behind the connection), take Redis
    /// for down and reconnect through the address until it reaches a master. Sluice's default
    /// is true; false keeps the connection, as envoyproxy/ratelimit's default does.
    #[arg(
        long,
        env = "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "true",
        value_parser = parse_go_bool,
        help_heading = "Redis"
    )]
    pub redis_close_connection_on_readonly_error: bool,
}

/// A backend's breaker settings from its probe interval (ms, 10 to 60000) and timeouts in a row
/// (1 to 1000), each with the variable that set it: Redis's and memcached's alike.
pub(super) fn breaker_settings(
    probe_ms: Named<u64>,
    timeouts: Named<u32>,
    health_follows_connection: bool,
) -> Result<BreakerSettings, SettingsError> {
    let ms = in_range(probe_ms.var, probe_ms.value, 10..=60_000)?;
    let open_after_timeouts = NonZeroU32::new(timeouts.value)
        .filter(|n| n.get() <= 1000)
        .ok_or_else(|| invalid(timeouts.var, timeouts.value, "must be between 1 and 1000"))?;
    Ok(BreakerSettings {
        probe_interval: Duration::from_millis(ms),
        open_after_timeouts,
        health_follows_connection,
        ..BreakerSettings::default()
    })
}

impl RedisBreakerArgs {
    fn validate(&self) -> Result<BreakerSettings, SettingsError> {
        let settings = breaker_settings(
            Named::new(
                "SLUICE_REDIS_PROBE_INTERVAL_MS",
                self.redis_probe_interval_ms,
            ),
            Named::new("SLUICE_REDIS_BREAKER_TIMEOUTS", self.redis_breaker_timeouts),
            self.redis_health_check_active_connection,
        )?;
        Ok(BreakerSettings {
            reconnect_on_readonly: self.redis_close_connection_on_readonly_error,
            ..settings
        })
    }

    /// Gives the validated settings to every Redis in use: the backend's and the write-behind's.
    pub(super) fn apply(
        &self,
        backend: &mut Backend,
        write_behind: Option<&mut WriteBehind>,
    ) -> Result<(), SettingsError> {
        let breaker = self.validate()?;
        if let Backend::Redis(redis) = backend {
            redis.breaker = breaker;
        }
        if let Some(wb) = write_behind {
            wb.redis.breaker = breaker;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::tests::{parse, settings};

    fn redis(extra: &[&str]) -> BreakerSettings {
        let mut args = vec!["--backend-type", "redis", "--redis-url", "localhost:6379"];
        args.extend(extra);
        match settings(&args).expect("valid").app.backend {
            Backend::Redis(r) => r.breaker,
            other => panic!("expected the Redis backend, got {other:?}"),
        }
    }

    #[test]
    fn defaults_probe_every_250_ms_and_open_after_three_timeouts() {
        assert_eq!(redis(&[]), BreakerSettings::default());
        let d = BreakerSettings::default();
        assert_eq!(d.probe_interval, Duration::from_millis(250));
        assert_eq!(d.open_after_timeouts.get(), 3);
        assert!(!d.health_follows_connection);
        assert!(d.reconnect_on_readonly, "Sluice's default; Go's is false");
    }

    #[test]
    fn the_flags_reach_the_redis_backend() {
        let b = redis(&[
            "--redis-probe-interval-ms",
            "40",
            "--redis-breaker-timeouts",
            "1",
            "--redis-health-check-active-connection",
            "--redis-close-connection-on-readonly-error=false",
        ]);
        assert_eq!(
            b,
            BreakerSettings {
                probe_interval: Duration::from_millis(40),
                open_after_timeouts: NonZeroU32::new(1).unwrap(),
                health_follows_connection: true,
                reconnect_on_readonly: false,
            }
        );
        assert!(redis(&["--redis-close-connection-on-readonly-error"]).reconnect_on_readonly);
    }

    #[test]
    fn the_flags_reach_the_write_behind_copy() {
        let s = settings(&[
            "--peers",
            "127.0.0.1:8081,127.0.0.2:8081",
            "--peer-advertise-address",
            "127.0.0.1:8081",
            "--peer-write-behind",
            "--redis-url",
            "localhost:6379",
            "--redis-probe-interval-ms",
            "1000",
        ])
        .expect("valid");
        let wb = s
            .app
            .cluster
            .and_then(|c| c.write_behind)
            .expect("write-behind");
        assert_eq!(wb.redis.breaker.probe_interval, Duration::from_secs(1));
    }

    #[test]
    fn out_of_range_values_name_the_variable() {
        for (args, start) in [
            (
                &["--redis-probe-interval-ms", "5"][..],
                "SLUICE_REDIS_PROBE_INTERVAL_MS=5: ",
            ),
            (
                &["--redis-probe-interval-ms", "60001"][..],
                "SLUICE_REDIS_PROBE_INTERVAL_MS=60001: ",
            ),
            (
                &["--redis-breaker-timeouts", "0"][..],
                "SLUICE_REDIS_BREAKER_TIMEOUTS=0: ",
            ),
            (
                &["--redis-breaker-timeouts", "1001"][..],
                "SLUICE_REDIS_BREAKER_TIMEOUTS=1001: ",
            ),
        ] {
            // Checked with the memory backend too: a typo is worth reporting before Redis is on.
            let err = settings(args).expect_err("invalid").to_string();
            assert!(err.starts_with(start), "{err}");
        }
    }

    #[test]
    fn redis_health_check_active_connection_is_a_go_bool_and_no_longer_refused() {
        assert!(redis(&["--redis-health-check-active-connection=true"]).health_follows_connection);
        assert!(!redis(&["--redis-health-check-active-connection=0"]).health_follows_connection);
        let err = parse(&["--redis-health-check-active-connection=yes"])
            .expect_err("not a Go bool")
            .to_string();
        assert!(
            err.contains("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"),
            "{err}"
        );
    }
}
