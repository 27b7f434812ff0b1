#!/bin/sh
# Chat-template render time: our interpreter vs @huggingface/jinja (node) on the same long agent
# conversation, for each fixture template.   bench/template/bench.sh [N_TURNS] [REPEATS]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
turns=${1:-50}
reps=${2:-200}
nm=${SPARK_NODE_MODULES:-$root/tests/node_modules}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT INT TERM
${CC:-cc} -std=c17 -O2 -D_GNU_SOURCE -I"$root/agent" -I"$root/engine" \
    "$root/bench/template/bench_template.c" "$root"/agent/template*.c "$root/agent/error.c" \
    -ljansson -lm -o "$out/bench_template"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
cd "$out"
for t in qwen3 qwen3_coder qwen35; do
    ./bench_template "$root/tests/fixtures/templates/$t.jinja" "$turns" "$reps"
    SPARK_NODE_MODULES=$nm node "$root/bench/template/bench_ref.mjs" \
        "$root/tests/fixtures/templates/$t.jinja" bench_conv.json "$reps"
done
