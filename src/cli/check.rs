//! `sluice check-config`: validates a config as the service would load it, with optional
//! stricter checks; every problem on stderr, one per line, and the OK line only when there are
//! none.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{self, ConfigSource, FileLimits, LoadOptions};
use crate::rlqs::KeyOrder;

/// What to check besides loading.
pub struct Checks {
    /// MERGE_DOMAIN_CONFIG: several files may declare the same domain.
    pub merge_domain_config: bool,
    /// `--strict-envoy`: every use of a Sluice YAML extension is a failure too.
    pub strict_envoy: bool,
    /// `--rlqs`, with SLUICE_RLQS_KEY_ORDER's order: every limit no quota bucket can reach is
    /// a failure too.
    pub rlqs: Option<KeyOrder>,
}

/// Validates the config at `path` within `limits` (the service's size caps, so a config that
/// passes here loads there): exit 0 with the OK line, or 1 with the problems.
pub fn run(path: PathBuf, checks: &Checks, limits: &FileLimits) -> ExitCode {
    let source = ConfigSource::Path(path.clone());
    let loaded = config::load(
        &source,
        &LoadOptions {
            merge_domain_config: checks.merge_domain_config,
            without_slots: None,
            calendar_month: false,
        },
        limits,
    );
    let mut failed = false;
    if let Err(errors) = &loaded {
        failed = true;
        for e in &errors.0 {
            eprintln!("{e}");
        }
    }
    if checks.strict_envoy {
        failed |= strict_envoy(&source, limits, loaded.is_ok());
    }
    if let (Ok(cfg), Some(order)) = (&loaded, &checks.rlqs) {
        let unreachable = crate::rlqs::unreachable_by_buckets(cfg, order);
        failed |= !unreachable.is_empty();
        for u in &unreachable {
            eprintln!("{u}");
        }
    }
    match loaded {
        Ok(cfg) if !failed => {
            println!("{}: OK ({} domains)", path.display(), cfg.domain_count());
            ExitCode::SUCCESS
        }
        _ => ExitCode::FAILURE,
    }
}

/// Prints every use of a Sluice YAML extension; whether there was one (or a file that could
/// not be read, when the load that just ran could: `loaded` says whether it did).
fn strict_envoy(source: &ConfigSource, limits: &FileLimits, loaded: bool) -> bool {
    match config::envoy_extensions(source, limits) {
        Ok(uses) => {
            for u in &uses {
                eprintln!("{u}");
            }
            !uses.is_empty()
        }
        // Unreadable files were just reported by the load, unless they changed since.
        Err(errors) if loaded => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            true
        }
        Err(_) => false,
    }
}
