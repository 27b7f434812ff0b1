#!/bin/sh
# Build and run the vec_dot / quantize benchmark against an existing build's engine library.
#   bench/quant/run.sh [BUILD_DIR] [ROWS] [THREADS]   (from the repository root; defaults:
#   build, 4096 rows of 4096, 1 thread; THREADS > 1 adds a parallel quantize figure)
# The library must be a release build (RelWithDebInfo, the default) for meaningful figures.
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build}
rows=${2:-4096}
threads=${3:-1}
lib="$build/engine/libengine.a"
[ -f "$lib" ] || { echo "no $lib: build the tree first (cmake --build $build)" >&2; exit 2; }
out="$build/bench_quant"
${CC:-cc} -std=c17 -O2 -D_GNU_SOURCE -I"$root/engine" -I"$root/engine/core" \
    "$root/bench/quant/bench_quant.c" "$lib" -o "$out" -lm -lpthread
"$out" "$rows" "$threads"
SPARK_CPU_SIMD=scalar "$out" 16 | head -1
