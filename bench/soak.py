#!/usr/bin/env python3
"""Sluice's soak and chaos run (issue 14, item 10). Not CI: `bench/soak.sh` builds and runs it.

    bench/soak.sh                          # 10 minutes; bench/results/soak.md and soak-*.csv
    BENCH_SOAK_QUICK=1 bench/soak.sh       # about 70 s, to try it; bench/results-quick/
    BENCH_SOAK_SECONDS=300 bench/soak.sh   # any length: always eleven slots, one per fault
    bench/soak.sh --repeat-flood 12        # only the flood, 12 times, no load: RSS after each

Topology (all on 127.0.0.1, free ports): one redis-server (persistence off); three Sluice peers
p1-p3 (PEERS, forward mode, SLUICE_PEER_WRITE_BEHIND to that Redis); one Sluice on the Redis
backend, r, on the same Redis; nginx in front of the three peers' `/nginx` (auth_request, the
upstream's three servers as nginx balances them). One Redis serves both ways Sluice uses it, so
each Redis fault hits a request path (r: REDIS_TIMEOUT, reconnects) and the cluster's durable
path (flushes, take-over loads) at once, and each peer fault hits forwarding, probes, take-over
and the restarted owner's loads, for about the CPU of one extra idle process.

Load (bench/programs/src/bin/soak_load.rs): BENCH_SOAK_RATE requests a second in all (default 600,
far below what 2 cores serve, so latencies mean something): half gRPC over the four nodes, a quarter
`/json` over the four, a quarter `/nginx` through nginx; open loop, `user` values spread over 5,000
per-minute counters with a limit no load reaches, so every answer should be OK.

Chaos: eleven slots (a quiet one first and last), each: an exact-count probe, a fault (logged
with its time), the repair, the time to recover, and the probe again. Faults: Redis
SIGSTOP/SIGCONT, Redis kill -9 and restart, a peer kill -9 and restart, a peer SIGSTOP/SIGCONT,
a peer killed and Redis stalled while it is away (its keys' stand-ins load from Redis), the
config rewritten in place (whole; half written, then completed; broken, then restored), and
2,000 connections held on one node.

Exact counts: the `probe` descriptor has a limit of PROBE_LIMIT a day. Before each fault a key
of each group (the cluster through all its entry points; r through gRPC and /json) takes PRE
hits; after recovery POST more (plus MID during a peer's absence, on the others): it must admit
exactly PROBE_LIMIT in all, PRE before and the rest after. r's key restarts from 0 after Redis
is killed (no persistence), and that is what is checked there. A fresh key each slot takes
FRESH hits and must admit exactly min(FRESH, PROBE_LIMIT).

Report: crashes (any sluice exit the script did not cause: goal 0, with a restart so the run
goes on), clean exits at the end (SIGTERM, exit 0), RSS and descriptors per node every few
seconds, per slot the answers at healthy nodes (goal: all OK within the deadline) and at the
faulted one, answers slower than BENCH_SOAK_DEADLINE_MS (default 1000: REDIS_TIMEOUT 500 ms
plus two peer deadlines of 200 ms plus 100 ms), recovery times, and the exact counts. Files:
soak.md, soak-events.csv, soak-rss.csv, soak-requests.csv (per BUCKET seconds and target),
soak-probes.csv. Exit status 1 when a sluice crashed, did not exit cleanly, or miscounted.

Environment: BENCH_SOAK_SECONDS, BENCH_SOAK_QUICK=1, BENCH_SOAK_RATE, BENCH_SOAK_DEADLINE_MS,
BENCH_OUT (results dir), BENCH_SOAK_KEEP=1 (keep the work dir: logs, raw requests).
"""

import collections
import csv
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from proc import free_ports, rss_kib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = os.environ.get("BENCH_SOAK_QUICK") == "1"
SECONDS = float(os.environ.get("BENCH_SOAK_SECONDS") or (60 if QUICK else 600))
RATE = float(os.environ.get("BENCH_SOAK_RATE") or 600)
DEADLINE_MS = float(os.environ.get("BENCH_SOAK_DEADLINE_MS") or 1000)
OUT = os.environ.get("BENCH_OUT") or os.path.join(
    ROOT, "bench", "results-quick" if QUICK else "results")
KEEP = os.environ.get("BENCH_SOAK_KEEP") == "1"
SLOT = SECONDS / 11  # eleven slots: see SLOTS
SAMPLE = 1.0 if SLOT < 20 else 5.0  # RSS sampling period, seconds
BUCKET = 1 if SLOT < 20 else 5  # soak-requests.csv resolution, seconds
FAULT = max(2.0, SECONDS / 60)  # how long a fault lasts (10 s at full length)
USERS = 5000
PROBE_LIMIT, PRE, MID, POST, FRESH = 40, 20, 10, 40, 60
REDIS_TIMEOUT_MS, WRITE_BEHIND_MS = 500, 500
# A write-behind flush has read and written every counter hit this long ago (docs/cluster.md's
# bound, I + T), so a count taken before it survives its owner.
FLUSHED = (REDIS_TIMEOUT_MS + WRITE_BEHIND_MS) / 1000 + 0.5
FLOOD_CONNECTIONS = 1000  # per port, on p1's HTTP and gRPC ports
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"  # Debian's is in sbin


def now_ms():
    return time.time() * 1000


def sleep_until(t):
    time.sleep(max(0.0, t - time.time()))


def seconds(took):
    return "never" if took is None else f"{took:.2f} s"


def wait_for(predicate, timeout, step=0.05):
    """Seconds until `predicate()` held, or None after `timeout`."""
    start = time.time()
    while time.time() - start < timeout:
        try:
            if predicate():
                return time.time() - start
        except OSError:
            pass
        time.sleep(step)
    return None


class Events:
    """The chaos log: every action with its time, printed as it happens."""

    def __init__(self):
        self.t0 = time.time()
        self.rows = []
        self.lock = threading.Lock()

    def add(self, slot, event, detail=""):
        ms = now_ms()
        with self.lock:
            self.rows.append({"unix_ms": int(ms), "t_s": round(ms / 1000 - self.t0, 3),
                              "slot": slot, "event": event, "detail": detail})
        print(f"[{ms / 1000 - self.t0:7.1f} s] {slot:15} {event} {detail}", flush=True)


class Proc:
    """A process the run started. `expected` is set before the run stops or kills it, so any
    other exit is a crash."""

    def __init__(self, name, argv, env, log_path):
        self.name, self.argv, self.env, self.log_path = name, argv, env, log_path
        self.popen, self.incarnation, self.expected = None, 0, True

    def start(self):
        self.incarnation += 1
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=log,
                                      stdin=subprocess.DEVNULL)
        log.close()
        self.expected = False

    def pid(self):
        return self.popen.pid

    def signal(self, sig):
        self.popen.send_signal(sig)

    def kill(self):
        self.expected = True
        self.popen.kill()
        self.popen.wait()

    def stop(self, timeout):
        """SIGTERM and wait: the exit code, or None when it outlived `timeout`."""
        self.expected = True
        if self.popen.poll() is not None:
            return self.popen.returncode
        self.popen.send_signal(signal.SIGCONT)
        self.popen.terminate()
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            return None


class Node(Proc):
    """One Sluice: its ports, and what its HTTP and debug ports say."""

    def __init__(self, name, binary, env, work, ports, config):
        self.http, self.grpc, self.debug, self.peer = ports
        argv = [binary, "--config", config, "--host", "127.0.0.1", "--grpc-host", "127.0.0.1",
                "--debug-host", "127.0.0.1", "--port", str(self.http),
                "--grpc-port", str(self.grpc), "--debug-port", str(self.debug)]
        super().__init__(name, argv, env, os.path.join(work, f"{name}.log"))

    def peer_addr(self):
        return f"127.0.0.1:{self.peer}"

    def targets(self):
        return [f"grpc,{self.name}-grpc,http://127.0.0.1:{self.grpc}",
                f"json,{self.name}-json,http://127.0.0.1:{self.http}/json"]

    def healthy(self):
        return http_status(self.http, "GET", "/healthcheck") == 200

    def answers_ok(self):
        body = json.dumps({"domain": "soak", "descriptors": [
            {"entries": [{"key": "user", "value": "ready"}]}]})
        return http_status(self.http, "POST", "/json", body) == 200

    def stats(self):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.debug}/stats", timeout=1).read()
        out = {}
        for line in text.decode().splitlines():
            name, _, value = line.rpartition(": ")
            if value.isdigit():
                out[name] = int(value)
        return out

    def serves(self, generation):
        """True when this node serves that generation of the config, complete."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.debug}/rlconfig", timeout=1).read()
        text = text.decode()
        return f"soak.gen_{generation}:" in text and "requests_per_unit=1000000000" in text

    def sees_peers(self, peers, up):
        """True when this node's /stats says each of `peers` is up (`up`) or down."""
        stats = self.stats()
        return all(stats.get(f"sluice.cluster.peer_up.{p.peer_addr()}") == int(up) for p in peers)


def http_status(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        c.request(method, path, body, {"content-type": "application/json"} if body else {})
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def config_text(generation, half=False, broken=False):
    """The soak's config. `user` comes last so that a write cut at its `requests_per_unit:`
    leaves every other rule whole (the finding of issue 14: that loaded as a limit of 0)."""
    if broken:
        return f"# soak, generation {generation}: broken\ndomain: soak\ndescriptors:\n  - key: [probe\n"
    # A marker per generation, so a node's /rlconfig tells which one it serves, and a few
    # more rules on some generations, so the rewrites change the compiled table.
    extra = "".join(f"  - key: extra_{g}\n    rate_limit: {{unit: hour, requests_per_unit: {g + 1}}}\n"
                    for g in range(generation % 5))
    extra += f"  - key: gen_{generation}\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
    text = (f"# soak, generation {generation}\ndomain: soak\ndescriptors:\n"
            f"  - key: probe\n    rate_limit:\n      unit: day\n"
            f"      requests_per_unit: {PROBE_LIMIT}\n{extra}"
            f"  - key: user\n    rate_limit:\n      unit: minute\n"
            f"      requests_per_unit: 1000000000\n")
    if half:
        return text[:text.rindex("requests_per_unit:") + len("requests_per_unit:")]
    return text


NGINX_CONF = """
worker_processes 1;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {work}/nginx/client_body_temp;
    proxy_temp_path {work}/nginx/proxy_temp;
    fastcgi_temp_path {work}/nginx/fastcgi_temp;
    uwsgi_temp_path {work}/nginx/uwsgi_temp;
    scgi_temp_path {work}/nginx/scgi_temp;
    upstream sluice {{
{servers}
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        # examples/nginx/nginx.conf's auth_request, with a static file for the application.
        location / {{
            auth_request /_sluice;
            auth_request_set $ratelimit_limit $upstream_http_ratelimit_limit;
            error_page 403 = @limited;
            add_header RateLimit-Limit $ratelimit_limit always;
            root {work}/nginx/www;
            default_type text/plain;
        }}
        location = /_sluice {{
            internal;
            proxy_pass http://sluice/nginx;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_connect_timeout 1s;
            proxy_send_timeout 1s;
            proxy_read_timeout 1s;
            proxy_set_header X-Sluice-Domain soak;
            proxy_set_header X-Sluice-Descriptor "user=@x-user, probe=@x-probe";
            proxy_set_header X-Sluice-Hits-Addend "";
        }}
        location @limited {{
            add_header RateLimit-Limit $ratelimit_limit always;
            return 429 "Too Many Requests\\n";
        }}
    }}
}}
"""


class Cluster:
    """Everything the run started, and the monitor that samples and watches it."""

    def __init__(self, sluice, work, events):
        self.work, self.events = work, events
        self.lock = threading.Lock()  # held while a process is killed, restarted or sampled
        self.crashes, self.rss_rows, self.slot = [], [], "start"
        self.config_path = os.path.join(work, "config", "soak.yaml")
        self.generation = 1
        os.makedirs(os.path.dirname(self.config_path))
        write_file(self.config_path, config_text(self.generation))
        ports = free_ports(18)
        self.redis_port, nginx_port = ports[16], ports[17]
        self.redis = Proc("redis", ["redis-server", "--port", str(self.redis_port), "--bind",
                                    "127.0.0.1", "--save", "", "--appendonly", "no"],
                          os.environ.copy(), os.path.join(work, "redis.log"))
        self.peers = [Node(f"p{i + 1}", sluice, None, work, ports[i * 4:i * 4 + 4],
                           self.config_path) for i in range(3)]
        base = dict(os.environ, LOG_LEVEL="warn", LOG_FORMAT="json", REDIS_SOCKET_TYPE="tcp",
                    REDIS_URL=f"127.0.0.1:{self.redis_port}")
        peers = ",".join(p.peer_addr() for p in self.peers)
        for p in self.peers:
            p.env = dict(base, PEERS=peers, PEER_PORT=str(p.peer),
                         PEER_ADVERTISE_ADDRESS=p.peer_addr(), SLUICE_PEER_WRITE_BEHIND="true")
        self.r = Node("r", sluice, dict(base, BACKEND_TYPE="redis"), work, ports[12:16],
                      self.config_path)
        self.nodes = self.peers + [self.r]
        self.nginx_port = nginx_port
        self.nginx = self.nginx_proc(nginx_port)

    def nginx_proc(self, port):
        root = os.path.join(self.work, "nginx")
        os.makedirs(os.path.join(root, "www"))
        # A file, not a directory: a directory's index is an internal redirect, which runs
        # auth_request again and would count every request twice.
        write_file(os.path.join(root, "www", "ok"), "ok\n")
        servers = "\n".join(f"        server 127.0.0.1:{p.http};" for p in self.peers)
        conf = os.path.join(root, "nginx.conf")
        write_file(conf, NGINX_CONF.format(work=self.work, servers=servers, port=port))
        # Run as root, nginx's workers are `nobody`: let them read the page and temp paths.
        for d in (self.work, root, os.path.join(root, "www")):
            os.chmod(d, 0o755)
        return Proc("nginx", [NGINX, "-p", root, "-c", conf, "-e", "stderr", "-g",
                              f"daemon off; pid {root}/nginx.pid;"],
                    os.environ.copy(), os.path.join(self.work, "nginx.log"))

    def start(self):
        self.redis.start()
        if wait_for(lambda: redis_ping(self.redis_port), 10) is None:
            sys.exit("redis-server did not start")
        for n in self.nodes:
            n.start()
        for n in self.nodes:
            if wait_for(n.answers_ok, 20) is None:
                sys.exit(f"{n.name} did not answer; see {n.log_path}")
        self.nginx.start()
        if wait_for(lambda: http_status(self.nginx_port, "GET", "/ok", None) in (200, 500), 10) is None:
            sys.exit("nginx did not start")
        wait_for(lambda: all(p.sees_peers(self.peers, True) for p in self.peers), 10)

    def load_targets(self):
        """KIND,NAME,URL,RATE for every target: half the rate gRPC, a quarter /json (each
        over the four nodes), a quarter /nginx."""
        out = []
        for n in self.nodes:
            grpc, js = n.targets()
            out += [f"{grpc},{RATE / 2 / len(self.nodes):g}", f"{js},{RATE / 4 / len(self.nodes):g}"]
        return out + [f"nginx,nginx,http://127.0.0.1:{self.nginx_port}/ok,{RATE / 4:g}"]

    def probe_targets(self, group, down=()):
        if group == "redis":
            return self.r.targets()
        out = [t for p in self.peers if p not in down for t in p.targets()]
        return out + [f"nginx,nginx,http://127.0.0.1:{self.nginx_port}/ok"]

    def monitor(self, stop):
        """Every SAMPLE seconds: each node's RSS, descriptors and CPU; any exit the run did
        not cause is a crash, logged and restarted so the run goes on."""
        cpu = {}
        while not stop.wait(SAMPLE):
            with self.lock:
                for n in self.nodes:
                    rc = n.popen.poll()
                    if rc is not None and not n.expected:
                        self.crash(n, rc)
                        continue
                    if rc is None:
                        self.sample(n, cpu)

    def crash(self, node, rc):
        tail = open(node.log_path, errors="replace").read()[-2000:]
        self.crashes.append({"node": node.name, "incarnation": node.incarnation,
                             "exit": rc, "slot": self.slot, "log_tail": tail})
        self.events.add(self.slot, "CRASH", f"{node.name} exited with {rc}; restarting")
        node.start()

    def sample(self, node, cpu):
        try:
            rss = rss_kib(node.pid())
            fields = open(f"/proc/{node.pid()}/stat").read().rsplit(")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])
            fds = len(os.listdir(f"/proc/{node.pid()}/fd"))
        except (OSError, IndexError, RuntimeError):
            return
        t = time.time()
        last = cpu.get(node.pid())
        pct = 100 * (ticks - last[1]) / os.sysconf("SC_CLK_TCK") / (t - last[0]) if last else ""
        cpu[node.pid()] = (t, ticks)
        self.rss_rows.append({"t_s": round(t - self.events.t0, 1), "slot": self.slot,
                              "node": node.name, "incarnation": node.incarnation,
                              "pid": node.pid(), "rss_kib": rss, "fds": fds,
                              "cpu_pct": round(pct, 1) if pct != "" else ""})

    def rewrite_config(self, text):
        """In place: the same inode truncated and written, as an editor or `>` does."""
        write_file(self.config_path, text)

    def config_loads(self):
        return {n.name: (n.stats().get("ratelimit.service.config_load_success", 0),
                         n.stats().get("ratelimit.service.config_load_error", 0))
                for n in self.nodes}

    def shutdown(self):
        """SIGTERM each node (a clean exit is 0 after the drain), then the rest."""
        exits = {}
        with self.lock:
            for n in self.nodes:
                exits[n.name] = n.stop(30)
        for p in (self.nginx, self.redis):
            if p.popen is not None:
                p.stop(10)
        return exits


def write_file(path, text):
    with open(path, "w") as f:
        f.write(text)


def redis_ping(port):
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")


class Fault:
    """A fault: what it does, how it is repaired, and how recovery is seen. `faulted` are the
    targets that may fail while it lasts (a stopped process cannot answer); every other target
    must answer OK. `resets` are the probe groups whose count a fault may lawfully lose."""

    name, faulted, resets, duration = "", (), (), FAULT

    def inject(self, c):
        pass

    def during(self, c, run):
        """Work while the fault lasts; returns the time before which `heal` must not run."""
        return 0.0

    def heal(self, c):
        pass

    def healed(self, c):
        return True


class RedisStop(Fault):
    name, faulted = "redis-stop", ("r-grpc", "r-json")

    def inject(self, c):
        c.redis.signal(signal.SIGSTOP)

    def heal(self, c):
        c.redis.signal(signal.SIGCONT)

    def healed(self, c):
        return c.r.answers_ok()


class RedisKill(Fault):
    # No persistence: r's counters are gone with Redis, as with the Go service.
    name, faulted, resets = "redis-kill", ("r-grpc", "r-json"), ("redis",)

    def inject(self, c):
        with c.lock:
            c.redis.kill()

    def heal(self, c):
        with c.lock:
            c.redis.start()

    def healed(self, c):
        return c.r.answers_ok()


class PeerKill(Fault):
    """kill -9 of p2, its keys taken over by the others (loading their counts from Redis), the
    probe continued there, then p2 restarted and its keys loaded back."""

    name, faulted = "peer-kill", ("p2-grpc", "p2-json")
    duration = max(FAULT, 5.0)

    def inject(self, c):
        with c.lock:
            c.peers[1].kill()

    def during(self, c, run):
        victim, others = c.peers[1], [c.peers[0], c.peers[2]]
        took = wait_for(lambda: all(p.sees_peers([victim], False) for p in others), 5)
        run.events.add(self.name, "detected", f"p1 and p3 mark p2 down after {seconds(took)}")
        run.probe_all("mid", MID, down=[victim], groups=("cluster",))
        return time.time() + FLUSHED

    def heal(self, c):
        with c.lock:
            c.peers[1].start()

    def healed(self, c):
        return c.peers[1].answers_ok() and all(p.sees_peers(c.peers, True) for p in c.peers)


class PeerKillRedisStop(PeerKill):
    """p1 killed, then Redis stalled while it is away: the others stand in for p1's keys and
    load each one first (once per window), so every such load meets the stalled Redis."""

    name, faulted = "peer+redis-stop", ("p1-grpc", "p1-json", "r-grpc", "r-json")
    duration = FAULT

    def inject(self, c):
        with c.lock:
            c.peers[0].kill()

    def during(self, c, run):
        victim, others = c.peers[0], c.peers[1:]
        took = wait_for(lambda: all(p.sees_peers([victim], False) for p in others), 5)
        run.events.add(self.name, "detected", f"p2 and p3 mark p1 down after {seconds(took)}")
        c.redis.signal(signal.SIGSTOP)
        run.events.add(self.name, "redis stopped")
        return 0.0

    def heal(self, c):
        c.redis.signal(signal.SIGCONT)
        with c.lock:
            c.peers[0].start()

    def healed(self, c):
        return (c.peers[0].answers_ok() and c.r.answers_ok()
                and all(p.sees_peers(c.peers, True) for p in c.peers))


class PeerStop(Fault):
    """SIGSTOP of p3: a peer that holds its connections open and answers nothing."""

    name, faulted = "peer-stop", ("p3-grpc", "p3-json")

    def inject(self, c):
        c.peers[2].signal(signal.SIGSTOP)

    def heal(self, c):
        c.peers[2].signal(signal.SIGCONT)

    def healed(self, c):
        return c.peers[2].answers_ok() and all(p.sees_peers(c.peers, True) for p in c.peers)


class ConfigRewrite(Fault):
    """The whole config rewritten in place, with a rule added or removed."""

    name, duration = "config-rewrite", 0.0

    def inject(self, c):
        c.generation += 1
        c.rewrite_config(config_text(c.generation))

    def healed(self, c):
        return all(n.serves(c.generation) for n in c.nodes)


class ConfigHalf(ConfigRewrite):
    """A rewrite that stalls half-way for two polls, cut at `requests_per_unit:`."""

    name, duration = "config-half", 1.0

    def inject(self, c):
        c.generation += 1
        c.rewrite_config(config_text(c.generation, half=True))

    def heal(self, c):
        with open(c.config_path, "a") as f:
            f.write(config_text(c.generation)[len(config_text(c.generation, half=True)):])


class ConfigBroken(ConfigRewrite):
    """A config that does not parse, for the fault's length, then a good one."""

    name = "config-broken"
    duration = FAULT

    def inject(self, c):
        c.rewrite_config(config_text(c.generation, broken=True))

    def heal(self, c):
        c.generation += 1
        c.rewrite_config(config_text(c.generation))


class Flood(Fault):
    """FLOOD_CONNECTIONS on each of p1's HTTP and gRPC ports, held for the fault's length:
    the HTTP ones stop in the middle of their request head, the gRPC ones after the HTTP/2
    preface, as a stalled or hostile client would. Held past SLUICE_HEADER_TIMEOUT_MS (10 s)
    at full length, so the HTTP ones are seen closed by the node."""

    name, duration = "flood", FAULT * 1.5

    def inject(self, c):
        self.socks = []  # (port name, socket)
        p1 = c.peers[0]
        for name, port, first in (("HTTP", p1.http, b"GET / HTTP/1.1\r\nHost: soak\r\nX-Slow: "),
                                  ("gRPC", p1.grpc, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")):
            for _ in range(FLOOD_CONNECTIONS):
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=2)
                    s.sendall(first)
                    s.setblocking(False)
                    self.socks.append((name, s))
                except OSError:
                    break

    def during(self, c, run):
        run.events.add(self.name, "held", f"{len(self.socks)} connections open on p1")
        return 0.0

    def heal(self, c):
        closed = collections.Counter(name for name, s in self.socks if server_closed(s))
        opened = collections.Counter(name for name, _ in self.socks)
        for _, s in self.socks:
            s.close()
        c.events.add(self.name, "released", ", ".join(
            f"{name}: {closed[name]} of {n} already closed by p1" for name, n in opened.items()))

    def healed(self, c):
        return c.peers[0].answers_ok()


def server_closed(sock):
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


SLOTS = [None, RedisStop(), PeerKill(), ConfigRewrite(), RedisKill(), PeerStop(), ConfigHalf(),
         PeerKillRedisStop(), Flood(), ConfigBroken(), None]
SLOT_NAMES = ["baseline", *(f.name for f in SLOTS[1:-1]), "quiet"]


class Soak:
    """The schedule: a slot of SLOT seconds per fault, each probe, fault, repair, probe."""

    def __init__(self, sluice, client):
        self.client = client
        self.work = tempfile.mkdtemp(prefix="sluice-soak.")
        self.events = Events()
        self.c = Cluster(sluice, self.work, self.events)
        self.run_id = time.strftime("%H%M%S")
        self.slot, self.probes, self.windows, self.counted = "start", [], [], {}

    def probe(self, value, hits, targets):
        out = subprocess.run([self.client, "probe", value, str(hits), *targets],
                             capture_output=True, text=True, timeout=300, check=True)
        return json.loads(out.stdout)

    def probe_all(self, phase, hits, down=(), groups=("cluster", "redis")):
        """One probe per group; checks what it admitted against what must have been."""
        for group in groups:
            value = f"{self.run_id}-{self.slot}-{group}" + ("-fresh" if phase == "fresh" else "")
            r = self.probe(value, hits, self.c.probe_targets(group, down))
            if phase == "fresh":
                expected = min(hits, PROBE_LIMIT)
            else:
                expected = max(0, min(hits, PROBE_LIMIT - self.counted.get(group, 0)))
                self.counted[group] = self.counted.get(group, 0) + expected
            day = lambda ms: int(ms // 86_400_000)
            if r["errors"]:
                verdict = "inconclusive: errors"
            elif day(r["last_ms"]) != day(self.windows[-1]["start_ms"]):
                verdict = "inconclusive: the day's window changed"
            else:
                verdict = "exact" if r["ok"] == expected else "WRONG"
            self.probes.append({"slot": self.slot, "group": group, "phase": phase, "key": value,
                                "hits": hits, "admitted": r["ok"], "expected": expected,
                                "over": r["over"], "errors": json.dumps(r["errors"]),
                                "verdict": verdict})
            self.events.add(self.slot, f"probe {phase}",
                            f"{group}: {r['ok']} of {hits} admitted, expected {expected}: {verdict}")

    def run(self):
        self.c.start()
        raw = open(os.path.join(self.work, "requests.csv"), "w")
        load = subprocess.Popen([self.client, "load", "0", str(USERS), *self.c.load_targets()],
                                stdout=raw)
        stop = threading.Event()
        monitor = threading.Thread(target=self.c.monitor, args=(stop,), daemon=True)
        monitor.start()
        self.load_avg = [open("/proc/loadavg").read().split()[:3]]
        t0 = time.time()
        self.events.add("start", "load", f"{RATE:g} requests/s over {len(self.c.load_targets())} targets")
        for i, fault in enumerate(SLOTS):
            self.run_slot(i, fault, t0 + i * SLOT)
        sleep_until(t0 + len(SLOTS) * SLOT)
        self.events.add("end", "load stops")
        load.send_signal(signal.SIGINT)
        load.wait(30)
        raw.close()
        stop.set()
        monitor.join()
        self.load_avg.append(open("/proc/loadavg").read().split()[:3])
        self.exits = self.c.shutdown()
        self.events.add("end", "shutdown", " ".join(f"{k}: exit {v}" for k, v in self.exits.items()))

    def run_slot(self, i, fault, start):
        sleep_until(start)
        self.slot = self.c.slot = SLOT_NAMES[i]
        self.windows.append({"slot": self.slot, "start_ms": now_ms(), "fault_ms": None,
                             "recovered_ms": None, "recovery_s": None,
                             "faulted": fault.faulted if fault else ()})
        self.counted = {}
        self.events.add(self.slot, "slot starts")
        self.probe_all("pre", PRE)
        if fault is None:
            sleep_until(start + SLOT / 2)
        else:
            sleep_until(max(start + SLOT / 4, time.time() + FLUSHED))
            self.fault(fault)
        if fault is not None and "redis" in fault.resets:
            self.counted["redis"] = 0
        self.probe_all("post", POST)
        self.probe_all("fresh", FRESH)

    def fault(self, fault):
        window, loads = self.windows[-1], self.c.config_loads()
        self.events.add(self.slot, "inject")
        window["fault_ms"] = now_ms()
        fault.inject(self.c)
        not_before = fault.during(self.c, self)
        sleep_until(max(window["fault_ms"] / 1000 + fault.duration, not_before))
        self.events.add(self.slot, "heal")
        fault.heal(self.c)
        took = wait_for(lambda: fault.healed(self.c), max(10.0, SLOT / 2))
        window["recovered_ms"], window["recovery_s"] = now_ms(), took
        self.events.add(self.slot, "recovered" if took is not None else "NOT RECOVERED",
                        f"{seconds(took)} after the repair")
        if isinstance(fault, ConfigRewrite):
            after = self.c.config_loads()
            self.events.add(self.slot, "config loads", ", ".join(
                f"{n}: +{after[n][0] - loads[n][0]} ok +{after[n][1] - loads[n][1]} failed"
                for n in after))


def pct(values, p):
    return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")


class Requests:
    """The load's raw lines, each placed in its slot and marked healthy or faulted: faulted
    when its target is one the slot's fault takes down and it was sent between a deadline
    before the fault and the recovery."""

    def __init__(self, path, windows, t0):
        self.by_slot = collections.defaultdict(lambda: {"healthy": Tally(), "faulted": Tally()})
        self.buckets = collections.defaultdict(Tally)
        self.late = collections.defaultdict(collections.Counter)  # slot -> healthy target -> n
        starts = [w["start_ms"] for w in windows]
        for line in open(path):
            ms, kind, name, outcome, us = line.rstrip("\n").split(",")
            ms, latency = float(ms), int(us) / 1000
            i = max(0, sum(1 for s in starts if s <= ms) - 1)
            w = windows[i]
            end = w["recovered_ms"] or (starts[i + 1] if i + 1 < len(starts) else float("inf"))
            faulted = (name in w["faulted"] and w["fault_ms"] is not None
                       and w["fault_ms"] - DEADLINE_MS <= ms <= end)
            self.by_slot[w["slot"]]["faulted" if faulted else "healthy"].add(outcome, latency)
            if latency > DEADLINE_MS and not faulted:
                self.late[w["slot"]][name] += 1
            bucket = int((ms / 1000 - t0) // BUCKET * BUCKET)
            self.buckets[(bucket, w["slot"], name)].add(outcome, latency)


class Tally:
    """Outcomes and latencies of a set of requests."""

    def __init__(self):
        self.outcomes, self.latencies = collections.Counter(), []

    def add(self, outcome, latency_ms):
        self.outcomes[outcome] += 1
        self.latencies.append(latency_ms)

    def n(self):
        return len(self.latencies)

    def not_ok(self):
        return {k: v for k, v in sorted(self.outcomes.items()) if k != "ok"}

    def late(self):
        return sum(1 for v in self.latencies if v > DEADLINE_MS)

    def summary(self):
        lat = sorted(self.latencies)
        return {"n": len(lat), "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
                "max": lat[-1] if lat else float("nan")}


def write_csv(path, rows, fields=None):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields or list(rows[0].keys()) if rows else ["none"])
        w.writeheader()
        w.writerows(rows)


def kinds(counter):
    return ", ".join(f"{k} {v:,}" for k, v in counter.items()) or "none"


def rss_table(rows, warm_t):
    """Per node incarnation: first sample, after the baseline slot, max, last (KiB)."""
    out = ["| node | first | warm (after the baseline slot) | max | end | end - warm | descriptors warm / max / end |",
           "|---|---|---|---|---|---|---|"]
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["node"], r["incarnation"])].append(r)
    for (node, inc), rs in sorted(groups.items()):
        warm = next((r for r in rs if r["t_s"] >= warm_t), rs[0])
        top = max(rs, key=lambda r: r["rss_kib"])
        fd_top = max(r["fds"] for r in rs)
        out.append(f"| {node}{' (restart ' + str(inc - 1) + ')' if inc > 1 else ''} | "
                   f"{rs[0]['rss_kib'] / 1024:.1f} MiB | {warm['rss_kib'] / 1024:.1f} MiB | "
                   f"{top['rss_kib'] / 1024:.1f} MiB at {top['t_s']:.0f} s | {rs[-1]['rss_kib'] / 1024:.1f} MiB | "
                   f"{(rs[-1]['rss_kib'] - warm['rss_kib']) / 1024:+.1f} MiB | "
                   f"{warm['fds']} / {fd_top} / {rs[-1]['fds']} |")
    return out


def log_lines(path):
    """Warnings and errors a node logged (LOG_FORMAT=json), by message, and any panic."""
    counts = collections.Counter()
    for line in open(path, errors="replace"):
        if "panicked" in line:
            counts["PANIC: " + line.strip()[:120]] += 1
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("level") in ("WARN", "ERROR"):
            counts[f"{entry['level']} {entry.get('fields', {}).get('message', '?')}"] += 1
    return counts


def slot_table(soak, reqs):
    out = ["| slot | recovered after | requests at healthy targets | not OK there | past the deadline | p50 / p99 / max | at the faulted targets while down | outcomes there | p50 / max |",
           "|---|---|---|---|---|---|---|---|---|"]
    for w in soak.windows:
        h, f = reqs.by_slot[w["slot"]]["healthy"], reqs.by_slot[w["slot"]]["faulted"]
        hs, fs = h.summary(), f.summary()
        rec = "-" if w["fault_ms"] is None else (
            f"{w['recovery_s']:.2f} s" if w["recovery_s"] is not None else "NOT RECOVERED")
        faulted = (f"{', '.join(w['faulted'])}: {fs['n']:,}" if w["faulted"] else "-")
        late = f"{h.late():,}" + (f" ({kinds(reqs.late[w['slot']])})" if h.late() else "")
        out.append(f"| {w['slot']} | {rec} | {hs['n']:,} | {kinds(h.not_ok())} | {late} | "
                   f"{hs['p50']:.1f} / {hs['p99']:.1f} / {hs['max']:.0f} ms | {faulted} | "
                   f"{kinds(f.not_ok()) if f.n() else '-'} | "
                   + (f"{fs['p50']:.0f} / {fs['max']:.0f} ms |" if f.n() else "- |"))
    return out


def report(soak):
    os.makedirs(OUT, exist_ok=True)
    t0 = soak.events.t0
    reqs = Requests(os.path.join(soak.work, "requests.csv"), soak.windows, t0)
    write_csv(os.path.join(OUT, "soak-events.csv"), soak.events.rows)
    write_csv(os.path.join(OUT, "soak-rss.csv"), soak.c.rss_rows)
    write_csv(os.path.join(OUT, "soak-probes.csv"), soak.probes)
    bucket_rows = []
    for (bucket, slot, name), t in sorted(reqs.buckets.items()):
        s = t.summary()
        bucket_rows.append({"t_s": bucket, "slot": slot, "target": name, "requests": s["n"],
                            "ok": t.outcomes["ok"], "not_ok": kinds(t.not_ok()),
                            "past_deadline": t.late(), "p50_ms": round(s["p50"], 2),
                            "max_ms": round(s["max"], 1)})
    write_csv(os.path.join(OUT, "soak-requests.csv"), bucket_rows)
    healthy = Tally()
    for slot in reqs.by_slot.values():
        healthy.outcomes.update(slot["healthy"].outcomes)
        healthy.latencies += slot["healthy"].latencies
    verdicts = collections.Counter(p["verdict"] for p in soak.probes)
    clean = {k: v for k, v in soak.exits.items() if v != 0}
    panics = {n.name: c for n in soak.c.nodes for c in [log_lines(n.log_path)]
              if any(k.startswith("PANIC") for k in c)}
    md = [f"# Soak and chaos: {SECONDS:.0f} s", "",
          f"`{command()}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}; "
          f"{os.cpu_count()} cores ({cpu_model()}); load average {' '.join(soak.load_avg[0])} at the start, "
          f"{' '.join(soak.load_avg[1])} at the end. Load {RATE:g} requests/s (half gRPC, a quarter /json, "
          f"a quarter /nginx through nginx); deadline {DEADLINE_MS:g} ms; slots of {SLOT:g} s, faults of {FAULT:g} s.",
          "", "## Verdict", "",
          f"- crashes (sluice exits the run did not cause): **{len(soak.c.crashes)}** (goal 0)"
          + "".join(f"; {c['node']} exit {c['exit']} in {c['slot']}" for c in soak.c.crashes),
          f"- exit codes after SIGTERM at the end: {', '.join(f'{k} {v}' for k, v in soak.exits.items())}"
          + (" (goal: all 0)" if clean else " (all clean)"),
          f"- panics in the logs: {panics or 'none'}",
          f"- exact counts: {', '.join(f'{v} {k}' for k, v in sorted(verdicts.items()))} "
          f"(of {len(soak.probes)} probes)",
          f"- answers at healthy targets: {healthy.n():,}; not OK: {kinds(healthy.not_ok())}; "
          f"slower than {DEADLINE_MS:g} ms: {healthy.late():,}",
          "", "## Slots", "",
          "Healthy targets: every target but the one a fault takes down, and that one outside "
          "its fault. Latencies are the client's, from send to answer.", "",
          *slot_table(soak, reqs),
          "", "## Resident memory and descriptors", "",
          f"Sampled every {SAMPLE:g} s (soak-rss.csv).", "",
          *rss_table(soak.c.rss_rows, SLOT),
          "", "## Exact counts", "",
          "| slot | group | phase | hits | admitted | expected | verdict |", "|---|---|---|---|---|---|---|",
          *(f"| {p['slot']} | {p['group']} | {p['phase']} | {p['hits']} | {p['admitted']} | "
            f"{p['expected']} | {p['verdict']} |" for p in soak.probes),
          "", "## Warnings logged", "",
          *(f"- {n.name}: " + ("; ".join(f"{k} ({v})" for k, v in log_lines(n.log_path).most_common(6)) or "none")
            for n in soak.c.nodes),
          "", "## Events", "", "```",
          *(f"{r['t_s']:7.1f} s  {r['slot']:15} {r['event']} {r['detail']}" for r in soak.events.rows),
          "```", ""]
    write_file(os.path.join(OUT, "soak.md"), "\n".join(md))
    print("\n".join(md[:md.index("## Exact counts")]))
    print(f"\nwritten: {OUT}/soak.md and soak-*.csv")
    wrong = verdicts.get("WRONG", 0)
    return 1 if soak.c.crashes or clean or wrong or panics else 0


def command():
    """How this run was asked for: bench/soak.sh and the BENCH_SOAK_* variables set."""
    env = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("BENCH_SOAK_")]
    return " ".join([*env, "bench/soak.sh"])


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def repeat_floods(soak, n):
    """The flood slot's fault n times on p1 (held 2 s, 2 s apart), no load: p1's RSS after
    each, to tell memory the allocator keeps for reuse (it levels off) from a leak (it grows
    with every flood)."""
    soak.c.start()
    flood, rss = Flood(), []
    for _ in range(n):
        flood.inject(soak.c)
        time.sleep(2)
        flood.heal(soak.c)
        time.sleep(2)
        rss.append(rss_kib(soak.c.peers[0].pid()) // 1024)
    print(f"p1's RSS after each of {n} floods of {2 * FLOOD_CONNECTIONS} connections (MiB): {rss}")
    soak.c.shutdown()
    return 0


def main():
    args = sys.argv[1:]
    floods = int(args.pop(1)) if len(args) == 4 and args[0] == "--repeat-flood" else None
    if floods is not None:
        args.pop(0)
    if len(args) != 2:
        sys.exit("usage: soak.py [--repeat-flood N] SLUICE_BINARY SOAK_LOAD_BINARY "
                 "(bench/soak.sh builds both and passes its arguments on)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the flood's connections
    soak = Soak(os.path.abspath(args[0]), os.path.abspath(args[1]))
    try:
        if floods is not None:
            sys.exit(repeat_floods(soak, floods))
        soak.run()
        status = report(soak)
    finally:
        for p in [*soak.c.nodes, soak.c.nginx, soak.c.redis]:
            if p.popen is not None and p.popen.poll() is None:
                p.popen.send_signal(signal.SIGCONT)
                p.popen.kill()
                p.popen.wait()
        if KEEP:
            print(f"work dir kept: {soak.work}")
        else:
            shutil.rmtree(soak.work, ignore_errors=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
