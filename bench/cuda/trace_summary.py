#!/usr/bin/env python3
"""Summary of a launch timeline (engine_cuda_trace_stop's file; bench_q35 / bench_decode with
SPARK_BENCH_TRACE=FILE in a -DSPARK_CUDA_TRACE=ON build).

Per launch (grid id): its blocks, the first and last block start (ev 0), the first and last
return of a block's PDL wait (ev 1). Launches in order of their first wait return (the
previous kernel's completion as this one saw it); a step starts at the embedding launch (the
first launch of one block), or where the draw gathers the next step's embedding, at the first
launch after the draw. For each launch:
  gap   = its first wait return - the previous launch's first wait return (us): the time the
          chain spent in the previous launch, boundary included
  early = first wait return - first block start: how long its first block waited (prefetching)
  late  = last block start - first wait return (> 0: blocks that only started after the
          previous kernel was done: a second wave, or no room beside the previous kernel)
  spread= last wait return - first wait return
  e3    = the last block's work done (ev 3: matvec, MoE up/down blocks) - first wait return
  e2, e4..e8 = the mean block's stage stamps (kernel-specific; moe_dev.cuh, matvec_dev.cuh,
          moe_fused.cu: the whole-grid MoE launch 9 the RMS scale summed, 5 routed, 11 routed
          again (SPARK_CUDA_MOE_FUSED_DIAG=0x10), 10 the copies issued, 6 x staged, 7 up rows
          landed, 4 past the grid barrier, 8 down rows landed)
          - first wait return
Usage: trace_summary.py FILE [--steps] (the ordered list of one step, else per launch shape)
       trace_summary.py FILE --blocks GX[,THREADS]: the launches of that grid (and block) size,
       block by block: for each event, its quantiles over the blocks of a launch (min, p10,
       median, p90, max, us after the launch's first wait return), and the per-block time from
       each stage to the next in time order, both the mean over the launches (a grid barrier
       waits for the slowest block: the max column is what the chain sees); with --range LO:HI
       only blocks LO..HI-1 of each launch (e.g. the wo + router launch's router blocks, 0:128
       for Qwen3-30B-A3B, against its wo blocks, 128:384);
       trace_summary.py FILE --all: every launch of the file in time order (no steps: for
       traces without one embedding launch per step, such as MTP draft and verify passes);
       a graph node replayed keeps its grid id, so a grid id's records more than 150 us after
       the first of its launch start another launch (a launch longer than that is split)."""
import collections
import sys


STAGES = (4, 5, 2, 6, 7, 8, 3)
FIELDS = ("gap", "early", "late", "spread") + tuple("e%d" % e for e in STAGES)


def all_launches(path):
    recs = []
    for line in open(path):
        t, grid, blk, ev, gx, gy, sm = map(int, line.split())
        recs.append((t, grid, ev, gx, gy))
    recs.sort()
    live, out = {}, []
    for t, grid, ev, gx, gy in recs:
        x = live.get(grid)
        if x is None or t - x["first"] > 150000:
            x = live[grid] = {"shape": (gx, gy, ev >> 8), "s": [], "w": [],
                              "st": collections.defaultdict(list), "first": t}
            out.append(x)
        e = ev & 0xFF
        (x["s"] if e == 0 else x["w"] if e == 1 else x["st"][e]).append(t)
    for x in out:
        x["key"] = x["w"][0] if x["w"] else x["s"][0] if x["s"] else x["first"]
    out.sort(key=lambda x: x["key"])
    print("%d launches" % len(out))
    print("%6s %10s %18s %6s" % ("i", "t, us", "grid x,y,threads", "blocks") +
          "".join("%7s" % f for f in FIELDS))
    for i, x in enumerate(out):
        nxt = out[i + 1]["key"] if i + 1 < len(out) else None
        w0 = x["key"]
        s0 = x["s"][0] if x["s"] else w0
        s1 = x["s"][-1] if x["s"] else w0
        w1 = x["w"][-1] if x["w"] else w0
        f = [(nxt - w0) / 1e3 if nxt else float("nan"), (w0 - s0) / 1e3, (s1 - w0) / 1e3,
             (w1 - w0) / 1e3]
        for e in STAGES:
            v = x["st"].get(e)
            f.append(((max(v) if e == 3 else sum(v) / len(v)) - w0) / 1e3 if v else float("nan"))
        print("%6d %10.1f %18s %6d" % (i, (w0 - out[0]["key"]) / 1e3, "%d,%d,%d" % x["shape"],
                                       max(len(x["s"]), len(x["w"]))) +
              "".join("%7.2f" % v for v in f))


def quantiles(xs):
    xs = sorted(xs)
    n = len(xs)
    return [xs[0], xs[n // 10], xs[n // 2], xs[(9 * n) // 10], xs[-1]]


def blocks(path, want, rng=None):
    lo, hi = (int(v) for v in rng.split(":")) if rng else (0, 1 << 30)
    gx = int(want.split(",")[0])
    th = int(want.split(",")[1]) if "," in want else None
    launches = collections.defaultdict(list)  # (grid id, threads) -> records
    for line in open(path):
        t, grid, blk, ev, x, gy, sm = map(int, line.split())
        if x == gx and (th is None or ev >> 8 == th) and lo <= blk < hi:
            launches[(grid, ev >> 8)].append((t, blk, ev & 0xFF))
    q = collections.defaultdict(list)
    d = collections.defaultdict(list)
    n = 0
    for rs in launches.values():
        rs.sort()
        runs = [[rs[0]]]  # a graph replay keeps the grid id: split at 150 us
        for r in rs[1:]:
            if r[0] - runs[-1][0][0] <= 150000:
                runs[-1].append(r)
            else:
                runs.append([r])
        for run in runs:
            waits = [t for t, b, e in run if e == 1]
            if not waits:
                continue
            w0 = min(waits)
            per = collections.defaultdict(dict)
            for t, b, e in run:
                per[b].setdefault(e, (t - w0) / 1e3)
            for e in sorted({e for v in per.values() for e in v}):
                q[e].append(quantiles([v[e] for v in per.values() if e in v]))
            for v in per.values():  # stage to stage, in time order, per block
                order = sorted((t, e) for e, t in v.items() if e != 0)
                for (ta, ea), (tb, eb) in zip(order, order[1:]):
                    d[(ea, eb)].append(tb - ta)
            n += 1
    print("%d launches of grid %s%s; us after each launch's first wait return of those blocks"
          % (n, want, ", blocks %s" % rng if rng else ""))
    print("%6s %7s %7s %7s %7s %7s" % ("event", "min", "p10", "median", "p90", "max"))
    for e, l in sorted(q.items()):
        print("%6s" % ("e%d" % e) + "".join("%8.2f" % (sum(x[i] for x in l) / len(l))
                                           for i in range(5)))
    print("per block, stage to the next (blocks with both):")
    for (a, b), l in sorted(d.items(), key=lambda kv: -len(kv[1])):
        x = quantiles(l)
        print("  e%d -> e%d: %6d blocks, median %.2f, p90 %.2f, max %.2f" % (a, b, len(l), x[2],
                                                                            x[3], x[4]))


def main():
    path = sys.argv[1]
    if "--all" in sys.argv:
        all_launches(path)
        return
    if "--blocks" in sys.argv:
        rng = sys.argv[sys.argv.index("--range") + 1] if "--range" in sys.argv else None
        blocks(path, sys.argv[sys.argv.index("--blocks") + 1], rng)
        return
    recs = []
    for line in open(path):
        t, grid, blk, ev, gx, gy, sm = map(int, line.split())
        recs.append((t, grid, ev, gx, gy))
    recs.sort()
    # a graph replay keeps its launches' grid ids: split the records into steps at the starts of
    # the embedding launch (one block of 128 threads), the first launch of a step; a step whose
    # embedding the draw before it gathers (SPARK_CUDA_EMBED_DRAW, the default since session
    # 42) starts at the first block start of another launch after a wait return of the draw
    # (ENGINE_CU_SAMPLE_BLOCKS = 128 blocks of 256 threads): the next replay's first launch
    # (there, one embedding launch before the first replay: whichever finds more steps)
    starts = [r[0] for r in recs if r[3] == 1 and r[4] == 1 and r[2] == 128 << 8]
    after_draw, draw_waited = [], False
    for t, grid, ev, gx, gy in recs:
        draw = gx == 128 and gy == 1 and ev >> 8 == 256
        if draw and ev & 0xFF == 1:
            draw_waited = True
        elif not draw and ev & 0xFF == 0 and draw_waited:
            after_draw.append(t)
            draw_waited = False
    if len(after_draw) > len(starts):
        starts = after_draw
    steps = []
    for i, t0 in enumerate(starts):
        t1 = starts[i + 1] if i + 1 < len(starts) else None
        g = collections.OrderedDict()
        for t, grid, ev, gx, gy in recs:
            if t < t0 or (t1 is not None and t >= t1):
                continue
            r = g.setdefault(grid, {"s": [], "w": [], "st": collections.defaultdict(list),
                                    "shape": (gx, gy, ev >> 8)})
            e = ev & 0xFF
            (r["s"] if e == 0 else r["w"] if e == 1 else r["st"][e]).append(t)
        L = []
        for gid, r in g.items():
            s, w = r["s"], r["w"]
            key = w[0] if w else s[0]
            L.append(dict(gid=gid, shape=r["shape"], n=max(len(s), len(w)),
                          s0=s[0] if s else key, s1=s[-1] if s else key,
                          w0=w[0] if w else key, w1=w[-1] if w else key, key=key,
                          st={e: (max(v) if e == 3 else sum(v) / len(v))
                              for e, v in r["st"].items()}))
        L.sort(key=lambda x: x["key"])
        steps.append(L)
    print("%d steps: %s launches" % (len(steps), [len(st) for st in steps]))
    if not steps:
        return
    full = steps[1:] if len(steps) > 1 else steps
    for i, st in enumerate(full):
        nx = full[i + 1] if i + 1 < len(full) else None
        print("step: %d launches, %.1f us from the first launch's wait to the last launch's wait%s" %
              (len(st), (st[-1]["w0"] - st[0]["w0"]) / 1e3,
               "; %.2f us from there to the next step's first wait (%.2f to its first block)" %
               ((nx[0]["w0"] - st[-1]["w0"]) / 1e3, (nx[0]["s0"] - st[-1]["w0"]) / 1e3)
               if nx else ""))
    rows = None
    for st in full:  # the mean over the steps (launch i of each)
        if len(st) != len(full[0]):
            continue
        rs = []
        for i, x in enumerate(st):
            nxt = st[i + 1]["key"] if i + 1 < len(st) else None
            rs.append(dict(shape=x["shape"], n=x["n"],
                           gap=(nxt - x["key"]) / 1e3 if nxt else float("nan"),
                           early=(x["w0"] - x["s0"]) / 1e3, late=(x["s1"] - x["w0"]) / 1e3,
                           spread=(x["w1"] - x["w0"]) / 1e3, k=1,
                           **{"e%d" % e: ((x["st"][e] - x["w0"]) / 1e3 if e in x["st"]
                                          else float("nan")) for e in STAGES}))
        if rows is None:
            rows = rs
        else:
            for a, b in zip(rows, rs):
                for f in FIELDS:
                    a[f] += b[f]
                a["k"] += 1
    for r in rows:
        for f in FIELDS:
            r[f] /= r["k"]
    if "--steps" in sys.argv:
        print("%4s %18s %6s" % ("i", "grid x,y,threads", "blocks") +
              "".join("%7s" % f for f in FIELDS))
        for i, r in enumerate(rows):
            print("%4d %18s %6d" % (i, "%d,%d,%d" % r["shape"], r["n"]) +
                  "".join("%7.2f" % r[f] for f in FIELDS))
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
