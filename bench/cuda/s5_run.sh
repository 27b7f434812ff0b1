#!/usr/bin/env bash
# One device call of the decode latency work (bench/RESULTS.md, stage 5): engine-only build for
# sm_90 with -Werror, the gpu tests (test_cuda_ops, test_cuda_forward, test_cuda_qwen35, side by
# side), cut-down Qwen3-30B-A3B models of LAYERS blocks generated meanwhile, and bench_decode on
# each model with the run-time variants of VARIANTS timed in the same process (bench_decode -e:
# ';'-separated environment settings; each variant's greedy tokens must equal the default's).
# Logs go to $OUT.
# Usage: [LAYERS=12] [VARIANTS="SPARK_CUDA_V5=0;..."] [SANITIZE=1] bench/cuda/s5_run.sh TYPE...
#   SANITIZE: also compute-sanitizer racecheck over test_cuda_ops (quick) and memcheck over
#   test_cuda_forward on one small model (4 tokens), side by side with the tests, their summary
#   lines printed (SANITIZE_S: seconds at most each).
#   LAYERS=0: the full 48-block model.
set -o pipefail
B=/tmp/b
OUT=${OUT:-/tmp/out}
TOK=$PWD/.tok # tokenizer.json + tokenizer_config.json, carried
types=${*:-q4_k_m}
layers=${LAYERS:-12}
t0=$(date +%s)
stamp() { echo "[+$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release -DSPARK_WERROR=ON -DSPARK_TOKENIZER_DIR=$TOK >/tmp/cfg.log 2>&1 ||
    { tail -30 /tmp/cfg.log; exit 1; }
ninja -C $B spark-agent >$OUT/build.log 2>&1 || { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
lflag=
[ "$layers" != 0 ] && lflag="--layers $layers"
(for t in $types; do
    /usr/bin/time -f "gen $t: %e s" $B/spark-agent model gen --preset qwen3-30b-a3b --type $t \
        $lflag -s 1 -o /tmp/cut-$t.gguf --tokenizer-dir $TOK || exit 1
    touch /tmp/gen-$t.done
done) >$OUT/gen.log 2>&1 &
gen=$!
stamp "spark-agent built"
ninja -C $B test_cuda_ops test_cuda_forward test_cuda_qwen35 >>$OUT/build.log 2>&1 ||
    { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
export SPARK_TOKENIZER_DIR=$TOK
stamp "tests built"
pids=
run() { # NAME TIMEOUT CMD...: in the background, its log in /tmp, rc and summary line printed
    local name=$1 t=$2
    shift 2
    (timeout $t "$@" >/tmp/$name.log 2>&1
        echo "$name rc=$? $(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" /tmp/$name.log | tail -1)") &
    pids="$pids $!"
}
run ops 200 $B/tests/engine/test_cuda_ops
run fwd 200 $B/tests/engine/test_cuda_forward
run q35 200 $B/tests/engine/test_cuda_qwen35
if [ -n "$SANITIZE" ]; then # side by side with the tests (correctness only: no timing yet)
    run racecheck-ops ${SANITIZE_S:-150} compute-sanitizer --tool racecheck --error-exitcode 3 \
        $B/tests/engine/test_cuda_ops quick
    run memcheck-fwd ${SANITIZE_S:-150} compute-sanitizer --tool memcheck --error-exitcode 3 \
        $B/tests/engine/test_cuda_forward tiny q4_k_m 4
fi
wait $pids
cp /tmp/ops.log /tmp/fwd.log /tmp/q35.log $OUT/
[ -n "$SANITIZE" ] && tail -n 4 /tmp/racecheck-ops.log /tmp/memcheck-fwd.log >$OUT/sanitize.log
grep -h "FAIL\|worst\|greedy" /tmp/ops.log /tmp/fwd.log /tmp/q35.log | grep -v "^spark" | tail -60
stamp "tests done"
for t in $types; do
    while [ ! -e /tmp/gen-$t.done ] && kill -0 $gen 2>/dev/null; do sleep 1; done
    [ -e /tmp/gen-$t.done ] || { echo "gen $t failed"; tail -5 $OUT/gen.log; break; }
    stamp "model $t generated ($layers blocks; 0: full)"
    args="-n 128 -r ${REPS:-5} -a 0"
    timeout 240 bash bench/cuda/run.sh $B /tmp/cut-$t.gguf $args ${VARIANTS:+-e "$VARIANTS"} 2>&1 |
        grep -v "info" | tee -a $OUT/bench.log
    stamp "bench $t done"
    rm -f /tmp/cut-$t.gguf
done
