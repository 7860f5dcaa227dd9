#!/usr/bin/env bash
# A shared-counter backend (Redis or memcached) beside the memory store, in one run.
#
#   bench/backend.sh redis           # 3 alternating rounds, 8 s per run: about 2 minutes
#   bench/backend.sh memcache
#   BENCH_ROUNDS=5 BENCH_DURATION=10 bench/backend.sh redis
#   REPLICAS=3 SLUICE_REDIS_ALLOWANCE=true bench/backend.sh redis
#
# Starts a local redis-server (persistence off) or memcached, Sluice on the memory store and
# REPLICAS Sluice processes (default 1) on that backend (the Go service's variables), all on free
# 127.0.0.1 ports; checks each answers correctly with a real gRPC client; then alternates the
# memory store and the replicas over rounds at three settings: `c2m100`, max(2, REPLICAS) h2load
# processes of `-c 1 -m 100`, process k sending to replica k mod REPLICAS one of two keys (so
# replicas share keys); `real`, the same with the realistic request (3 descriptors of 2
# entries); and `c1m1`, one call at a time to the first replica. Reports req/s, p50/p99 and,
# from the backend's own counters, what each request Sluice answered cost it: Redis's commands
# (INFO's total_commands_processed, reservations included) and socket reads (round trips),
# memcached's connections opened per 1000 requests. SLUICE_* variables in the environment reach
# every Sluice (SLUICE_REDIS_ALLOWANCE=true: allowances). Writes
# bench/results/<backend>[-<REPLICAS>-replicas][-allowance].md.
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
# BENCH_NO_BUILD=1: measure the binaries already in the target directory (a baseline kept aside).
[[ -n ${BENCH_NO_BUILD:-} ]] || cargo build --release --quiet -p sluice -p sluice-bench --bin sluice \
    --bin bench_client
BIN="$TARGET/release"
CLIENT="$BIN/bench_client"

REPLICAS=${REPLICAS:-1}
read -r STORE MEM_GRPC P1 P2 < <(free_ports 4)

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
# URL[server] is every process's gRPC URL (the memory store's one, the backend's replicas);
# ANSWERS[server] the specs bench/answers.py sums over them.
declare -A URL=([memory]="http://127.0.0.1:$MEM_GRPC" [$BACKEND]="")
declare -A ANSWERS=([memory]="sluice:$P2" [$BACKEND]="")
# HTTP[server]: every process's HTTP port, for `keys10k`'s /forward-auth calls.
declare -A HTTP_PORTS=([memory]="$P1" [$BACKEND]="")
for _ in $(seq "$REPLICAS"); do
    read -r HTTP GRPC DEBUG < <(free_ports 3)
    env LOG_LEVEL=error "${backend_env[@]}" "$BIN/sluice" "${common[@]}" \
        --port "$HTTP" --grpc-port "$GRPC" --debug-port "$DEBUG" &
    PIDS+=($!)
    URL[$BACKEND]+="http://127.0.0.1:$GRPC "
    HTTP_PORTS[$BACKEND]+="$HTTP "
    ANSWERS[$BACKEND]+="sluice:$DEBUG "
    # Healthy once the backend has answered (a memcache Sluice answers OK before that: it
    # fails open by default, as the Go service does).
    python3 - "$HTTP" <<'PY'
import sys, time, urllib.request
for _ in range(200):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthcheck", timeout=1)
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit("the backend's Sluice never became healthy")
PY
done
# The realistic request: 3 descriptors of 2 entries each (key `client`, then `route`).
real_request() { echo "client=$1,route=r1" "client=$1,route=r2" "client=$1,route=r3"; }
seq 0 9999 | sed 's|.*|/forward-auth?domain=bench\&descriptor=client%3Dk&|' >"$WORK/keys10k.txt"
for k in cold warm; do "$CLIENT" body "$WORK/$k-0.bin" bench "client=$k"; done
"$CLIENT" body "$WORK/over-0.bin" over "client=hot"
for k in 0 1; do
    "$CLIENT" body "$WORK/body-$k.bin" bench "client=c$k"
    # shellcheck disable=SC2046  # one argument per descriptor
    "$CLIENT" body "$WORK/real-$k.bin" bench $(real_request "c$k")
done
for server in memory "$BACKEND"; do
    for url in ${URL[$server]}; do
        wait_ready "$CLIENT" "$url"
        # Correctness: every call counted against 1e9/s and answered OK, remaining going down.
        "$CLIENT" check "$url" 20 1000000000 bench "client=check-$server"
        # The exact bytes h2load will send, answered OK (bench/answers.py says why).
        "$CLIENT" check-body "$url" "$WORK"/body-*.bin "$WORK"/real-*.bin
    done
done

# counters: what the backend did so far: Redis's commands processed and socket reads (round
# trips); memcached's `incr` calls and connections opened. OWN: what reading them adds to each
# between two reads (Redis: one INFO command and its read; memcached: one connection).
if [[ $BACKEND == redis ]]; then OWN=(1 1); else OWN=(0 1); fi
counters() {
    case $BACKEND in
        redis)
            redis-cli -p "$STORE" INFO stats | tr -d '\r' | python3 -c '
import sys
st = dict(l.strip().split(":", 1) for l in sys.stdin if ":" in l)
print(st["total_commands_processed"], st["total_reads_processed"])'
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

# allowance_calls SPEC...: "LOCAL COLD DRY", the replicas' allowance counters summed
# (sluice_redis_allowance_*_calls_total; 0 0 0 without allowances).
allowance_calls() {
    python3 - "$@" <<'PY'
import sys, urllib.request
sums = {"local": 0, "cold": 0, "dry": 0}
for spec in sys.argv[1:]:
    port = spec.split(":")[1]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        for k in sums:
            if line.startswith(f"sluice_redis_allowance_{k}_calls_total "):
                sums[k] += int(line.split()[1])
print(sums["local"], sums["cold"], sums["dry"])
PY
}

# run SERVER SETTING: one measurement; prints a JSON line.
run() {
    # single: every process sends the one body (else process k sends body k mod 2).
    local server=$1 setting=$2 procs=1 streams=1 body=body single=0 k pids=() urls rps=()
    read -r -a urls <<<"${URL[$server]}"
    case $setting in
        c2m100|real) procs=$((REPLICAS > 2 ? REPLICAS : 2)); streams=100 ;;
        # One key through every replica at a fixed rate per replica: cold (1 call a second) or
        # warm (50 a second, 5 a horizon: just hot enough to take batches).
        cold) procs=$REPLICAS; body=cold; single=1; rps=(--rps=1) ;;
        warm) procs=$REPLICAS; body=warm; single=1; rps=(--rps=50) ;;
        # One key of 1,000 a second (bench/config/over.yaml) through every replica as fast as
        # it answers: past its limit, nearly every call refused.
        over) procs=$REPLICAS; streams=100; body=over; single=1 ;;
        # 10^4 keys, every replica cycling through them as fast as it answers (/forward-auth
        # GETs, one key each, the same list for every process).
        keys10k) procs=$REPLICAS; streams=100 ;;
    esac
    local ports
    read -r -a ports <<<"${HTTP_PORTS[$server]}"
    [[ $setting == real ]] && body=real
    local before after answered_before answered_after calls_before=(0 0 0) calls_after=(0 0 0)
    read -r -a before < <(counters)
    # shellcheck disable=SC2086
    [[ $server == memory ]] || read -r -a calls_before < <(allowance_calls ${ANSWERS[$server]})
    # shellcheck disable=SC2086  # one spec per process
    answered_before=$(answers ${ANSWERS[$server]})
    local started=$EPOCHREALTIME
    for k in $(seq 0 $((procs - 1))); do
        local request=(-d "$WORK/$body-$((k % 2 * (1 - single))).bin"
            -H 'content-type: application/grpc' -H 'te: trailers'
            "${urls[k % ${#urls[@]}]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        if [[ $setting == keys10k ]]; then
            local port=${ports[k % ${#ports[@]}]}
            sed "s|^|http://127.0.0.1:$port|" "$WORK/keys10k.txt" >"$WORK/uris-$k.txt"
            request=(-i "$WORK/uris-$k.txt")
        fi
        h2load -c 1 -m "$streams" -t 1 -D "$DURATION" --warm-up-time=1 "${rps[@]}" \
            --log-file="$WORK/log-$k.tsv" "${request[@]}" >"$WORK/out-$k.txt" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k"; done
    # shellcheck disable=SC2086
    answered_after=$(answers --settled ${ANSWERS[$server]})
    read -r -a after < <(counters)
    local seconds
    seconds=$(python3 -c "print($EPOCHREALTIME - $started)")
    # shellcheck disable=SC2086
    [[ $server == memory ]] || read -r -a calls_after < <(allowance_calls ${ANSWERS[$server]})
    # Exits (so does the script) unless every call h2load counted was answered OK.
    python3 "$ROOT/bench/answers.py" check "$server, round $round, $setting" "$answered_before" \
        "$answered_after" -- "$WORK"/out-*.txt >&2
    python3 - "$server" "$setting" "$answered_before" "$answered_after" \
        "$((after[0] - before[0] - OWN[0]))" "$((after[1] - before[1] - OWN[1]))" \
        "$((calls_after[0] - calls_before[0])) $((calls_after[1] - calls_before[1])) $((calls_after[2] - calls_before[2]))" \
        "$seconds" "$WORK"/out-*.txt -- "$WORK"/log-*.tsv <<'PY'
import json, re, sys
server, setting, before, after, a, b, calls, seconds = sys.argv[1:9]
rest = sys.argv[9:]
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
# What Sluice answered OK (warm-up included, as the backend's counters are): the requests the
# backend's costs are divided by.
answered = int(after.split()[0]) - int(before.split()[0])
print(json.dumps({"server": server, "setting": setting, "rps": round(rps), "p50_ms": pct(0.5),
                  "p99_ms": pct(0.99), "answered": answered,
                  "a_per_request": int(a) / answered if answered else None,
                  "b_per_request": int(b) / answered if answered else None,
                  # The backend's commands a second over the run (warm-up included).
                  "a_per_second": round(int(a) / float(seconds), 1),
                  # With allowances: descriptors decided from batches, sent to Redis cold, and
                  # sent to Redis while their batch was dry.
                  "allowance_local_cold_dry": [int(c) for c in calls.split()]}))
PY
    rm -f "$WORK"/log-*.tsv "$WORK"/out-*.txt
}

RUNS="$WORK/runs.jsonl"
# BENCH_SETTINGS: a subset, or `cold warm` (one key at a fixed rate per replica), `over` (one
# key past its limit), `keys10k`.
SETTINGS=${BENCH_SETTINGS:-c2m100 real c1m1}
for round in $(seq "$ROUNDS"); do
    if ((round % 2)); then order="memory $BACKEND"; else order="$BACKEND memory"; fi
    for setting in $SETTINGS; do
        for server in $order; do run "$server" "$setting" | tee -a "$RUNS"; done
    done
done

NAME=$BACKEND
((REPLICAS > 1)) && NAME+="-$REPLICAS-replicas"
[[ ${SLUICE_REDIS_ALLOWANCE:-false} =~ ^(true|on|1)$ ]] && NAME+="-allowance"
python3 - "$RUNS" "$OUT/$NAME.md" "$ROUNDS" "$DURATION" "$BACKEND" "$REPLICAS" "$SETTINGS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
backend, replicas, settings = sys.argv[5], int(sys.argv[6]), sys.argv[7].split()
# The backend's two costs per request answered, and a scale for each.
cost = {"redis": (("Redis commands per request", 1), ("Redis round trips per request", 1)),
        "memcache": (("memcached incr per request", 1),
                     ("memcached connections opened per 1000 requests", 1000))}[backend]
label = backend if replicas == 1 else f"{backend} ({replicas} replicas)"
out = [f"| setting | store | req/s (median) | p50 | p99 | {cost[0][0]} | {cost[1][0]} | {cost[0][0].split(' per ')[0]} per second |",
       "|---|---|---|---|---|---|---|---|"]
med = lambda rs, k: statistics.median(r[k] for r in rs)
ratios = {}
for setting in settings:
    for server in ("memory", backend):
        rs = [r for r in rows if r["server"] == server and r["setting"] == setting]
        per = ([f"{med(rs, k) * c[1]:.3f}" for k, c in zip(("a_per_request", "b_per_request"), cost)]
               if server == backend else ["-", "-"])
        per.append(f"{med(rs, 'a_per_second'):,.1f}" if server == backend else "-")
        out.append(f"| `{setting}` | {label if server == backend else server} | "
                   f"{med(rs, 'rps'):,.0f} | {med(rs, 'p50_ms'):.2f} ms | "
                   f"{med(rs, 'p99_ms'):.2f} ms | {per[0]} | {per[1]} | {per[2]} |")
    m = med([r for r in rows if r["server"] == "memory" and r["setting"] == setting], "rps")
    r = med([r for r in rows if r["server"] == backend and r["setting"] == setting], "rps")
    ratios[setting] = r / m
out.append("")
out.append(f"{backend} / memory throughput (medians of {sys.argv[3]} alternating rounds, {sys.argv[4]} s each): "
           + ", ".join(f"`{s}` {v:.2f}" for s, v in ratios.items()))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
