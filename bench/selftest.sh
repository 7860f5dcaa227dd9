#!/usr/bin/env bash
# The benchmark refuses a server whose answers are not OK (issue 32): bench/run.sh in quick mode,
# one round of 1 s, with the no-op server planted (`noop_ratelimit --unavailable-after 100`) to
# answer its first 100 calls OK, enough for every check before the load, and every later call
# UNAVAILABLE, at full speed. h2load counts those answers as successes (HTTP 200); bench/run.sh
# must stop at the no-op server's first load run, exit non-zero and name it.
#
#   bench/selftest.sh    # about 15 s with the release binaries built (scripts/test.sh runs it
#                        # after the quick benchmark); results go to a temporary directory
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$(mktemp -d /tmp/sluice-selftest.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
start=$SECONDS

if BENCH_QUICK=1 BENCH_ROUNDS=1 BENCH_DURATION=1 BENCH_OUT="$OUT" \
    BENCH_NOOP_ARGS="--unavailable-after 100" "$ROOT/bench/run.sh" >"$OUT/log" 2>&1; then
    cat "$OUT/log"
    echo "!! bench/run.sh accepted a server answering UNAVAILABLE (log above)" >&2
    exit 1
fi
# Both checks fire: the server's count of errors, and its OK answers short of h2load's successes.
expected='^bench: refusing noop, round 1, c2m100: the server answered [0-9]+ calls with a non-zero grpc-status; h2load counted [0-9]+ successes but the server answered [0-9]+ calls OK$'
if ! grep -Eq "$expected" "$OUT/log"; then
    cat "$OUT/log"
    echo "!! bench/run.sh failed, but not with the refusal expected (log above)" >&2
    exit 1
fi
grep '^bench: refusing' "$OUT/log"
echo "selftest: bench/run.sh refused the planted server, as it should ($((SECONDS - start)) s)"
