//! Sluice: an external rate-limit service for Envoy, nginx and other proxies, drop-in compatible
//! with envoyproxy/ratelimit.
//!
//! A request flows one way:
//!
//! ```text
//! api (decode) -> config (lookup: matched limits) -> store (apply hits, using limiter) -> api (encode)
//! ```
//!
//! - [`settings`]: CLI flags and envoyproxy/ratelimit's environment variables, validated once
//!   into the configuration types the subsystems own (one file per subsystem) and the app's
//!   options. Only `main` imports it; no subsystem does.
//! - [`app`]: the composition root, wiring only: the backend choice ([`app::Backend`],
//!   [`app::AnyStore`]), task supervision; listeners are passed in.
//! - [`cli`]: the command-line tools beside `main` (`check-config`, `explain`, `probe`):
//!   clients of the service, above [`api`], with their own HTTP/1.1 client (hyper's,
//!   bounded in time and size); `main` hands them plain inputs, never the settings.
//! - [`api`]: adapters only (gRPC, `/json`, `/nginx` and `/forward-auth`, HAProxy's SPOE,
//!   health); errors become statuses here.
//! - `admin`: the debug port's admin above the adapters: the status page, explain, counters,
//!   the runtime limits API and its tokens; a runtime limit change goes to
//!   [`runtime_limits`]'s sinks.
//! - [`descriptor`]: the decoded request, free of any protocol types.
//! - [`config`]: YAML -> validated model -> compiled lookup table (`value_regex` patterns in
//!   `config::patterns`); reload; the runtime limits set through the API (`config::runtime`: a
//!   layer over the YAML's tree per domain, its file).
//! - [`service`]: envoyproxy/ratelimit's decision semantics over a store, as a short
//!   orchestration of named steps; it reports to an observer (`service::observe`) that
//!   [`telemetry`] implements, and knows no metrics or trace format.
//! - [`store`]: the counter-store trait and its backends (memory, Redis, memcached; the Redis
//!   store, its targets and the Sentinel watcher share one client module and do not import each
//!   other; Redis and memcached share the breaker and the Go service's fixed-window pieces;
//!   `store::penalty`: `penalty_seconds`, one algorithm over every store that keeps penalties).
//! - [`key`]: the one writer of counter keys, the bytes a counter is kept under: the Go
//!   service's (CACHE_KEY_PREFIX, domain, entries, window start) and Sluice's own suffixes
//!   (`#<i>_`, `x<N><UNIT>_`, algorithm state, write-behind, memcached's hashed keys, RLQS
//!   buckets). It takes plain inputs, so the service, the stores, the cluster and the RLQS
//!   service call it without importing one another.
//! - [`rlqs`]: the Rate Limit Quota Service's state (Envoy's `rate_limit_quota` filter): its
//!   buckets, each Envoy's reports, the max-min fair parts assigned from attempted demand, and
//!   across nodes the bucket owner's view of the others ([`api`]'s `rlqs` adapter speaks the
//!   protocol; `limiter::Quota`, a limit's rate, is another thing).
//! - [`cluster`]: counters owned by one peer each (rendezvous hashing over `members`), hits
//!   taken to their counters by one type per SLUICE_CLUSTER_MODE behind one trait (`route/`:
//!   forward, divided, leased, and minority without a majority) and applied by the key's owner
//!   (`owner`) over the versioned peer protocol (`proto/sluice/peer/v1/peer.proto`, generated
//!   by `build.rs`; `peer/`: the protocol's server, client and batcher); the lease logic and
//!   the parent cluster's link (`lease/`); RLQS buckets' owners (`rlqs_peers`); optionally
//!   written behind to Redis and loaded by a new owner (`durable`); a node that joins relays
//!   its keys to their previous owner, then takes their counters over (`join`). Runtime limits
//!   shared by every peer (`runtime_peers`, a [`runtime_limits::Sink`]).
//! - [`runtime_limits`]: where a runtime limit change goes once it applies here, each a `Sink`
//!   the limits API waits for: SLUICE_RUNTIME_LIMITS_PATH's file, the peers, the replicas
//!   sharing Redis (`runtime_limits::redis`). The limits themselves are `config::runtime`.
//! - [`limiter`]: the algorithms, pure functions of `(state, now, hits, limit)`, their
//!   `Decision`, and the one dispatch from a quota to its algorithm (`limiter::counter`);
//!   calendar windows (`limiter::calendar`); what the lease client, the lease parent link and
//!   Redis allowances share, deciding from a batch a remote authority granted: the batch, its
//!   use and the next window's granted ahead (`limiter::granted`), and the attempted demand
//!   they refill ahead by (`limiter::demand`).
//! - [`clock`]: the injected time source.
//! - [`percent`]: the one strict percent-decoder (`/nginx`'s and `/forward-auth`'s fields, the OTEL
//!   `key=value` lists).
//! - [`secret`]: passwords and tokens, which never show in logs or debug output.
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

// An item is `pub` only when the binary, tests, benches, examples or measuring programs
// (bench/programs) reach it, so the compiler finds dead code: modules that no target outside the
// library uses are `pub(crate)`, and their items with them. (The library's own lint: test crates'
// helpers are theirs to make `pub`.)
#![warn(unreachable_pub)]

pub(crate) mod admin;
pub mod api;
pub mod app;
pub(crate) mod charged;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod descriptor;
pub mod key;
pub mod limiter;
pub mod net;
pub mod percent;
pub mod rlqs;
pub mod runtime_limits;
pub(crate) mod secret;
pub mod service;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod xds;
