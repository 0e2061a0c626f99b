#!/usr/bin/env python3
"""Medians (with min-max) and ratios of the rows bench/mirror-bench.sh wrote.

Rows (tab-separated):
  backlog CASE TOOL ROUND wall_s copy_s MB/s records/s cpu_s cpu_s_per_GB rss_MB
  latency -    TOOL ROUND p50_ms p99_ms max_ms send_p50_ms send_p99_ms cpu_s sent_rate rss_MB
  scale   -    TOOL ROUND first_s last_s idle_cpu_pct rss_MB
"""
import statistics
import sys
from collections import defaultdict

BACKLOG = ["wall_s", "copy_s", "MB/s", "rec/s", "cpu_s", "cpu_s/GB", "rss_MB"]
LATENCY = ["p50_ms", "p99_ms", "max_ms", "send_p50_ms", "send_p99_ms", "cpu_s", "rate", "rss_MB"]
SCALE = ["first_s", "last_s", "idle_cpu_%_of_a_core", "rss_MB"]


def num(v):
    try:
        return float(v)
    except ValueError:
        return None


def main(path):
    runs = defaultdict(list)
    with open(path) as f:
        for line in f:
            kind, case, tool, _round, *vals = line.rstrip("\n").split("\t")
            runs[(kind, case, tool)].append([num(v) for v in vals])
    med = {}

    def cell(key, i):
        vals = [r[i] for r in runs[key] if r[i] is not None]
        if not vals:
            return "-"
        m = statistics.median(vals)
        med[(key, i)] = m
        fmt = "{:.0f}" if m >= 100 else "{:.1f}" if m >= 1 else "{:.2f}"
        s = fmt.format(m)
        if len(vals) > 1:
            s += " (" + fmt.format(min(vals)) + "-" + fmt.format(max(vals)) + ")"
        return s

    for kind, names in (("backlog", BACKLOG), ("latency", LATENCY), ("scale", SCALE)):
        keys = sorted(k for k in runs if k[0] == kind)
        if not keys:
            continue
        print(f"\n{kind}: median (min-max) of {max(len(runs[k]) for k in keys)} runs")
        print("| case | tool | " + " | ".join(names) + " |")
        print("|---" * (len(names) + 2) + "|")
        for k in keys:
            print(f"| {k[1]} | {k[2]} | " + " | ".join(cell(k, i) for i in range(len(names))) + " |")

    def ratio(a, b, i):
        x, y = med.get((a, i)), med.get((b, i))
        return "-" if not x or not y else f"{x / y:.2f}"

    print("\nratios of medians")
    for case in ("large", "lz4", "small", "many", "keyed"):
        k, m = ("backlog", case, "kmirror"), ("backlog", case, "mm2")
        if k in runs and m in runs:
            print(
                f"{case}: throughput kmirror/MM2 {ratio(k, m, 2)}x (copy phase only: "
                f"{ratio(m, k, 1)}x), CPU-s/GB kmirror/MM2 {ratio(k, m, 5)}, "
                f"peak RSS kmirror/MM2 {ratio(k, m, 6)}"
            )
    for case in ("large", "lz4", "small", "many", "keyed"):
        k, b = ("backlog", case, "kmirror"), ("backlog", case, "kmirror-before")
        if k in runs and b in runs:
            print(
                f"{case}: kmirror after/before: throughput {ratio(k, b, 2)}x (copy phase only: "
                f"{ratio(b, k, 1)}x), CPU-s/GB {ratio(k, b, 5)}, peak RSS {ratio(k, b, 6)}"
            )
    for case in ("large", "lz4", "small", "many", "keyed"):
        k, n = ("backlog", case, "kmirror"), ("backlog", case, "kmirror-nomerge")
        if k in runs and n in runs:
            print(
                f"{case}: kmirror without/with merging: throughput {ratio(n, k, 2)}x (copy phase "
                f"only: {ratio(k, n, 1)}x), CPU-s/GB {ratio(n, k, 5)}"
            )
    k, d = ("backlog", "large", "kmirror"), ("backlog", "large", "direct")
    if k in runs and d in runs:
        print(f"large: kmirror / direct produce (the limit) {ratio(k, d, 2)} of its MB/s")
    r = ("backlog", "large", "kmirror-record")
    if r in runs and k in runs:
        print(
            f"large: record mode / batch mode: MB/s {ratio(r, k, 2)}, CPU-s/GB {ratio(r, k, 5)}"
        )
    k, b = ("latency", "-", "kmirror"), ("latency", "-", "kmirror-before")
    if k in runs and b in runs:
        print(
            f"latency kmirror after/before: p50 {ratio(k, b, 0)}, p99 {ratio(k, b, 1)}, "
            f"max {ratio(k, b, 2)}, CPU {ratio(k, b, 5)}"
        )
    k, m = ("latency", "-", "kmirror"), ("latency", "-", "mm2")
    if k in runs and m in runs:
        print(
            f"latency kmirror/MM2: p50 {ratio(k, m, 0)}, p99 {ratio(k, m, 1)}, "
            f"max {ratio(k, m, 2)}, CPU {ratio(k, m, 5)}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
