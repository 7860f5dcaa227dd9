//! The runtime limits API's settings (SLUICE_ADMIN_TOKEN_FILE, SLUICE_RUNTIME_LIMITS_PATH,
//! SLUICE_MAX_RUNTIME_LIMITS, SLUICE_RUNTIME_HISTORY, SLUICE_RUNTIME_LIMITS_POLL_MS,
//! SLUICE_RUNTIME_LIMITS_SYNC_MS), validated into [`RuntimeLimitsOptions`]: the token file read
//! and parsed, the limits file's directory checked, before any port is bound.

use std::path::PathBuf;

use super::parse::in_range_or;
use super::{SettingsError, invalid};
use crate::admin::auth::AdminAuth;
use crate::admin::limits::history::DEFAULT_HISTORY;
use crate::app::RuntimeLimitsOptions;
use crate::config::runtime::DEFAULT_MAX_RUNTIME_LIMITS;

/// The most changes SLUICE_RUNTIME_HISTORY may keep.
const MAX_HISTORY: usize = 100_000;

/// Raw runtime-limits settings, as typed by the operator.
#[derive(Clone, Debug, clap::Args)]
pub struct RuntimeLimitsArgs {
    /// A file of bearer tokens for the runtime limits API (`/limits/...` on the debug port), one
    /// a line, each optionally preceded by a name and a space (the name goes in the audit log);
    /// read again when it changes. Unset: the API refuses every call (403).
    #[arg(long, env = "SLUICE_ADMIN_TOKEN_FILE", help_heading = "Runtime limits")]
    pub admin_token_file: Option<PathBuf>,
    /// Where a node keeps its runtime limits (one JSON object a line), saved after every change
    /// (appended to a journal beside it, fsynced) and loaded at start. Unset: they live in
    /// memory, and in Redis for replicas sharing it; a peer cluster's nodes hold one another's
    /// copies, in memory only, so losing every node at once loses them.
    #[arg(
        long,
        env = "SLUICE_RUNTIME_LIMITS_PATH",
        help_heading = "Runtime limits"
    )]
    pub runtime_limits_path: Option<PathBuf>,
    /// The most runtime limits a node holds, all domains together; past it a new path is
    /// refused (507) and a change to an existing one still applies.
    #[arg(
        long,
        env = "SLUICE_MAX_RUNTIME_LIMITS",
        default_value_t = DEFAULT_MAX_RUNTIME_LIMITS,
        help_heading = "Runtime limits"
    )]
    pub max_runtime_limits: usize,
    /// The changes `GET /limits/_history` keeps, the newest (every change is logged too).
    #[arg(
        long,
        env = "SLUICE_RUNTIME_HISTORY",
        default_value_t = DEFAULT_HISTORY,
        help_heading = "Runtime limits"
    )]
    pub runtime_history: usize,
    /// With BACKEND_TYPE=redis: how often each replica reads the runtime limits' change log
    /// in Redis, in milliseconds: a change made on one replica holds on the others within it.
    #[arg(
        long,
        env = "SLUICE_RUNTIME_LIMITS_POLL_MS",
        default_value_t = 250,
        help_heading = "Runtime limits"
    )]
    pub runtime_limits_poll_ms: u64,
    /// With PEERS or PEERS_DNS: how often each node compares a digest of its runtime limits
    /// with one peer's, in milliseconds (the anti-entropy pass); when they differ it pulls the
    /// peer's set and pushes back what the peer lacks. A change a peer missed (its push failed)
    /// reaches it at the next pass.
    #[arg(
        long,
        env = "SLUICE_RUNTIME_LIMITS_SYNC_MS",
        default_value_t = 5000,
        help_heading = "Runtime limits"
    )]
    pub runtime_limits_sync_ms: u64,
}

impl RuntimeLimitsArgs {
    pub fn validate(&self) -> Result<RuntimeLimitsOptions, SettingsError> {
        if let Some(file) = &self.admin_token_file {
            AdminAuth::from_file(file.clone())
                .map_err(|e| invalid("SLUICE_ADMIN_TOKEN_FILE", file.display(), e.to_string()))?;
        }
        if let Some(path) = &self.runtime_limits_path {
            let var = "SLUICE_RUNTIME_LIMITS_PATH";
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            if path.file_name().is_none() || path.is_dir() {
                return Err(invalid(var, path.display(), "expected a file's path"));
            }
            if !dir.is_dir() {
                return Err(invalid(
                    var,
                    path.display(),
                    format!("its directory {} does not exist", dir.display()),
                ));
            }
        }
        if self.max_runtime_limits == 0 {
            return Err(invalid(
                "SLUICE_MAX_RUNTIME_LIMITS",
                0,
                "expected at least 1",
            ));
        }
        in_range_or(
            "SLUICE_RUNTIME_HISTORY",
            self.runtime_history,
            &(0..=MAX_HISTORY),
            format_args!("expected 0 to {MAX_HISTORY}"),
        )?;
        let poll_ms = in_range_or(
            "SLUICE_RUNTIME_LIMITS_POLL_MS",
            self.runtime_limits_poll_ms,
            &(10..=60_000),
            "expected 10 to 60000",
        )?;
        let sync_ms = in_range_or(
            "SLUICE_RUNTIME_LIMITS_SYNC_MS",
            self.runtime_limits_sync_ms,
            &(100..=600_000),
            "expected 100 to 600000",
        )?;
        Ok(RuntimeLimitsOptions {
            poll: std::time::Duration::from_millis(poll_ms),
            sync: std::time::Duration::from_millis(sync_ms),
            admin_token_file: self.admin_token_file.clone(),
            path: self.runtime_limits_path.clone(),
            max: self.max_runtime_limits,
            history: self.runtime_history,
        })
    }
}
