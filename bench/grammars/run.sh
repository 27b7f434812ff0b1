#!/bin/sh
# Build and run the grammar benchmark against an existing build's grammars library.
#   bench/grammars/run.sh [BUILD_DIR] [SAMPLES]   (from the repository root; default build, 10)
# Use a release build (RelWithDebInfo, the default) for meaningful figures. Needs the Qwen3
# tokenizer in tests/node_modules (scripts/install-deps.sh).
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build}
samples=${2:-10}
lib="$build/grammars/libgrammars.a"
[ -f "$lib" ] || { echo "no $lib: build the tree first (cmake --build $build)" >&2; exit 2; }
out="$build/bench_grammars"
${CC:-cc} -std=c17 -O2 -D_GNU_SOURCE -I"$root" -I"$root/grammars" -I"$root/tests" \
    -DSPARK_TEST_SOURCE_DIR="\"$root\"" \
    "$root/bench/grammars/bench_grammars.c" "$root/tests/grammars/qwen_vocab.c" "$lib" \
    -o "$out" $(pkg-config --cflags --libs jansson) -lm
"$out" "$samples"
