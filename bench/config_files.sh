#!/usr/bin/env bash
# What config files cost (docs/hardening.md, "Config files"), for one sluice binary:
#
#   parse   `sluice check-config` on one valid file of each size in SIZES_MB: CPU and peak RSS
#   idle    `sluice --config DIR` serving one valid file of each size in IDLE_MB, left alone:
#           CPU over IDLE_SECS (after the start-up load), and RSS
#   sparse  the same with a small config, then a 1 GiB sparse file dropped into DIR: CPU over
#           IDLE_SECS, and whether the old config keeps serving
#   calls   (with strace installed) the file system calls of 20 polls of the first IDLE_MB file
#   reload  10 changes (written elsewhere, renamed into place): the delay until /json answers
#           with the new limit
#
#   bench/config_files.sh [BIN]   # about 2.5 minutes; BIN defaults to
#                                 # $CARGO_TARGET_DIR/release/sluice (`cargo build --release`)
#   CONFIG_BENCH_SIZES_MB="1 4 16 50" CONFIG_BENCH_IDLE_MB="4 50" CONFIG_BENCH_IDLE_SECS=30
#
# The caps are raised (through their variables) far enough for every size to load; a binary
# without them ignores the variables. CPU is user + system time (from /proc/PID/stat for a
# running process), which a busy machine inflates less than wall time.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/bench/lib.sh"

BIN=${1:-${CARGO_TARGET_DIR:-$ROOT/target}/release/sluice}
SIZES_MB=${CONFIG_BENCH_SIZES_MB:-1 4 16 50}
IDLE_MB=${CONFIG_BENCH_IDLE_MB:-4 50}
IDLE_SECS=${CONFIG_BENCH_IDLE_SECS:-30}
export SLUICE_CONFIG_MAX_FILE_BYTES=$((1 << 30)) SLUICE_CONFIG_MAX_TOTAL_BYTES=$((1 << 30))
export LOG_LEVEL=error
TICKS=$(getconf CLK_TCK)

# gen FILE MB: one domain of `key: kN` descriptors, MB megabytes (10^6 bytes) at most.
gen() {
    python3 - "$1" "$2" <<'PY'
import sys
path, size = sys.argv[1], int(float(sys.argv[2]) * 1_000_000)
with open(path, "w") as f:
    f.write("domain: big\ndescriptors:\n")
    n, written = 0, 26
    while True:
        line = f"  - key: k{n}\n    rate_limit: {{unit: second, requests_per_unit: {n + 1}}}\n"
        if written + len(line) > size:
            break
        f.write(line)
        written += len(line)
        n += 1
PY
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_mb() { awk '/^VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }

# serve DIR: starts sluice on DIR, waits (up to 120 s) until it answers, sets PID and HTTP.
serve() {
    local http grpc debug
    read -r http grpc debug < <(free_ports 3)
    "$BIN" --config "$1" --host 127.0.0.1 --grpc-host 127.0.0.1 --debug-host 127.0.0.1 \
        --port "$http" --grpc-port "$grpc" --debug-port "$debug" >/dev/null 2>&1 &
    PID=$!
    PIDS+=("$PID")
    HTTP=$http
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$http/healthcheck" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "sluice on $1 did not answer" >&2
    return 1
}

# idle_cpu: percent of one core PID used over IDLE_SECS.
idle_cpu() {
    local before after
    before=$(cpu_ticks "$PID")
    sleep "$IDLE_SECS"
    after=$(cpu_ticks "$PID")
    awk -v d=$((after - before)) -v t="$TICKS" -v s="$IDLE_SECS" 'BEGIN {printf "%.1f", 100 * d / t / s}'
}

stop() {
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
}

echo "binary: $BIN"
echo "== parse: check-config on one file"
for mb in $SIZES_MB; do
    gen "$WORK/parse.yaml" "$mb"
    /usr/bin/time -f "%e %U %S %M" -o "$WORK/time" "$BIN" check-config "$WORK/parse.yaml" >/dev/null 2>&1 || true
    read -r wall user sys kb <"$WORK/time"
    cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%.2f", u + s}')
    printf '%5s MB: %6s s of CPU (%s s wall), peak RSS %5d MB\n' "$mb" "$cpu" "$wall" $((kb / 1024))
done

echo "== idle: serving one valid file, untouched, for $IDLE_SECS s"
for mb in $IDLE_MB; do
    mkdir -p "$WORK/idle$mb"
    gen "$WORK/idle$mb/limits.yaml" "$mb"
    start=$(date +%s.%N)
    serve "$WORK/idle$mb"
    loaded=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    sleep 2
    cpu=$(idle_cpu)
    printf '%5s MB: ready in %s s, idle CPU %s%% of a core, RSS %s MB\n' "$mb" "$loaded" "$cpu" "$(rss_mb "$PID")"
    stop
done

if command -v strace >/dev/null; then
    mb=${IDLE_MB%% *}
    echo "== calls: file system calls of an idle process over 10 s (20 polls), $mb MB config"
    serve "$WORK/idle$mb"
    sleep 2
    timeout -s INT 10 strace -f -c -e trace=openat,read,statx,newfstatat,getdents64 -p "$PID" \
        2>"$WORK/strace" || true
    awk '$NF ~ /^(openat|read|statx|newfstatat|getdents64)$/ {printf "  %-11s %s calls\n", $NF, $4}' "$WORK/strace"
    stop
fi

echo "== sparse: a 1 GiB sparse file dropped into a served directory (default caps)"
unset SLUICE_CONFIG_MAX_FILE_BYTES SLUICE_CONFIG_MAX_TOTAL_BYTES
mkdir -p "$WORK/sparse"
gen "$WORK/sparse/limits.yaml" 0.001
serve "$WORK/sparse"
python3 -c "open('$WORK/sparse/huge.yaml', 'wb').truncate(1 << 30)"
sleep 2
cpu=$(idle_cpu)
status=$(curl -s -o /dev/null -w '%{http_code}' -d '{"domain":"big","descriptors":[{"entries":[{"key":"k0"}]}]}' \
    "http://127.0.0.1:$HTTP/json" || true)
printf 'CPU %s%% of a core over %s s, RSS %s MB; /json on the old config: HTTP %s\n' \
    "$cpu" "$IDLE_SECS" "$(rss_mb "$PID")" "$status"
stop

echo "== reload: delay from a rename into place to the new limit answering, 10 changes"
mkdir -p "$WORK/reload"
printf 'domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n' \
    >"$WORK/reload/limits.yaml"
serve "$WORK/reload"
python3 - "$WORK/reload" "$HTTP" <<'PY'
import json, os, sys, time, urllib.request
folder, port = sys.argv[1], sys.argv[2]
def limit():
    body = json.dumps({"domain": "r", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/json", body.encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return json.load(r)["statuses"][0]["currentLimit"]["requestsPerUnit"]
    except urllib.error.HTTPError as e:
        return json.load(e)["statuses"][0]["currentLimit"]["requestsPerUnit"]
delays = []
for n in range(2, 12):
    tmp = os.path.join(folder, ".limits.yaml.tmp")
    with open(tmp, "w") as f:
        f.write(f"domain: r\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {n}}}\n")
    start = time.monotonic()
    os.rename(tmp, os.path.join(folder, "limits.yaml"))
    while limit() != n:
        time.sleep(0.01)
    delays.append(time.monotonic() - start)
    time.sleep(0.3)
delays.sort()
print(f"min {delays[0]:.2f} s, median {delays[len(delays) // 2]:.2f} s, max {delays[-1]:.2f} s")
PY
stop
