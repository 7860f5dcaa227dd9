#!/usr/bin/env python3
"""Lease mode at high cardinality (issue 49), with real processes: what many keys cost.

Three release `sluice` nodes on 127.0.0.1 (PEERS pointing at each other, memory store), one
hourly limit per user (`key: user` with no value, --limit a hour, far above what most users
use), started afresh for each number of users K and each mode (lease, then forward, the same
run). Per (K, mode), three phases driven by `keys_load` (bench/programs/src/bin/keys_load.rs:
gRPC ShouldRateLimit, 40 descriptors a call, the calls spread over the three nodes in turn):

- touch: every user u0 .. u<K-1> once (K decisions, the users' first hits; its time and CPU
  reported too);
- load: --load-secs at --rate calls a second, each of 40 distinct users drawn with Zipf(--zipf)
  popularity over the K users (u0 the hottest);
- idle: nothing sent, for --idle-secs, after --idle-wait seconds.

Reported per node and for the three (from /proc/PID/stat's utime + stime, the nodes' /stats on
the debug port, and `ss -tinp` on the peer connections): CPU cores while in use, CPU-seconds per
1,000 decisions, CPU cores while idle, peer calls and peer bytes a second, hops per decision,
admitted / limit for the hottest users (their windows offered at least the limit), held
and leased keys, resident memory.

    python3 bench/lease_keys.py                                    # K = 10^4, 10^5: 90 s
    python3 bench/lease_keys.py --keys 1000000 --hour-margin 1200  # 10^6 users: 75 s (after
                                                                   # issue 49's step 1; 10 min before)
    python3 bench/lease_keys.py --keys 20000 --load-secs 4 --idle-secs 8 --max-idle-cores 0.02
                                                                   # the short check: 34 s
    python3 bench/lease_keys.py --unit minute --keys 10000,100000  # per-minute limits, each run
                                                                   # in a window begun after the
                                                                   # start (free shares): 4 min

Definitions. A decision is one descriptor answered (the client counts them per node). Peer
calls: forward mode's batched forward calls (`peer_calls`) plus lease mode's renewal calls
(`lease.renewal_calls`); lease mode's acquires are counted in hits (`lease.acquires`), each
call carrying those of one request for one owner, so acquire calls are at most that; acquires
for the keys a node owns itself are answered by its own lease server, with no call. Peer bytes:
bytes sent plus received on the node's TCP connections to or from a peer port (`ss`'s
bytes_sent and bytes_received: HTTP/2 and gRPC framing included, TCP/IP headers not; the
membership probes included; per connection, so a connection closed in a phase loses its last
bytes). Hops: lease acquires plus forwarded and relayed hits (a node that started relays each
key's first hit in the window of its start to the key's previous owner, to take its counter
over: `cluster::join`), over decisions. Also counted, over the three phases: failed peer calls
(forwards and relays; each marks the peer down), hits decided alone (by a node that marked a
majority of its peers down) and the client's failed calls.

Every run lies in one hourly window: past its end a node may forget every key it held, so an
idle measure across it would say nothing of held keys. A run waits for the next hour when fewer
than --hour-margin seconds (90) are left in this one, and a run that crossed one anyway is
marked "(hour ended)".

Exit status 1 when a client call failed (the run goes on, and the table counts them), when a
hottest user's window admitted more than its limit, and (--max-idle-cores X) when the three nodes' idle CPU exceeds X cores in any run,
or (--max-idle-over-forward X) when a lease run's idle CPU exceeds the forward run's with as many
users by more than X cores: what held keys cost, apart from the machine's own idle floor (probes,
timers), which differs between machines. Builds the
binaries with cargo first unless --no-build (CARGO_TARGET_DIR, else target/). SLUICE_LEASE_MAX_BYTES (32 MiB by default, which 10^6 held
keys pass) is raised to --lease-max-bytes, SLUICE_MAX_COUNTERS and SLUICE_MAX_COUNTER_BYTES to
hold 4,000,000 counters, so no table fills.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proc import free_ports, rss_kib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICKS = os.sysconf("SC_CLK_TCK")
CONFIG = """domain: keys
descriptors:
  - key: user
    rate_limit:
      unit: {unit}
      requests_per_unit: {limit}
"""


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", default="10000,100000", help="comma-separated user counts K")
    ap.add_argument("--modes", default="lease,forward")
    ap.add_argument("--load-secs", type=float, default=8.0)
    ap.add_argument("--idle-secs", type=float, default=8.0)
    ap.add_argument("--idle-wait", type=float, default=2.0,
                    help="seconds between the load's end and the idle measure")
    ap.add_argument("--rate", type=float, default=250.0, help="calls a second in the load")
    ap.add_argument("--per-request", type=int, default=40)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--limit", type=int, default=1000, help="each user's limit per --unit")
    ap.add_argument("--unit", choices=("hour", "minute"), default="hour",
                    help="the limit's window; with minute, each run starts in a window that "
                         "began after the nodes started (free shares apply from such a window)")
    ap.add_argument("--top", type=int, default=10, help="hottest users checked against the limit")
    ap.add_argument("--hour-margin", type=float, default=90.0,
                    help="wait for the next hour when fewer seconds are left in this one")
    ap.add_argument("--lease-max-bytes", type=int, default=4 << 30)
    ap.add_argument("--max-idle-cores", type=float, help="exit 1 above this idle CPU (3 nodes)")
    ap.add_argument("--max-idle-over-forward", type=float,
                    help="exit 1 when lease mode's idle CPU passes forward mode's by more (3 nodes)")
    ap.add_argument("--env", action="append", default=[],
                    help="NAME=VALUE for every node (repeatable): e.g. SLUICE_LEASE_RENEW_MS=200")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", help="also write the markdown report here")
    ap.add_argument("--from-jsonl", nargs="+", metavar="FILE",
                    help="run nothing: the report of the runs --jsonl kept in FILEs")
    ap.add_argument("--jsonl", help="append each run's numbers here, one JSON line a run")
    return ap.parse_args()


def build(target):
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "sluice", "-p", "sluice-bench",
                    "--bin", "sluice", "--bin", "keys_load"], cwd=ROOT, check=True)
    return (os.path.join(target, "release", "sluice"),
            os.path.join(target, "release", "keys_load"))


class Cluster:
    """Three nodes in one mode, their ports and processes; stopped on exit."""

    def __init__(self, binary, config_dir, work, mode, args):
        free = free_ports(12)  # at once: twelve distinct ports
        self.ports = [dict(zip(("http", "grpc", "debug", "peer"), free[4 * i:4 * i + 4]))
                      for i in range(3)]
        peers = ",".join(f"127.0.0.1:{p['peer']}" for p in self.ports)
        self.procs, self.logs = [], []
        for i, p in enumerate(self.ports):
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("SLUICE_", "REDIS", "PEER"))}
            env.update(
                LOG_LEVEL="error", BACKEND_TYPE="memory", SLUICE_CLUSTER_MODE=mode,
                HOST="127.0.0.1", GRPC_HOST="127.0.0.1", DEBUG_HOST="127.0.0.1",
                PORT=str(p["http"]), GRPC_PORT=str(p["grpc"]), DEBUG_PORT=str(p["debug"]),
                PEERS=peers, PEER_PORT=str(p["peer"]),
                PEER_ADVERTISE_ADDRESS=f"127.0.0.1:{p['peer']}",
                SLUICE_LEASE_MAX_BYTES=str(args.lease_max_bytes),
                SLUICE_MAX_COUNTERS="4000000", SLUICE_MAX_COUNTER_BYTES=str(1 << 30))
            env.update(kv.split("=", 1) for kv in args.env)
            self.logs.append(os.path.join(work, f"node-{mode}-{i}.log"))
            with open(self.logs[-1], "w") as log:
                self.procs.append(subprocess.Popen(
                    [binary, "--config", config_dir], env=env, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT))
        try:
            self.wait_up()
        except BaseException:
            self.stop()
            raise

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def urls(self):
        return ",".join(f"http://127.0.0.1:{p['grpc']}" for p in self.ports)

    def stats(self, i):
        url = f"http://127.0.0.1:{self.ports[i]['debug']}/stats"
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        out = {}
        for line in body.splitlines():
            name, _, value = line.partition(": ")
            if name.startswith("sluice.cluster.") and value.isdigit():
                out[name.removeprefix("sluice.cluster.")] = int(value)
        return out

    def wait_up(self, deadline=30.0):
        """Every node answers /stats and sees all three peers up."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            for p, log in zip(self.procs, self.logs):
                if p.poll() is not None:
                    with open(log) as f:
                        tail = f.read()[-2000:]
                    sys.exit(f"a node exited with {p.returncode}:\n{tail}")
            try:
                ups = [sum(v for k, v in self.stats(i).items() if k.startswith("peer_up."))
                       for i in range(3)]
                if ups == [3, 3, 3]:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        sys.exit("the nodes never all saw each other up")

    def peer_bytes(self):
        """Per node, {(local port, remote port): (sent, received)}: the bytes of each TCP
        connection to or from a peer port (a peer marked down reconnects: the phase's delta is
        taken per connection, a closed one's last bytes lost)."""
        peer_ports = {p["peer"] for p in self.ports}
        pids = {p.pid: i for i, p in enumerate(self.procs)}
        out = [{} for _ in self.procs]
        text = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True,
                              text=True, check=True).stdout
        # One socket is a line of addresses and owner, then an indented line of TCP info.
        for head, info in re.findall(r"^(\S.*)\n\s+(.*)$", text, re.M):
            addrs = re.findall(r"[\d.]+:(\d+)", head)
            pid = re.search(r"pid=(\d+)", head)
            if len(addrs) < 2 or not pid or int(pid.group(1)) not in pids:
                continue
            if not peer_ports & {int(addrs[0]), int(addrs[1])}:
                continue
            counts = []
            for field in ("bytes_sent", "bytes_received"):
                m = re.search(rf"\b{field}:(\d+)", info)
                counts.append(int(m.group(1)) if m else 0)
            out[pids[int(pid.group(1))]][(int(addrs[0]), int(addrs[1]))] = tuple(counts)
        return out

    def snapshot(self):
        """Per node: CPU seconds, /stats, peer bytes (sent, received), resident KiB."""
        peer = self.peer_bytes()
        snap = []
        for i, p in enumerate(self.procs):
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
            snap.append({"t": time.monotonic(), "cpu": cpu, "stats": self.stats(i),
                         "sockets": peer[i], "rss_kib": rss_kib(p.pid)})
        return snap


def client(keys_load, args_list, timeout):
    """keys_load's report. Failed calls are counted, not fatal: the run goes on, the table says
    how many failed and the exit status is 1 (a node too busy to answer a peer in time is
    something to measure too)."""
    r = subprocess.run([keys_load, *args_list], capture_output=True, text=True, timeout=timeout)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 and not lines:
        sys.exit(f"keys_load {' '.join(args_list[:3])} failed: {r.stderr.strip()}")
    out = json.loads(lines[-1])
    if out["failed"]:
        print(f"# keys_load {args_list[0]}: {out['failed']} of {out['calls']} calls failed, the "
              f"first: {out['first_failure']}", file=sys.stderr, flush=True)
    return out


def socket_bytes(before, after):
    """(sent, received) on the peer connections between two snapshots of one node."""
    sent = received = 0
    for sock, (s, r) in after["sockets"].items():
        s0, r0 = before["sockets"].get(sock, (0, 0))
        sent, received = sent + s - s0, received + r - r0
    return sent, received


def phase(before, after, decisions):
    """Per node, what one phase cost: cores, CPU-s, peer calls and bytes, hops."""
    out = []
    for i, (b, a) in enumerate(zip(before, after)):
        secs = a["t"] - b["t"]
        d = {k: v - b["stats"].get(k, 0) for k, v in a["stats"].items()}
        calls = d.get("peer_calls", 0) + d.get("lease.renewal_calls", 0)
        hops = d.get("lease.acquires", 0) + d.get("forwarded_hits", 0) + d.get("relayed_hits", 0)
        n = decisions[i] if decisions else 0
        sent, received = socket_bytes(b, a)
        out.append({
            "secs": secs, "cpu_s": a["cpu"] - b["cpu"], "cores": (a["cpu"] - b["cpu"]) / secs,
            "decisions": n, "calls_per_s": calls / secs,
            "acquires_per_s": d.get("lease.acquires", 0) / secs,
            "renewed_keys_per_s": d.get("lease.renewals", 0) / secs,
            "bytes_per_s": (sent + received) / secs, "sent_per_s": sent / secs,
            "hops": hops, "hops_per_decision": hops / n if n else 0.0,
            "alone_hits": d.get("alone_hits", 0),
            "failed_calls": d.get("failed_forwards", 0) + d.get("failed_relays", 0),
            "held_keys": a["stats"].get("lease.held_keys", 0),
            "leased_keys": a["stats"].get("lease.leased_keys", 0),
            "rss_mib": a["rss_kib"] / 1024,
            "counters": {k: v for k, v in d.items() if v}})
    return out


def hot_ratios(outputs, limit):
    """admitted / limit of the hottest users' (user, hour) windows offered at least the limit
    (all of it should be admitted, never more)."""
    windows = {}
    for o in outputs:
        for rank, h, offered, admitted in o["top"]:
            w = windows.setdefault((rank, h), [0, 0])
            w[0] += offered
            w[1] += admitted
    return sorted(a / limit for o, a in windows.values() if o >= limit)


WINDOW = {"hour": 3600, "minute": 60}


def hour(window=3600):
    """The index of the limit's window now."""
    return int(time.time() // window)


def wait_for_hour(margin, window=3600):
    """A run must lie in one window of the limit: past its end every key's lease can be
    forgotten, so an idle measure after it says nothing of keys held. Waits for the next window
    when fewer than `margin` seconds are left in this one."""
    left = window - time.time() % window
    if left < margin:
        print(f"# waiting {left + 1:.0f} s for the next window", file=sys.stderr, flush=True)
        time.sleep(left + 1)


def wait_for_fresh_window(window):
    """Waits for the next window's start and a second and a half: a window that began more
    than a lease duration after the nodes got their permits, as a long-running cluster's
    windows do, so free shares apply (docs/cluster.md, "Free shares")."""
    left = window - time.time() % window
    print(f"# waiting {left + 1.5:.0f} s for a window begun after the start", file=sys.stderr,
          flush=True)
    time.sleep(left + 1.5)


def run_one(k, mode, bins, args, work, config_dir):
    sluice, keys_load = bins
    per = str(args.per_request)
    window = WINDOW[args.unit]
    c = Cluster(sluice, config_dir, work, mode, args)
    try:
        time.sleep(2)  # past the lease duration after the ring formed (the rebuild cap)
        if args.unit == "minute":
            wait_for_fresh_window(window)
        load0, hour0 = os.getloadavg()[0], hour(window)
        s0 = c.snapshot()
        touch = client(keys_load, ["touch", c.urls(), str(k), "--per-request", per,
                                   "--top", str(args.top), "--window-secs", str(window)], 3600)
        s1 = c.snapshot()
        load = client(keys_load, ["zipf", c.urls(), str(k), "--secs", str(args.load_secs),
                                  "--rate", str(args.rate), "--zipf", str(args.zipf),
                                  "--per-request", per, "--top", str(args.top),
                                  "--window-secs", str(window)],
                      args.load_secs * 20 + 120)
        s2 = c.snapshot()
        time.sleep(args.idle_wait)
        s3 = c.snapshot()
        time.sleep(args.idle_secs)
        s4 = c.snapshot()
    finally:
        c.stop()
    return {
        "keys": k, "mode": mode, "load_avg_before": load0, "load_avg_after": os.getloadavg()[0],
        "hour_crossed": hour(window) != hour0,
        "touch_secs": touch["secs"], "touch": phase(s0, s1, touch["per_target"]),
        "load_client": {x: load[x] for x in ("calls", "decisions", "admitted", "over", "secs")},
        "load": phase(s1, s2, load["per_target"]),
        "idle": phase(s3, s4, None),
        "hot": hot_ratios([touch, load], args.limit),
        "failed_calls": [touch["failed"], load["failed"]],
    }


def total(nodes, key):
    return sum(n[key] for n in nodes)


def fmt_k(k):
    return f"10^{len(str(k)) - 1}" if re.fullmatch(r"10*", str(k)) else f"{k:,}"


def mode_name(run):
    return run["mode"] + (" (hour ended)" if run["hour_crossed"] else "")


def summary_rows(runs):
    rows = ["| users K | mode | touch: s | CPU-s per 1,000 decisions | in use: decisions/s "
            "| cores | CPU-s per 1,000 decisions | peer calls/s | acquires/s | peer KB/s "
            "| hops/decision | idle: cores | peer calls/s | keys renewed/s | peer KB/s "
            "| hottest users: admitted/limit mean, max (windows) | held / leased keys | RSS MiB "
            "| failed calls: client, peer | hits decided alone | load avg |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
            "|---|---|---:|---|---:|---|"]
    for r in runs:
        ld, idle, c = r["load"], r["idle"], r["load_client"]
        secs = ld[0]["secs"]
        hot = r["hot"]
        hot_text = (f"{sum(hot) / len(hot):.3f}, {max(hot):.3f} ({len(hot)})" if hot else "-")
        touch = r["touch"]
        phases = (touch, ld, idle)
        peer_failed = sum(total(p, "failed_calls") for p in phases)
        alone = sum(total(p, "alone_hits") for p in phases)
        rows.append(
            f"| {fmt_k(r['keys'])} | {mode_name(r)} | {r['touch_secs']:.1f} "
            f"| {1000 * total(touch, 'cpu_s') / r['keys']:.4f} "
            f"| {c['decisions'] / secs:,.0f} | {total(ld, 'cores'):.3f} "
            f"| {1000 * total(ld, 'cpu_s') / max(c['decisions'], 1):.4f} "
            f"| {total(ld, 'calls_per_s'):,.0f} | {total(ld, 'acquires_per_s'):,.0f} "
            f"| {total(ld, 'sent_per_s') / 1000:,.1f} "
            f"| {total(ld, 'hops') / max(c['decisions'], 1):.4f} "
            f"| {total(idle, 'cores'):.3f} | {total(idle, 'calls_per_s'):,.1f} "
            f"| {total(idle, 'renewed_keys_per_s'):,.0f} "
            f"| {total(idle, 'sent_per_s') / 1000:,.1f} | {hot_text} "
            f"| {total(idle, 'held_keys'):,} / {total(idle, 'leased_keys'):,} "
            f"| {total(idle, 'rss_mib'):,.0f} | {sum(r['failed_calls'])}, {peer_failed} "
            f"| {alone:,} "
            f"| {r['load_avg_before']:.2f} → {r['load_avg_after']:.2f} |")
    return rows


def node_rows(runs):
    rows = ["| users K | mode | node | in use: decisions | cores | CPU-s per 1,000 decisions "
            "| peer calls/s | peer KB/s (sent+received) | hops/decision | idle: cores "
            "| peer calls/s | peer KB/s | held / leased keys | RSS MiB |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in runs:
        for i, (ld, idle) in enumerate(zip(r["load"], r["idle"])):
            rows.append(
                f"| {fmt_k(r['keys'])} | {mode_name(r)} | {i} | {ld['decisions']:,} "
                f"| {ld['cores']:.3f} | {1000 * ld['cpu_s'] / max(ld['decisions'], 1):.4f} "
                f"| {ld['calls_per_s']:,.0f} | {ld['bytes_per_s'] / 1000:,.1f} "
                f"| {ld['hops_per_decision']:.4f} | {idle['cores']:.3f} "
                f"| {idle['calls_per_s']:,.1f} | {idle['bytes_per_s'] / 1000:,.1f} "
                f"| {idle['held_keys']:,} / {idle['leased_keys']:,} | {idle['rss_mib']:,.0f} |")
    return rows


def report(runs, args):
    head = (f"{len(runs)} runs: 3 nodes each, {args.per_request} descriptors a call, "
            f"limit {args.limit} per user per {args.unit}; load {args.load_secs:g} s at "
            f"{args.rate:g} calls/s (Zipf {args.zipf}), idle {args.idle_secs:g} s after "
            f"{args.idle_wait:g} s; {os.cpu_count()} CPUs"
            + (f"; node settings {' '.join(args.env)}" if args.env else ""))
    return "\n".join([head, "", "Three nodes together:", "", *summary_rows(runs), "",
                      "Per node:", "", *node_rows(runs), ""])



def idle_over_forward(runs, args):
    """Whether every lease run's idle CPU is within --max-idle-over-forward of the forward run's
    with as many users (which must have run); says which is not."""
    forward = {r["keys"]: total(r["idle"], "cores") for r in runs if r["mode"] == "forward"}
    ok = True
    for r in (r for r in runs if r["mode"] == "lease"):
        if r["keys"] not in forward:
            print(f"no forward run with {fmt_k(r['keys'])} users to compare lease mode's idle "
                  "CPU with: run --modes lease,forward", file=sys.stderr)
            ok = False
            continue
        lease = total(r["idle"], "cores")
        if lease - forward[r["keys"]] > args.max_idle_over_forward:
            print(f"idle CPU of the three nodes, {fmt_k(r['keys'])} users: lease mode {lease:.3f} "
                  f"cores, forward mode {forward[r['keys']]:.3f}, more than "
                  f"{args.max_idle_over_forward} apart", file=sys.stderr)
            ok = False
    return ok

def main():
    args = parse_args()
    if args.from_jsonl:
        runs = [json.loads(line) for name in args.from_jsonl for line in open(name)]
        print(report(runs, args))
        return
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    bins = ((os.path.join(target, "release", "sluice"),
             os.path.join(target, "release", "keys_load"))
            if args.no_build else build(target))
    runs = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-lease-keys.") as work:
        config_dir = os.path.join(work, "config")
        os.mkdir(config_dir)
        with open(os.path.join(config_dir, "keys.yaml"), "w") as f:
            f.write(CONFIG.format(limit=args.limit, unit=args.unit))
        for k in (int(x) for x in args.keys.split(",")):
            for mode in args.modes.split(","):
                if args.unit == "hour":
                    wait_for_hour(args.hour_margin)
                t = time.monotonic()
                r = run_one(k, mode, bins, args, work, config_dir)
                r["run_secs"] = time.monotonic() - t
                runs.append(r)
                print(f"# {fmt_k(k)} users, {mode}: {r['run_secs']:.0f} s; idle "
                      f"{total(r['idle'], 'cores'):.3f} cores", file=sys.stderr, flush=True)
                if args.jsonl:
                    with open(args.jsonl, "a") as f:
                        f.write(json.dumps(r) + "\n")
    text = report(runs, args)
    print(text)
    print(f"# {time.monotonic() - started:.0f} s in all", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    failed = [r for r in runs if sum(r["failed_calls"])]
    for r in failed:
        touch, load = r["failed_calls"]
        print(f"failed calls, {fmt_k(r['keys'])} users, {r['mode']} mode: {touch} in the touch, "
              f"{load} in the load", file=sys.stderr)
    if args.max_idle_cores is not None:
        over = [r for r in runs if total(r["idle"], "cores") > args.max_idle_cores]
        for r in over:
            print(f"idle CPU of the three nodes, {fmt_k(r['keys'])} users, {r['mode']} mode: "
                  f"{total(r['idle'], 'cores'):.3f} cores > {args.max_idle_cores}",
                  file=sys.stderr)
        if over:
            sys.exit(1)
    if args.max_idle_over_forward is not None and not idle_over_forward(runs, args):
        sys.exit(1)
    over_limit = [r for r in runs if r["hot"] and max(r["hot"]) > 1.0]
    for r in over_limit:
        print(f"over the limit, {fmt_k(r['keys'])} users, {r['mode']} mode: a hottest user's "
              f"window admitted {max(r['hot']):.3f} times its limit", file=sys.stderr)
    if failed or over_limit:
        sys.exit(1)


if __name__ == "__main__":
    main()
