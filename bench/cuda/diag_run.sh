#!/usr/bin/env bash
# One device call of the decode diagnosis (issue 5, session 5): where the captured step's time
# goes on its critical path. Engine-only Release build for sm_90, a cut-down Qwen3-30B-A3B
# (LAYERS blocks, TYPE) generated meanwhile, then bench_decode on it with each per-layer op left
# out (SPARK_CUDA_DIAG_SKIP: the tok/s difference is that op's cost in the graph; the tokens
# then differ, as expected) or launched twice (SPARK_CUDA_DIAG_TWICE), and the prefill A/B of
# SPARK_CUDA_PREFILL_GEMM=pipe on pp512. Then, if time is left, compute-sanitizer over the gpu
# tests that have not run under it (SAN="...": test names; SAN_S seconds each).
# Usage (device tool, carry [".tok", DIR]): cd DIR && ln -sfn ../.tok .tok &&
#        [LAYERS=12] [TYPE=q4_k_m] [VARIANTS="..."] [SAN="test_cuda_batch"] bash bench/cuda/diag_run.sh
set -o pipefail
B=/tmp/b
OUT=${OUT:-/tmp/out}
TOK=$PWD/.tok
layers=${LAYERS:-12}
type=${TYPE:-q4_k_m}
t0=$(date +%s)
stamp() { echo "[+$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "# commit $(cat COMMIT 2>/dev/null || echo '?')"
cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release -DSPARK_TOKENIZER_DIR=$TOK >/tmp/cfg.log 2>&1 ||
    { tail -30 /tmp/cfg.log; exit 1; }
ninja -C $B spark-agent >$OUT/build.log 2>&1 || { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
G=$B/spark-agent
stamp "spark-agent built"
M=/tmp/cut-$type.gguf
/usr/bin/time -f "gen: %e s" $G model gen --preset qwen3-30b-a3b --type $type --layers $layers \
    -s 1 -t 8 -o $M --tokenizer-dir $TOK >$OUT/gen.log 2>&1 &
gen=$!
cc -O2 -std=c17 -D_GNU_SOURCE -Iengine -c bench/cuda/bench_decode.c -o $B/bench_decode.o &&
    nvcc -o $B/bench_decode $B/bench_decode.o $B/engine/libengine.a -lpthread -lm || exit 1
[ -n "$SAN" ] && { ninja -C $B $SAN >>$OUT/build.log 2>&1 || echo "sanitizer tests: build failed"; }
wait $gen || { tail -5 $OUT/gen.log; exit 1; }
stamp "built, $(tail -1 $OUT/gen.log)"
export SPARK_TOKENIZER_DIR=$TOK
D=SPARK_CUDA_DIAG_SKIP
V=${VARIANTS:-"$D=1;$D=2;$D=4;$D=8;$D=16;$D=32;$D=63;SPARK_CUDA_DIAG_TWICE=2"}
timeout 200 $B/bench_decode $M -n 128 -r 3 -a 0 -e "$V" >$OUT/decode.log 2>&1
echo "bench_decode rc=$? (1 expected: the skip variants' tokens differ)"
grep -v "^spark-agent: info" $OUT/decode.log | grep -E "tok/s|variant|us" | head -30
stamp "decode done"
for g in default pipe; do
    e=
    [ $g = pipe ] && e="SPARK_CUDA_PREFILL_GEMM=pipe"
    env $e SPARK_DEVICE=cuda timeout 60 $G bench -m $M -p 512 -n 0 -r 3 >$OUT/pp-$g.log 2>&1
    echo "pp512 $g rc=$?: $(grep -E "pp512|tok/s" $OUT/pp-$g.log | grep -v info | tail -2)"
done
stamp "prefill done"
for t in $SAN; do
    timeout ${SAN_S:-60} compute-sanitizer --tool memcheck --error-exitcode 3 $B/tests/engine/$t \
        >$OUT/san-$t.log 2>&1
    echo "memcheck $t rc=$? $(grep -h "ERROR SUMMARY" $OUT/san-$t.log | tail -1)"
done
stamp "end"
