#!/usr/bin/env bash
# MTP speculative decoding cost on the CPU (see verify_cost.c): verify pass of k+1 tokens vs a
# plain step, the draft step, the rollback, and tok/s computed for acceptance 0.6/0.8/0.9.
#
#   bench/mtp/verify_cost.sh [-b BUILD_DIR] [PRESET [TYPE [THREADS [REPS [DEPTH]]]]]
#
# Defaults: build/, qwen35-tiny, q8_0, 2 threads, 5 reps, depth 256.
set -euo pipefail
build=build
if [ "${1:-}" = -b ]; then build=$2; shift 2; fi
src=$(cd "$(dirname "$0")/../.." && pwd)
exe=${TMPDIR:-/tmp}/spark_mtp_verify_cost
cmake --build "$build" --target engine >/dev/null
cc -std=c17 -O2 -D_GNU_SOURCE -I"$src/engine" -I"$src/engine/core" -I"$build/generated" \
    "$src/bench/mtp/verify_cost.c" "$build/engine/libengine.a" -lm -lpthread \
    $(pkg-config --libs libpcre2-8 2>/dev/null || echo -lpcre2-8) -o "$exe"
echo "# $(date -u +%FT%TZ) $(git -C "$src" rev-parse --short HEAD)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$exe" "${1:-qwen35-tiny}" "${2:-q8_0}" "${3:-2}" "${4:-5}" "${5:-256}"
