//! Rate-limit configuration: YAML text -> raw serde types -> validated, compiled lookup table,
//! plus loading from disk and hot reload.
//!
//! The pipeline, one module per stage:
//!
//! - [`yaml`]: YAML text -> a generic value, refusing documents whose aliases expand them past
//!   what a file of their size could hold (the "billion laughs").
//! - [`raw`]: parses one file. The YAML is first walked generically (unknown keys, non-string
//!   keys, list elements that are not maps, unsupported scalar types), then deserialised into
//!   raw serde types. Both steps report envoyproxy/ratelimit's exact error messages, in its
//!   order.
//! - [`build`]: validates the raw descriptors (empty keys, duplicate composite keys, units,
//!   replaces, share_threshold, metadata, and Sluice's `algorithm`, `burst` and `rate_limits`
//!   extensions) and builds the per-domain lookup table.
//! - [`lookup`]: that table, which requests are matched against. A request never walks
//!   YAML-shaped data.
//! - [`mod@load`]: finds the files of a [`ConfigSource`] (a `--config` path or the Go service's
//!   runtime directory layout), in a deterministic order, and turns them into one
//!   [`RateLimitConfig`]; it also finds the extension keys a Go-loadable file must not use.
//!   Every read is bounded by [`FileLimits`], checked on metadata before reading.
//! - [`poll`]: the [`Poller`], which tells changed files by their metadata, reads only those,
//!   and loads a change once it has settled, so a file written in place is never loaded
//!   half-written.
//! - [`watch`]: the shared [`ConfigHandle`] that request handlers read, and the watcher task
//!   that runs the poller and swaps in a new config (keeping the old one on error).
//!
//! Every error names the config (file name or goruntime key) it came from:
//! `"<name>: <message>"`, as the Go service prints it.

pub(crate) mod build;
pub(crate) mod limit;
pub(crate) mod load;
pub(crate) mod lookup;
pub(crate) mod patterns;
pub(crate) mod poll;
pub(crate) mod raw;
pub mod runtime;
pub(crate) mod runtime_layer;
pub(crate) mod stats_slot;
pub(crate) mod watch;
pub(crate) mod yaml;

#[cfg(test)]
mod tests;

pub(crate) use load::envoy_extensions;
pub use load::{
    ConfigSource, FileLimits, LoadOptions, build_raw, envoy_extensions_in, load, parse_files,
};
pub use lookup::{Block, Domain, Limit, Matched, RateLimitConfig, Rule, Source, Step};
pub use poll::Poller;
pub(crate) use stats_slot::StatsSlot;
pub use watch::{ConfigHandle, WatchGuard, spawn_watcher};

use std::fmt;

/// One problem with one config file (or with the source as a whole, e.g. a missing directory).
///
/// Displayed as `name: message`, byte for byte what envoyproxy/ratelimit reports, so operators'
/// alerts and runbooks keep matching.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {message}")]
pub struct ConfigError {
    /// The config's name: the bare file name for a `--config` file, the path relative to the
    /// directory for a `--config` directory, or the goruntime key (`config.basic.yaml`).
    pub name: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(name: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            name: name.into(),
            message: message.into(),
        }
    }
}

/// Every problem found while loading a config source; never empty when returned as an error.
///
/// Loading keeps going after a bad file so that `check-config` can print all of them at once.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    pub fn iter(&self) -> impl Iterator<Item = &ConfigError> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

impl fmt::Display for ConfigErrors {
    /// One error per line, in load order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}
