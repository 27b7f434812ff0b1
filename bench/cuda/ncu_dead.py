#!/usr/bin/env python3
"""The code in a kernel's image that a profiled launch never ran, by source line: Nsight
Compute's executed-instruction counts (`ncu --section SourceCounters`, then `ncu --import R
--page source --csv --print-source sass > F.csv`, gzip or not) joined by offset with the
kernel's disassembly from a cubin compiled with -lineinfo (`nvdisasm -gi -c -fun INDEX
X.cubin > K.sass`; the same instructions as the profiled build: compare the counts). Prints
each run of at least MIN unexecuted instructions with its offset, length and the source lines
(innermost first, then where each was inlined) that most of it comes from, and the totals.
Session 40 found the runs this way that the MoE, q/k/v and wo + router instances never take.

Usage: ncu_dead.py K.sass F.csv[.gz] [MIN]   (MIN default 16)"""
import collections
import csv
import gzip
import re
import sys


def sass_lines(path):
    """offset -> source chain ("file:line < file:line ...") of each instruction."""
    loc, chain, after_ins = {}, [], True
    for line in open(path):
        m = re.match(r'\s*//## File "([^"]*)", line (\d+)', line)
        if m:
            if after_ins:
                chain = []
            after_ins = False
            chain.append("%s:%s" % (m.group(1).split("/")[-1], m.group(2)))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s", line)
        if m:
            loc[int(m.group(1), 16)] = " < ".join(chain) or "?"
            after_ins = True
    return loc


def executed(path):
    """offset -> executed count of the first launch in the source page's CSV."""
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        lines = f.read().split("\n")
    first = next(i for i, l in enumerate(lines) if l.startswith('"Kernel Name"'))
    rows = list(csv.reader(lines[first + 1:]))
    hdr, rows = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    col = {h: i for i, h in enumerate(hdr)}
    base = int(rows[0][col["Address"]], 16)
    return {int(r[col["Address"]], 16) - base: float(r[col["Instructions Executed"]] or 0)
            for r in rows}


def main():
    loc, ex = sass_lines(sys.argv[1]), executed(sys.argv[2])
    min_run = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    if len(loc) != len(ex):
        print("warning: %d instructions disassembled, %d profiled: not the same build?"
              % (len(loc), len(ex)))
    runs, cur = [], None
    for o in sorted(ex):
        live = ex[o] > 0
        if cur is None or cur[0] != live:
            cur = [live, []]
            runs.append(cur)
        cur[1].append(o)
    dead = sum(len(r[1]) for r in runs if not r[0])
    print("%d instructions, %d executed, %d never (%d runs of >= %d)"
          % (len(ex), len(ex) - dead, dead,
             sum(1 for r in runs if not r[0] and len(r[1]) >= min_run), min_run))
    for live, offs in runs:
        if live or len(offs) < min_run:
            continue
        print("never %6x %5d" % (offs[0], len(offs)))
        for src, n in collections.Counter(loc.get(o, "?") for o in offs).most_common(4):
            print("      %4d  %s" % (n, src[:160]))


if __name__ == "__main__":
    main()
