#!/usr/bin/env bash
# A 3-node loopback peer cluster beside one node (issue 6's benchmark).
#
#   bench/cluster.sh                 # 3 alternating rounds, 8 s per run: about 2 minutes
#   BENCH_ROUNDS=5 BENCH_DURATION=10 bench/cluster.sh
#   BENCH_WRITE_BEHIND=1 bench/cluster.sh   # the peers write behind to a redis-server
#   BENCH_PEER_TLS=1 bench/cluster.sh       # the cluster in clear beside one over mutual TLS
#
# Starts one Sluice (memory store) and three Sluice peers (PEERS pointing at each other,
# forward mode) on free 127.0.0.1 ports, checks both answer correctly, then alternates:
#   - single: 3 h2load processes (-c 1 -m 50 each, one key each) on the single node;
#   - cluster: the same 3 processes, one per peer, so two thirds of the keys' hits are forwarded.
# Reports req/s, p50/p99 and, from the peers' /stats, forwarded hits and peer calls per request.
# All three peers share this machine's two cores with h2load, so the cluster pays for its
# forwarding with no extra CPU: the figure is a floor, not what three machines would do.
# With BENCH_WRITE_BEHIND=1 the peers run with SLUICE_PEER_WRITE_BEHIND=true against a
# redis-server started here (persistence off), and the report adds the take-over loads (Redis
# round trips on the request path) and the counters written per second.
# With BENCH_PEER_TLS=1 the rounds alternate between the three peers in clear and the same
# three (restarted on the same ports, so every key keeps its owner) with SLUICE_PEER_TLS (one
# certificate for the three, from a CA made here with openssl), instead of single node and
# cluster: the figure is what mutual TLS costs the forwarding.
# Writes bench/results/cluster.md (cluster-write-behind.md with BENCH_WRITE_BEHIND=1,
# cluster-peer-tls.md with BENCH_PEER_TLS=1).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

bench_defaults

if ! command -v h2load >/dev/null; then
    apt-get update -qq && apt-get install -y -qq nghttp2-client >/dev/null
fi
cargo build --release --quiet --bin sluice --example bench_client
BIN="$TARGET/release"
CLIENT="$BIN/examples/bench_client"

# 4 nodes x (http, grpc, debug, peer): 16 distinct ports, and one for Redis.
read -r -a P < <(free_ports 17)
PEERS="127.0.0.1:${P[7]},127.0.0.1:${P[11]},127.0.0.1:${P[15]}"
WRITE_BEHIND=${BENCH_WRITE_BEHIND:-0}
PEER_TLS=${BENCH_PEER_TLS:-0}
REPORT="$OUT/cluster.md"
DURABLE=()
TLS=()
NODES="0 1 2 3"
MODES=(single cluster)
if [[ $PEER_TLS == 1 ]]; then
    REPORT="$OUT/cluster-peer-tls.md"
    NODES="1 2 3"
    MODES=(cluster cluster-tls)
    ossl() { openssl "$@" >/dev/null 2>&1; }
    ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$WORK/ca.key" \
        -out "$WORK/ca.crt" -days 2 -subj /CN=bench-ca
    ossl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$WORK/peer.key" \
        -out "$WORK/peer.csr" -subj /CN=sluice-peers.bench
    echo "subjectAltName=DNS:sluice-peers.bench" >"$WORK/peer.ext"
    ossl x509 -req -in "$WORK/peer.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" \
        -CAcreateserial -out "$WORK/peer.crt" -days 2 -extfile "$WORK/peer.ext"
    TLS_ENV=(SLUICE_PEER_TLS=true SLUICE_PEER_TLS_CERT="$WORK/peer.crt"
        SLUICE_PEER_TLS_KEY="$WORK/peer.key" SLUICE_PEER_TLS_CACERT="$WORK/ca.crt"
        SLUICE_PEER_TLS_SAN=sluice-peers.bench)
fi
if [[ $WRITE_BEHIND == 1 ]]; then
    REPORT="$OUT/cluster-write-behind.md"
    redis-server --port "${P[16]}" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
    PIDS+=($!)
    for _ in $(seq 100); do
        [[ $(redis-cli -p "${P[16]}" PING 2>/dev/null) == PONG ]] && break
        sleep 0.1
    done
    DURABLE=(SLUICE_PEER_WRITE_BEHIND=true REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:${P[16]}")
fi
declare -A NODE_PID
start() { # start INDEX: 0 the single node, 1-3 the peers (with TLS's variables)
    local i=$1 base=$(($1 * 4))
    local env=(LOG_LEVEL=error BACKEND_TYPE=memory)
    if [[ $i -gt 0 ]]; then
        env+=(PEERS="$PEERS" PEER_PORT="${P[base + 3]}" PEER_ADVERTISE_ADDRESS="127.0.0.1:${P[base + 3]}"
            "${DURABLE[@]}" "${TLS[@]}")
    fi
    env "${env[@]}" "$BIN/sluice" --config "$ROOT/bench/config" --host 127.0.0.1 \
        --grpc-host 127.0.0.1 --debug-host 127.0.0.1 --port "${P[base]}" \
        --grpc-port "${P[base + 1]}" --debug-port "${P[base + 2]}" &
    PIDS+=($!)
    NODE_PID[$i]=$!
}
grpc() { echo "http://127.0.0.1:${P[$1 * 4 + 1]}"; }
debug() { echo "${P[$1 * 4 + 2]}"; }
start_all() { # start_all: every node of $NODES, checked
    local i
    for i in $NODES; do start "$i"; done
    for i in $NODES; do
        wait_ready "$CLIENT" "$(grpc "$i")"
        "$CLIENT" check "$(grpc "$i")" 10 1000000000 bench "client=check-$i"
    done
}
restart_peers() { # restart_peers cluster|cluster-tls: the same three peers, TLS on or off
    local i
    for i in $NODES; do kill "${NODE_PID[$i]}"; wait "${NODE_PID[$i]}" 2>/dev/null || true; done
    TLS=()
    [[ $1 == cluster-tls ]] && TLS=("${TLS_ENV[@]}")
    start_all >/dev/null
    sleep 1 # a few probes: every peer up before the load starts
}
start_all
for k in 0 1 2; do "$CLIENT" body "$WORK/body-$k.bin" bench "client=c$k"; done

cluster_stat() { # sum of a sluice.cluster.* counter over the three peers
    local total=0 i v
    for i in 1 2 3; do
        v=$(curl -s "http://127.0.0.1:$(debug "$i")/stats" | sed -n "s/^sluice.cluster.$1: //p")
        total=$((total + ${v:-0}))
    done
    echo "$total"
}

run() { # run single|cluster
    local mode=$1 k pids=() fwd0 calls0 local0 loads0 written0
    fwd0=$(cluster_stat forwarded_hits); calls0=$(cluster_stat peer_calls)
    local0=$(cluster_stat local_hits)
    loads0=$(cluster_stat durable.loads); written0=$(cluster_stat durable.flushed_counters)
    for k in 0 1 2; do
        local node=0
        [[ $mode != single ]] && node=$((k + 1))
        h2load -c 1 -m 50 -t 1 -D "$DURATION" --warm-up-time=1 \
            -d "$WORK/body-$k.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
            --log-file="$WORK/log-$k.tsv" \
            "$(grpc "$node")/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
            >"$WORK/out-$k.txt" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k"; done
    local fwd calls locals loads written
    fwd=$(($(cluster_stat forwarded_hits) - fwd0)); calls=$(($(cluster_stat peer_calls) - calls0))
    locals=$(($(cluster_stat local_hits) - local0))
    loads=$(($(cluster_stat durable.loads) - loads0))
    written=$(($(cluster_stat durable.flushed_counters) - written0))
    python3 - "$mode" "$fwd" "$calls" "$locals" "$loads" "$written" "$DURATION" \
        "$WORK"/out-*.txt -- "$WORK"/log-*.tsv <<'PY'
import json, re, sys
mode, fwd, calls, local = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
loads, written, duration = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
rest = sys.argv[8:]
sep = rest.index("--")
outs, logs = rest[:sep], rest[sep + 1:]
rps = sum(float(m.group(1)) for o in outs
          for m in [re.search(r"finished in [^,]+, ([\d.]+) req/s", open(o).read())] if m)
lat = sorted(int(f[2]) for l in logs for f in (line.split() for line in open(l))
             if len(f) >= 3 and f[1] == "200")
pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] / 1000 if lat else float("nan")
# The counters include h2load's warm-up second (its logs leave it out), so the ratios are taken
# between counters, never against the logged request count.
print(json.dumps({"mode": mode, "rps": round(rps), "p50_ms": pct(0.5), "p99_ms": pct(0.99),
                  "requests": len(lat), "forwarded": fwd, "local": local, "peer_calls": calls,
                  "loads": loads, "written_per_s": round(written / (duration + 1), 1)}))
PY
    rm -f "$WORK"/log-*.tsv "$WORK"/out-*.txt
}

RUNS="$WORK/runs.jsonl"
for round in $(seq "$ROUNDS"); do
    if ((round % 2)); then order="${MODES[0]} ${MODES[1]}"; else order="${MODES[1]} ${MODES[0]}"; fi
    for mode in $order; do
        [[ $PEER_TLS == 1 ]] && restart_peers "$mode"
        run "$mode" | tee -a "$RUNS"
    done
done

python3 - "$RUNS" "$REPORT" "$ROUNDS" "$DURATION" "$WRITE_BEHIND" "${MODES[@]}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
modes = sys.argv[6:]
med = lambda rs, k: statistics.median(r[k] for r in rs)
names = {"single": "single node", "cluster": "cluster nodes", "cluster-tls": "cluster nodes, mutual TLS"}
out = ["| setup | req/s (median) | p50 | p99 | share of hits forwarded | forwarded hits per peer call |",
       "|---|---|---|---|---|---|"]
for mode in modes:
    rs = [r for r in rows if r["mode"] == mode]
    if mode != "single":
        share = statistics.median(r["forwarded"] / max(1, r["forwarded"] + r["local"]) for r in rs)
        per_call = statistics.median(r["forwarded"] / max(1, r["peer_calls"]) for r in rs)
        extra = (f"{share:.2f}", f"{per_call:.1f}")
    else:
        extra = ("-", "-")
    out.append(f"| {names[mode]} | {med(rs, 'rps'):,.0f} | "
               f"{med(rs, 'p50_ms'):.2f} ms | {med(rs, 'p99_ms'):.2f} ms | {extra[0]} | {extra[1]} |")
base = statistics.median(r["rps"] for r in rows if r["mode"] == modes[0])
other = statistics.median(r["rps"] for r in rows if r["mode"] == modes[1])
what = ("3-node cluster over mutual TLS / in clear" if modes[0] == "cluster"
        else "3-node cluster / single node")
out.append("")
out.append(f"{what} throughput (medians of {sys.argv[3]} alternating rounds, "
           f"{sys.argv[4]} s each, all on one 2-core machine): {other / base:.2f}")
if sys.argv[5] == "1":
    rs = [r for r in rows if r["mode"] == "cluster"]
    loads = sum(r["loads"] for r in rs)
    requests = sum(r["requests"] for r in rs)
    out.append("")
    out.append(f"With SLUICE_PEER_WRITE_BEHIND (500 ms): {loads} take-over loads (Redis round trips "
               f"on the request path) over {requests:,} cluster requests in the timed runs, and "
               f"{med(rs, 'written_per_s')} counters written behind per second (median).")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
