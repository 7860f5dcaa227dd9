#!/usr/bin/env bash
# A 3-node loopback peer cluster, in forward and in lease mode, beside one node (issues 6, 16).
#
#   bench/cluster.sh                 # 3 rounds of single / forward / lease, 8 s per load run:
#                                    # about 3 minutes
#   BENCH_ROUNDS=5 BENCH_DURATION=10 bench/cluster.sh
#   BENCH_WRITE_BEHIND=1 bench/cluster.sh   # single / forward, the peers writing behind to Redis
#   BENCH_PEER_TLS=1 bench/cluster.sh       # forward mode in clear / over mutual TLS
#   BENCH_SERIAL_REQUESTS=9000 bench/cluster.sh   # one-at-a-time requests per mode and round
#   BENCH_PEER_BATCH_WINDOW_US=0 bench/cluster.sh # the peers' SLUICE_PEER_BATCH_WINDOW_US
#
# Starts one Sluice (memory store) and three Sluice peers (PEERS pointing at each other) on free
# 127.0.0.1 ports, checks both answer correctly, then rotates through the modes, restarting the
# peers (same ports, so every key keeps its owner) when a mode needs other peer settings:
#   - single: everything on the single node;
#   - cluster: the peers in forward mode (SLUICE_CLUSTER_MODE=forward);
#   - lease: the peers in lease mode (SLUICE_CLUSTER_MODE=lease, default lease timing);
#   - cluster-tls (BENCH_PEER_TLS=1): forward mode with SLUICE_PEER_TLS.
# Each run has two parts:
#   - load: 3 h2load processes (-c 1 -m 50 each, one key each), all on the single node or one
#     per peer; req/s and p50/p99 from h2load's per-request logs. The keys are picked (by
#     probing the peers' forwarded hits) so that one client's peer owns its key and the two
#     others' do not: two hits in three cross to a peer in forward mode, whatever the ports;
#   - one at a time: one h2load client with one request in flight (-c 1 -m 1), sequentially
#     over every (key, node) pair, so in a cluster two requests in three land on a node that
#     does not own their key, as with a load balancer in front; mean, p50 and p99 latency, and
#     in forward mode the same over forwarded decisions only (the pairs whose node forwarded).
# From the peers' /stats, each part reports its peer hops per decision (forwarded hits in
# forward mode; acquires and forwards in lease mode) and, for the load, peer calls per second
# per node (forward calls; lease renewal calls and acquires).
# Both parts are checked against the nodes' own counts of their answers (bench/answers.py): a
# call answered with a non-zero grpc-status stops the script with a message naming the mode and
# the round; one at a time (h2load -n, no warm-up), the nodes' OK answers must equal h2load's
# successes exactly.
# All three peers share this machine's two cores with h2load, so a cluster pays for its peer
# traffic with no extra CPU: the throughput is a floor, not what three machines would do.
# With BENCH_WRITE_BEHIND=1 the forward-mode peers run with SLUICE_PEER_WRITE_BEHIND=true
# against a redis-server started here (persistence off; lease mode does not write behind), and
# the report adds the take-over loads and the counters written per second.
# With BENCH_PEER_TLS=1 the peers run in forward mode in clear and over mutual TLS (one
# certificate for the three, from a CA made here with openssl): what mutual TLS costs.
# Writes bench/results/cluster.md (cluster-write-behind.md with BENCH_WRITE_BEHIND=1,
# cluster-peer-tls.md with BENCH_PEER_TLS=1) and keeps every run in cluster-runs.jsonl beside.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

bench_defaults
SERIAL=${BENCH_SERIAL_REQUESTS:-9000}

if ! command -v h2load >/dev/null; then
    apt-get update -qq && apt-get install -y -qq nghttp2-client >/dev/null
fi
cargo build --release --quiet -p sluice -p sluice-bench --bin sluice --bin bench_client
BIN="$TARGET/release"
CLIENT="$BIN/bench_client"

# 4 nodes x (http, grpc, debug, peer): 16 distinct ports, and one for Redis.
read -r -a P < <(free_ports 17)
PEERS="127.0.0.1:${P[7]},127.0.0.1:${P[11]},127.0.0.1:${P[15]}"
WRITE_BEHIND=${BENCH_WRITE_BEHIND:-0}
PEER_TLS=${BENCH_PEER_TLS:-0}
REPORT="$OUT/cluster.md"
DURABLE=()
TLS=()
[[ -n ${BENCH_PEER_BATCH_WINDOW_US:-} ]] && DURABLE=(SLUICE_PEER_BATCH_WINDOW_US="$BENCH_PEER_BATCH_WINDOW_US")
CLUSTER_MODE=forward
NODES="0 1 2 3"
MODES=(single cluster lease)
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
    MODES=(single cluster)
    redis-server --port "${P[16]}" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
    PIDS+=($!)
    for _ in $(seq 100); do
        [[ $(redis-cli -p "${P[16]}" PING 2>/dev/null) == PONG ]] && break
        sleep 0.1
    done
    DURABLE+=(SLUICE_PEER_WRITE_BEHIND=true REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:${P[16]}")
fi
declare -A NODE_PID
start() { # start INDEX: 0 the single node, 1-3 the peers (in $CLUSTER_MODE, with $TLS)
    local i=$1 base=$(($1 * 4))
    local env=(LOG_LEVEL=error BACKEND_TYPE=memory)
    if [[ $i -gt 0 ]]; then
        env+=(PEERS="$PEERS" PEER_PORT="${P[base + 3]}" PEER_ADVERTISE_ADDRESS="127.0.0.1:${P[base + 3]}"
            SLUICE_CLUSTER_MODE="$CLUSTER_MODE" "${DURABLE[@]}" "${TLS[@]}")
    fi
    env "${env[@]}" "$BIN/sluice" --config "$ROOT/bench/config" --host 127.0.0.1 \
        --grpc-host 127.0.0.1 --debug-host 127.0.0.1 --port "${P[base]}" \
        --grpc-port "${P[base + 1]}" --debug-port "${P[base + 2]}" &
    PIDS+=($!)
    NODE_PID[$i]=$!
}
grpc() { echo "http://127.0.0.1:${P[$1 * 4 + 1]}"; }
debug() { echo "${P[$1 * 4 + 2]}"; }
peers_up() { # peers_up: every peer sees all three peers up (at most 15 s)
    local _ i n
    for _ in $(seq 150); do
        n=0
        for i in 1 2 3; do
            n=$((n + $(curl -s "http://127.0.0.1:$(debug "$i")/stats" | grep -c '^sluice.cluster.peer_up.*: 1$' || true)))
        done
        [[ $n == 9 ]] && return 0
        sleep 0.1
    done
    echo "the peers never all saw each other up" >&2
    return 1
}
start_all() { # start_all: every node of $NODES, checked
    local i
    for i in $NODES; do start "$i"; done
    for i in $NODES; do
        wait_ready "$CLIENT" "$(grpc "$i")"
        "$CLIENT" check "$(grpc "$i")" 10 1000000000 bench "client=check-$i"
    done
    peers_up
}
RUNNING=forward # the peers' settings now: forward, lease or forward-tls
settings_of() { # settings_of MODE: the peer settings MODE runs on
    case $1 in
        single) echo "$RUNNING" ;; # the peers idle: whatever runs
        cluster) echo forward ;;
        cluster-tls) echo forward-tls ;;
        lease) echo lease ;;
    esac
}
restart_peers() { # restart_peers SETTINGS: the same three peers, on the same ports
    local i
    for i in 1 2 3; do kill "${NODE_PID[$i]}"; wait "${NODE_PID[$i]}" 2>/dev/null || true; done
    TLS=()
    [[ $1 == forward-tls ]] && TLS=("${TLS_ENV[@]}")
    CLUSTER_MODE=forward
    [[ $1 == lease ]] && CLUSTER_MODE=lease
    local nodes=$NODES
    NODES="1 2 3"
    start_all >/dev/null
    NODES=$nodes
    RUNNING=$1
    sleep 1 # a few probes and renewals before the load starts
}
start_all

node_stat() { # node_stat NODE NAME: peer NODE's sluice.cluster.NAME
    curl -s "http://127.0.0.1:$(debug "$1")/stats" | sed -n "s/^sluice.cluster.$2: //p"
}
owns() { # owns NODE VALUE: whether peer NODE owns client=VALUE (the peers in forward mode)
    local before
    before=$(node_stat "$1" forwarded_hits)
    "$CLIENT" check "$(grpc "$1")" 1 1000000000 bench "client=$2" >/dev/null
    [[ $(node_stat "$1" forwarded_hits) == "$before" ]]
}
# The load's keys, one per client: the first client's owned by peer 1, which it loads, the
# others' owned elsewhere than the peer they load. So in forward mode two hits in three are
# forwarded, as behind a load balancer spreading over three nodes, whatever the ports hash to.
KEYS=()
for k in 0 1 2; do
    for i in $(seq 100); do
        value="k$k-$i"
        owned=0
        owns $((k + 1)) "$value" && owned=1
        if [[ ($k == 0 && $owned == 1) || ($k != 0 && $owned == 0) ]]; then break; fi
    done
    KEYS+=("$value")
    "$CLIENT" body "$WORK/body-$k.bin" bench "client=$value"
done
# The exact bytes h2load will send, answered OK by every node (bench/answers.py says why).
for i in $NODES; do "$CLIENT" check-body "$(grpc "$i")" "$WORK"/body-*.bin; done

stats() { # stats: every numeric sluice.cluster.* counter, summed over the three peers, as JSON
    python3 - "$(debug 1)" "$(debug 2)" "$(debug 3)" <<'PY'
import json, sys, urllib.request
total = {}
for port in sys.argv[1:]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5).read().decode()
    for line in body.splitlines():
        name, _, value = line.partition(": ")
        if name.startswith("sluice.cluster.") and value.isdigit():
            name = name.removeprefix("sluice.cluster.")
            total[name] = total.get(name, 0) + int(value)
print(json.dumps(total))
PY
}

PATH_RL=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
H2_ARGS=(-H 'content-type: application/grpc' -H 'te: trailers')

answer_specs() { # answer_specs: where every node of $NODES counts its answers
    local i
    for i in $NODES; do echo "sluice:$(debug "$i")"; done
}
check_answers() { # check_answers LABEL BEFORE AFTER [exact] -- H2LOAD_STDOUT...: exits unless all OK
    python3 "$ROOT/bench/answers.py" check "$@" >&2
}

run() { # run MODE: one load run, then one-at-a-time requests; one JSON line
    local mode=$1 k n pids=() s0 s1 s2 node a0 a1 a2
    # shellcheck disable=SC2046  # one argument per node
    a0=$(answers $(answer_specs))
    s0=$(stats)
    for k in 0 1 2; do
        node=0
        [[ $mode != single ]] && node=$((k + 1))
        h2load -c 1 -m 50 -t 1 -D "$DURATION" --warm-up-time=1 -d "$WORK/body-$k.bin" \
            "${H2_ARGS[@]}" --log-file="$WORK/log-$k.tsv" "$(grpc "$node")$PATH_RL" \
            >"$WORK/out-$k.txt" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k"; done
    s1=$(stats)
    # Settled: calls still being answered after h2load left must not count one at a time.
    # shellcheck disable=SC2046
    a1=$(python3 "$ROOT/bench/answers.py" read --settled $(answer_specs))
    check_answers "$mode, round $round, load" "$a0" "$a1" -- "$WORK"/out-*.txt
    # One client, one request at a time: every key on every node of the setup, in turn.
    local targets=(0) each=$((SERIAL / 3))
    if [[ $mode != single ]]; then targets=(1 2 3); each=$((SERIAL / 9)); fi
    local before owner
    for k in 0 1 2; do
        for n in "${targets[@]}"; do
            before=$(node_stat "$n" forwarded_hits)
            h2load -c 1 -m 1 -t 1 -n "$each" -d "$WORK/body-$k.bin" "${H2_ARGS[@]}" \
                --log-file="$WORK/serial-$k-$n.tsv" "$(grpc "$n")$PATH_RL" \
                >"$WORK/serial-out-$k-$n.txt" 2>&1
            # A node that forwarded these hits does not own the key: its latencies are
            # forwarded decisions'.
            owner=$([[ $(node_stat "$n" forwarded_hits) == "$before" ]] && echo own || echo fwd)
            mv "$WORK/serial-$k-$n.tsv" "$WORK/serial-$k-$n-$owner.tsv"
        done
    done
    s2=$(stats)
    # shellcheck disable=SC2046
    a2=$(answers $(answer_specs))
    check_answers "$mode, round $round, one at a time" "$a1" "$a2" exact -- "$WORK"/serial-out-*.txt
    python3 - "$mode" "$DURATION" "$s0" "$s1" "$s2" "$WORK"/out-*.txt -- "$WORK"/log-*.tsv \
        -- "$WORK"/serial-*.tsv <<'PY'
import json, re, statistics, sys
mode, duration = sys.argv[1], int(sys.argv[2])
s0, s1, s2 = (json.loads(a) for a in sys.argv[3:6])
rest = sys.argv[6:]
a = rest.index("--")
b = rest.index("--", a + 1)
outs, logs, serial = rest[:a], rest[a + 1:b], rest[b + 1:]

def latencies(files):  # µs, answered requests only
    return sorted(int(f[2]) for name in files for f in (l.split() for l in open(name))
                  if len(f) >= 3 and f[1] == "200")

def pct(lat, p):
    return lat[min(len(lat) - 1, int(p * len(lat)))] / 1000 if lat else float("nan")

def delta(after, before):
    return {k: v - before.get(k, 0) for k, v in after.items()}

def hops(d):
    """Hits that crossed to a peer on the request path, and decisions, in one part."""
    fwd = d.get("forwarded_hits", 0)
    if mode == "lease":
        crossed = d.get("lease.acquires", 0) + fwd
        return crossed, d.get("lease.local_decisions", 0) + crossed
    return fwd, fwd + d.get("local_hits", 0)

rps = sum(float(m.group(1)) for o in outs
          for m in [re.search(r"finished in [^,]+, ([\d.]+) req/s", open(o).read())] if m)
load, one = latencies(logs), latencies(serial)
fwd = latencies([name for name in serial if name.endswith("-fwd.tsv")])
dl, ds = delta(s1, s0), delta(s2, s1)
crossed, decisions = hops(dl)
serial_crossed, serial_decisions = hops(ds)
calls = dl.get("peer_calls", 0) + dl.get("lease.renewal_calls", 0) + dl.get("lease.acquires", 0)
# The counters include h2load's warm-up second (its logs leave it out), so the ratios are taken
# between counters, never against the logged request count.
print(json.dumps({
    "mode": mode, "rps": round(rps), "p50_ms": pct(load, 0.5), "p99_ms": pct(load, 0.99),
    "requests": len(load),
    "serial_mean_ms": statistics.fmean(one) / 1000 if one else float("nan"),
    "serial_p50_ms": pct(one, 0.5), "serial_p99_ms": pct(one, 0.99), "serial_requests": len(one),
    "serial_forwarded_mean_ms": statistics.fmean(fwd) / 1000 if fwd else float("nan"),
    "serial_forwarded_p50_ms": pct(fwd, 0.5), "serial_forwarded_p99_ms": pct(fwd, 0.99),
    "serial_forwarded_requests": len(fwd),
    "hops_per_decision": crossed / decisions if decisions else 0.0,
    "serial_hops_per_decision": serial_crossed / serial_decisions if serial_decisions else 0.0,
    "peer_calls_per_s_node": calls / (duration + 1) / 3,
    "forwarded": dl.get("forwarded_hits", 0), "peer_calls": dl.get("peer_calls", 0),
    "renewal_calls": dl.get("lease.renewal_calls", 0), "acquires": dl.get("lease.acquires", 0),
    "loads": dl.get("durable.loads", 0),
    "written_per_s": round(dl.get("durable.flushed_counters", 0) / (duration + 1), 1)}))
PY
    rm -f "$WORK"/log-*.tsv "$WORK"/out-*.txt "$WORK"/serial-*.tsv "$WORK"/serial-out-*.txt
}

RUNS="$WORK/runs.jsonl"
for round in $(seq "$ROUNDS"); do
    # Each round starts one mode further on, so every mode runs first, second and last.
    order=()
    for i in "${!MODES[@]}"; do order+=("${MODES[$(((i + round - 1) % ${#MODES[@]}))]}"); done
    for mode in "${order[@]}"; do
        settings=$(settings_of "$mode")
        [[ $settings != "$RUNNING" ]] && restart_peers "$settings"
        run "$mode" | tee -a "$RUNS"
    done
done
cat "$RUNS" >>"${REPORT%.md}-runs.jsonl"

python3 - "$RUNS" "$REPORT" "$ROUNDS" "$DURATION" "$WRITE_BEHIND" "$SERIAL" "${MODES[@]}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rounds, duration, write_behind, serial = sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
modes = sys.argv[7:]
med = lambda rs, k: statistics.median(r[k] for r in rs)
small = lambda v: f"{v:.3f}" if v >= 0.01 or v == 0 else f"{v:.1e}"
names = {"single": "single node", "cluster": "3 peers, forward mode",
         "cluster-tls": "3 peers, forward mode, mutual TLS", "lease": "3 peers, lease mode"}
out = ["| setup | req/s (median) | p50 | p99 | one at a time: mean | p50 | p99 "
       "| peer hops per decision (load / one at a time) | peer calls per second per node |",
       "|---|---|---|---|---|---|---|---|---|"]
by = {m: [r for r in rows if r["mode"] == m] for m in modes}
for mode in modes:
    rs = by[mode]
    if mode == "single":
        extra = ("-", "-")
    else:
        extra = (f"{small(med(rs, 'hops_per_decision'))} / "
                 f"{small(med(rs, 'serial_hops_per_decision'))}",
                 f"{med(rs, 'peer_calls_per_s_node'):.1f}")
    out.append(f"| {names[mode]} | {med(rs, 'rps'):,.0f} | {med(rs, 'p50_ms'):.2f} ms | "
               f"{med(rs, 'p99_ms'):.2f} ms | {med(rs, 'serial_mean_ms') * 1000:.0f} µs | "
               f"{med(rs, 'serial_p50_ms') * 1000:.0f} µs | {med(rs, 'serial_p99_ms') * 1000:.0f} µs | "
               f"{extra[0]} | {extra[1]} |")
out.append("")
out.append(f"Medians of {rounds} rounds (the order rotating each round), {duration} s of load "
           f"per run (3 h2load clients, -c 1 -m 50, one key each) and {serial} requests one at a "
           f"time (h2load -c 1 -m 1 over every key and node), all on one 2-core machine.")
out.append("")
# Forward mode only: in lease mode a node that forwarded a few hits decided the rest itself.
fwd_modes = [m for m in modes if m.startswith("cluster") and by[m]]
for mode in fwd_modes:
    rs = by[mode]
    out.append(f"- {names[mode]}, forwarded decisions only, one at a time: mean "
               f"{med(rs, 'serial_forwarded_mean_ms') * 1000:.0f} µs, p50 "
               f"{med(rs, 'serial_forwarded_p50_ms') * 1000:.0f} µs, p99 "
               f"{med(rs, 'serial_forwarded_p99_ms') * 1000:.0f} µs "
               f"({med(rs, 'serial_forwarded_requests'):.0f} requests a round)")
if fwd_modes:
    out.append("")
base = modes[0]
for mode in modes[1:]:
    out.append(f"- {names[mode]} / {names[base]}: throughput "
               f"{med(by[mode], 'rps') / med(by[base], 'rps'):.2f}, one-at-a-time mean latency "
               f"{med(by[mode], 'serial_mean_ms') / med(by[base], 'serial_mean_ms'):.2f}, "
               f"p99 {med(by[mode], 'serial_p99_ms') / med(by[base], 'serial_p99_ms'):.2f}")
if write_behind == "1":
    rs = by["cluster"]
    loads = sum(r["loads"] for r in rs)
    requests = sum(r["requests"] for r in rs)
    out.append("")
    out.append(f"With SLUICE_PEER_WRITE_BEHIND (500 ms): {loads} take-over loads (Redis round trips "
               f"on the request path) over {requests:,} cluster requests in the timed runs, and "
               f"{med(rs, 'written_per_s')} counters written behind per second (median).")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
