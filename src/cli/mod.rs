//! The command-line tools beside the server: clients of the service, above [`crate::api`],
//! which nothing else in the crate imports. `main` parses the command line and validates the
//! settings, then calls one of them with plain inputs (they never read the settings); each
//! prints its result and returns the exit code.
//!
//! - [`check`]: `sluice check-config`, a config validated as the service would load it.
//! - [`explain`]: `sluice explain`, against a running Sluice's `/debug/explain` or a config file.
//! - [`render`]: the explanation's text for a terminal.
//! - [`probe`]: `sluice probe`, the Helm chart's test hook.
//! - [`http`]: the HTTP/1.1 client explain and probe share (hyper's), with its time and size
//!   bounds.

pub mod check;
pub mod explain;
pub(crate) mod http;
pub mod probe;
pub(crate) mod render;

#[cfg(test)]
mod test_server;
