#!/usr/bin/env python3
"""Where a kernel's warps stall, instruction by instruction, from Nsight Compute's source page
(`ncu --import R.ncu-rep --page source --csv --print-source sass > F.csv`, gzip or not; the
report taken with --section SourceCounters and, for enough samples on a short launch,
--warp-sampling-interval 0). Per profiled launch: its warp samples, the stall reasons summed
over its instructions, the code executed (unique instructions, bytes, 128-byte lines) and the
executed griddepcontrol.wait (ACQBULK) addresses. For the first launch, also the instructions
with the most samples of one reason (default stall_no_inst: a warp waiting for its next
instructions to be fetched), with their offsets from the kernel's start, so that stalls at
regular distances through straight-line code show up as such.

Usage: ncu_sass.py F.csv[.gz] [REASON] [N]   (REASON e.g. stall_barrier; N rows, default 25)"""
import csv
import gzip
import sys


def launches(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        cur = None
        for line in f:
            if line.startswith('"Kernel Name"'):
                if cur:
                    yield cur
                cur = [line]
            elif cur is not None:
                cur.append(line)
        if cur:
            yield cur


def main():
    path = sys.argv[1]
    reason = sys.argv[2] if len(sys.argv) > 2 else "stall_no_inst"
    n_top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    for li, lines in enumerate(launches(path)):
        name = next(csv.reader(lines[:1]))[1]
        rows = list(csv.reader(lines[1:]))
        hdr, rows = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
        col = {h: i for i, h in enumerate(hdr)}
        num = lambda r, h: float(r[col[h]] or 0) if h in col else 0.0
        base = int(rows[0][col["Address"]], 16)
        samples = sum(num(r, "Warp Stall Sampling (All Samples)") for r in rows)
        reasons = {h: sum(num(r, h) for r in rows) for h in hdr
                   if h.startswith("stall_") and not h.endswith("(Not Issued)")}
        run = [r for r in rows if num(r, "Instructions Executed") > 0]
        lines128 = {(int(r[col["Address"]], 16) - base) // 128 for r in run}
        waits = [hex(int(r[col["Address"]], 16) - base) for r in run
                 if "ACQBULK" in r[col["Source"]]]
        print("launch %d: %s" % (li, name[:90]))
        print("  %d instructions in the image (%d bytes), %d executed (%d bytes, %d lines of 128)"
              % (len(rows), 16 * len(rows), len(run), 16 * len(run), len(lines128)))
        print("  waits (ACQBULK) at %s; %d warp samples" % (", ".join(waits) or "-", samples))
        for h, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:8]:
            print("    %-26s %6d  %5.1f%%" % (h, v, 100.0 * v / samples if samples else 0))
        if li == 0 and reason in col:
            print("  top instructions by %s (offset, samples, source):" % reason)
            top = sorted(rows, key=lambda r: -num(r, reason))[:n_top]
            for r in sorted(top, key=lambda r: int(r[col["Address"]], 16)):
                if num(r, reason) > 0:
                    print("    %7x %5d  %s" % (int(r[col["Address"]], 16) - base, num(r, reason),
                                            r[col["Source"]].strip()[:60]))


if __name__ == "__main__":
    main()
