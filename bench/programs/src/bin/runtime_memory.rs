//! Bytes per runtime limit (issue 38), beside bytes per limit of the same limits in the YAML.
//!
//! Sets N per-tenant limits (`tenant=t<i>`, 5 a minute, default N = 100,000) in domain `d`
//! of a [`ConfigHandle`] whose YAML holds one unrelated limit, and prints the heap bytes they
//! keep, divided by N: what the counting allocator (`tests/alloc_counter`) saw asked for and
//! not given back, the runtime state and the served config together, the allocator's own
//! overhead left out. The resident memory (VmRSS) before and after is printed beside it, which
//! includes that overhead and whatever the allocator keeps from freed memory.
//!
//! In the runtime modes it then prints the part of that which is the bodies as given (each
//! limit keeps its `PUT`'s JSON, what `GET` answers and the file saves), measured by building
//! the same N bodies alone.
//!
//! Modes: `api` sets each limit in a change of its own, as each `PUT` does; `load` sets them
//! all in one change, as loading SLUICE_RUNTIME_LIMITS_PATH does; `yaml` writes the same
//! limits into the YAML instead (`- key: tenant` / `value: t<i>` / `rate_limit: ...`) and
//! parses it, the YAML text freed before the reading.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin runtime_memory -- api 100000
//! cargo run --release -p sluice-bench --bin runtime_memory -- load 100000
//! cargo run --release -p sluice-bench --bin runtime_memory -- yaml 100000
//! ```

use std::sync::Arc;

use alloc_counter::{Counting, live_bytes};
use sluice::config::ConfigHandle;
use sluice_test_support::bench::rss::rss_bytes;
use sluice_test_support::bench::tenants::{body, made, set_runtime, yaml};

#[global_allocator]
static ALLOC: Counting = Counting;

fn put(config: &ConfigHandle, i: usize, origin: &Arc<str>) {
    let value = format!("t{i}");
    config
        .change(|s| {
            s.put("d", &[("tenant", Some(&value))], body(5), made(origin))
                .map(drop)
        })
        .expect("a valid runtime limit");
}

/// The heap bytes per body of N bodies as the runtime limits keep them (a `serde_json::Value`
/// inline in each limit, its map and strings on the heap).
fn body_bytes(n: usize) -> f64 {
    let mut bodies = Vec::with_capacity(n);
    let before = live_bytes();
    for _ in 0..n {
        bodies.push(body(5));
    }
    let bytes = live_bytes() - before;
    drop(bodies);
    bytes as f64 / n as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "api".to_owned());
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    // Every mode starts from the same served config: the YAML of one unrelated limit.
    let config = ConfigHandle::new(Some(yaml(0, 5)));
    let origin: Arc<str> = "".into();
    let (heap, rss) = (live_bytes(), rss_bytes());
    let config = match mode.as_str() {
        "api" => {
            for i in 0..n {
                put(&config, i, &origin);
            }
            config
        }
        "load" => {
            set_runtime(&config, "tenant", "t", n, 5);
            config
        }
        "yaml" => {
            let loaded = yaml(n, 5);
            // Stored as a reload stores it, replacing the config of one limit.
            config.store(loaded);
            config
        }
        other => {
            eprintln!("runtime_memory: unknown mode {other:?} (api, load or yaml)");
            std::process::exit(2);
        }
    };
    let served = config.current().expect("a config");
    assert_eq!(served.limits().count(), n + 1, "every limit is served");
    drop(served);
    let heap = live_bytes() - heap;
    let rss = rss_bytes().saturating_sub(rss);
    let per = |bytes: f64| bytes / n as f64;
    println!(
        "runtime_memory {mode}: {n} limits (tenant=t<i>, values of 2 to {} bytes)\n\
         heap: {:.0} bytes per limit ({heap} bytes)\n\
         resident: {:.0} bytes per limit ({rss} bytes)",
        format!("t{}", n.saturating_sub(1)).len(),
        per(heap as f64),
        per(rss as f64),
    );
    drop(config);
    if mode != "yaml" {
        println!(
            "of which the bodies as given: {:.0} bytes per limit",
            body_bytes(n)
        );
    }
}
