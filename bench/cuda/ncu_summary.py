#!/usr/bin/env python3
"""Sum Nsight Compute's gpu__time_duration per kernel (CSV from ncu --csv --metrics
gpu__time_duration.sum): count, mean and total microseconds, largest total first."""
import csv
import sys

rows = {}
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0]
    grid = r.get("Grid Size", "")
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "nsecond")
    us = v / 1e3 if unit.startswith("n") else v if unit.startswith("u") else v * 1e3
    key = (name, grid)
    c, t = rows.get(key, (0, 0.0))
    rows[key] = (c + 1, t + us)
print(f"{'kernel':<40} {'grid':<16} {'n':>4} {'mean us':>9} {'total us':>10}")
for (name, grid), (c, t) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
    print(f"{name[:40]:<40} {grid[:16]:<16} {c:>4} {t / c:>9.2f} {t:>10.1f}")
