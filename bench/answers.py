#!/usr/bin/env python3
"""Every load run's answers, checked against the server's own count (standard library only).

h2load counts a call answered with HTTP 200 as a success whatever `grpc-status` ended it, so
a server answering UNAVAILABLE at full speed would score as well as one answering OK. The bench
scripts therefore read each server's count of its answers, OK and not, before and after every
load run, and refuse the run (exit 1, naming it) unless:

  - the server answered no call with a non-zero grpc-status during the run (nor refused one at
    a listener limit, for Sluice): exact;
  - h2load counted no failed, errored or non-2xx request: exact;
  - the server answered at least as many calls OK as h2load counted successes: exact. The
    server's count is larger by the calls h2load leaves out of its figures: those answered in
    its warm-up (--warm-up-time), and at most the calls in flight when its duration ended (it
    closes its connections then; at most -m per connection). With `exact` (h2load -n, no
    warm-up, every call waited for) the two counts must be equal.

Together: every call h2load counted as a success was answered OK. The counts come from the
servers' handlers; a call refused before any handler (routing, framing, decoding) is refused the
same way for the same bytes, so the bench scripts send each body file once beforehand with a
real gRPC client (`bench_client check-body`), which requires grpc-status 0.

  answers.py read [--settled] SPEC...
      Prints "OK ERRORS": the answers the servers counted so far, summed; with --settled, once
      two reads 0.2 s apart agree (a server may still be answering calls whose client has gone:
      before an exact check, they must not fall into its window). SPEC is
      sluice:DEBUG_PORT (Sluice's /metrics: total_requests less its errors; errors: service and
      backend errors plus the listeners' refusals) or example:PORT (the comparison servers'
      --answers port, tests/support/src/bench/answers.rs).
  answers.py check LABEL BEFORE AFTER [exact] -- H2LOAD_STDOUT...
      Checks one run (BEFORE and AFTER as `read` printed them); prints one line, or exits 1.
"""
import re
import sys
import time
import urllib.request


def parse_h2load(text):
    """req/s and request counts from one h2load stdout."""
    rps = re.search(r"finished in [^,]+, ([\d.]+) req/s", text)
    req = re.search(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout",
        text,
    )
    status = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    if not rps or not req:
        raise SystemExit("h2load output not understood:\n" + text)
    return {
        "rps": float(rps.group(1)),
        "succeeded": int(req.group(4)),
        # h2load counts a non-2xx answer as failed too; errored and timed-out ones are apart.
        "failed": int(req.group(5)) + int(req.group(6)) + int(req.group(7)),
        "non2xx": sum(int(status.group(i)) for i in (2, 3, 4)) if status else 0,
    }


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def sluice_counts(port):
    """(OK, errors) from Sluice's /metrics: every ShouldRateLimit call counts in total_requests
    as it is answered, an error also in should_rate_limit_error (a backend error answered
    anyway, failing open, counts there too: not a run to measure); a call a listener refused
    (in flight, deadline, message size, pending bytes) never reached the service."""
    total, errors, refused = None, 0, 0
    for line in get(f"http://127.0.0.1:{port}/metrics").splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith('ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}'):
            total = int(float(value))
        elif name.startswith("ratelimit_service_should_rate_limit_error{"):
            errors += int(float(value))
        elif name.startswith("sluice_listener_refused_total{"):
            refused += int(float(value))
    if total is None:
        raise SystemExit(f"no ratelimit_service_total_requests in :{port}/metrics (DISABLE_STATS?)")
    return total - errors, errors + refused


def example_counts(port):
    """(OK, errors) from a comparison server's --answers port."""
    counts = dict(line.split() for line in get(f"http://127.0.0.1:{port}/").splitlines())
    return int(counts["ok"]), int(counts["errors"])


def read(specs):
    ok = errors = 0
    for spec in specs:
        kind, _, port = spec.partition(":")
        o, e = {"sluice": sluice_counts, "example": example_counts}[kind](port)
        ok, errors = ok + o, errors + e
    return ok, errors


def verify(label, before, after, succeeded, failed, exact=False):
    """Refuses (SystemExit) a run whose answers were not all OK; returns (OK, errors)."""
    ok, errors = after[0] - before[0], after[1] - before[1]
    problems = []
    if errors:
        problems.append(f"the server answered {errors} calls with a non-zero grpc-status")
    if failed:
        problems.append(f"h2load counted {failed} failed requests")
    if ok < succeeded or (exact and ok != succeeded):
        problems.append(
            f"h2load counted {succeeded} successes but the server answered {ok} calls OK"
            + (" (h2load -n: they must be equal)" if exact else "")
            + (" (no answer counted at all: Sluice with DISABLE_STATS counts none)" if ok == errors == 0 else "")
        )
    if problems:
        raise SystemExit(f"bench: refusing {label}: " + "; ".join(problems))
    return ok, errors


def settled(specs):
    last = read(specs)
    for _ in range(50):
        time.sleep(0.2)
        now = read(specs)
        if now == last:
            return now
        last = now
    raise SystemExit(f"the answer counts of {' '.join(specs)} never settled: {last}")


def main(args):
    if args[:2] == ["read", "--settled"] and len(args) > 2:
        print(*settled(args[2:]))
    elif args[:1] == ["read"] and len(args) > 1:
        print(*read(args[1:]))
    elif args[:1] == ["check"] and "--" in args:
        sep = args.index("--")
        label, before, after, *flags = args[1:sep]
        runs = [parse_h2load(open(p).read()) for p in args[sep + 1 :]]
        succeeded = sum(r["succeeded"] for r in runs)
        failed = sum(r["failed"] for r in runs)
        parse = lambda s: tuple(int(x) for x in s.split())
        ok, _ = verify(label, parse(before), parse(after), succeeded, failed, exact=flags == ["exact"])
        print(f"  answers checked: {succeeded} successes counted by h2load, {ok} OK by the server, no error")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
