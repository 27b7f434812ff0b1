#!/usr/bin/env python3
"""Instruction counts of the loops of one kernel in PTX or SASS text: for each backward branch
(a loop), the instructions between its target label and the branch, and how many of them are
dp4a / IDP (the integer dot products), shared-memory loads and global loads. A first look at
how many instructions a kernel spends per weight chunk, without a profiler.

Usage: sass_loops.py FILE [KERNEL]
  FILE: `nvcc -ptx` output, or `cuobjdump -sass` output (one function: -fun NAME)
  KERNEL: for PTX, the .entry's mangled name (default: the whole file)
Example (session 17, PTX of moe_fused.cu, moe_grid_kernel<Q8_K, router fusion>): the up rows'
loop over a lane's chunks held 504 instructions with 32 dp4a, i.e. four Q4_K chunk products
(2 rows x gate and up) of ~126 PTX instructions each for 32 weights, and 44 shared loads, the
staged x's 6 loads repeated for each of the four; the down rows' loop (two chunks an iteration)
430 instructions for 16 dp4a, ~215 a chunk, with an integer division per item (it / nch).
PTX is before ptxas's optimisation: the SASS (cuobjdump on the device) is what runs. Session 18
(`cuobjdump -sass -fun` of the same kernel; its branches name addresses): the up rows' loops of
the three K types hold 407 / 516 / 465 SASS instructions for 32 IDP each, ~102-129 a chunk, so
ptxas keeps about PTX's count."""
import re
import sys


def body_of(text, kernel):
    if not kernel:
        return text
    i = text.index(".entry " + kernel)
    j = text.find(".entry ", i + 7)
    return text[i:j if j >= 0 else len(text)]


def main():
    text = open(sys.argv[1]).read()
    body = body_of(text, sys.argv[2] if len(sys.argv) > 2 else None)
    sass = "/*0" in body
    lines = [l.strip() for l in body.split("\n")]
    addr = {}  # cuobjdump's branches name addresses ("BRA 0xb90"), nvdisasm's labels
    for k, l in enumerate(lines):
        m = re.match(r"^/\*([0-9a-f]+)\*/", l)
        if m:
            addr[int(m.group(1), 16)] = k
    if sass:  # "/*0120*/  IMAD R1, ... ;  /* 0x... */" -> "IMAD R1, ..."
        lines = [re.sub(r"^@!?U?P\w+\s+", "",
                        re.sub(r"^/\*[0-9a-f]+\*/\s*", "", l).split(";")[0].strip())
                 if l.startswith("/*") else l for l in lines]
    lab_re = r"^(\.L_x_\d+):" if sass else r"^(\$L__BB\d+_\d+):"
    bra_re = r"BRA\s+`?\(?(\.L_x_\d+)\)?" if sass else r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);"
    labels = {}
    for k, l in enumerate(lines):
        m = re.match(lab_re, l)
        if m:
            labels[m.group(1)] = k
    if sass and not labels:
        bra_re = r"BRA\s+(0x[0-9a-f]+)"
        labels = {"0x%x" % a: k for a, k in addr.items()}

    def instr(x):
        return x and not x.startswith(("$", "//", ".", "/*")) and x not in ("{", "}")

    dots = ("dp4a", "IDP")
    for k, l in enumerate(lines):
        m = re.search(bra_re, l)
        if not m or m.group(1) not in labels or labels[m.group(1)] >= k:
            continue
        seg = [x for x in lines[labels[m.group(1)]:k + 1] if instr(x)]
        d = sum(any(t in x for t in dots) for x in seg)
        ls = sum(x.startswith(("ld.shared", "LDS")) for x in seg)
        lg = sum(x.startswith(("ld.global", "LDG")) for x in seg)
        print("loop at %d..%d: %4d instructions, %3d dot products, %3d shared loads, %3d global "
              "loads" % (labels[m.group(1)], k, len(seg), d, ls, lg))


main()
