//! SLUICE_RLQS_*: the Rate Limit Quota Service's assignments, memory and bucket mapping
//! ([`crate::rlqs`]).

use std::time::Duration;

use super::parse::{MinBytes, in_range, table_bytes};
use super::{SettingsError, invalid};
use crate::rlqs::{KeyOrder, RlqsOptions};

/// Raw RLQS settings, flattened into [`super::ServeArgs`].
#[derive(Clone, Debug, clap::Args)]
pub struct RlqsArgs {
    /// Rate Limit Quota Service: the shortest time to live of an assignment, in seconds (1 to
    /// 3600); twice a stream's reporting interval when that is longer. An Envoy whose stream
    /// ends keeps enforcing its assignment this long, and its part is reserved until then.
    #[arg(
        long,
        env = "SLUICE_RLQS_ASSIGNMENT_TTL_SECS",
        default_value_t = 10,
        help_heading = "Rate Limit Quota Service"
    )]
    pub rlqs_assignment_ttl_secs: u64,
    /// Rate Limit Quota Service: a bucket an Envoy reports no request for during this many
    /// seconds is abandoned (Envoy forgets it until its next request), freeing its memory (at
    /// least twice SLUICE_RLQS_ASSIGNMENT_TTL_SECS, at most 86400).
    #[arg(
        long,
        env = "SLUICE_RLQS_ABANDON_IDLE_SECS",
        default_value_t = 300,
        help_heading = "Rate Limit Quota Service"
    )]
    pub rlqs_abandon_idle_secs: u64,
    /// Rate Limit Quota Service: the memory, in bytes, of the buckets and of every Envoy's part
    /// of them, each charged its key or bucket id plus a fixed overhead (64 KiB to 64 GiB);
    /// past it a new bucket gets no assignment (Envoy applies its no_assignment_behavior).
    #[arg(
        long,
        env = "SLUICE_RLQS_MAX_BYTES",
        default_value_t = 32 << 20,
        help_heading = "Rate Limit Quota Service"
    )]
    pub rlqs_max_bytes: usize,
    /// Rate Limit Quota Service: bucket id keys that come first, in this order, when a bucket id
    /// becomes a descriptor (comma-separated); the other keys follow sorted bytewise. Empty: all
    /// sorted bytewise.
    #[arg(
        long,
        env = "SLUICE_RLQS_KEY_ORDER",
        default_value = "",
        help_heading = "Rate Limit Quota Service"
    )]
    pub rlqs_key_order: String,
}

impl RlqsArgs {
    /// The service's options; `base` carries the caps and SHADOW_MODE it shares with
    /// ratelimit.v3.
    pub(super) fn validate(&self, base: RlqsOptions) -> Result<RlqsOptions, SettingsError> {
        let ttl = in_range(
            "SLUICE_RLQS_ASSIGNMENT_TTL_SECS",
            self.rlqs_assignment_ttl_secs,
            1..=3_600,
        )?;
        let idle = self.rlqs_abandon_idle_secs;
        if idle < 2 * ttl || idle > 86_400 {
            return Err(invalid(
                "SLUICE_RLQS_ABANDON_IDLE_SECS",
                idle,
                format!(
                    "must be at least twice SLUICE_RLQS_ASSIGNMENT_TTL_SECS ({}) and at most 86400",
                    2 * ttl
                ),
            ));
        }
        let max_bytes = table_bytes(
            "SLUICE_RLQS_MAX_BYTES",
            self.rlqs_max_bytes,
            MinBytes {
                bytes: 64 << 10,
                name: "64 KiB",
            },
        )?;
        Ok(RlqsOptions {
            ttl: Duration::from_secs(ttl),
            abandon_idle: Duration::from_secs(idle),
            max_bytes,
            key_order: key_order(&self.rlqs_key_order)?,
            ..base
        })
    }
}

/// SLUICE_RLQS_KEY_ORDER: comma-separated keys, none empty or repeated.
pub fn key_order(value: &str) -> Result<KeyOrder, SettingsError> {
    let mut keys: Vec<String> = Vec::new();
    if value.trim().is_empty() {
        return Ok(KeyOrder::default());
    }
    for key in value.split(',').map(str::trim) {
        if key.is_empty() {
            return Err(invalid(
                "SLUICE_RLQS_KEY_ORDER",
                value,
                "has an empty key (keys are separated by single commas)",
            ));
        }
        if keys.iter().any(|k| k == key) {
            return Err(invalid(
                "SLUICE_RLQS_KEY_ORDER",
                value,
                format!("names {key:?} twice"),
            ));
        }
        keys.push(key.to_owned());
    }
    Ok(KeyOrder::new(keys))
}

#[cfg(test)]
mod tests {
    use super::super::tests::serve;
    use super::*;

    fn validate(args: &[&str]) -> Result<RlqsOptions, SettingsError> {
        serve(args).rlqs.validate(RlqsOptions::default())
    }

    #[test]
    fn defaults_and_values() {
        assert_eq!(validate(&[]).unwrap(), RlqsOptions::default());
        let o = validate(&[
            "--rlqs-assignment-ttl-secs",
            "3",
            "--rlqs-abandon-idle-secs",
            "6",
            "--rlqs-key-order",
            "tenant, plan",
        ])
        .unwrap();
        assert_eq!(o.ttl, Duration::from_secs(3));
        assert_eq!(o.abandon_idle, Duration::from_secs(6));
        assert_eq!(o.key_order.keys(), ["tenant", "plan"]);
    }

    #[test]
    fn refusals_name_their_variable() {
        for (args, var) in [
            (
                &["--rlqs-assignment-ttl-secs", "0"][..],
                "SLUICE_RLQS_ASSIGNMENT_TTL_SECS",
            ),
            (
                &[
                    "--rlqs-assignment-ttl-secs",
                    "20",
                    "--rlqs-abandon-idle-secs",
                    "30",
                ],
                "SLUICE_RLQS_ABANDON_IDLE_SECS",
            ),
            (&["--rlqs-max-bytes", "100"], "SLUICE_RLQS_MAX_BYTES"),
            (&["--rlqs-key-order", "a,,b"], "SLUICE_RLQS_KEY_ORDER"),
            (&["--rlqs-key-order", "a,b,a"], "SLUICE_RLQS_KEY_ORDER"),
        ] {
            let e = validate(args).unwrap_err().to_string();
            assert!(e.contains(var), "{args:?}: {e}");
        }
    }
}
