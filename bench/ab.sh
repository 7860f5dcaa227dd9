#!/usr/bin/env bash
# A/B: two sluice binaries (say, a build of an earlier commit and this one) on the same config
# (bench/config: every request counted and answered OK), measured by h2load in alternating
# rounds so that a busy machine slows both alike. Prints each round and the medians. Every run
# is checked against the binary's own count of its answers (its /metrics; bench/answers.py): a
# call answered with a non-zero grpc-status stops the script, naming the binary and the round.
#
#   bench/ab.sh OLD_BINARY NEW_BINARY
#   BENCH_ROUNDS=9 BENCH_DURATION=6 BENCH_CONNECTIONS=2 BENCH_STREAMS=100 bench/ab.sh A B
#
# The gRPC request body comes from bench_client (bench/programs, built here in release).
set -euo pipefail
shopt -s inherit_errexit # a failed check inside $(rps ...) stops the script too

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
[[ $# == 2 ]] || { echo "usage: $0 OLD_BINARY NEW_BINARY" >&2; exit 64; }
OLD=$1
NEW=$2
ROUNDS=${BENCH_ROUNDS:-7}
DURATION=${BENCH_DURATION:-6}
C=${BENCH_CONNECTIONS:-2}
M=${BENCH_STREAMS:-100}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

cargo build --release --quiet -p sluice-bench --bin bench_client
CLIENT="$TARGET/release/bench_client"
"$CLIENT" body "$WORK/body.bin" bench client=c0

# start BINARY: starts it on free ports; prints its gRPC and debug ports.
start() {
    local http grpc debug
    read -r http grpc debug < <(free_ports 3)
    HOST=127.0.0.1 GRPC_HOST=127.0.0.1 DEBUG_HOST=127.0.0.1 PORT=$http GRPC_PORT=$grpc \
        DEBUG_PORT=$debug "$1" --config "$ROOT/bench/config" >/dev/null 2>&1 &
    PIDS+=($!)
    echo "$grpc $debug"
}
read -r OLD_PORT OLD_DEBUG < <(start "$OLD")
read -r NEW_PORT NEW_DEBUG < <(start "$NEW")
for port in "$OLD_PORT" "$NEW_PORT"; do
    wait_ready "$CLIENT" "http://127.0.0.1:$port"
    # The exact bytes h2load will send, answered OK (bench/answers.py says why).
    "$CLIENT" check-body "http://127.0.0.1:$port" "$WORK/body.bin" >/dev/null
done

# rps PORT DEBUG_PORT LABEL: requests per second h2load reached against it, once its answers
# are checked.
rps() {
    local before
    before=$(answers "sluice:$2")
    h2load -c "$C" -m "$M" -t 1 -D "$DURATION" --warm-up-time=1 -d "$WORK/body.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$1/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
        >"$WORK/out.txt" 2>&1
    python3 "$ROOT/bench/answers.py" check "$3" "$before" "$(answers "sluice:$2")" \
        -- "$WORK/out.txt" >/dev/null
    awk '/finished in/ { gsub(",", "", $4); print $4 }' "$WORK/out.txt"
}
echo "h2load -c $C -m $M, $ROUNDS rounds of $DURATION s, alternating"
for round in $(seq "$ROUNDS"); do
    old=$(rps "$OLD_PORT" "$OLD_DEBUG" "old, round $round")
    new=$(rps "$NEW_PORT" "$NEW_DEBUG" "new, round $round")
    echo "round $round old $old new $new"
done | tee "$WORK/rounds.txt"
python3 - "$WORK/rounds.txt" <<'PY'
import statistics, sys
rounds = [line.split() for line in open(sys.argv[1])]
old = [float(r[3]) for r in rounds]
new = [float(r[5]) for r in rounds]
print(f"median req/s: old {statistics.median(old):,.0f}, new {statistics.median(new):,.0f}, "
      f"new/old {statistics.median(new) / statistics.median(old):.2f}")
PY
