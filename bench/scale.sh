#!/usr/bin/env bash
# The scale envelope (issue 40): how Sluice's costs grow with its work, one curve each.
#
#   bench/scale.sh                              # every curve: about 10 minutes
#   SCALE_CURVES="counters lease" bench/scale.sh
#   SCALE_COUNTERS="10000 100000 1000000 10000000 100000000" bench/scale.sh   # 10^8: ~15 GB
#   SCALE_CURVES=config SCALE_SHAPES=regex bench/scale.sh
#
# One program per curve, in bench/programs/src/bin:
#   counters  scale_counters.rs: 10^4 to 10^7 live counters in the memory store
#   config    scale_config.rs: 10 to 10^5 descriptors in one domain: flat, nested,
#             with wildcards and with value_regex patterns
#   rlqs      scale_rlqs.rs: 1 to 10,000 Envoy streams (simulated clients over real
#             sockets) against a real `sluice` process
#   lease     scale_lease.rs: 10^3 to 10^6 held keys per node, one renewal round
#
# Each size runs in its own process (so resident memory starts clean) and prints one JSON line;
# they go to bench/results/scale.jsonl (a size run again replaces its line in the report), and
# bench/scale_report.py writes bench/results/scale.md and one plot per curve
# (bench/results/scale-<curve>.svg), which docs/benchmarks.md shows.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
bench_defaults

CURVES=${SCALE_CURVES:-counters config rlqs lease}
COUNTERS=${SCALE_COUNTERS:-10000 100000 1000000 10000000}
DESCRIPTORS=${SCALE_DESCRIPTORS:-10 100 1000 10000 100000}
SHAPES=${SCALE_SHAPES:-flat nested wildcard regex}
STREAMS=${SCALE_STREAMS:-1 10 100 1000 5000 10000}
HELD=${SCALE_HELD:-1000 10000 100000 1000000}
RUNS="$OUT/scale.jsonl"

programs=()
for curve in $CURVES; do
    case $curve in
        counters|config|rlqs|lease) programs+=(--bin "scale_$curve") ;;
        *) echo "unknown curve $curve (counters, config, rlqs, lease)" >&2; exit 64 ;;
    esac
done
cargo build --release --quiet -p sluice -p sluice-bench --bin sluice "${programs[@]}"
BIN="$TARGET/release"

# one CURVE ARGS...: one size, its JSON line appended to RUNS (and shown).
one() {
    local curve=$1 line
    shift
    echo "scale: $curve $*" >&2
    line=$("$BIN/scale_$curve" "$@")
    echo "$line" | tee -a "$RUNS"
}

for curve in $CURVES; do
    case $curve in
        counters) for n in $COUNTERS; do one counters "$n"; done ;;
        config)
            for shape in $SHAPES; do
                for n in $DESCRIPTORS; do one config "$n" "$shape"; done
            done
            ;;
        rlqs) for n in $STREAMS; do one rlqs "$BIN/sluice" "$n"; done ;;
        lease) for n in $HELD; do one lease "$n"; done ;;
    esac
done
python3 "$ROOT/bench/scale_report.py" "$RUNS" "$OUT" >/dev/null
echo "scale: $OUT/scale.md and $OUT/scale-*.svg" >&2
