#!/usr/bin/env bash
# One short device call for the batched decode (engine/cuda/batch.cu): an engine-only Release
# build for sm_90 of spark-agent and test_cuda_batch_paged, the test, a cut-down random-weight
# Qwen3-30B-A3B (LAYERS blocks, generated in the background meanwhile), then
# `spark-agent bench -B N` (N = 1, 2, 8, 32) with the scheduler's GPU batched mode (decode steps:
# a CUDA graph per bucket; SPARK_CUDA_BATCH_PROF=1 logs each bucket's GPU and wall ms a step)
# and with one session per request; CONTROL=1 adds the batched mode with its decode steps
# through the prefill pass (SPARK_CUDA_BATCH_DECODE=0). Logs go to $OUT.
# Usage (from a snapshot of the tree, .tok beside): [LAYERS=12] [TYPE=q4_k_m] [N=64]
#        [BIN=dir] bench/cuda_batch/batch_iter.sh
# BIN: spark-agent and test_cuda_batch_paged built elsewhere (engine-only, sm_90): no build.
set -o pipefail
B=/tmp/b
OUT=${OUT:-/tmp/out}
TOK=$PWD/.tok
TYPE=${TYPE:-q4_k_m}
LAYERS=${LAYERS:-12}
N=${N:-64}
t0=$(date +%s)
stamp() { echo "[+$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ -n "$BIN" ]; then
    AGENT=$BIN/spark-agent TEST=$BIN/test_cuda_batch_paged
else
    AGENT=$B/spark-agent TEST=$B/tests/engine/test_cuda_batch_paged
    cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DSPARK_TOKENIZER_DIR=$TOK -DCMAKE_BUILD_TYPE=Release >/tmp/cfg.log 2>&1 ||
        { tail -30 /tmp/cfg.log; exit 1; }
    ninja -C $B spark-agent >$OUT/build.log 2>&1 ||
        { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
    stamp "spark-agent built"
fi
(/usr/bin/time -f "gen $TYPE ($LAYERS layers): %e s" $AGENT model gen \
    --preset qwen3-30b-a3b --type $TYPE --layers $LAYERS -s 1 -o /tmp/cut.gguf \
    --tokenizer-dir $TOK && touch /tmp/gen.done) >$OUT/gen.log 2>&1 &
gen=$!
if [ -z "$BIN" ]; then
    ninja -C $B test_cuda_batch_paged >>$OUT/build.log 2>&1 ||
        { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
fi
SPARK_TOKENIZER_DIR=$TOK timeout 100 $TEST 2>&1 |
    tee $OUT/test_paged.log | grep -v "^\[" | tail -40
echo "test_cuda_batch_paged rc=$?"
stamp "test done"
wait $gen
[ -e /tmp/gen.done ] || { echo "gen failed"; tail -5 $OUT/gen.log; exit 1; }
stamp "model generated"; tail -1 $OUT/gen.log
export SPARK_DEVICE=cuda
bench() { timeout 60 $AGENT bench -m /tmp/cut.gguf "$@" 2>&1 | grep -v "^\[" |
    tee -a $OUT/bench.log; }
for b in 1 2 8 32; do
    echo "== batched (graph) -B $b"
    SPARK_SCHED_GPU_BATCH=1 SPARK_CUDA_BATCH_PROF=1 bench -B $b -p 128 -n $N -r 1
    echo "== sessions -B $b"; SPARK_SCHED_GPU_BATCH=0 bench -B $b -p 128 -n $N -r 1
done
if [ -n "$CONTROL" ]; then
    echo "== batched, decode through the prefill pass (control) -B 8"
    SPARK_SCHED_GPU_BATCH=1 SPARK_CUDA_BATCH_DECODE=0 bench -B 8 -p 128 -n $N -r 1
fi
stamp "all done"
