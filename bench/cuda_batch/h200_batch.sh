#!/usr/bin/env bash
# One call on the GPU machine for the batched GPU pass (engine_cuda_batch, the scheduler's
# SPARK_SCHED_GPU_BATCH=1 path): engine-only Release build for sm_90, the gpu-labelled tests
# (test_cuda_batch_paged first), the random-weight Qwen3-30B-A3B model (generated in the
# background meanwhile), then `spark-agent bench -B 8` and `-B 32` with the batched pass and,
# as the baseline, with one session per request. Logs go to $OUT.
# Usage: [TYPE=q4_k_m] [SKIP_TESTS=1] [SKIP_BASELINE=1] bench/cuda_batch/h200_batch.sh
set -o pipefail
B=/tmp/b
OUT=${OUT:-/tmp/out}
TOK=$PWD/.tok
TYPE=${TYPE:-q4_k_m}
t0=$(date +%s)
stamp() { echo "[+$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSPARK_TOKENIZER_DIR=$TOK -DCMAKE_BUILD_TYPE=Release >/tmp/cfg.log 2>&1 ||
    { tail -30 /tmp/cfg.log; exit 1; }
ninja -C $B >$OUT/build.log 2>&1 || { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
stamp "built"
(/usr/bin/time -f "gen $TYPE: %e s" $B/spark-agent model gen --preset qwen3-30b-a3b \
    --type $TYPE -s 1 -o /tmp/30b.gguf --tokenizer-dir $TOK && touch /tmp/gen.done) \
    >$OUT/gen.log 2>&1 &
gen=$!
if [ -z "$SKIP_TESTS" ]; then
    SPARK_TOKENIZER_DIR=$TOK timeout 120 $B/tests/engine/test_cuda_batch_paged 2>&1 |
        tee $OUT/test_paged.log
    echo "test_cuda_batch_paged rc=$?"
    (cd $B && SPARK_TOKENIZER_DIR=$TOK timeout 280 ctest -L gpu -E test_cuda_batch_paged \
        --output-on-failure >$OUT/ctest_gpu.log 2>&1; echo "ctest -L gpu rc=$?"
        tail -15 $OUT/ctest_gpu.log)
    stamp "tests done"
fi
wait $gen
[ -e /tmp/gen.done ] || { echo "gen failed"; tail -5 $OUT/gen.log; exit 1; }
stamp "model generated"; tail -1 $OUT/gen.log
export SPARK_DEVICE=cuda
bench() { timeout 150 $B/spark-agent bench -m /tmp/30b.gguf "$@" 2>&1 | grep -v "^\[" |
    tee -a $OUT/bench.log; }
# SPARK_CUDA_BATCH_PROF=1: each decode bucket's GPU and wall ms a step (an INFO line at the end)
SPARK_SCHED_GPU_BATCH=1 SPARK_CUDA_BATCH_PROF=1 bench -B 8 -p 128 -n 128 -r 2
stamp "batched B8 done"
SPARK_SCHED_GPU_BATCH=1 SPARK_CUDA_BATCH_PROF=1 bench -B 32 -p 128 -n 128 -r 2
stamp "batched B32 done"
if [ -z "$SKIP_BASELINE" ]; then
    bench -B 8 -p 128 -n 64 -r 1; stamp "sessions B8 done"
    bench -B 32 -p 128 -n 32 -r 1; stamp "sessions B32 done"
fi
