#!/usr/bin/env bash
# Refreshes deny/advisory-db/, the vendored copy of the RustSec advisory database that
# `cargo deny check` falls back to when github.com cannot be reached (scripts/test.sh).
#
# Only the advisories of the crates.io packages in Cargo.lock are kept, so the copy stays small; run this
# again after adding a dependency, and from time to time for new advisories. Usage:
#
#   scripts/refresh-advisory-db.sh                # clones https://github.com/rustsec/advisory-db
#   scripts/refresh-advisory-db.sh PATH           # from a clone (a work tree or a bare git dir)
#
# deny/advisory-db/SNAPSHOT records the commit and date the copy was taken from.
set -euo pipefail
cd "$(dirname "$0")/.."

src="${1:-}"
tmp=""
cleanup() { [ -z "$tmp" ] || rm -rf "$tmp"; }
trap cleanup EXIT
if [ -z "$src" ]; then
  tmp="$(mktemp -d)"
  git clone --quiet --bare --depth 1 https://github.com/rustsec/advisory-db "$tmp/advisory-db.git"
  src="$tmp/advisory-db.git"
fi
git_src() { git --git-dir="$(git -C "$src" rev-parse --git-dir | sed "s|^\([^/]\)|$src/\1|")" "$@"; }

commit="$(git_src rev-parse HEAD)"
date="$(git_src log -1 --format=%cI HEAD)"
out=deny/advisory-db
rm -rf "$out"
mkdir -p "$out/crates"

# The crates.io packages in Cargo.lock.
names="$(scripts/lock-crates.sh)"
kept=0
for name in $names; do
  files="$(git_src ls-tree --name-only "HEAD:crates/$name" 2>/dev/null || true)"
  [ -n "$files" ] || continue
  mkdir -p "$out/crates/$name"
  for f in $files; do
    git_src show "HEAD:crates/$name/$f" >"$out/crates/$name/$f"
    kept=$((kept + 1))
  done
done

# The names looked up, so scripts/test.sh can tell when Cargo.lock has crates this copy never
# looked for (a dependency added since).
echo "$names" >"$out/CRATES"

cat >"$out/SNAPSHOT" <<INFO
RustSec advisory database (https://github.com/rustsec/advisory-db), CC0-1.0.
Commit: $commit
Commit date: $date
Taken on: $(date -u +%Y-%m-%d)
Kept: the $kept advisories of the crates.io packages in Cargo.lock ($(echo "$names" | wc -l) crates).
Refresh: scripts/refresh-advisory-db.sh [PATH to a clone]
INFO
echo "deny/advisory-db: $kept advisories from $commit ($date)"
