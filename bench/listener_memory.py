#!/usr/bin/env python3
"""What the listener limits cost at worst: the resident memory of a real sluice process holding
idle HTTP/1.1 connections, idle HTTP/2 connections, and HTTP/2 streams whose gRPC message never
comes, each at scale, measured as the growth of VmRSS per connection or per stream.

    cargo build --release && python3 bench/listener_memory.py [path/to/sluice]

It starts sluice on free loopback ports with the default limits except where a row says
otherwise, and prints one Markdown table row per case (docs/hardening.md has the results).
"""

import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

from proc import free_ports, rss_kib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(TARGET, "release", "sluice")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
SETTINGS_ACK = bytes([0, 0, 0, 4, 1, 0, 0, 0, 0])


def call_headers():
    block = b""
    for name, value in [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
        (b":authority", b"sluice"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]:
        block += bytes([0, len(name)]) + name + bytes([len(value)]) + value
    return block


def headers_frame(stream_id, block):
    n = len(block)
    return bytes([n >> 16, (n >> 8) & 0xFF, n & 0xFF, 1, 4]) + stream_id.to_bytes(4, "big") + block


class Sluice:
    def __init__(self, env):
        http, grpc, debug = free_ports(3)
        self.http, self.grpc = http, grpc
        self.config = tempfile.TemporaryDirectory()
        with open(os.path.join(self.config.name, "c.yaml"), "w") as f:
            f.write("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 9}\n")
        full_env = dict(os.environ, HOST="127.0.0.1", GRPC_HOST="127.0.0.1", DEBUG_HOST="127.0.0.1",
                        PORT=str(http), GRPC_PORT=str(grpc), DEBUG_PORT=str(debug), **env)
        self.proc = subprocess.Popen([BIN, "--config", self.config.name], env=full_env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", http), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sluice did not start")

    def settle(self):
        time.sleep(1.0)
        return rss_kib(self.proc.pid)

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.config.cleanup()


def measure(case, unit, n, env, open_all):
    s = Sluice(env)
    try:
        before = s.settle()
        held = open_all(s, n)
        after = s.settle()
        per = (after - before) * 1024 / n
        print(f"| {case} | {n:,} {unit} | {before:,} KiB | {after:,} KiB | {per:,.0f} B |")
        for c in held:
            c.close()
    finally:
        s.stop()


def idle_http1(s, n):
    return [socket.create_connection(("127.0.0.1", s.http)) for _ in range(n)]


def idle_http2(s, n):
    conns = []
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", s.grpc))
        c.sendall(PREFACE + SETTINGS_ACK)
        conns.append(c)
    return conns


def held_streams(per_conn):
    def open_all(s, n):
        block = call_headers()
        conns = []
        for _ in range(n // per_conn):
            c = socket.create_connection(("127.0.0.1", s.grpc))
            c.sendall(PREFACE + SETTINGS_ACK + b"".join(
                headers_frame(2 * i + 1, block) for i in range(per_conn)))
            conns.append(c)
        return conns
    return open_all


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"sluice: {BIN}")
    print("| case | held | RSS before | RSS after | per unit |")
    print("|---|---|---|---|---|")
    measure("idle HTTP/1.1 connections (PORT)", "connections", 4000, {}, idle_http1)
    measure("idle HTTP/2 connections (GRPC_PORT)", "connections", 4000, {}, idle_http2)
    # Streams held until their deadline: a long one, so none ends during the measurement.
    measure("gRPC streams with no message, 100 per connection", "streams", 40_000,
            {"SLUICE_REQUEST_TIMEOUT_MS": "60000", "SLUICE_MAX_INFLIGHT_REQUESTS": "100000"}, held_streams(100))


if __name__ == "__main__":
    main()
