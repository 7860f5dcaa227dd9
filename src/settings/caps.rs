//! SLUICE_MAX_KEY_BYTES and SLUICE_MAX_COUNTER_BYTES: the byte caps on what a request may make
//! (its counter keys, checked by the service before any store is touched) and on what the
//! memory store keeps (its counters' keys plus a measured overhead each).

use std::num::NonZeroUsize;

use super::{SettingsError, invalid, non_zero};
use crate::store::memory::COUNTER_OVERHEAD_BYTES;

/// Raw byte caps, flattened into [`super::ServeArgs`].
#[derive(Clone, Debug, clap::Args)]
pub struct CapsArgs {
    /// Longest counter key a request may make, in bytes (CACHE_KEY_PREFIX, domain, keys and
    /// values); a longer one is refused (gRPC INVALID_ARGUMENT, HTTP 400) before any store is
    /// touched. Descriptors that match no limit make no key and are not checked.
    #[arg(
        long,
        env = "SLUICE_MAX_KEY_BYTES",
        default_value_t = 4096,
        help_heading = "Sluice limits"
    )]
    pub max_key_bytes: usize,
    /// Memory budget of the in-memory counters, in bytes, each counting its key plus a fixed
    /// overhead (112); past it new counters are refused as past SLUICE_MAX_COUNTERS.
    #[arg(
        long,
        env = "SLUICE_MAX_COUNTER_BYTES",
        default_value_t = 256 << 20,
        help_heading = "Sluice limits"
    )]
    pub max_counter_bytes: usize,
}

/// Validated byte caps: the first goes to the service (and its stats), the second to the
/// memory store, both in the app's options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub max_key_bytes: NonZeroUsize,
    /// At least one counter of the longest key.
    pub max_counter_bytes: NonZeroUsize,
}

impl CapsArgs {
    pub fn validate(&self) -> Result<Caps, SettingsError> {
        let max_key_bytes = non_zero("SLUICE_MAX_KEY_BYTES", self.max_key_bytes)?;
        // A budget smaller than one counter of an accepted key would refuse that key forever,
        // as a backend error rather than as the request's fault.
        let one_counter = max_key_bytes.get().saturating_add(COUNTER_OVERHEAD_BYTES);
        if self.max_counter_bytes < one_counter {
            return Err(invalid(
                "SLUICE_MAX_COUNTER_BYTES",
                self.max_counter_bytes,
                format!(
                    "must hold at least one counter of the longest key: SLUICE_MAX_KEY_BYTES + \
                     {COUNTER_OVERHEAD_BYTES} = {one_counter}"
                ),
            ));
        }
        Ok(Caps {
            max_key_bytes,
            max_counter_bytes: non_zero("SLUICE_MAX_COUNTER_BYTES", self.max_counter_bytes)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::super::tests::serve;
    use super::super::{Cli, Settings};
    use super::*;

    fn settings(args: &[&str]) -> Result<Settings, SettingsError> {
        serve(args).validate()
    }

    #[test]
    fn defaults_allow_a_jwt_sized_key_and_a_million_ordinary_counters() {
        let app = settings(&[]).unwrap().app;
        assert_eq!(app.service.max_key_bytes, 4096);
        assert_eq!(app.max_counter_bytes, 256 << 20);
        // SLUICE_MAX_COUNTERS' default of counters whose keys are 100 bytes fits the budget.
        let ordinary = 1_000_000 * (100 + COUNTER_OVERHEAD_BYTES);
        assert!(ordinary <= app.max_counter_bytes);
    }

    #[test]
    fn flags_set_the_caps() {
        let one = (100 + COUNTER_OVERHEAD_BYTES).to_string();
        let app = settings(&["--max-key-bytes", "100", "--max-counter-bytes", &one])
            .unwrap()
            .app;
        assert_eq!(app.service.max_key_bytes, 100);
        assert_eq!(app.max_counter_bytes.to_string(), one);
    }

    #[test]
    fn zero_or_a_budget_below_one_counter_is_refused_naming_the_variable() {
        let error = |args: &[&str]| settings(args).unwrap_err().to_string();
        assert_eq!(
            error(&["--max-key-bytes", "0"]),
            "SLUICE_MAX_KEY_BYTES=0: must be greater than 0"
        );
        let one = 100 + COUNTER_OVERHEAD_BYTES;
        let below = (one - 1).to_string();
        assert_eq!(
            error(&["--max-key-bytes", "100", "--max-counter-bytes", &below]),
            format!(
                "SLUICE_MAX_COUNTER_BYTES={below}: must hold at least one counter of the longest \
                 key: SLUICE_MAX_KEY_BYTES + {COUNTER_OVERHEAD_BYTES} = {one}"
            )
        );
        assert!(error(&["--max-counter-bytes", "0"]).starts_with("SLUICE_MAX_COUNTER_BYTES=0:"));
    }

    #[test]
    fn help_names_both_variables() {
        let help = Cli::command().render_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for var in ["SLUICE_MAX_KEY_BYTES", "SLUICE_MAX_COUNTER_BYTES"] {
            assert!(help.contains(&format!("[env: {var}=")), "{var}:\n{help}");
        }
    }
}
