#!/usr/bin/env bash
# Sluice's benchmarks, end to end: one command reproduces every number in docs/benchmarks.md.
#
#   bench/run.sh                  # full run, about 10 minutes on 2 cores
#   BENCH_QUICK=1 bench/run.sh    # smoke run, about 2 minutes; results go to bench/results-quick/ (ignored by git)
#
# What it does, in order:
#   1. installs h2load (Debian's nghttp2-client) if missing; builds release binaries;
#   2. starts Sluice (the real binary, memory store, bench/config/: one limit of 1e9/s that every
#      key matches, so every request is counted and answered OK) and the no-op ratelimit.v3 server
#      (examples/noop_ratelimit.rs: same tonic/envoy-types/tokio, answers OK with no work), both on
#      free 127.0.0.1 ports, and checks both answer correctly with a real gRPC client;
#   3. alternates the two servers over ROUNDS rounds at `-c 2 -m 100` and at `-c 1 -m 1`, back to
#      back with the same settings; the headline is the ratio of the medians;
#   4. sweeps offered load (h2load --rps) for both servers, and draws the chart; then sweeps
#      outstanding requests (closed loop, 2 connections x 1..100 streams);
#   5. stops the servers, then runs the criterion micro-benchmarks and the memory measurement.
#
# Several distinct keys: h2load sends one body file, so the concurrent setting runs KEYS h2load
# processes at once, each with its own key (client=c0, c1, ...) and `-c 1 -m 100`: the same
# 2 connections x 100 streams as one `h2load -c 2 -m 100`. Requests per second are summed;
# latency percentiles come from the merged per-request logs (h2load --log-file).
#
# Environment: BENCH_QUICK=1; BENCH_OUT (results dir; default bench/results, or bench/results-quick
# in quick mode); BENCH_ROUNDS, BENCH_DURATION (seconds per load run); CARGO_TARGET_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

if [[ "${BENCH_QUICK:-0}" == 1 ]]; then
    ROUNDS=${BENCH_ROUNDS:-1}; DURATION=${BENCH_DURATION:-2}; WARMUP=1
    SWEEP_DURATION=2; SWEEP_LEVELS="0.25 0.5 1.0"; CLOSED_STREAMS="1 8 100"
    OUT=${BENCH_OUT:-$ROOT/bench/results-quick}; CRITERION_ARGS=(--quick)
else
    ROUNDS=${BENCH_ROUNDS:-5}; DURATION=${BENCH_DURATION:-10}; WARMUP=2
    SWEEP_DURATION=6; SWEEP_LEVELS="0.1 0.25 0.5 0.75 0.9 1.0 1.1 1.25"
    CLOSED_STREAMS="1 2 4 8 16 32 64 100"
    OUT=${BENCH_OUT:-$ROOT/bench/results}; CRITERION_ARGS=()
fi
KEYS=2
mkdir -p "$OUT"
export BENCH_RUNS="$OUT/runs.jsonl"
: >"$BENCH_RUNS"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
REPORT="python3 $ROOT/bench/report.py"

say() { printf '\n== %s\n' "$*"; }

# 1. Tools and binaries.
if ! command -v h2load >/dev/null; then
    say "installing h2load (nghttp2-client)"
    apt-get update -qq && apt-get install -y -qq nghttp2-client >/dev/null
fi
say "building release binaries"
cargo build --release --quiet --bin sluice --example noop_ratelimit --example bench_client \
    --example counter_memory
cargo bench --quiet --bench decision --no-run 2>/dev/null
BIN="$TARGET/release"
CLIENT="$BIN/examples/bench_client"

{
    echo "nproc: $(nproc)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "kernel: $(uname -sr)"
    echo "memory: $(grep MemTotal /proc/meminfo | awk '{printf "%.1f GiB", $2/1048576}')"
    echo "rustc: $(rustc --version)"
    echo "h2load: $(h2load --version | head -1)"
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "settings: rounds=$ROUNDS duration=${DURATION}s warm-up=${WARMUP}s keys=$KEYS"
} >"$OUT/machine.txt"

# 2. Servers.
read -r HTTP_PORT GRPC_PORT DEBUG_PORT NOOP_PORT < <(free_ports 4)

say "starting Sluice on 127.0.0.1:$GRPC_PORT and the no-op server on 127.0.0.1:$NOOP_PORT"
LOG_LEVEL=error "$BIN/sluice" --config "$ROOT/bench/config" \
    --host 127.0.0.1 --port "$HTTP_PORT" --grpc-host 127.0.0.1 --grpc-port "$GRPC_PORT" \
    --debug-host 127.0.0.1 --debug-port "$DEBUG_PORT" &
PIDS+=($!)
"$BIN/examples/noop_ratelimit" "127.0.0.1:$NOOP_PORT" &
PIDS+=($!)
declare -A URL=([sluice]="http://127.0.0.1:$GRPC_PORT" [noop]="http://127.0.0.1:$NOOP_PORT")
for server in sluice noop; do
    wait_ready "$CLIENT" "${URL[$server]}"
done

say "correctness (a real gRPC client; h2load ignores grpc-status)"
# Sluice: every call counted against 1e9/s and answered OK, remaining going down by one.
"$CLIENT" check "${URL[sluice]}" 20 1000000000 bench client=check
"$CLIENT" check "${URL[noop]}" 5 0 bench client=check

for k in $(seq 0 $((KEYS - 1))); do
    "$CLIENT" body "$WORK/body-$k.bin" bench "client=c$k"
done

# load NAME SETTING OFFERED DURATION WARMUP [field=value...]: one measurement.
# SETTING is c2m100 (KEYS processes x -c 1 -m 100) or c1m1 (one process, one request at a time).
# OFFERED is the total --rps (0: as fast as possible).
load() {
    local name=$1 setting=$2 offered=$3 duration=$4 warmup=$5
    shift 5
    local procs streams rps_args=() outs=() logs=() pids=() k
    case $setting in
        c2m100) procs=$KEYS; streams=100 ;;
        c1m1) procs=1; streams=1 ;;
        c2m*) procs=$KEYS; streams=${setting#c2m} ;;
    esac
    if [[ $offered != 0 ]]; then
        rps_args=(--rps="$(python3 -c "print(max(1, round($offered / $procs)))")")
    fi
    for k in $(seq 0 $((procs - 1))); do
        outs+=("$WORK/out-$k.txt"); logs+=("$WORK/log-$k.tsv")
        h2load -c 1 -m "$streams" -t 1 -D "$duration" --warm-up-time="$warmup" "${rps_args[@]}" \
            -d "$WORK/body-$k.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
            --log-file="$WORK/log-$k.tsv" \
            "${URL[$name]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
            >"$WORK/out-$k.txt" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k"; done
    $REPORT run "$name" setting="$setting" offered="$offered" "$@" -- "${outs[@]}" -- "${logs[@]}"
    rm -f "${logs[@]}"
}

# 3. Alternating rounds: within a round each setting runs both servers back to back, and the
# order of the servers flips every round.
say "alternating rounds: $ROUNDS x (c2m100, c1m1) x (sluice, noop), ${DURATION}s each"
for round in $(seq "$ROUNDS"); do
    if ((round % 2)); then order="sluice noop"; else order="noop sluice"; fi
    for setting in c2m100 c1m1; do
        for server in $order; do
            load "$server" "$setting" 0 "$DURATION" "$WARMUP" phase=rounds round="$round"
        done
    done
done

# 4. Offered-load sweep, as fractions of Sluice's median maximum at c2m100.
MAX=$(python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('$BENCH_RUNS')]
print(round(statistics.median(r['rps'] for r in rows
      if r['name'] == 'sluice' and r['setting'] == 'c2m100' and r['phase'] == 'rounds')))")
say "offered-load sweep: fractions $SWEEP_LEVELS of Sluice's maximum ($MAX req/s)"
i=0
for level in $SWEEP_LEVELS; do
    offered=$(python3 -c "print(round($level * $MAX))")
    if ((i++ % 2)); then order="noop sluice"; else order="sluice noop"; fi
    for server in $order; do
        load "$server" c2m100 "$offered" "$SWEEP_DURATION" 1 phase=sweep level="$level"
    done
done
# 4b. Closed-loop sweep: load set by outstanding requests (2 connections x N streams) instead of
# a rate. h2load's --rps pacing adds about 1 ms to every measured latency on this machine (the
# no-op server shows it too, even at 500 req/s), so the p99-at-half-throughput target is read
# from this sweep.
say "closed-loop sweep: 2 connections x $CLOSED_STREAMS streams"
i=0
for streams in $CLOSED_STREAMS; do
    if ((i++ % 2)); then order="noop sluice"; else order="sluice noop"; fi
    for server in $order; do
        load "$server" "c2m$streams" 0 "$SWEEP_DURATION" 1 phase=closed streams="$streams"
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"

# 5. Servers down; micro-benchmarks and memory on a quiet machine.
cleanup_servers() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    PIDS=()
}
cleanup_servers
say "micro-benchmarks (criterion)"
cargo bench --quiet --bench decision -- "${CRITERION_ARGS[@]}" 2>&1 | tee "$OUT/micro.txt"
say "memory per live counter"
for n in 250000 500000 1000000; do
    echo "# $n distinct keys"
    "$BIN/examples/counter_memory" "$n"
done | tee "$OUT/memory.txt"

say "summary (also in $OUT/summary.md)"
$REPORT summary "$BENCH_RUNS" "$OUT/micro.txt" "$OUT/memory.txt" "$OUT/machine.txt" "$OUT"
