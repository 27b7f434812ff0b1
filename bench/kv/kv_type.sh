#!/usr/bin/env bash
# KV type benchmark (not a test): F16 vs Q8_0 KV on the CPU, memory per token, prefill and
# decode speed at a context depth, and the attention op alone (see kv_type.c).
#
#   bench/kv/kv_type.sh [-b BUILD_DIR] [PRESET [WEIGHT_TYPE [DEPTH [N_GEN [THREADS [REPS]]]]]]
#
# Defaults: build/, preset tiny, weights q8_0, depth 2048, 32 decode tokens, 2 threads, 3 reps.
set -euo pipefail
build=build
if [ "${1:-}" = -b ]; then build=$2; shift 2; fi
src=$(cd "$(dirname "$0")/../.." && pwd)
exe=${TMPDIR:-/tmp}/spark_kv_type
cmake --build "$build" --target engine >/dev/null
cc -std=c17 -O2 -I"$src/engine" -I"$src/engine/core" -I"$build/generated" \
    "$src/bench/kv/kv_type.c" "$build/engine/libengine.a" -lm -lpthread -o "$exe"
echo "# $(date -u +%FT%TZ) $(git -C "$src" rev-parse --short HEAD)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$exe" "${1:-tiny}" "${2:-q8_0}" "${3:-2048}" "${4:-32}" "${5:-2}" "${6:-3}"
