#!/usr/bin/env bash
# Build bench_decode against an engine built with CUDA and run it (a benchmark, not a test).
#   bench/cuda/run.sh BUILD_DIR MODEL.gguf [bench_decode options]
# The model: spark-agent model gen --preset qwen3-30b-a3b --type q4_k_m -o MODEL.gguf
set -euo pipefail
build=$1
shift
src=$(cd "$(dirname "$0")/../.." && pwd)
cc -O2 -std=c17 -D_GNU_SOURCE -I"$src/engine" -c "$src/bench/cuda/bench_decode.c" \
    -o "$build/bench_decode.o"
nvcc -o "$build/bench_decode" "$build/bench_decode.o" "$build/engine/libengine.a" -lpthread -lm
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv,noheader || true
echo "# commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')"
"$build/bench_decode" "$@"
