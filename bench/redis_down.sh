#!/usr/bin/env bash
# Calls while Redis is down, and the time service takes to resume once it is back (issue 14,
# item 6: fail fast when Redis is known down).
#
#   bench/redis_down.sh                          # this checkout's release build: about 1 minute
#   SLUICE_BIN=/tmp/sluice-before BENCH_OUTAGES=1 bench/redis_down.sh
#                                                # another build, e.g. one without the breaker
#                                                # (minutes: every call may wait REDIS_TIMEOUT)
#   BENCH_CALLS=200 BENCH_OUTAGES=10 bench/redis_down.sh
#
# Starts a local redis-server (persistence off) and Sluice on it with the Go service's
# variables (REDIS_TIMEOUT=500ms, its default), on free 127.0.0.1 ports; then, over one
# keep-alive HTTP connection, times BENCH_CALLS (100) sequential /json calls with Redis up, and
# in each of BENCH_OUTAGES (5) outages of each kind: Redis killed (SIGKILL: connections
# refused), then restarted on its port; Redis stopped (SIGSTOP: connections accepted, nothing
# answered), then continued (SIGCONT). After each outage it polls Redis (PING) and /json every
# 5 ms and reports how long after Redis's first PONG the first /json answered 200.
# Writes bench/results/redis-down.md (or BENCH_OUT/redis-down.md).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

CALLS=${BENCH_CALLS:-100}
OUTAGES=${BENCH_OUTAGES:-5}
OUT=${BENCH_OUT:-$ROOT/bench/results}
mkdir -p "$OUT"
if [[ -z ${SLUICE_BIN:-} ]]; then
    cargo build --release --quiet --bin sluice
    SLUICE_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/sluice
fi

read -r REDIS HTTP GRPC DEBUG < <(free_ports 4)
# start_redis [nowait]: redis-server on $REDIS; waits until it answers unless told not to.
start_redis() {
    redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
    REDIS_PID=$!
    PIDS+=("$REDIS_PID")
    [[ ${1:-} == nowait ]] && return
    until [[ $(redis-cli -p "$REDIS" PING 2>/dev/null) == PONG ]]; do sleep 0.01; done
}
start_redis
LOG_LEVEL=error REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$REDIS" REDIS_TIMEOUT=500ms \
    "$SLUICE_BIN" --config "$ROOT/bench/config" --host 127.0.0.1 --grpc-host 127.0.0.1 \
    --debug-host 127.0.0.1 --port "$HTTP" --grpc-port "$GRPC" --debug-port "$DEBUG" &
PIDS+=($!)
for _ in $(seq 200); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$HTTP/healthcheck") == 200 ]] && break
    sleep 0.1
done

RESULTS="$WORK/results.jsonl"
# client measure PHASE: CALLS sequential /json calls; records a JSON line.
# client recover PHASE: polls Redis (PING) and /json every 5 ms until /json answers 200;
# records how long after the first PONG that was.
client() {
    python3 - "$HTTP" "$REDIS" "$1" "$2" "$CALLS" <<'PY' | tee -a "$RESULTS"
import http.client, json, socket, sys, time
port, redis_port, mode, phase, calls = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
body = json.dumps({"domain": "bench", "descriptors": [{"entries": [{"key": "client", "value": "down"}]}]})
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
def call():
    conn.request("POST", "/json", body, {"content-type": "application/json"})
    r = conn.getresponse()
    r.read()
    return r.status
def pong():
    try:
        with socket.create_connection(("127.0.0.1", redis_port), timeout=0.05) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False
if mode == "measure":
    lat, statuses = [], {}
    for _ in range(calls):
        t = time.perf_counter()
        s = call()
        lat.append((time.perf_counter() - t) * 1000)
        statuses[s] = statuses.get(s, 0) + 1
    srt = sorted(lat)
    pct = lambda p: srt[min(len(srt) - 1, int(p * len(srt)))]
    print(json.dumps({"phase": phase, "calls": calls, "statuses": statuses, "p50_ms": round(pct(0.5), 2),
                      "p99_ms": round(pct(0.99), 2), "max_ms": round(srt[-1], 2),
                      "slow_calls": sum(1 for l in lat if l >= 100), "total_s": round(sum(lat) / 1000, 2)}))
else:
    start, first_pong = time.perf_counter(), None
    while True:
        if first_pong is None and pong():
            first_pong = time.perf_counter()
        if first_pong is not None and call() == 200:
            break
        if time.perf_counter() - start > 60:
            break
        time.sleep(0.005)
    print(json.dumps({"phase": phase, "recovered_ms": round((time.perf_counter() - first_pong) * 1000, 1)}))
PY
}

client measure "Redis up"
for _ in $(seq "$OUTAGES"); do
    kill -KILL "$REDIS_PID"
    wait "$REDIS_PID" 2>/dev/null || true
    client measure "Redis killed"
    start_redis nowait
    client recover "Redis restarted"
    kill -STOP "$REDIS_PID"
    client measure "Redis stopped (SIGSTOP)"
    kill -CONT "$REDIS_PID"
    client recover "Redis continued (SIGCONT)"
done

python3 - "$RESULTS" "$OUT/redis-down.md" "$SLUICE_BIN" "$OUTAGES" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = [f"`{sys.argv[3]}`, REDIS_TIMEOUT=500ms, sequential /json calls over one connection, "
       f"{sys.argv[4]} outage(s) of each kind:", "",
       "| phase | calls | answers | p50 | p99 | max | calls >= 100 ms | time for all calls (median per outage) |",
       "|---|---|---|---|---|---|---|---|"]
phases = []
for r in rows:
    if r["phase"] not in phases:
        phases.append(r["phase"])
for phase in phases:
    rs = [r for r in rows if r["phase"] == phase and "calls" in r]
    if not rs:
        continue
    statuses = {}
    for r in rs:
        for s, n in r["statuses"].items():
            statuses[s] = statuses.get(s, 0) + n
    answers = ", ".join(f"{n}x {s}" for s, n in sorted(statuses.items()))
    med = lambda k: statistics.median(r[k] for r in rs)
    out.append(f"| {phase} | {sum(r['calls'] for r in rs)} | {answers} | {med('p50_ms')} ms | "
               f"{med('p99_ms')} ms | {max(r['max_ms'] for r in rs)} ms | "
               f"{sum(r['slow_calls'] for r in rs)} | {med('total_s')} s |")
out.append("")
for phase in phases:
    rec = [r["recovered_ms"] for r in rows if r["phase"] == phase and "recovered_ms" in r]
    if rec:
        out.append(f"- {phase}: first /json 200 after Redis's first PONG: median "
                   f"{statistics.median(rec)} ms, max {max(rec)} ms ({len(rec)} outages)")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
