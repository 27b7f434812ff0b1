#!/usr/bin/env bash
# Build and run delta_op.c (the delta rule of one head, recurrent vs chunked) against a build's
# libengine.a: bench/qwen35/delta_op.sh [BUILD_DIR] [DK DV N CHUNK]. A benchmark, not a test.
set -euo pipefail
build=${1:-build}
shift || true
src=$(cd "$(dirname "$0")/../.." && pwd)
out=${TMPDIR:-/tmp}/spark-delta-op
cc -std=c17 -D_GNU_SOURCE -O3 -I"$src/engine" "$src/bench/qwen35/delta_op.c" "$build/engine/libengine.a" \
    -lm -lpthread -o "$out"
echo "# $(date -u +%FT%TZ) $(git -C "$src" rev-parse --short HEAD)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$out" "$@"
