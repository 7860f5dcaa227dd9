#!/usr/bin/env python3
"""How many requests pass a memcached-backed limit when they arrive together.

Starts a real memcached, then for each round sends CALLS requests at once (threads released by
one barrier) on a fresh key with a limit of LIMIT per hour:

- the Go service's order of operations, replayed over memcached's text protocol: `get` the
  count, decide on it (`count + 1 <= limit`), then `incr`, or `add` for a new key and `incr`
  again if another writer added it first (src/memcached/cache_impl.go: DoLimit, increaseAsync);
- Sluice itself: the `sluice` binary with BACKEND_TYPE=memcache on the same memcached, the
  requests as `/json` calls.

Usage: python3 bench/memcache_accuracy.py [SLUICE_BINARY] (default target/release/sluice).
Prints the admitted counts per round and their mean for both.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

CALLS, LIMIT, ROUNDS = 100, 50, 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(port, line):
    """One command on its own connection, as gomemcache does without idle connections."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(line.encode())
        reply = b""
        while not reply.endswith(b"\r\n") or (reply.startswith(b"VALUE") and not reply.endswith(b"END\r\n")):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
        return reply.decode()


def go_request(port, key, limit, barrier, admitted):
    barrier.wait()
    reply = command(port, f"get {key}\r\n")
    count = int(reply.split("\r\n")[1]) if reply.startswith("VALUE") else 0
    if count + 1 <= limit:
        admitted.append(1)
    # increaseAsync: after the answer.
    if command(port, f"incr {key} 1\r\n").strip() == "NOT_FOUND":
        if command(port, f"add {key} 0 3600 1\r\n1\r\n").strip() == "NOT_STORED":
            command(port, f"incr {key} 1\r\n")


def sluice_request(http_port, value, barrier, admitted):
    body = json.dumps({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": value}]}]})
    barrier.wait()
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/json", data=body.encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status == 200:
                admitted.append(1)
    except urllib.error.HTTPError as e:
        if e.code != 429:
            raise


def rounds(run):
    """ROUNDS rounds after one warm-up round (the first threads and connections of a process
    start slowly enough to spread the burst out), which is not counted."""
    counts = []
    for r in range(ROUNDS + 1):
        barrier, admitted = threading.Barrier(CALLS), []
        threads = [threading.Thread(target=run, args=(r, barrier, admitted)) for _ in range(CALLS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counts.append(len(admitted))
    return counts[1:]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/sluice"
    mc_port = free_port()
    mc = subprocess.Popen(["memcached", "-l", "127.0.0.1", "-p", str(mc_port), "-U", "0", "-u", "root", "-t", "4"])
    sluice = None
    try:
        time.sleep(0.3)
        go = rounds(lambda r, b, a: go_request(mc_port, f"go_round{r}", LIMIT, b, a))
        root = tempfile.mkdtemp()
        os.makedirs(f"{root}/rl/config")
        with open(f"{root}/rl/config/limits.yaml", "w") as f:
            f.write(f"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}}}\n")
        http_port = free_port()
        env = dict(os.environ, BACKEND_TYPE="memcache", MEMCACHE_HOST_PORT=f"127.0.0.1:{mc_port}",
                   RUNTIME_ROOT=root, RUNTIME_SUBDIRECTORY="rl", USE_STATSD="false", HOST="127.0.0.1",
                   PORT=str(http_port), GRPC_HOST="127.0.0.1", GRPC_PORT=str(free_port()),
                   DEBUG_HOST="127.0.0.1", DEBUG_PORT=str(free_port()), LOG_LEVEL="error")
        sluice = subprocess.Popen([binary], env=env)
        deadline = time.time() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthcheck", timeout=1)
                break
            except Exception:
                if time.time() > deadline:
                    raise SystemExit("sluice did not become healthy")
                time.sleep(0.05)
        ours = rounds(lambda r, b, a: sluice_request(http_port, f"round{r}", b, a))
        print(f"{CALLS} requests at once, limit {LIMIT}, {ROUNDS} rounds")
        print(f"  Go's order of operations: admitted {go}, mean {sum(go) / len(go):.1f}")
        print(f"  Sluice:                   admitted {ours}, mean {sum(ours) / len(ours):.1f}")
    finally:
        if sluice:
            sluice.kill()
        mc.kill()


if __name__ == "__main__":
    main()
