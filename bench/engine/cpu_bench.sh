#!/usr/bin/env bash
# CPU prefill/decode speed of the engine (a benchmark, not a test): generate a random-weight
# model of a preset and type, then `spark-agent bench` it at the given thread counts.
#
#   bench/engine/cpu_bench.sh [-b BUILD_DIR] [-P PRESET] [-T TYPE] [-p N_PROMPT] [-n N_GEN]
#                             [-r REPS] [-t "1 2 ..."] [-k]
#
# Defaults: build/, preset small (qwen3moe, 12 layers, hidden 1024, 32 experts / 8 active),
# type q8_0, pp128, tg32, 3 reps, threads "1 <all cores>". The model goes to
# ${TMPDIR:-/tmp}/spark-bench-PRESET-TYPE.gguf and is removed afterwards unless -k.
set -euo pipefail
build=build preset=small type=q8_0 np=128 ng=32 reps=3 keep=0
threads="1 $(nproc)"
while getopts "b:P:T:p:n:r:t:k" o; do
    case $o in
    b) build=$OPTARG ;; P) preset=$OPTARG ;; T) type=$OPTARG ;; p) np=$OPTARG ;;
    n) ng=$OPTARG ;; r) reps=$OPTARG ;; t) threads=$OPTARG ;; k) keep=1 ;;
    *) sed -n 2,12p "$0"; exit 2 ;;
    esac
done
cli=$build/spark-agent
model=${TMPDIR:-/tmp}/spark-bench-$preset-$type.gguf
[ "$keep" = 1 ] || trap 'rm -f "$model"' EXIT
[ -f "$model" ] || "$cli" model gen --preset "$preset" --type "$type" -s 1 -o "$model"
echo "# $(date -u +%FT%TZ) $(git -C "$(dirname "$0")" rev-parse --short HEAD) $("$cli" version | tail -1)"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
for t in $threads; do
    "$cli" bench -m "$model" -p "$np" -n "$ng" -r "$reps" -t "$t"
done
