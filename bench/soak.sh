#!/usr/bin/env bash
# The soak and chaos run (issue 14): about 10 minutes of gRPC, /json and /nginx load on three
# write-behind peers and a Redis-backend node while Redis is stopped and killed, a peer is
# killed and stopped, the config is rewritten (whole, half-written, broken) and one node is
# flooded with connections. Not part of CI. See bench/soak.py for what it checks and reports.
#
#   bench/soak.sh                          # 10 minutes; bench/results/soak.md and soak-*.csv
#   BENCH_SOAK_QUICK=1 bench/soak.sh       # about 70 s, to try it; bench/results-quick/
#   BENCH_SOAK_SECONDS=300 bench/soak.sh   # any length (eleven slots, one per fault)
#   bench/soak.sh --repeat-flood 12        # only the flood, 12 times: RSS after each
#
# Environment: BENCH_SOAK_SECONDS, BENCH_SOAK_QUICK, BENCH_SOAK_RATE (requests/s, 600),
# BENCH_SOAK_DEADLINE_MS (1000), BENCH_OUT, BENCH_SOAK_KEEP=1 (keep logs), CARGO_TARGET_DIR.
# Exits 1 when a sluice crashed, did not exit cleanly at the end, or miscounted.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

export PATH="$PATH:/usr/sbin"
for pkg in redis-server:redis-server nginx:nginx; do
    if ! command -v "${pkg%%:*}" >/dev/null; then
        apt-get update -qq && apt-get install -y -qq "${pkg#*:}" >/dev/null
    fi
done
cargo build --release --quiet -p sluice -p sluice-bench --bin sluice --bin soak_load
exec python3 "$ROOT/bench/soak.py" "$@" "$TARGET/release/sluice" "$TARGET/release/soak_load"
