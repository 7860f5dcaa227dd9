#!/usr/bin/env python3
"""Numbers for bench/run.sh, with the standard library only.

  report.py run NAME before="OK ERRORS" after="OK ERRORS" KEY=VALUE... -- STDOUT_FILE... -- LOG_FILE...
      Checks, then summarises, one load run (several h2load processes at once). before and after
      are the server's answer counts around the run (bench/answers.py read): the run is refused,
      exit 1 with a message naming the server and the round, unless every call h2load counted as
      a success was answered OK (bench/answers.py verify). Requests per second is the sum of the
      processes' figures; latency percentiles come from the merged per-request logs (h2load
      --log-file). Appends one JSON line to $BENCH_RUNS.
  report.py summary RUNS.jsonl MICRO.txt MEMORY.txt MACHINE.txt OUT_DIR [quick]
      Writes OUT_DIR/summary.md (the tables) and OUT_DIR/sweep.svg (throughput and p99 against
      offered load), and prints the tables. With `quick` (BENCH_QUICK=1: one short round) the
      headline says so and gives its ratios to two significant figures, beside the spread of
      full runs' rounds.
"""
import json
import os
import re
import statistics
import sys

sys.dont_write_bytecode = True  # no bench/__pycache__/answers.*.pyc left in the work tree
from answers import parse_h2load, verify  # noqa: E402  (after the line above)


def percentile(sorted_values, q):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, int(-(-q * len(sorted_values) // 100)))  # ceil(q/100 * n)
    return sorted_values[min(rank, len(sorted_values)) - 1]


def cmd_run(args):
    name = args[0]
    sep1 = args.index("--")
    fields = dict(a.split("=", 1) for a in args[1:sep1])
    before, after = (tuple(int(x) for x in fields.pop(k).split()) for k in ("before", "after"))
    rest = args[sep1 + 1 :]
    sep2 = rest.index("--")
    stdouts, logs = rest[:sep2], rest[sep2 + 1 :]
    procs = [parse_h2load(open(p).read()) for p in stdouts]
    succeeded = sum(p["succeeded"] for p in procs)
    failed = sum(p["failed"] + p["non2xx"] for p in procs)
    answered_ok, _ = verify(run_label(name, fields), before, after, succeeded, failed)
    durations = []
    for path in logs:
        with open(path) as f:
            for line in f:
                parts = line.split("\t")
                if len(parts) == 3 and parts[1] == "200":
                    durations.append(int(parts[2]))
    durations.sort()
    row = {
        "name": name,
        **{k: (float(v) if re.fullmatch(r"[\d.]+", v) else v) for k, v in fields.items()},
        "rps": round(sum(p["rps"] for p in procs), 1),
        "succeeded": succeeded,
        "failed": failed,
        "p50_us": percentile(durations, 50),
        "p99_us": percentile(durations, 99),
        "p999_us": percentile(durations, 99.9),
        "samples": len(durations),
        # The server's count: h2load's successes plus its warm-up and the calls in flight at its end.
        "answered_ok": answered_ok,
    }
    with open(os.environ["BENCH_RUNS"], "a") as f:
        f.write(json.dumps(row) + "\n")
    print(
        f"  {name:<7} {fields.get('setting', ''):<10} offered={fields.get('offered', '-'):>8} "
        f"{row['rps']:>10.0f} req/s  p50 {row['p50_us']} us  p99 {row['p99_us']} us  "
        f"p99.9 {row['p999_us']} us  answered OK {answered_ok} >= {succeeded} counted, no error"
    )


def run_label(name, fields):
    """`noop, round 1, c2m100`: which run, for a refusal."""
    phase = fields.get("phase", "")
    where = {
        "rounds": f"round {fields.get('round')}",
        "sweep": f"sweep level {fields.get('level')}",
        "closed": f"closed-loop sweep, {fields.get('streams')} streams",
    }.get(phase, phase)
    return f"{name}, {where}, {fields.get('setting', '')}"


def med(rows, key):
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def fmt_us(v):
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.0f} µs"


def svg_chart(sweep, path):
    """Two panels over offered load: achieved req/s and p99 latency, one line per server."""
    colors = {"sluice": "#1f77b4", "noop": "#7f7f7f"}
    w, h, ml, mr, mt, mb, gap = 760, 520, 70, 150, 40, 50, 60
    ph = (h - mt - mb - gap) / 2
    pw = w - ml - mr
    xs = [r["offered"] for r in sweep]
    xmax = max(xs) * 1.05
    ymax_rps = max(max(r["rps"] for r in sweep), max(xs)) * 1.05
    ymax_p99 = max(r["p99_us"] for r in sweep) * 1.1 / 1000
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{ml}" y="20" font-size="14">Throughput and p99 latency against offered load (ShouldRateLimit, h2load)</text>',
    ]

    def panel(top, ymax, title, value, ylabel_fmt):
        out.append(f'<rect x="{ml}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
        out.append(f'<text x="{ml + 4}" y="{top + 14}">{title}</text>')
        for i in range(5):
            y = top + ph - ph * i / 4
            out.append(f'<line x1="{ml}" y1="{y:.1f}" x2="{ml + pw}" y2="{y:.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{ylabel_fmt(ymax * i / 4)}</text>')
        for i in range(6):
            x = ml + pw * i / 5
            out.append(f'<text x="{x:.1f}" y="{top + ph + 14}" text-anchor="middle">{xmax * i / 5 / 1000:.0f}k</text>')
        for server, color in colors.items():
            pts = sorted((r["offered"], value(r)) for r in sweep if r["name"] == server)
            if not pts:
                continue
            coords = " ".join(f"{ml + pw * x / xmax:.1f},{top + ph - ph * min(y, ymax) / ymax:.1f}" for x, y in pts)
            out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
            for x, y in pts:
                out.append(
                    f'<circle cx="{ml + pw * x / xmax:.1f}" cy="{top + ph - ph * min(y, ymax) / ymax:.1f}" r="3" fill="{color}"/>'
                )

    panel(mt, ymax_rps, "achieved req/s (dashed: offered)", lambda r: r["rps"], lambda v: f"{v / 1000:.0f}k")
    # The ideal line: achieved = offered.
    out.append(
        f'<line x1="{ml}" y1="{mt + ph}" x2="{ml + pw * min(xmax, ymax_rps) / xmax:.1f}" '
        f'y2="{mt + ph - ph * min(xmax, ymax_rps) / ymax_rps:.1f}" stroke="#999" stroke-dasharray="4 4"/>'
    )
    top2 = mt + ph + gap
    panel(top2, ymax_p99, "p99 latency (ms)", lambda r: r["p99_us"] / 1000, lambda v: f"{v:.2f}")
    out.append(f'<text x="{ml + pw / 2}" y="{h - 8}" text-anchor="middle">offered load (req/s, h2load --rps)</text>')
    for i, (server, color) in enumerate(colors.items()):
        y = mt + 20 + i * 18
        out.append(f'<line x1="{ml + pw + 15}" y1="{y}" x2="{ml + pw + 40}" y2="{y}" stroke="{color}" stroke-width="2"/>')
        label = "Sluice (memory)" if server == "sluice" else "no-op server"
        out.append(f'<text x="{ml + pw + 45}" y="{y + 4}">{label}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def parse_micro(text):
    """criterion lines: `name  time: [low est high]` (the name may be on its own line)."""
    rows = []
    for m in re.finditer(r"^(\S[^\n]*?)\s*(?:\n\s*)?time:\s+\[([\d.]+ \S+) ([\d.]+ \S+) ([\d.]+ \S+)\]", text, re.M):
        rows.append((m.group(1).strip(), m.group(3)))
    return rows


SERVERS = {"sluice": "Sluice", "careful": "careful", "noop": "no-op", "traced": "Sluice, tracing unsampled"}
SETTINGS = {"c2m100": "`-c 2 -m 100`", "real": "`-c 2 -m 100`, 3 descriptors x 2 entries", "c1m1": "`-c 1 -m 1`"}
# The headline: each server against the no-op server's floor, and Sluice against the careful
# server, what a small DashMap implementation of the same work reaches.
HEADLINE = [("sluice", "noop"), ("careful", "noop"), ("sluice", "careful"), ("traced", "noop")]


def ratios(rs, a, b):
    """(ratio of the medians, per-round ratios) of server a's req/s to server b's."""
    x = [r for r in rs if r["name"] == a]
    y = [r for r in rs if r["name"] == b]
    if not x or not y:
        return None, []
    per_round = []
    for rnd in sorted({r["round"] for r in rs}):
        p = [r["rps"] for r in x if r["round"] == rnd]
        q = [r["rps"] for r in y if r["round"] == rnd]
        if p and q:
            per_round.append(p[0] / q[0])
    return med(x, "rps") / med(y, "rps"), per_round


# The per-round Sluice / no-op ratio at `-c 2 -m 100` over the five 10 s rounds of the run in
# docs/benchmarks.md ("Results against the targets", "Noise"): what one round can be off by.
ROUND_SPREAD = "0.73 to 1.10"


def headline(rounds, settings, quick, machine):
    """The headline ratios: medians over the rounds with the per-round ratios in brackets; in
    quick mode, plainly what one short round gives."""
    head = [f"{SERVERS[a]} / {SERVERS[b]}" for a, b in HEADLINE]
    if quick:
        m = re.search(r"rounds=(\d+) duration=(\d+)s warm-up=(\d+)s", machine)
        n, duration, warmup = m.groups() if m else ("?", "?", "?")
        lines = [
            "## Headline: throughput ratios from one short noisy round (not a measurement; see "
            "docs/benchmarks.md for the method)",
            "",
            f"BENCH_QUICK=1: {'one round' if n == '1' else n + ' rounds'} of {duration} s per server "
            f"after {warmup} s of warm-up, on "
            "a shared machine. In full runs (five 10 s rounds) the per-round Sluice / no-op ratio "
            f"at `-c 2 -m 100` ranged {ROUND_SPREAD}, so these two-figure ratios only show that "
            "every server ran and answered; they do not measure Sluice.",
            "",
        ]
    else:
        lines = [
            "## Headline: throughput ratios (medians over alternating rounds; per-round ratios in brackets)",
            "",
        ]
    lines += ["| setting | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for setting in settings:
        rs = [r for r in rounds if r["setting"] == setting]
        cells = []
        for a, b in HEADLINE:
            ratio, per_round = ratios(rs, a, b)
            each = ", ".join(f"{x:.2f}" for x in per_round)
            if ratio is None:
                cells.append("-")
            elif quick:
                cells.append(f"{ratio:#.2g}" + (f" ({each})" if len(per_round) > 1 else ""))
            else:
                cells.append(f"**{ratio:.3f}** ({each})")
        lines.append(f"| {SETTINGS[setting]} | " + " | ".join(cells) + " |")
    return lines


def answers_line(runs):
    """What the per-run checks (bench/answers.py) established, over every load run."""
    if not all("answered_ok" in r for r in runs):
        return "Answers: not checked (runs recorded before bench/answers.py)."
    counted = sum(r["succeeded"] for r in runs)
    answered = sum(r["answered_ok"] for r in runs)
    return (
        f"Answers: every one of the {len(runs)} load runs was checked against its server's own "
        f"count (bench/answers.py): the {counted:,} calls h2load counted as successes were all "
        f"answered OK (grpc-status 0; the servers answered {answered:,} OK, warm-ups included), and "
        "no call got another status."
    )


def rounds_tables(rounds, quick=False, machine="", runs=()):
    """The headline ratios, then every server's medians, for the alternating rounds."""
    settings = [s for s in SETTINGS if any(r["setting"] == s for r in rounds)]
    lines = headline(rounds, settings, quick, machine)
    lines += [
        "",
        answers_line(runs or rounds),
        "",
        "## Load: every server (medians over alternating rounds)",
        "",
        "| setting | server | req/s (median) | p50 | p99 | p99.9 | rounds | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for setting in settings:
        for server, label in SERVERS.items():
            rows = [r for r in rounds if r["setting"] == setting and r["name"] == server]
            if rows:
                lines.append(
                    f"| {SETTINGS[setting]} | {label} | {med(rows, 'rps'):,.0f} | {fmt_us(med(rows, 'p50_us'))} | "
                    f"{fmt_us(med(rows, 'p99_us'))} | {fmt_us(med(rows, 'p999_us'))} | {len(rows)} | "
                    f"{sum(r['failed'] for r in rows):.0f} |"
                )
    lines.append("")
    return lines


def cmd_summary(args):
    runs_path, micro_path, memory_path, machine_path, out_dir = args[:5]
    quick = args[5:] == ["quick"]
    runs = [json.loads(l) for l in open(runs_path) if l.strip()]
    lines = []
    machine = open(machine_path).read().strip() if os.path.exists(machine_path) else ""
    lines += ["## Machine", "", "```", machine, "```", ""]

    lines += rounds_tables([r for r in runs if r.get("phase") == "rounds"], quick, machine, runs)

    sweep = [r for r in runs if r.get("phase") == "sweep"]
    if sweep:
        lines += [
            "## Offered-load sweep (`-c 2 -m 100`, h2load `--rps` per client)",
            "",
            "| offered req/s | server | achieved req/s | p50 | p99 | p99.9 |",
            "|---|---|---|---|---|---|",
        ]
        for r in sorted(sweep, key=lambda r: (r["offered"], r["name"])):
            lines.append(
                f"| {r['offered']:,.0f} | {r['name']} | {r['rps']:,.0f} | {fmt_us(r['p50_us'])} | "
                f"{fmt_us(r['p99_us'])} | {fmt_us(r['p999_us'])} |"
            )
        lines.append("")
        svg_chart(sweep, os.path.join(out_dir, "sweep.svg"))
        lines += ["![throughput and p99 against offered load](sweep.svg)", ""]

    closed = [r for r in runs if r.get("phase") == "closed"]
    if closed:
        peak = {n: max((r["rps"] for r in runs if r["name"] == n and r.get("phase") in ("rounds", "closed")), default=0)
                for n in ("sluice", "noop")}
        lines += [
            "## Closed-loop sweep (2 connections x N outstanding streams each)",
            "",
            "| streams per connection | server | req/s | share of the server's best | p50 | p99 | p99.9 |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in sorted(closed, key=lambda r: (r["streams"], r["name"])):
            lines.append(
                f"| {r['streams']:.0f} | {r['name']} | {r['rps']:,.0f} | {r['rps'] / peak[r['name']]:.0%} | "
                f"{fmt_us(r['p50_us'])} | {fmt_us(r['p99_us'])} | {fmt_us(r['p999_us'])} |"
            )
        lines.append("")

    if os.path.exists(micro_path):
        micro = parse_micro(open(micro_path).read())
        if micro:
            lines += ["## Micro-benchmarks (criterion, median estimate)", "", "| benchmark | time |", "|---|---|"]
            lines += [f"| `{n}` | {t} |" for n, t in micro]
            lines.append("")
    if os.path.exists(memory_path):
        lines += ["## Memory per live fixed-window counter", "", "```", open(memory_path).read().strip(), "```", ""]

    text = "\n".join(lines)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write("# Benchmark results (written by bench/run.sh)\n\n" + text)
    print(text)
    # A run with nothing answered means the bench broke (a server down or refusing the calls),
    # not that the machine was slow: fail, so CI says so.
    broken = [r for r in runs if r["succeeded"] == 0]
    if broken:
        raise SystemExit(f"{len(broken)} load runs got no successful answer, first: {broken[0]}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    {"run": cmd_run, "summary": cmd_summary}[sys.argv[1]](sys.argv[2:])
