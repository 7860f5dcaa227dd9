#!/usr/bin/env bash
# What a stranger costs a node with SLUICE_PEER_TLS: clients without a certificate handshake
# with its peer port in a loop (each refused), while /json is timed on the same node.
#
#   bench/peer_tls_flood.sh              # 4 flooding clients, 10 s: about 30 s
#   FLOODERS=8 bench/peer_tls_flood.sh
#
# Starts one release sluice (a one-node peer cluster with mutual TLS, certificates made here
# with openssl), times /json for 8 s idle, then for 8 s while FLOODERS `openssl s_time -new`
# loops hammer the peer port, and prints the refused handshakes (from the node's rate-limited
# warning, which counts the suppressed ones) and the warning lines logged. Everything shares
# this machine's cores, flooders included.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
FLOODERS=${FLOODERS:-4}
cargo build --release --quiet --bin sluice

ossl() { openssl "$@" >/dev/null 2>&1; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$WORK/ca.key" \
    -out "$WORK/ca.crt" -days 2 -subj /CN=bench-ca
ossl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$WORK/peer.key" \
    -out "$WORK/peer.csr" -subj /CN=peers.bench
echo "subjectAltName=DNS:peers.bench" >"$WORK/peer.ext"
ossl x509 -req -in "$WORK/peer.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" -CAcreateserial \
    -out "$WORK/peer.crt" -days 2 -extfile "$WORK/peer.ext"
printf 'domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n' \
    >"$WORK/limits.yaml"

read -r HTTP GRPC DEBUG PEER < <(free_ports 4)
LOG_LEVEL=warn LOG_FORMAT=json PEERS="127.0.0.1:$PEER" PEER_PORT="$PEER" \
    PEER_ADVERTISE_ADDRESS="127.0.0.1:$PEER" SLUICE_PEER_TLS=true \
    SLUICE_PEER_TLS_CERT="$WORK/peer.crt" SLUICE_PEER_TLS_KEY="$WORK/peer.key" \
    SLUICE_PEER_TLS_CACERT="$WORK/ca.crt" SLUICE_PEER_TLS_SAN=peers.bench \
    "$TARGET/release/sluice" --config "$WORK/limits.yaml" --host 127.0.0.1 --grpc-host 127.0.0.1 \
    --debug-host 127.0.0.1 --port "$HTTP" --grpc-port "$GRPC" --debug-port "$DEBUG" \
    2>"$WORK/sluice.log" &
PIDS+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$HTTP/healthcheck" >/dev/null && break; sleep 0.1; done

timed() { # timed LABEL: sequential /json calls for 8 s, one connection each
    python3 - "$HTTP" "$1" <<'PY'
import http.client, sys, time
port, label, lat = int(sys.argv[1]), sys.argv[2], []
body = '{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}'
end = time.monotonic() + 8
while time.monotonic() < end:
    t = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("POST", "/json", body)
    c.getresponse().read()
    c.close()
    lat.append((time.monotonic() - t) * 1000)
lat.sort()
print(f"| {label} | {len(lat) / 8:,.0f} | {lat[len(lat) // 2]:.2f} ms | "
      f"{lat[int(len(lat) * 0.99)]:.2f} ms | {lat[-1]:.2f} ms |")
PY
}
echo "| /json, one call per connection | calls/s | p50 | p99 | max |"
echo "|---|---|---|---|---|"
timed idle
flood=()
for _ in $(seq "$FLOODERS"); do
    openssl s_time -connect "127.0.0.1:$PEER" -new -time 10 -CAfile "$WORK/ca.crt" >/dev/null 2>&1 &
    flood+=($!)
done
sleep 1
timed "$FLOODERS clients without a certificate flooding the peer port"
for pid in "${flood[@]}"; do wait "$pid" || true; done
python3 - "$WORK/sluice.log" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if "peer TLS handshake failed" in l]
refused = sum(1 + int(l["fields"].get("suppressed", 0)) for l in lines)
print(f"\nrefused handshakes: {refused:,} in about 10 s ({refused / 10:,.0f}/s), "
      f"{len(lines)} warning lines logged")
PY
