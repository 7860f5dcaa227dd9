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

# Installs a Debian package when its binary is missing (CI machines start without them).
apt_updated=
ensure_apt_package() {
  local bin=$1 pkg=$2
  command -v "$bin" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if [ -z "$apt_updated" ]; then
      apt-get update -qq >/dev/null
      apt_updated=1
    fi
    echo "== installing $pkg"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
  else
    echo "!! $bin is missing: install the Debian package $pkg (tests that need it will skip, or fail under CI)"
  fi
}

ensure_apt_package redis-server redis-server

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --all-targets --all-features --locked -- -D warnings

echo "== cargo test"
cargo test --all-targets --locked
