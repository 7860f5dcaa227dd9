#!/usr/bin/env bash
# The Redis backend beside the memory store, in one run (issue 5's benchmark).
#
#   bench/redis.sh                 # 3 alternating rounds, 8 s per run: about 2 minutes
#   BENCH_ROUNDS=5 BENCH_DURATION=10 bench/redis.sh
#
# Starts a local redis-server (persistence off), Sluice on the memory store and Sluice on Redis
# (REDIS_URL, the Go service's variables), all on free 127.0.0.1 ports; checks both answer
# correctly with a real gRPC client; then alternates the two over rounds at `-c 2 -m 100` (two
# h2load processes, one key each) and `-c 1 -m 1`, and reports req/s, p50/p99 and, from Redis's
# INFO, commands and socket reads (round trips) per request. Writes bench/results/redis.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

bench_defaults

for pkg in h2load:nghttp2-client redis-server:redis-server; do
    if ! command -v "${pkg%%:*}" >/dev/null; then
        apt-get update -qq && apt-get install -y -qq "${pkg#*:}" >/dev/null
    fi
done
cargo build --release --quiet --bin sluice --example bench_client
BIN="$TARGET/release"
CLIENT="$BIN/examples/bench_client"

read -r REDIS MEM_GRPC RED_GRPC P1 P2 P3 P4 < <(free_ports 7)

redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
PIDS+=($!)
common=(--config "$ROOT/bench/config" --host 127.0.0.1 --grpc-host 127.0.0.1 --debug-host 127.0.0.1)
LOG_LEVEL=error BACKEND_TYPE=memory "$BIN/sluice" "${common[@]}" \
    --port "$P1" --grpc-port "$MEM_GRPC" --debug-port "$P2" &
PIDS+=($!)
LOG_LEVEL=error REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$REDIS" "$BIN/sluice" "${common[@]}" \
    --port "$P3" --grpc-port "$RED_GRPC" --debug-port "$P4" &
PIDS+=($!)
declare -A URL=([memory]="http://127.0.0.1:$MEM_GRPC" [redis]="http://127.0.0.1:$RED_GRPC")
for server in memory redis; do
    wait_ready "$CLIENT" "${URL[$server]}"
    # Correctness: every call counted against 1e9/s and answered OK, remaining going down.
    "$CLIENT" check "${URL[$server]}" 20 1000000000 bench "client=check-$server"
done
for k in 0 1; do "$CLIENT" body "$WORK/body-$k.bin" bench "client=c$k"; done

info() { redis-cli -p "$REDIS" INFO "$1" | tr -d '\r'; }
stat() { info "$2" | sed -n "s/^$1:\(calls=\)\{0,1\}\([0-9]*\).*/\2/p"; }

# run SERVER SETTING: one measurement; prints a JSON line.
run() {
    local server=$1 setting=$2 procs streams k pids=()
    case $setting in c2m100) procs=2; streams=100 ;; c1m1) procs=1; streams=1 ;; esac
    local reads0 incr0
    reads0=$(stat total_reads_processed stats); incr0=$(stat cmdstat_incrby commandstats)
    for k in $(seq 0 $((procs - 1))); do
        h2load -c 1 -m "$streams" -t 1 -D "$DURATION" --warm-up-time=1 \
            -d "$WORK/body-$k.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
            --log-file="$WORK/log-$k.tsv" \
            "${URL[$server]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
            >"$WORK/out-$k.txt" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k"; done
    local reads1 incr1
    reads1=$(stat total_reads_processed stats); incr1=$(stat cmdstat_incrby commandstats)
    python3 - "$server" "$setting" "$DURATION" "$((reads1 - reads0))" "$((${incr1:-0} - ${incr0:-0}))" \
        "$WORK"/out-*.txt -- "$WORK"/log-*.tsv <<'PY'
import json, re, sys
server, setting, duration, reads, incrby = sys.argv[1:6]
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
                  # Redis also counted h2load's warm-up, which its logs leave out; each request
                  # here has exactly one descriptor, so one INCRBY, and INCRBY calls count the
                  # requests Redis saw.
                  "incrby": int(incrby),
                  "reads_per_request": round(int(reads) / int(incrby), 3) if int(incrby) else None}))
PY
    rm -f "$WORK"/log-*.tsv "$WORK"/out-*.txt
}

RUNS="$WORK/runs.jsonl"
for round in $(seq "$ROUNDS"); do
    if ((round % 2)); then order="memory redis"; else order="redis memory"; fi
    for setting in c2m100 c1m1; do
        for server in $order; do run "$server" "$setting" | tee -a "$RUNS"; done
    done
done

python3 - "$RUNS" "$OUT/redis.md" "$ROUNDS" "$DURATION" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = ["| setting | store | req/s (median) | p50 | p99 | Redis socket reads (round trips) per request |",
       "|---|---|---|---|---|---|"]
med = lambda rs, k: statistics.median(r[k] for r in rs)
ratios = {}
for setting in ("c2m100", "c1m1"):
    for server in ("memory", "redis"):
        rs = [r for r in rows if r["server"] == server and r["setting"] == setting]
        per = lambda k: f"{med(rs, k):.3f}" if server == "redis" else "-"
        out.append(f"| `{setting}` | {server} | {med(rs, 'rps'):,.0f} | {med(rs, 'p50_ms'):.2f} ms | "
                   f"{med(rs, 'p99_ms'):.2f} ms | {per('reads_per_request')} |")
    m = med([r for r in rows if r["server"] == "memory" and r["setting"] == setting], "rps")
    r = med([r for r in rows if r["server"] == "redis" and r["setting"] == setting], "rps")
    ratios[setting] = r / m
out.append("")
out.append(f"Redis / memory throughput (medians of {sys.argv[3]} alternating rounds, {sys.argv[4]} s each): "
           + ", ".join(f"`{s}` {v:.2f}" for s, v in ratios.items()))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
