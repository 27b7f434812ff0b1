#!/usr/bin/env bash
# Benchmark (not a test): wall time of `spark-agent model gen` for a preset and type, written
# to a scratch file that is deleted afterwards.
#
#   bench/gen/gen_speed.sh [PRESET] [TYPE] [THREADS]      (default: qwen3-30b-a3b q4_k_m, all)
#
# Needs ~19 GB free in ${TMPDIR:-/tmp} for the default. Measured on the GPU machine (16 cores,
# engine-only build): qwen3-30b-a3b q4_k_m, 18.55 GB of weights, 86.8 s wall at 1545% CPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cli=${SPARK_CLI:-$root/build/spark-agent}
preset=${1:-qwen3-30b-a3b}
type=${2:-q4_k_m}
threads=${3:-0}
out=$(mktemp "${TMPDIR:-/tmp}/spark-gen-bench-XXXXXX.gguf")
trap 'rm -f "$out" "$out.tmp"' EXIT
args=(model gen --preset "$preset" --type "$type" -o "$out")
[ "$threads" != 0 ] && args+=(-t "$threads")
[ -n "${SPARK_TOKENIZER_DIR:-}" ] && args+=(--tokenizer-dir "$SPARK_TOKENIZER_DIR")
start=$(date +%s.%N)
"$cli" "${args[@]}"
end=$(date +%s.%N)
size=$(stat -c %s "$out")
awk -v s="$start" -v e="$end" -v b="$size" -v p="$preset" -v t="$type" -v n="$(nproc)" \
    'BEGIN { printf "%s %s: %.2f GB in %.1f s (%.2f GB/s), %s CPUs\n", p, t, b / 1e9, e - s, b / 1e9 / (e - s), n }'
