#!/bin/sh
# Build and run the vec_dot / quantize benchmark against an existing build's engine library.
#   bench/quant/run.sh [BUILD_DIR] [ROWS]     (from the repository root; default BUILD_DIR=build)
# The library must be a release build (RelWithDebInfo, the default) for meaningful figures.
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build}
rows=${2:-4096}
lib="$build/engine/libengine.a"
[ -f "$lib" ] || { echo "no $lib: build the tree first (cmake --build $build)" >&2; exit 2; }
out="$build/bench_quant"
${CC:-cc} -std=c17 -O2 -D_GNU_SOURCE -I"$root/engine" -I"$root/engine/core" \
    "$root/bench/quant/bench_quant.c" "$lib" -o "$out" -lm -lpthread
"$out" "$rows"
SPARK_CPU_SIMD=scalar "$out" "$rows" | head -1
