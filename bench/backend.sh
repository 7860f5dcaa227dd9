#!/usr/bin/env bash
# A shared-counter backend (Redis or memcached) beside the memory store, in one run.
#
#   bench/backend.sh redis           # 3 alternating rounds, 8 s per run: about 2 minutes
#   bench/backend.sh memcache
#   BENCH_ROUNDS=5 BENCH_DURATION=10 bench/backend.sh redis
#
# Starts a local redis-server (persistence off) or memcached, Sluice on the memory store and
# Sluice on that backend (the Go service's variables), all on free 127.0.0.1 ports; checks both
# answer correctly with a real gRPC client; then alternates the two over rounds at `-c 2 -m 100`
# (two h2load processes, one key each) and `-c 1 -m 1`, and reports req/s, p50/p99 and, from the
# backend's own counters, what each request cost it: Redis's socket reads (round trips) per
# INCRBY, memcached's connections opened per 1000 `incr`. Writes bench/results/<backend>.md.
# Every load run is checked against Sluice's own count of its answers (bench/answers.py): a call
# answered with a non-zero grpc-status, or a backend error even answered OK (failing open), stops
# the script with a message naming the store and the round.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

bench_defaults
BACKEND=${1:-redis}
case $BACKEND in
    redis) server_pkg=redis-server:redis-server ;;
    memcache) server_pkg=memcached:memcached ;;
    *) echo "usage: bench/backend.sh redis|memcache" >&2; exit 64 ;;
esac

for pkg in h2load:nghttp2-client "$server_pkg"; do
    if ! command -v "${pkg%%:*}" >/dev/null; then
        apt-get update -qq && apt-get install -y -qq "${pkg#*:}" >/dev/null
    fi
done
cargo build --release --quiet --bin sluice --example bench_client
BIN="$TARGET/release"
CLIENT="$BIN/examples/bench_client"

read -r STORE MEM_GRPC RED_GRPC P1 P2 P3 P4 < <(free_ports 7)

case $BACKEND in
    redis)
        redis-server --port "$STORE" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
        backend_env=(REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$STORE")
        ;;
    memcache)
        memcached -l 127.0.0.1 -p "$STORE" -U 0 -u root -t 4 -m 256 &
        backend_env=(BACKEND_TYPE=memcache MEMCACHE_HOST_PORT="127.0.0.1:$STORE")
        ;;
esac
PIDS+=($!)
common=(--config "$ROOT/bench/config" --host 127.0.0.1 --grpc-host 127.0.0.1 --debug-host 127.0.0.1)
LOG_LEVEL=error BACKEND_TYPE=memory "$BIN/sluice" "${common[@]}" \
    --port "$P1" --grpc-port "$MEM_GRPC" --debug-port "$P2" &
PIDS+=($!)
env LOG_LEVEL=error "${backend_env[@]}" "$BIN/sluice" "${common[@]}" \
    --port "$P3" --grpc-port "$RED_GRPC" --debug-port "$P4" &
PIDS+=($!)
declare -A URL=([memory]="http://127.0.0.1:$MEM_GRPC" [$BACKEND]="http://127.0.0.1:$RED_GRPC")
declare -A ANSWERS=([memory]="sluice:$P2" [$BACKEND]="sluice:$P4")
# Healthy once the backend has answered (a memcache Sluice answers OK before that: it fails
# open by default, as the Go service does).
python3 - "$P3" <<'PY'
import sys, time, urllib.request
for _ in range(200):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthcheck", timeout=1)
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit("the backend's Sluice never became healthy")
PY
for server in memory "$BACKEND"; do
    wait_ready "$CLIENT" "${URL[$server]}"
    # Correctness: every call counted against 1e9/s and answered OK, remaining going down.
    "$CLIENT" check "${URL[$server]}" 20 1000000000 bench "client=check-$server"
done
for k in 0 1; do "$CLIENT" body "$WORK/body-$k.bin" bench "client=c$k"; done
# The exact bytes h2load will send, answered OK (bench/answers.py says why).
for server in memory "$BACKEND"; do "$CLIENT" check-body "${URL[$server]}" "$WORK"/body-*.bin; done

# counters: the backend's (requests it saw, what they cost): Redis's INCRBY calls (one per
# request here: one descriptor each) and socket reads; memcached's `incr` calls and connections
# opened.
counters() {
    case $BACKEND in
        redis)
            local info
            info=$(redis-cli -p "$STORE" INFO all | tr -d '\r')
            echo "$(sed -n 's/^cmdstat_incrby:calls=\([0-9]*\).*/\1/p' <<<"$info" | grep . || echo 0)" \
                "$(sed -n 's/^total_reads_processed:\([0-9]*\)/\1/p' <<<"$info")"
            ;;
        memcache)
            python3 - "$STORE" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"stats\r\n")
raw = b""
while not raw.endswith(b"END\r\n"):
    raw += s.recv(65536)
st = dict(l.split()[1:3] for l in raw.decode().splitlines() if l.startswith("STAT"))
print(int(st["incr_hits"]) + int(st["incr_misses"]), st["total_connections"])
PY
            ;;
    esac
}

# run SERVER SETTING: one measurement; prints a JSON line.
run() {
    local server=$1 setting=$2 procs streams k pids=()
    case $setting in c2m100) procs=2; streams=100 ;; c1m1) procs=1; streams=1 ;; esac
    local before after answered
    read -r -a before < <(counters)
    answered=$(answers "${ANSWERS[$server]}")
    for k in $(seq 0 $((procs - 1))); do
        h2load -c 1 -m "$streams" -t 1 -D "$DURATION" --warm-up-time=1 \
            -d "$WORK/body-$k.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
            --log-file="$WORK/log-$k.tsv" \
            "${URL[$server]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
            >"$WORK/out-$k.txt" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k"; done
    read -r -a after < <(counters)
    # Exits (so does the script) unless every call h2load counted was answered OK.
    python3 "$ROOT/bench/answers.py" check "$server, round $round, $setting" "$answered" \
        "$(answers "${ANSWERS[$server]}")" -- "$WORK"/out-*.txt >&2
    python3 - "$server" "$setting" "$DURATION" "$((after[1] - before[1]))" "$((after[0] - before[0]))" \
        "$WORK"/out-*.txt -- "$WORK"/log-*.tsv <<'PY'
import json, re, sys
server, setting, duration, cost, calls = sys.argv[1:6]
rest = sys.argv[6:]
sep = rest.index("--")
outs, logs = rest[:sep], rest[sep + 1:]
rps = 0.0
for o in outs:
    m = re.search(r"finished in [^,]+, ([\d.]+) req/s", open(o).read())
    rps += float(m.group(1)) if m else 0.0
lat = []
for l in logs:
    for line in open(l):
        f = line.split()
        if len(f) >= 3 and f[1] == "200":
            lat.append(int(f[2]))
lat.sort()
pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] / 1000 if lat else float("nan")
total = sum(1 for l in logs for _ in open(l))
print(json.dumps({"server": server, "setting": setting, "rps": round(rps), "p50_ms": pct(0.5),
                  "p99_ms": pct(0.99), "requests": total,
                  # The backend also counted h2load's warm-up, which its logs leave out; each
                  # request here has exactly one descriptor, so one INCRBY (or incr), and those
                  # count the requests the backend saw.
                  "calls": int(calls),
                  "cost_per_request": round(int(cost) / int(calls), 4) if int(calls) else None}))
PY
    rm -f "$WORK"/log-*.tsv "$WORK"/out-*.txt
}

RUNS="$WORK/runs.jsonl"
for round in $(seq "$ROUNDS"); do
    if ((round % 2)); then order="memory $BACKEND"; else order="$BACKEND memory"; fi
    for setting in c2m100 c1m1; do
        for server in $order; do run "$server" "$setting" | tee -a "$RUNS"; done
    done
done

python3 - "$RUNS" "$OUT/$BACKEND.md" "$ROUNDS" "$DURATION" "$BACKEND" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
backend = sys.argv[5]
cost = {"redis": ("Redis socket reads (round trips) per request", 1),
        "memcache": ("memcached connections opened per 1000 requests", 1000)}[backend]
out = [f"| setting | store | req/s (median) | p50 | p99 | {cost[0]} |",
       "|---|---|---|---|---|---|"]
med = lambda rs, k: statistics.median(r[k] for r in rs)
ratios = {}
for setting in ("c2m100", "c1m1"):
    for server in ("memory", backend):
        rs = [r for r in rows if r["server"] == server and r["setting"] == setting]
        per = f"{med(rs, 'cost_per_request') * cost[1]:.3f}" if server == backend else "-"
        out.append(f"| `{setting}` | {server} | {med(rs, 'rps'):,.0f} | {med(rs, 'p50_ms'):.2f} ms | "
                   f"{med(rs, 'p99_ms'):.2f} ms | {per} |")
    m = med([r for r in rows if r["server"] == "memory" and r["setting"] == setting], "rps")
    r = med([r for r in rows if r["server"] == backend and r["setting"] == setting], "rps")
    ratios[setting] = r / m
out.append("")
out.append(f"{backend} / memory throughput (medians of {sys.argv[3]} alternating rounds, {sys.argv[4]} s each): "
           + ", ".join(f"`{s}` {v:.2f}" for s, v in ratios.items()))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
