# Shared by the bench scripts: a work directory and a list of started processes, both cleaned
# up on exit, free loopback ports, and the servers' answer counts. Source it after
# `set -euo pipefail`, with ROOT set.

WORK=$(mktemp -d /tmp/sluice-bench.XXXXXX)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_ports N: N distinct ports free on 127.0.0.1 a moment ago, on one line.
free_ports() {
    python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
ports = [s.getsockname()[1] for s in socks]
for s in socks:
    s.close()  # before printing: the caller binds them as soon as it reads this line
print(*ports)' "$1"
}

# wait_ready CLIENT URL: waits (at most 20 s) until the ratelimit server at URL answers a call.
wait_ready() {
    local _
    for _ in $(seq 100); do
        "$1" check "$2" 1 0 bench client=ready >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "no answer from $2" >&2
    return 1
}

# answers SPEC...: "OK ERRORS", the answers the servers counted so far (sluice:DEBUG_PORT or
# example:ANSWERS_PORT); read before and after each load run, for bench/answers.py to check.
answers() {
    python3 "$ROOT/bench/answers.py" read "$@"
}

# bench_defaults: ROUNDS, DURATION (s), OUT (created) and TARGET from BENCH_ROUNDS,
# BENCH_DURATION, BENCH_OUT and CARGO_TARGET_DIR, for the backend benchmarks (redis, cluster).
bench_defaults() {
  ROUNDS=${BENCH_ROUNDS:-3}
  DURATION=${BENCH_DURATION:-8}
  OUT=${BENCH_OUT:-$ROOT/bench/results}
  mkdir -p "$OUT"
  TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
}
