//! How much config Sluice reads, and how still it must be before it is loaded:
//! SLUICE_CONFIG_MAX_FILE_BYTES, SLUICE_CONFIG_MAX_TOTAL_BYTES and SLUICE_CONFIG_SETTLE_MS,
//! validated into [`FileLimits`]. `check-config` applies the same sizes as the service.

use super::{SettingsError, invalid};
use crate::config::FileLimits;
use std::time::Duration;

/// Raw config-file limits, as typed by the operator.
#[derive(Clone, Debug, clap::Args)]
pub struct ConfigFileArgs {
    /// The largest config file read, in bytes; a bigger one is refused by its size, unread.
    #[arg(
        long,
        env = "SLUICE_CONFIG_MAX_FILE_BYTES",
        default_value_t = FileLimits::DEFAULT_MAX_FILE_BYTES,
        help_heading = "Sluice limits"
    )]
    pub config_max_file_bytes: u64,
    /// The config files together, in bytes (at least SLUICE_CONFIG_MAX_FILE_BYTES).
    #[arg(
        long,
        env = "SLUICE_CONFIG_MAX_TOTAL_BYTES",
        default_value_t = FileLimits::DEFAULT_MAX_TOTAL_BYTES,
        help_heading = "Sluice limits"
    )]
    pub config_max_total_bytes: u64,
    /// How long changed config files must stay unchanged before they are loaded, in
    /// milliseconds (0..=60000), so a file written in place is not loaded half-written.
    #[arg(
        long,
        env = "SLUICE_CONFIG_SETTLE_MS",
        default_value_t = FileLimits::DEFAULT_SETTLE.as_millis() as u64,
        help_heading = "Sluice limits"
    )]
    pub config_settle_ms: u64,
}

impl ConfigFileArgs {
    pub fn validate(&self) -> Result<FileLimits, SettingsError> {
        let file = self.config_max_file_bytes;
        let total = self.config_max_total_bytes;
        if file == 0 {
            return Err(invalid(
                "SLUICE_CONFIG_MAX_FILE_BYTES",
                file,
                "must be greater than 0",
            ));
        }
        if total < file {
            return Err(invalid(
                "SLUICE_CONFIG_MAX_TOTAL_BYTES",
                total,
                format!("must be at least SLUICE_CONFIG_MAX_FILE_BYTES ({file})"),
            ));
        }
        if self.config_settle_ms > 60_000 {
            return Err(invalid(
                "SLUICE_CONFIG_SETTLE_MS",
                self.config_settle_ms,
                "must be between 0 and 60000",
            ));
        }
        Ok(FileLimits {
            max_file_bytes: file,
            max_total_bytes: total,
            settle: Duration::from_millis(self.config_settle_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::Cli;
    use super::super::tests::parse;
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        parse(args).expect("arguments parse")
    }

    fn limits(args: &[&str]) -> Result<FileLimits, SettingsError> {
        cli(args).serve.config_files.validate()
    }

    #[test]
    fn defaults_are_the_config_subsystems() {
        assert_eq!(limits(&[]).expect("valid"), FileLimits::default());
        let settings = cli(&[]).serve.validate().expect("valid");
        assert_eq!(settings.config.files, FileLimits::default());
    }

    #[test]
    fn flags_set_every_limit() {
        let l = limits(&[
            "--config-max-file-bytes=100",
            "--config-max-total-bytes=300",
            "--config-settle-ms=0",
        ])
        .expect("valid");
        assert_eq!(
            l,
            FileLimits {
                max_file_bytes: 100,
                max_total_bytes: 300,
                settle: Duration::ZERO,
            }
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        let err = |args: &[&str]| limits(args).expect_err("invalid").to_string();
        assert_eq!(
            err(&["--config-max-file-bytes=0"]),
            "SLUICE_CONFIG_MAX_FILE_BYTES=0: must be greater than 0"
        );
        assert_eq!(
            err(&[
                "--config-max-file-bytes=1000",
                "--config-max-total-bytes=999"
            ]),
            "SLUICE_CONFIG_MAX_TOTAL_BYTES=999: must be at least SLUICE_CONFIG_MAX_FILE_BYTES (1000)"
        );
        assert_eq!(
            err(&["--config-settle-ms=60001"]),
            "SLUICE_CONFIG_SETTLE_MS=60001: must be between 0 and 60000"
        );
        // ServeArgs::validate reports them too, so `sluice` exits 64 before binding a port.
        let serve = cli(&["--config-settle-ms=60001"]).serve.validate();
        assert!(serve.is_err());
    }
}
