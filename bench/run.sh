#!/usr/bin/env bash
# Sluice's benchmarks, end to end: one command reproduces every number in docs/benchmarks.md.
#
#   bench/run.sh                  # full run, about 13 minutes on 2 cores
#   BENCH_QUICK=1 bench/run.sh    # smoke run, about 2 minutes; results go to bench/results-quick/ (ignored by git)
#                                 # (scripts/test.sh runs it, so CI prints the ratios)
#
# What it does, in order:
#   1. installs h2load (Debian's nghttp2-client) if missing; builds release binaries;
#   2. starts, on free 127.0.0.1 ports, Sluice (the real binary, memory store, bench/config/: limits
#      of 1e9/s that every key matches, so every request is counted and answered OK), the careful
#      comparison server (bench/programs/src/bin/careful_ratelimit.rs: the same work in a DashMap,
#      no more), the no-op ratelimit.v3 server (bench/programs/src/bin/noop_ratelimit.rs: answers OK
#      with no work), all three on the same tonic/envoy-types/tokio, and Sluice again with tracing
#      on but unsampled ("traced": TRACING_SAMPLING_RATE=0, an OTLP endpoint nobody listens on), and
#      for the realistic request Sluice and the careful server with the RateLimit-* headers on;
#      checks each answers correctly with a real gRPC client, and answers OK each body file h2load
#      will send;
#   3. alternates the servers over ROUNDS rounds at `-c 2 -m 100` (all four), at `-c 1 -m 1` and
#      with the realistic request (`real`: 3 descriptors of 2 entries, `-c 2 -m 100`), back to back
#      with the same settings; the headline is the ratios of the medians to the no-op server's,
#      and Sluice's to the careful server's;
#      every load run (here and below) is checked against the server's own count of its answers,
#      read before and after it (Sluice's /metrics, the baseline servers' --answers port): a run
#      where a call got a non-zero grpc-status, or h2load counted more successes than the server
#      answered OK, stops the benchmark with a message naming the server and the round
#      (bench/answers.py);
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
# in quick mode); BENCH_ROUNDS, BENCH_DURATION (seconds per load run); CARGO_TARGET_DIR;
# BENCH_NOOP_ARGS (more arguments for the no-op server: bench/selftest.sh plants a failing one).
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
cargo build --release --quiet -p sluice -p sluice-bench --bin sluice --bin noop_ratelimit \
    --bin careful_ratelimit --bin bench_client --bin counter_memory --bin lease_memory \
    --bin rlqs_memory
cargo bench --quiet --bench decision --no-run 2>/dev/null
BIN="$TARGET/release"
CLIENT="$BIN/bench_client"

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
read -r HTTP_PORT GRPC_PORT DEBUG_PORT NOOP_PORT CAREFUL_PORT T_HTTP T_GRPC T_DEBUG DEAD_PORT \
    H_HTTP H_GRPC H_DEBUG H_CAREFUL_PORT NOOP_ANSWERS CAREFUL_ANSWERS H_CAREFUL_ANSWERS \
    < <(free_ports 16)

# start_sluice HTTP GRPC DEBUG: the sluice binary on the bench config, in the background.
start_sluice() {
    LOG_LEVEL=error "$BIN/sluice" --config "$ROOT/bench/config" \
        --host 127.0.0.1 --port "$1" --grpc-host 127.0.0.1 --grpc-port "$2" \
        --debug-host 127.0.0.1 --debug-port "$3" &
    PIDS+=($!)
}
say "starting Sluice, the careful server, the no-op server and Sluice with tracing unsampled"
start_sluice "$HTTP_PORT" "$GRPC_PORT" "$DEBUG_PORT"
# Tracing on, nothing sampled: no caller sends a traceparent, so every call is a root sampled at
# rate 0; the exporter's endpoint is a port nobody listens on, and it never gets a span.
TRACING_ENABLED=true TRACING_SAMPLING_RATE=0 OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$DEAD_PORT" \
    start_sluice "$T_HTTP" "$T_GRPC" "$T_DEBUG"
# The realistic request's servers add the RateLimit-* headers (the issue's "headers on").
LIMIT_RESPONSE_HEADERS_ENABLED=true start_sluice "$H_HTTP" "$H_GRPC" "$H_DEBUG"
"$BIN/careful_ratelimit" "127.0.0.1:$CAREFUL_PORT" --answers "127.0.0.1:$CAREFUL_ANSWERS" &
PIDS+=($!)
"$BIN/careful_ratelimit" "127.0.0.1:$H_CAREFUL_PORT" headers \
    --answers "127.0.0.1:$H_CAREFUL_ANSWERS" &
PIDS+=($!)
# shellcheck disable=SC2086  # BENCH_NOOP_ARGS: words
"$BIN/noop_ratelimit" "127.0.0.1:$NOOP_PORT" --answers "127.0.0.1:$NOOP_ANSWERS" \
    ${BENCH_NOOP_ARGS:-} &
PIDS+=($!)
declare -A URL=([sluice]="http://127.0.0.1:$GRPC_PORT" [noop]="http://127.0.0.1:$NOOP_PORT"
    [careful]="http://127.0.0.1:$CAREFUL_PORT" [traced]="http://127.0.0.1:$T_GRPC"
    [sluice_real]="http://127.0.0.1:$H_GRPC" [careful_real]="http://127.0.0.1:$H_CAREFUL_PORT")
# Where each server's count of its answers is read (bench/answers.py read).
declare -A ANSWERS=([sluice]="sluice:$DEBUG_PORT" [noop]="example:$NOOP_ANSWERS"
    [careful]="example:$CAREFUL_ANSWERS" [traced]="sluice:$T_DEBUG"
    [sluice_real]="sluice:$H_DEBUG" [careful_real]="example:$H_CAREFUL_ANSWERS")
for server in "${!URL[@]}"; do
    wait_ready "$CLIENT" "${URL[$server]}"
done

# The realistic request: 3 descriptors of 2 entries each (key `client`, then `route`).
real_request() { echo "client=$1,route=r1" "client=$1,route=r2" "client=$1,route=r3"; }
say "correctness (a real gRPC client; h2load ignores grpc-status)"
# Every call counted against 1e9/s and answered OK with full statuses, remaining going down by
# one: the same answers from Sluice (with and without tracing) and the careful server.
for server in sluice careful traced; do
    "$CLIENT" check "${URL[$server]}" 20 1000000000 bench client=check
    # shellcheck disable=SC2046  # one argument per descriptor
    "$CLIENT" check "${URL[$server]}" 10 1000000000 bench $(real_request check)
done
for server in sluice_real careful_real; do
    # shellcheck disable=SC2046
    "$CLIENT" check --headers "${URL[$server]}" 10 1000000000 bench $(real_request check)
done
"$CLIENT" check "${URL[noop]}" 5 0 bench client=check

for k in $(seq 0 $((KEYS - 1))); do
    "$CLIENT" body "$WORK/body-$k.bin" bench "client=c$k"
    # shellcheck disable=SC2046
    "$CLIENT" body "$WORK/real-$k.bin" bench $(real_request "c$k")
done
# The exact bytes each server will get from h2load, answered OK: a call refused before any
# handler is refused alike for the same bytes, and is in no server's count of its answers.
for server in sluice careful noop traced; do
    "$CLIENT" check-body "${URL[$server]}" "$WORK"/body-*.bin
done
for server in sluice_real careful_real noop; do
    "$CLIENT" check-body "${URL[$server]}" "$WORK"/real-*.bin
done

# load NAME SETTING OFFERED DURATION WARMUP [field=value...]: one measurement.
# SETTING is c2m100 (KEYS processes x -c 1 -m 100), real (the same with the realistic request) or
# c1m1 (one process, one request at a time).
# OFFERED is the total --rps (0: as fast as possible).
load() {
    local name=$1 setting=$2 offered=$3 duration=$4 warmup=$5
    shift 5
    local procs streams body=body rps_args=() outs=() logs=() pids=() k
    case $setting in
        c2m100) procs=$KEYS; streams=100 ;;
        real) procs=$KEYS; streams=100; body=real ;;
        c1m1) procs=1; streams=1 ;;
        c2m*) procs=$KEYS; streams=${setting#c2m} ;;
    esac
    if [[ $offered != 0 ]]; then
        rps_args=(--rps="$(python3 -c "print(max(1, round($offered / $procs)))")")
    fi
    local server=$name
    [[ $setting == real && -n ${URL[${name}_real]:-} ]] && server=${name}_real
    local url=${URL[$server]} before after
    before=$(answers "${ANSWERS[$server]}")
    for k in $(seq 0 $((procs - 1))); do
        outs+=("$WORK/out-$k.txt"); logs+=("$WORK/log-$k.tsv")
        h2load -c 1 -m "$streams" -t 1 -D "$duration" --warm-up-time="$warmup" "${rps_args[@]}" \
            -d "$WORK/$body-$k.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
            --log-file="$WORK/log-$k.tsv" \
            "$url/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
            >"$WORK/out-$k.txt" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k"; done
    after=$(answers "${ANSWERS[$server]}")
    # Refuses (exits 1, so does this script) a run whose answers were not all OK.
    $REPORT run "$name" before="$before" after="$after" setting="$setting" offered="$offered" "$@" \
        -- "${outs[@]}" -- "${logs[@]}"
    rm -f "${logs[@]}"
}

# 3. Alternating rounds: within a round each setting runs its servers back to back, and the
# order of the servers reverses every round. Tracing is measured at c2m100 only.
declare -A SERVERS=([c2m100]="sluice careful noop traced" [real]="sluice careful noop"
    [c1m1]="sluice careful noop")
say "alternating rounds: $ROUNDS x (c2m100 x 4 servers, real x 3, c1m1 x 3), ${DURATION}s each"
for round in $(seq "$ROUNDS"); do
    for setting in c2m100 real c1m1; do
        order=${SERVERS[$setting]}
        ((round % 2)) || order=$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')
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
    "$BIN/counter_memory" "$n"
done | tee "$OUT/memory.txt"
# Lease and RLQS tables against what their byte bounds charge: each run exits 1 (and this script
# with it) when a table uses more than it is charged.
say "lease and quota tables against their charges"
for holders in 1 3 10; do
    "$BIN/lease_memory" 100000 "$holders"
    "$BIN/rlqs_memory" 100000 "$holders"
done | tee "$OUT/table-memory.txt"

say "summary (also in $OUT/summary.md)"
QUICK_FLAG=()
[[ "${BENCH_QUICK:-0}" == 1 ]] && QUICK_FLAG=(quick)
$REPORT summary "$BENCH_RUNS" "$OUT/micro.txt" "$OUT/memory.txt" "$OUT/machine.txt" "$OUT" \
    "${QUICK_FLAG[@]}"
