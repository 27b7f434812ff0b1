#!/usr/bin/env python3
"""Nsight Compute CSV (ncu --csv --metrics ...) per kernel and grid.

ncu_summary.py CSV: gpu__time_duration.sum per kernel: count, mean and total microseconds,
largest total first.
ncu_summary.py CSV METRIC...: the mean of each named metric per kernel (one column each), and
for each pair NAME.max / NAME.avg their ratio (how unevenly the units, e.g. the L2 slices, took
the work: 1.0 is even)."""
import csv
import sys

DUR = "gpu__time_duration.sum"


def value(r):
    v = float(r["Metric Value"].replace(",", ""))
    if r["Metric Name"] == DUR:
        unit = r.get("Metric Unit", "nsecond")
        return v / 1e3 if unit.startswith("n") else v if unit.startswith("u") else v * 1e3
    return v


def main():
    want = sys.argv[2:] or [DUR]
    rows = {}  # (kernel, grid) -> {metric: [values]}
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        m = r.get("Metric Name")
        if m not in want:
            continue
        key = (r["Kernel Name"].split("(")[0], r.get("Grid Size", ""))
        rows.setdefault(key, {}).setdefault(m, []).append(value(r))
    if want == [DUR]:
        print(f"{'kernel':<40} {'grid':<16} {'n':>4} {'mean us':>9} {'total us':>10}")
        tot = {k: (len(v[DUR]), sum(v[DUR])) for k, v in rows.items()}
        for (name, grid), (c, t) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
            print(f"{name[:40]:<40} {grid[:16]:<16} {c:>4} {t / c:>9.2f} {t:>10.1f}")
        return
    pairs = [m[:-4] for m in want if m.endswith(".max") and m[:-4] + ".avg" in want]
    print("kernel | grid | n | " + " | ".join(want + [p + " max/avg" for p in pairs]))
    for (name, grid), ms in sorted(rows.items()):
        mean = {m: sum(v) / len(v) for m, v in ms.items()}
        n = max(len(v) for v in ms.values())
        cols = [f"{mean[m]:.4g}" if m in mean else "-" for m in want]
        for p in pairs:
            a, b = mean.get(p + ".max"), mean.get(p + ".avg")
            cols.append(f"{a / b:.3f}" if a is not None and b else "-")
        print(f"{name[:40]} | {grid} | {n} | " + " | ".join(cols))


main()
