#!/usr/bin/env python3
"""Lease mode under a burst (issue 34), with real processes.

Three `sluice` nodes in lease mode on loopback, one key limited to LIMIT per minute, and a
burst of 3 x LIMIT requests offered at once from six client threads: 90% of them to one node
and 5% to each of the others (pinned Envoy connections do this). Prints, per run, what the
cluster admitted of the LIMIT the window allows; the burst is fired only when the minute has
at least 20 s to spare, so it lies in one window.

    cargo build --release --bin sluice
    python3 bench/lease_burst.py --runs 5 [--binary target/release/sluice] [--warm]

`--warm` first sends the key a trickle in the previous window from every node, so the burst
meets leases granted ahead rather than cold keys. Exit status 1 when a run admits more than
the limit or fewer than `--floor` (default 0.95) of it.
"""

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

LIMIT = 600


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nodes(binary, config_dir, extra_env):
    ports = [
        {k: free_port() for k in ("http", "grpc", "debug", "peer")} for _ in range(3)
    ]
    peers = ",".join(f"127.0.0.1:{p['peer']}" for p in ports)
    procs = []
    for p in ports:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "REDIS"))}
        env.update(
            SLUICE_CLUSTER_MODE="lease",
            HOST="127.0.0.1",
            GRPC_HOST="127.0.0.1",
            DEBUG_HOST="127.0.0.1",
            PORT=str(p["http"]),
            GRPC_PORT=str(p["grpc"]),
            DEBUG_PORT=str(p["debug"]),
            PEERS=peers,
            PEER_PORT=str(p["peer"]),
            PEER_ADVERTISE_ADDRESS=f"127.0.0.1:{p['peer']}",
            **extra_env,
        )
        procs.append(
            subprocess.Popen(
                [binary, "--config", config_dir],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return ports, procs


def wait_healthy(ports, deadline=20):
    end = time.monotonic() + deadline
    for p in ports:
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", p["http"], timeout=1)
                c.request("GET", "/healthcheck")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > end:
                sys.exit("a node never became healthy")
            time.sleep(0.05)


def body(value):
    return json.dumps(
        {"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": value}]}]}
    )


def client(port, value, n, out, barrier):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    b = body(value)
    admitted = 0
    barrier.wait()
    for _ in range(n):
        c.request("POST", "/json", b, {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        if r.status == 200:
            admitted += 1
        elif r.status != 429:
            raise SystemExit(f"unexpected status {r.status}")
    out.append((port, admitted))


def burst(ports, value, busy):
    """1,800 requests at once: 4 threads on the busy node (90%), one on each other (5%)."""
    total = 3 * LIMIT
    quiet = total * 5 // 100
    plan = [(busy, (total - 2 * quiet) // 4)] * 4
    plan += [(i, quiet) for i in range(3) if i != busy]
    barrier = threading.Barrier(len(plan))
    out = []
    threads = [
        threading.Thread(target=client, args=(ports[i]["http"], value, n, out, barrier))
        for i, n in plan
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    per_node = {}
    for port, a in out:
        per_node[port] = per_node.get(port, 0) + a
    return sum(a for _, a in out), took, [per_node.get(p["http"], 0) for p in ports]


def lease_view(port, value):
    c = http.client.HTTPConnection("127.0.0.1", port["debug"], timeout=5)
    c.request("GET", f"/debug/lease?key=d_k_{value}_")
    r = c.getresponse()
    text = r.read()
    return json.loads(text) if r.status == 200 else {}


def trickle(ports, value, seconds):
    for _ in range(int(seconds * 10)):
        for p in ports:
            c = http.client.HTTPConnection("127.0.0.1", p["http"], timeout=5)
            c.request("POST", "/json", body(value), {"content-type": "application/json"})
            c.getresponse().read()
        time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default="target/release/sluice")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--floor", type=float, default=0.95)
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="print every node's /debug/lease")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "limits.yaml"), "w") as f:
            f.write(
                "domain: d\ndescriptors:\n  - key: k\n"
                f"    rate_limit: {{unit: minute, requests_per_unit: {LIMIT}}}\n"
            )
        ports, procs = start_nodes(args.binary, d, {"SLUICE_PEER_TIMEOUT_MS": "2000"})
        bad = 0
        try:
            wait_healthy(ports)
            # Past the lease duration after the ring formed (the rebuild cap).
            time.sleep(2)
            for run in range(args.runs):
                value = f"burst-{run}-{time.time_ns()}"
                busy = run % 3
                if args.warm:
                    # The trickle ends in the previous window, close to its end.
                    while 60 - time.time() % 60 > 2.5:
                        time.sleep(0.2)
                    trickle(ports, value, 2.0)
                    while 60 - time.time() % 60 < 50:
                        time.sleep(0.05)
                else:
                    while 60 - time.time() % 60 < 20:
                        time.sleep(0.5)
                admitted, took, per_node = burst(ports, value, busy)
                ok = args.floor * LIMIT <= admitted <= LIMIT
                owner = lease_view(ports[busy], value).get("owner", "?")
                if args.verbose:
                    for p in ports:
                        print("  ", json.dumps(lease_view(p, value)))
                bad += not ok
                print(
                    f"run {run}: busy node {busy} (owner {owner}): admitted {admitted} of {LIMIT}"
                    f" ({admitted / LIMIT:.3f}; per node {per_node}) in {took:.2f} s{'' if ok else '  <- out of bounds'}",
                    flush=True,
                )
        finally:
            for p in procs:
                p.kill()
                p.wait()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
