//! The debug port's admin (DEBUG_PORT): what an operator reads and changes, apart from the
//! protocol adapters in [`crate::api`], whose request decoders it reuses.
//!
//! - [`debug`]: the router: `/rlconfig`, `/metrics`, `/stats`, `/debug/*` (explain, counters,
//!   hot keys, lease and cluster views) and `/limits/...`, reading [`state`]; [`status`] renders
//!   the status page.
//! - [`explain`]: the request `/debug/explain` and `/debug/counters` take, decoded (`sluice
//!   explain --config` decodes it the same way; the tool itself is in `crate::cli`).
//! - [`limits`]: the runtime limits API (`/limits/...`): its paths read by [`limits_path`], its
//!   callers checked by [`auth`] (SLUICE_ADMIN_TOKEN_FILE), each change handed to the
//!   `crate::runtime_limits` sinks.

pub(crate) mod auth;
pub(crate) mod debug;
pub(crate) mod explain;
pub(crate) mod limits;
pub(crate) mod limits_path;
pub(crate) mod state;
pub(crate) mod status;
