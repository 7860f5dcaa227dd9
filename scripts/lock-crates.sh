#!/usr/bin/env bash
# Prints the names of the crates.io packages in a Cargo.lock (default: the repository's), sorted
# and once each: what the vendored advisory copy must cover (path packages such as sluice itself
# and tests/alloc_counter have no advisories). Used by scripts/test.sh and
# scripts/refresh-advisory-db.sh.
set -euo pipefail
lock="${1:-$(dirname "$0")/../Cargo.lock}"
awk '
  /^\[\[package\]\]/ { name = "" }
  /^name = "/ { name = $3; gsub(/"/, "", name) }
  /^source = "registry\+/ { print name }
' "$lock" | LC_ALL=C sort -u
