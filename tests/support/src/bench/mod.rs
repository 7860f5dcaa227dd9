//! Helpers of the measuring programs (`bench/programs/`, `benches/decision.rs`): a comparison
//! server's count of its answers, a never-waiting future polled once, this process's resident
//! memory, the runtime-limit measurements' tenants, the workloads' random stream, and the
//! comparison servers' main loop.

pub mod answers;
pub mod ready;
pub mod rng;
pub mod rss;
pub mod serve;
pub mod tenants;
