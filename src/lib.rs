//! Sluice: an external rate-limit service for Envoy and nginx, drop-in compatible with
//! envoyproxy/ratelimit.
//!
//! A request flows one way:
//!
//! ```text
//! api (decode) -> config (lookup: matched limits) -> store (apply hits, using limiter) -> api (encode)
//! ```
//!
//! - [`settings`]: CLI flags and envoyproxy/ratelimit's environment variables, validated once.
//! - [`app`]: wiring; listeners are passed in.
//! - [`api`]: adapters only (gRPC, `/json`, nginx `auth_request`, health, debug); errors become
//!   statuses here.
//! - [`descriptor`]: the decoded request, free of any protocol types.
//! - [`config`]: YAML -> validated model -> compiled lookup table; reload.
//! - [`service`]: envoyproxy/ratelimit's decision semantics over a store, as a short
//!   orchestration of named steps; it reports to an observer (`service::observe`) that
//!   [`telemetry`] implements, and knows no metrics or trace format.
//! - [`store`]: the counter-store trait and its backends.
//! - [`cluster`]: counters owned by one peer each (rendezvous hashing), hits forwarded to owners;
//!   optionally written behind to Redis and loaded by a new owner.
//! - [`limiter`]: the algorithms, pure functions of `(state, now, hits, limit)`, their
//!   `Decision`, and the one dispatch from a quota to its algorithm (`limiter::counter`).
//! - [`clock`]: the injected time source.
//! - [`net`]: every listener's accept loop and connections: caps on connections, streams and
//!   requests in flight, deadlines, idle and header timeouts, TLS handshakes, gRPC message
//!   lengths checked before decoding.
//! - [`tls`]: PEM files -> checked certificates and keys; the gRPC and peer listeners'
//!   reloading certificates; the peer cluster's mutual TLS (one certificate for the peer
//!   listener and the calls to peers); the clients' trust and identity (xDS, Redis, OTLP) and
//!   their tonic or rustls client configs.
//! - [`xds`]: config over xDS (CONFIG_TYPE=GRPC_XDS_SOTW), an adapter feeding [`config`].
//! - [`telemetry`]: the service's observer (stats, spans and logs of each decision); stats
//!   with envoyproxy/ratelimit's names and arithmetic, the Prometheus exposition, logs, and
//!   OpenTelemetry (spans and metrics over OTLP).

pub mod api;
pub mod app;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod descriptor;
pub mod limiter;
pub mod net;
pub mod service;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod xds;
