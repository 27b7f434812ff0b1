#!/usr/bin/env bash
# CPU prefill speed of qwen35moe with the Gated DeltaNet delta rule in chunked form (the
# default since issue 11) vs the recurrent form (SPARK_Q35_DELTA=recurrent, token by token):
# a benchmark, not a test. Generates the qwen35-tiny preset (F32 or the type given), then runs
# `spark-agent bench` at each prompt length in both modes, interleaved: prefill, and decode of
# N_GEN tokens after the prompt (decode appends one row at a time to the chunk).
#
#   bench/qwen35/prefill_cpu.sh [-b BUILD_DIR] [-T TYPE] [-p "512 2048"] [-B BATCH] [-n N_GEN]
#                               [-r REPS] [-t THREADS] [-k]
#
# Defaults: build/, f32, pp512 and pp2048, batch 512, tg32, 3 reps, all cores. Any build with the
# engine works (SPARK_ENGINE_ONLY=ON is enough). The model goes to
# ${TMPDIR:-/tmp}/spark-bench-qwen35-tiny-TYPE.gguf, removed afterwards unless -k.
set -euo pipefail
build=build type=f32 lens="512 2048" batch=512 ng=32 reps=3 threads=$(nproc) keep=0
while getopts "b:T:p:B:n:r:t:k" o; do
    case $o in
    b) build=$OPTARG ;; T) type=$OPTARG ;; p) lens=$OPTARG ;; B) batch=$OPTARG ;;
    n) ng=$OPTARG ;;
    r) reps=$OPTARG ;; t) threads=$OPTARG ;; k) keep=1 ;;
    *) sed -n 2,12p "$0"; exit 2 ;;
    esac
done
cli=$build/spark-agent
model=${TMPDIR:-/tmp}/spark-bench-qwen35-tiny-$type.gguf
[ "$keep" = 1 ] || trap 'rm -f "$model"' EXIT
[ -f "$model" ] || "$cli" model gen --preset qwen35-tiny --type "$type" -s 1 -o "$model"
echo "# $(date -u +%FT%TZ) $(git -C "$(dirname "$0")" rev-parse --short HEAD)"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
for n in $lens; do
    for mode in recurrent chunked; do
        echo "## pp$n, delta rule $mode"
        SPARK_Q35_DELTA=$mode "$cli" bench -m "$model" -p "$n" -n "$ng" -b "$batch" \
            -r "$reps" -t "$threads"
    done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
