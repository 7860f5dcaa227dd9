#!/usr/bin/env python3
"""Token budgets through a real Envoy, side by side (issue 51, docs/token-budgets.md).

Starts Sluice (memory store, examples/envoy-token-budget/ratelimit.yaml: 10,000 tokens a minute
per tenant), the example's OpenAI-style upstream (logging every stream it serves) and three
Envoys on free 127.0.0.1 ports, one per way of charging a stream's tokens:

  after   checks with 0 hits, charges the usage when the stream ends (as AI gateways do);
  refund  reserves the estimate (`x-max-tokens`), at the end refunds it (`is_negative_hits`)
          and charges the usage: the plain refund recipe;
  reserve Sluice's reservations: examples/envoy-token-budget/envoy.yaml as it is.

Two workloads run at once on each, each its own tenant: `short`, 40 concurrent streams of 50 to
300 ms, demand far above the budget; `long`, 7 concurrent streams of 2 to 20 s, demand near it,
so streams cross the windows' edges. Every request estimates 500 and costs 100 to 500. Then
prints, per mode and workload, the tokens spent in each minute (each served stream's cost, in
the minute it started: the minute whose budget admitted it) against the budget, as a Markdown
table, and exits 1 if `reserve` spent more than the budget in any minute, or less than 0.8 of it
in a whole minute of `short`.

    python3 bench/token_budget.py --sluice target/release/sluice --envoy target/venv/bin/envoy \\
        [--seconds 150] [--out bench/results/token-budget.md]
"""

import argparse
import collections
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "envoy-token-budget")
BUDGET = 10_000
WINDOW = 60

TENANT = """                            - request_headers:
                                header_name: x-tenant
                                descriptor_key: tenant
"""
USAGE = '"%DYNAMIC_METADATA(sluice.usage:tokens)%"'
# The ratelimit filter's rate_limits for the two other modes (the example's is `reserve`).
RATE_LIMITS = {
    "after": f"""                      rate_limits:
                        - actions:
{TENANT}                          hits_addend:
                            number: 0
                        - actions:
{TENANT}                          apply_on_stream_done: true
                          hits_addend:
                            format: {USAGE}
""",
    "refund": f"""                      rate_limits:
                        - actions:
{TENANT}                          hits_addend:
                            format: "%REQ(x-max-tokens)%"
                        - actions:
{TENANT}                          apply_on_stream_done: true
                          hits_addend:
                            format: "%REQ(x-max-tokens)%"
                            is_negative_hits: true
                        - actions:
{TENANT}                          apply_on_stream_done: true
                          hits_addend:
                            format: {USAGE}
""",
}
WORKLOADS = {
    # streams in flight, their length (ms), the wait after a refusal (s)
    "short": (40, (50, 300), 0.2),
    "long": (7, (2_000, 20_000), 1.0),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, what, seconds=20):
    end = time.time() + seconds
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"token_budget: {what} never listened on {port}")


def envoy_config(mode, ports):
    text = open(os.path.join(EXAMPLE, "envoy.yaml")).read()
    if mode != "reserve":
        # Their charge of the usage is sent for a refused request too: it must charge 0.
        default = 'dynamicMetadata():set("sluice.usage", "tokens", estimate)'
        text = text.replace(default, default.replace("estimate)", '"0")'))
        start = text.index("                      rate_limits:\n")
        end = text.index("                      failure_mode_deny:")
        text = text[:start] + RATE_LIMITS[mode] + text[end:]
    for name, value in ports.items():
        text = text.replace("${" + name + "}", str(value))
    return text


def client(port, tenant, workload, until, counts):
    in_flight, (short, long), pause = WORKLOADS[workload]
    while time.time() < until:
        headers = {"x-tenant": tenant, "x-max-tokens": "500",
                   "x-cost": str(random.randint(100, 500)),
                   "x-stream-ms": str(random.randint(short, long))}
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/v1/chat/completions", body='{"stream": true}', headers=headers)
            answer = conn.getresponse()
            answer.read()
            conn.close()
            counts[answer.status] += 1
            if answer.status != 200:
                time.sleep(pause)
        except OSError:
            counts["error"] += 1
            time.sleep(pause)


def spent(log):
    """Tokens served per tenant per minute (by the stream's start)."""
    out = collections.defaultdict(lambda: collections.defaultdict(int))
    for line in open(log):
        s = json.loads(line)
        out[s["tenant"]][int(s["started"] // WINDOW)] += s["cost"]
    return out


def table(spent_by, started, ended):
    first, last = int(started // WINDOW), int(ended // WINDOW)
    whole = [w for w in range(first, last + 1) if w * WINDOW >= started and (w + 1) * WINDOW <= ended]
    rows, failures = [], []
    for workload in WORKLOADS:
        for mode in ("after", "refund", "reserve"):
            per = spent_by.get(f"{mode}-{workload}", {})
            cells = [per.get(w, 0) for w in range(first, last + 1)]
            most = max(cells) / BUDGET
            least = min((per.get(w, 0) for w in whole), default=0) / BUDGET
            rows.append(f"| `{workload}` | {mode} | " + ", ".join(f"{c:,}" for c in cells)
                        + f" | **{most:.2f}** | {least:.2f} |")
            if mode == "reserve" and most > 1.0:
                failures.append(f"reserve/{workload}: {most:.2f} of the budget in a minute")
            if mode == "reserve" and workload == "short" and least < 0.8:
                failures.append(f"reserve/short: only {least:.2f} of the budget in a whole minute")
    head = ("| workload | mode | tokens spent per minute (first and last partial) "
            "| most / budget | least in a whole minute / budget |\n|---|---|---|---|---|")
    return head + "\n" + "\n".join(rows), failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sluice", required=True)
    parser.add_argument("--envoy", required=True)
    parser.add_argument("--seconds", type=int, default=150)
    parser.add_argument("--out")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="token-budget-")
    procs = []
    try:
        grpc, http_port, debug, up = free_port(), free_port(), free_port(), free_port()
        log = os.path.join(work, "streams.jsonl")
        procs.append(subprocess.Popen(
            [args.sluice, "--config", os.path.join(EXAMPLE, "ratelimit.yaml"),
             "--host", "127.0.0.1", "--port", str(http_port), "--grpc-host", "127.0.0.1",
             "--grpc-port", str(grpc), "--debug-host", "127.0.0.1", "--debug-port", str(debug)],
            env={**os.environ, "LOG_LEVEL": "warn"}, stdout=subprocess.DEVNULL))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(EXAMPLE, "upstream.py"), "--port", str(up), "--log", log]))
        wait_port(grpc, "sluice")
        wait_port(up, "upstream.py")
        ports = {}
        for mode in ("after", "refund", "reserve"):
            port = free_port()
            conf = os.path.join(work, f"envoy-{mode}.yaml")
            with open(conf, "w") as f:
                f.write(envoy_config(mode, {
                    "LISTEN_PORT": port, "ADMIN_PORT": 0, "RATELIMIT_HOST": "127.0.0.1",
                    "RATELIMIT_GRPC_PORT": grpc, "UPSTREAM_HOST": "127.0.0.1", "UPSTREAM_PORT": up}))
            procs.append(subprocess.Popen(
                [args.envoy, "-c", conf, "-l", "error", "--concurrency", "1",
                 "--base-id", str(random.randint(1, 1 << 20))],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, f"envoy-{mode}.log"), "w")))
            wait_port(port, f"envoy ({mode})")
            ports[mode] = port
        started = time.time()
        until = started + args.seconds
        counts = collections.defaultdict(collections.Counter)
        threads = []
        for mode, port in ports.items():
            for workload, (n, _, _) in WORKLOADS.items():
                tenant = f"{mode}-{workload}"
                for _ in range(n):
                    t = threading.Thread(target=client, args=(port, tenant, workload, until, counts[tenant]),
                                         daemon=True)
                    t.start()
                    threads.append(t)
        for t in threads:
            t.join()
        ended = time.time()
        time.sleep(2)
        text, failures = table(spent(log), started, until)
        answers = ", ".join(f"{t}: {dict(c)}" for t, c in sorted(counts.items()))
        report = (f"{text}\n\nBudget {BUDGET:,} tokens a minute per tenant; run of {args.seconds} s "
                  f"(last stream ended {ended - until:.1f} s after); answers per tenant: {answers}\n")
        print(report)
        if args.out:
            with open(args.out, "w") as f:
                f.write(report)
        if failures:
            sys.exit("token_budget: " + "; ".join(failures))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
