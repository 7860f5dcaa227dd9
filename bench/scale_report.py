#!/usr/bin/env python3
"""The scale envelope's tables and plots (issue 40), from bench/scale.sh's JSON lines.

    scale_report.py RUNS.jsonl OUT_DIR

Writes OUT_DIR/scale.md (one table per curve) and OUT_DIR/scale-<curve>.svg (panels on log-log
axes, one per cost, against the work: counters, descriptors, streams, held keys). Standard
library only. Each run is one JSON line with "curve" and "n" (and "shape" for config, or for an
earlier version's runs kept beside the current ones, plotted as their own series); a later line
for the same curve, shape and n replaces an earlier one.
"""
import json
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]

# Per curve: the work's name, the table's columns (key, heading, format) and the plot's panels
# (title, [(series label, key)]); config's series are its shapes.
CURVES = {
    "counters": {
        "work": "live counters",
        "columns": [
            ("bytes_per_counter", "bytes per counter", "{:.1f}"),
            ("decision_p50_ns", "decision p50 (ns)", "{:.0f}"),
            ("decision_p99_ns", "decision p99 (ns)", "{:.0f}"),
            ("sweeping_p99_ns", "p99 while sweeping (ns)", "{:.0f}"),
            ("sweep_keep_cpu_ms", "sweep pass, none expired (ms CPU)", "{:.1f}"),
            ("sweep_free_cpu_ms", "sweep pass, all expired (ms CPU)", "{:.1f}"),
            ("sweep_free_write_hold_ns", "longest write hold while freeing (ns)", "{:.0f}"),
            ("freeing_p99_ns", "p99 while it frees (ns)", "{:.0f}"),
            ("freeing_p9999_ns", "p99.99 while it frees (ns)", "{:.0f}"),
            ("freeing_max_ns", "longest while it frees (ns)", "{:.0f}"),
            ("sweeper_core_share", "sweeper's share of a core (every 10 s)", "{:.4f}"),
        ],
        "panels": [
            ("bytes per counter", [("resident", "bytes_per_counter")]),
            ("decision latency (ns)", [("p50", "decision_p50_ns"), ("p99", "decision_p99_ns"),
                                       ("p99 while sweeping", "sweeping_p99_ns")]),
            ("decisions while a pass frees (ns)", [("p99", "freeing_p99_ns"),
                                                   ("p99.99", "freeing_p9999_ns"),
                                                   ("longest", "freeing_max_ns")]),
            ("sweep pass (ms CPU)", [("none expired", "sweep_keep_cpu_ms"),
                                     ("all expired", "sweep_free_cpu_ms")]),
        ],
    },
    "config": {
        "work": "descriptors in one domain",
        "columns": [
            ("load_ms", "load and compile (ms)", "{:.2f}"),
            ("bytes_per_descriptor", "bytes per descriptor", "{:.0f}"),
            ("lookup_ns", "lookup, a match (ns)", "{:.0f}"),
            ("miss_ns", "lookup, a miss (ns)", "{:.0f}"),
        ],
        "panels": [
            ("load and compile (ms)", "load_ms"),
            ("bytes per descriptor", "bytes_per_descriptor"),
            ("lookup of a match (ns)", "lookup_ns"),
        ],
    },
    "rlqs": {
        "work": "Envoy streams",
        "columns": [
            ("reports", "reports", "{:.0f}"),
            ("bytes_per_stream", "resident bytes per stream", "{:.0f}"),
            ("cpu_us_per_report", "CPU per report (µs)", "{:.1f}"),
            ("assign_p50_ms", "assignment p50 (ms)", "{:.2f}"),
            ("assign_p99_ms", "assignment p99 (ms)", "{:.2f}"),
        ],
        "panels": [
            ("resident bytes per stream", [("bytes", "bytes_per_stream")]),
            ("CPU per report (µs)", [("CPU", "cpu_us_per_report")]),
            ("assignment latency (ms)", [("p50", "assign_p50_ms"), ("p99", "assign_p99_ms")]),
        ],
    },
    "lease": {
        "work": "held keys per node",
        "columns": [
            ("bytes_per_key", "resident bytes per key (node and owner)", "{:.0f}"),
            ("node_ms", "node's round (ms)", "{:.1f}"),
            ("owner_ms", "owner's round (ms)", "{:.1f}"),
            ("node_core_share", "node's share of a core", "{:.3f}"),
            ("owner_core_share", "owner's share of a core", "{:.3f}"),
            ("wire_bytes_per_key", "wire bytes per key per round", "{:.1f}"),
            ("wire_mb_per_s", "wire MB/s", "{:.2f}"),
        ],
        "panels": [
            ("CPU per key per round (µs)", [("node", "node_us_per_key"), ("owner", "owner_us_per_key")]),
            ("wire bytes per key per round", [("asks and grants", "wire_bytes_per_key")]),
            ("resident bytes per key", [("node and owner", "bytes_per_key")]),
        ],
    },
}


def load(path):
    runs = {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("curve") == "lease":
            r["node_us_per_key"] = r["node_ms"] * 1e3 / r["n"]
            r["owner_us_per_key"] = r["owner_ms"] * 1e3 / r["n"]
        runs[(r["curve"], r.get("shape", ""), r["n"])] = r
    return sorted(runs.values(), key=lambda r: (r["curve"], r.get("shape", ""), r["n"]))


def table(curve, spec, rows):
    shaped = any(r.get("shape") for r in rows)
    head = (["shape"] if shaped else []) + [spec["work"]] + [c[1] for c in spec["columns"]]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ([r.get("shape") or "now"] if shaped else []) + [f"{r['n']:,}"]
        cells += [c[2].format(r[c[0]]) if r.get(c[0]) is not None else "-" for c in spec["columns"]]
        out.append("| " + " | ".join(cells) + " |")
    return out


def series(curve, spec, rows):
    """Each panel's title and its series: (label, [(n, value)])."""
    panels = []
    for title, what in spec["panels"]:
        if isinstance(what, str):  # one series per shape
            shapes = sorted({r["shape"] for r in rows})
            lines = [(s, [(r["n"], r[what]) for r in rows if r["shape"] == s]) for s in shapes]
        else:
            # A shaped run of a curve without shapes is an earlier version kept for comparison
            # (rlqs "before": issue 50's per-report split): its own series, labelled so.
            shapes = sorted({r.get("shape", "") for r in rows})
            lines = [(f"{label} ({s})" if s else label,
                      [(r["n"], r[key]) for r in rows if r.get(key) and r.get("shape", "") == s])
                     for s in shapes for label, key in what]
        panels.append((title, [(l, [p for p in pts if p[1] and p[1] > 0]) for l, pts in lines]))
    return panels


def svg(curve, spec, panels, path):
    pw, ph, ml, mt, gap = 250, 220, 60, 40, 70
    w = ml + len(panels) * (pw + gap)
    # Room under the panels for the longest legend (an earlier version's series double it).
    h = mt + ph + max(90, 46 + 14 * max(len(lines) for _, lines in panels))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{ml}" y="18" font-size="13">{curve}: cost against {spec["work"]} (log-log)</text>']
    for p, (title, lines) in enumerate(panels):
        left = ml + p * (pw + gap)
        pts = [pt for _, line in lines for pt in line]
        if not pts:
            continue
        x0, x1 = decades(min(x for x, _ in pts), max(x for x, _ in pts))
        y0, y1 = decades(min(y for _, y in pts), max(y for _, y in pts))
        fx = lambda x: left + pw * (math.log10(x) - x0) / (x1 - x0)
        fy = lambda y: mt + ph - ph * (math.log10(y) - y0) / (y1 - y0)
        out.append(f'<rect x="{left}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
        out.append(f'<text x="{left}" y="{mt - 6}">{title}</text>')
        for d in range(x0, x1 + 1):
            x = fx(10 ** d)
            out.append(f'<line x1="{x:.1f}" y1="{mt}" x2="{x:.1f}" y2="{mt + ph}" stroke="#eee"/>')
            out.append(f'<text x="{x:.1f}" y="{mt + ph + 14}" text-anchor="middle">1e{d}</text>')
        for d in range(y0, y1 + 1):
            y = fy(10 ** d)
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#eee"/>')
            out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{short(10 ** d)}</text>')
        for i, (label, line) in enumerate(lines):
            color = COLORS[i % len(COLORS)]
            coords = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in sorted(line))
            out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
            for x, y in line:
                out.append(f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3" fill="{color}"/>')
            ly = mt + ph + 32 + i * 14
            out.append(f'<line x1="{left}" y1="{ly - 4}" x2="{left + 20}" y2="{ly - 4}" stroke="{color}" stroke-width="2"/>')
            out.append(f'<text x="{left + 25}" y="{ly}">{label}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def decades(lo, hi):
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return a, max(b, a + 1)


def short(v):
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


def main():
    runs, out_dir = load(sys.argv[1]), sys.argv[2]
    md = ["# The scale envelope (bench/scale.sh)", ""]
    for curve, spec in CURVES.items():
        rows = [r for r in runs if r["curve"] == curve]
        if not rows:
            continue
        md += [f"## {curve}", ""] + table(curve, spec, rows) + ["", f"![{curve}](scale-{curve}.svg)", ""]
        svg(curve, spec, series(curve, spec, rows), f"{out_dir}/scale-{curve}.svg")
    with open(f"{out_dir}/scale.md", "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
