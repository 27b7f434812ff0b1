#!/usr/bin/env bash
# Persisted-prefix benchmark (not a test): builds bench/prefix/bench_prefix.c against an
# existing build's engine library and runs it (see the C file for the arguments).
#
#   bench/prefix/run.sh [-b BUILD_DIR] [PRESET [TYPE [SYSTEM [NEW [REPS]]]]]
#
# Defaults: build/, preset small, type q8_0, a 1024-token system block, a 64-token first user
# message, 3 repetitions. The model is generated once into $TMPDIR (or /tmp) and reused.
set -euo pipefail
build=build
if [ "${1:-}" = -b ]; then build=$2; shift 2; fi
src=$(cd "$(dirname "$0")/../.." && pwd)
exe=${TMPDIR:-/tmp}/spark_bench_prefix
cmake --build "$build" --target engine >/dev/null
cc -std=c17 -O2 -I"$src/engine" "$src/bench/prefix/bench_prefix.c" "$build/engine/libengine.a" \
    -lm -lpthread -o "$exe"
echo "# $(date -u +%FT%TZ) $(git -C "$src" rev-parse --short HEAD)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
"$exe" "${1:-small}" "${2:-q8_0}" "${3:-1024}" "${4:-64}" "${5:-3}"
