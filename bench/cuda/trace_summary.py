#!/usr/bin/env python3
"""Summary of a launch timeline (engine_cuda_trace_stop's file; bench_q35 / bench_decode with
SPARK_BENCH_TRACE=FILE in a -DSPARK_CUDA_TRACE=ON build).

Per launch (grid id): its blocks, the first and last block start (ev 0), the first and last
return of a block's PDL wait (ev 1). Launches in order of their first wait return (the
previous kernel's completion as this one saw it); a step starts at the embedding launch (the
first launch of one block). For each launch:
  gap   = its first wait return - the previous launch's first wait return (us): the time the
          chain spent in the previous launch, boundary included
  early = first wait return - first block start: how long its first block waited (prefetching)
  late  = last block start - first wait return (> 0: blocks that only started after the
          previous kernel was done: a second wave, or no room beside the previous kernel)
  spread= last wait return - first wait return
Usage: trace_summary.py FILE [--steps] (the ordered list of one step, else per launch shape)."""
import collections
import sys


def main():
    path = sys.argv[1]
    g = collections.defaultdict(lambda: {"s": [], "w": [], "shape": None})
    for line in open(path):
        t, grid, blk, ev, gx, gy, sm = map(int, line.split())
        r = g[grid]
        r["shape"] = (gx, gy, ev >> 8)
        (r["s"] if ev & 0xFF == 0 else r["w"]).append(t)
    L = []
    for gid, r in g.items():
        s, w = sorted(r["s"]), sorted(r["w"])
        key = w[0] if w else s[0]
        L.append(dict(gid=gid, shape=r["shape"], n=max(len(s), len(w)), s0=s[0] if s else key,
                      s1=s[-1] if s else key, w0=w[0] if w else key, w1=w[-1] if w else key,
                      key=key))
    L.sort(key=lambda x: x["key"])
    steps, cur = [], None
    for x in L:
        if x["shape"][0] == 1 and x["shape"][1] == 1 and x["shape"][2] == 128:  # embed
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append(x)
    print("%d launches, %d steps" % (len(L), len(steps)))
    if len(steps) < 2:
        return
    full = steps[1:-1] if len(steps) > 2 else steps[:1]
    for st in full:
        print("step: %d launches, %.1f us from the embedding's wait to the last launch's wait" %
              (len(st), (st[-1]["w0"] - st[0]["w0"]) / 1e3))
    st = full[0]
    rows = []
    for i, x in enumerate(st):
        nxt = st[i + 1]["key"] if i + 1 < len(st) else None
        rows.append(dict(shape=x["shape"], n=x["n"],
                         gap=(nxt - x["key"]) / 1e3 if nxt else float("nan"),
                         early=(x["w0"] - x["s0"]) / 1e3, late=(x["s1"] - x["w0"]) / 1e3,
                         spread=(x["w1"] - x["w0"]) / 1e3))
    if "--steps" in sys.argv:
        print("%4s %18s %6s %8s %8s %8s %8s" % ("i", "grid x,y,threads", "blocks", "gap", "early",
                                                  "late", "spread"))
        for i, r in enumerate(rows):
            print("%4d %18s %6d %8.2f %8.2f %8.2f %8.2f" % (i, "%d,%d,%d" % r["shape"], r["n"],
                                                            r["gap"], r["early"], r["late"],
                                                            r["spread"]))
    agg = collections.OrderedDict()
    for r in rows:
        a = agg.setdefault(r["shape"], [0, 0.0, 0.0, 0.0, 0.0, 0])
        if r["gap"] == r["gap"]:
            a[0] += 1
            a[1] += r["gap"]
        a[2] += r["early"]
        a[3] += r["late"]
        a[4] += r["spread"]
        a[5] += 1
    print("%18s %5s %9s %8s %8s %8s %8s" % ("grid x,y,threads", "count", "sum gap", "gap",
                                            "early", "late", "spread"))
    for k, a in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print("%18s %5d %9.1f %8.2f %8.2f %8.2f %8.2f" % ("%d,%d,%d" % k, a[5], a[1],
                                                         a[1] / max(a[0], 1), a[2] / a[5],
                                                         a[3] / a[5], a[4] / a[5]))


main()
