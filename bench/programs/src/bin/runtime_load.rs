//! How long loading SLUICE_RUNTIME_LIMITS_PATH takes at start (issue 38: 100,000 limits in
//! under a second).
//!
//! `write FILE N` writes a file of N per-tenant limits as Sluice saves them, one JSON object a
//! line (`{"domain":"d","levels":[["tenant","t<i>"]],"limit":{"requests_per_unit":5,"unit":"minute"},"at_us":..,"origin":""}`).
//! `time FILE [ROUNDS]` loads it as `sluice` does at start, [`file::load`] in one
//! [`ConfigHandle::change`] over a YAML of one unrelated limit, ROUNDS times (default 5), each
//! into a fresh handle, and prints each round's time and the fastest. Each round then saves
//! the limits as the saver behind SLUICE_RUNTIME_LIMITS_PATH does after a change (the limits
//! taken from the state, [`file::save`] to `FILE.saved`, fsyncs included), and prints how long
//! that took: a `PUT` with the file set waits for such a save.
//!
//! ```sh
//! cargo run --release -p sluice-bench --bin runtime_load -- write /tmp/limits.jsonl 100000
//! cargo run --release -p sluice-bench --bin runtime_load -- time /tmp/limits.jsonl
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark's or load generator's own stopwatch, outside Sluice"
)]

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use sluice::config::runtime::file;
use sluice::config::{ConfigHandle, LoadOptions, parse_files};

const YAML: &str = "domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: second, requests_per_unit: 5}\n";

fn write(path: &Path, n: usize) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).expect("create the file"));
    for i in 0..n {
        writeln!(
            out,
            r#"{{"domain":"d","levels":[["tenant","t{i}"]],"limit":{{"requests_per_unit":5,"unit":"minute"}},"at_us":{},"origin":""}}"#,
            1_764_000_000_000_000_u64 + i as u64
        )
        .expect("write the file");
    }
    out.flush().expect("write the file");
}

/// One load as `sluice` starts: the YAML first, then the file in one change; then one save.
fn load(path: &Path) -> (usize, Duration, Duration) {
    let yaml = parse_files(&[("d.yaml".into(), YAML.into())], &LoadOptions::default())
        .expect("the config loads");
    let config = ConfigHandle::new(Some(yaml));
    let t = Instant::now();
    let n = config
        .change(|state| file::load(path, state))
        .expect("the file loads")
        .limits;
    let took = t.elapsed();
    let saved = path.with_extension("saved");
    let t = Instant::now();
    let (limits, removals) = config.runtime(|s| (s.all(), s.removals()));
    file::save(&saved, &limits, &removals).expect("the limits save");
    let save = t.elapsed();
    drop(limits);
    // Not timed: freeing the limits, which start-up never does.
    drop(config);
    (n, took, save)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["write", path, n] => {
            let n = n.parse().expect("N: a number");
            write(Path::new(path), n);
            println!("runtime_load: wrote {n} limits to {path}");
        }
        ["time", path, ref rounds @ ..] => {
            let rounds: usize = rounds.first().map_or(5, |r| r.parse().expect("ROUNDS"));
            let mut best = Duration::MAX;
            for round in 1..=rounds {
                let (n, took, save) = load(Path::new(path));
                println!(
                    "runtime_load: round {round}: {n} limits loaded in {:.3} s, saved in {:.3} s",
                    took.as_secs_f64(),
                    save.as_secs_f64()
                );
                best = best.min(took);
            }
            println!("runtime_load: fastest {:.3} s", best.as_secs_f64());
        }
        _ => {
            eprintln!("usage: runtime_load write FILE N | runtime_load time FILE [ROUNDS]");
            std::process::exit(2);
        }
    }
}
