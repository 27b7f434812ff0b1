#!/usr/bin/env bash
# One call on the GPU machine (device tool): engine-only build with CUDA for sm_90, the gpu
# tests, the random-weight Qwen3-30B-A3B models (generated in the background meanwhile), and
# the decode benchmark of each model as soon as it is generated. Logs go to $OUT.
# Usage: [DEPTH=N] [NCU=N_KERNELS] [SANITIZE=1] [ALT="VAR=VALUE"] [FUSED=1]
#        bench/cuda/h200_run.sh [TYPE...]
#   (TYPE default q4_k_m); ALT: the first type benched again with that environment (A/B).
#   DEPTH: also decode 128 tokens after N (first type; no per-op comparison there, but a short
#   run at depth 700 compares the fused step with the per-op launches over several splits);
#   NCU: per-kernel durations (ncu) of the first N_KERNELS kernels (first type); SANITIZE:
#   compute-sanitizer memcheck and racecheck over both gpu tests, side by side with the tests
#   (SANITIZE_S seconds at most each). Each bench also runs the per-op launches
#   (SPARK_CUDA_FUSED=0) and checks the same tokens; bench_sync first times a dependent step
#   alone (per-op launches against the fused kernel's counter waits). FUSED=1: test_cuda_forward
#   again with SPARK_TEST_CUDA_FUSED=1 (the fused step bit for bit against the per-op launches)
#   and the DEPTH bench of the fused step too.
set -o pipefail
B=/tmp/b
OUT=${OUT:-/tmp/out}
TOK=$PWD/.tok # tokenizer.json + tokenizer_config.json, carried (no node_modules there)
types=${*:-q4_k_m}
t0=$(date +%s)
stamp() { echo "[+$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release >/tmp/cfg.log 2>&1 || { tail -30 /tmp/cfg.log; exit 1; }
ninja -C $B spark-agent >$OUT/build.log 2>&1 || { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
(for t in $types; do
    rm -f /tmp/gen-$t.done
    /usr/bin/time -f "gen $t: %e s" $B/spark-agent model gen --preset qwen3-30b-a3b --type $t \
        -s 1 -o /tmp/30b-$t.gguf --tokenizer-dir $TOK || exit 1
    touch /tmp/gen-$t.done
done) >$OUT/gen.log 2>&1 &
gen=$!
stamp "spark-agent built"
ninja -C $B test_cuda_ops test_cuda_forward >>$OUT/build.log 2>&1 || { grep -A12 -m3 error $OUT/build.log; }
export SPARK_TOKENIZER_DIR=$TOK
pids=
if [ -n "$SANITIZE" ]; then # side by side with the tests (correctness only: no timing yet)
    for tool in memcheck racecheck; do # the four runs side by side
        for t in test_cuda_ops test_cuda_forward; do
            args= # the forward test over all six models takes minutes: the MoE Q4_K_M one
            [ $t = test_cuda_forward ] && args="tiny q4_k_m 12"
            [ $tool = racecheck ] && [ $t = test_cuda_forward ] && args="tiny q4_k_m 4"
            (timeout ${SANITIZE_S:-150} compute-sanitizer --tool $tool --error-exitcode 3 \
                $B/tests/engine/$t $args >/tmp/$tool-$t.log 2>&1
            echo "$tool $t $args rc=$? ($(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" \
                /tmp/$tool-$t.log | tail -1))") &
            pids="$pids $!"
        done
    done
fi
timeout 150 $B/tests/engine/test_cuda_ops 2>&1 | tee $OUT/ops.log
echo "test_cuda_ops rc=$?"
timeout 200 $B/tests/engine/test_cuda_forward 2>&1 | tee $OUT/fwd.log
echo "test_cuda_forward rc=$?"
if [ -n "$FUSED" ]; then
    SPARK_TEST_CUDA_FUSED=1 timeout 200 $B/tests/engine/test_cuda_forward 2>&1 |
        tee $OUT/fwd_fused.log | grep -v "^spark-agent: info" | tail -12
    echo "test_cuda_forward (fused step checked) rc=$?"
fi
stamp "tests done"
if [ -n "$SANITIZE" ]; then
    wait $pids
    for f in /tmp/memcheck-*.log /tmp/racecheck-*.log; do
        echo "== $f"; grep -v "^attention\|^matvec\|^moe\|^sample\|^embed\|^rmsnorm" $f | tail -40
    done >$OUT/sanitize.log
    stamp "sanitizers done"
fi
# the cost of a dependent step alone: per-op launches against the fused kernel's counter waits
nvcc -O3 -std=c++17 -arch=sm_90 -Iengine -Iengine/cuda bench/cuda/bench_sync.cu -o $B/bench_sync &&
    timeout 60 $B/bench_sync 288 396 2>&1 | tee -a $OUT/bench.log
first=1
for t in $types; do # each model is benched as soon as it is generated
    while [ ! -e /tmp/gen-$t.done ] && kill -0 $gen 2>/dev/null; do sleep 1; done
    [ -e /tmp/gen-$t.done ] || { echo "gen $t failed"; tail -5 $OUT/gen.log; break; }
    stamp "model $t generated"; grep -v "^\[" $OUT/gen.log | grep "$t" | tail -2
    timeout 240 bash bench/cuda/run.sh $B /tmp/30b-$t.gguf -n 128 -r 5 2>&1 | tee -a $OUT/bench.log
    if [ $first = 1 ] && [ -n "$ALT" ]; then # the same code with a run-time switch (A/B)
        echo "# with $ALT"
        env $ALT $B/bench_decode /tmp/30b-$t.gguf -n 128 -r 5 2>&1 | tee -a $OUT/bench.log
    fi
    if [ $first = 1 ] && [ -n "$DEPTH" ]; then
        timeout 60 $B/bench_decode /tmp/30b-$t.gguf -n 16 -r 1 -d 700 2>&1 | grep -v "^  \|info" |
            tee -a $OUT/bench.log
        timeout 240 $B/bench_decode /tmp/30b-$t.gguf -n 128 -r 3 -d $DEPTH -a 0 2>&1 |
            tee -a $OUT/bench.log
        [ -n "$FUSED" ] && SPARK_CUDA_FUSED=1 timeout 240 $B/bench_decode /tmp/30b-$t.gguf \
            -n 128 -r 3 -d $DEPTH -a 0 2>&1 | grep -v "info" | tee -a $OUT/bench.log
    fi
    if [ $first = 1 ] && [ -n "$NCU" ]; then # per-kernel durations of the first $NCU kernels
        ncu --clock-control none --csv --metrics gpu__time_duration.sum -c $NCU \
            $B/bench_decode /tmp/30b-$t.gguf -n 1 -r 1 -a 0 >$OUT/ncu.csv 2>$OUT/ncu.err
        python3 bench/cuda/ncu_summary.py $OUT/ncu.csv
    fi
    stamp "bench $t done"
    rm -f /tmp/30b-$t.gguf
    first=0
done
