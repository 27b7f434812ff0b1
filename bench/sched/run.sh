#!/usr/bin/env bash
# Scheduler benchmark (not a test): aggregate decode tok/s at 1, 4 and 16 concurrent requests
# and a prefix-cache replay through the scheduler, then the same replay with the cache off.
# Builds bench/sched/bench_sched.c against an existing build's engine library and generates the
# model with the CLI of that build.
#
#   bench/sched/run.sh [-b BUILD_DIR] [PRESET [TYPE [THREADS [TOKENS]]]]
#
# Defaults: build/, preset tiny, type q8_0, 2 threads, 32 tokens per request.
set -euo pipefail
build=build
if [ "${1:-}" = -b ]; then build=$2; shift 2; fi
preset=${1:-tiny} type=${2:-q8_0} threads=${3:-2} tokens=${4:-32}
src=$(cd "$(dirname "$0")/../.." && pwd)
exe=${TMPDIR:-/tmp}/spark_bench_sched
model=${TMPDIR:-/tmp}/spark_bench_sched_${preset}_${type}.gguf
cmake --build "$build" --target engine >/dev/null
cc -std=c17 -O2 -D_GNU_SOURCE -I"$src/engine" -I"$src/engine/core" -I"$build/generated" \
    "$src/bench/sched/bench_sched.c" "$build/engine/libengine.a" -lm -lpthread -o "$exe"
[ -f "$model" ] || "$exe" gen "$preset" "$type" "$model"
echo "# $(date -u +%FT%TZ) $(git -C "$src" rev-parse --short HEAD)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$exe" "$model" decode "$threads" "$tokens" 1 4 16
"$exe" "$model" replay "$threads" 20 512 96 32
"$exe" "$model" replay-off "$threads" 20 512 96 32
