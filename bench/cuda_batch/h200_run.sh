#!/usr/bin/env bash
# One call on the GPU machine (device tool) for the prefill path: engine-only build with CUDA
# for sm_90, test_cuda_batch, the random-weight Qwen3-30B-A3B model (generated in the
# background meanwhile), then `spark-agent bench` on the GPU: pp512 + tg128, pp4096 (chunks of
# 2048 (the default since session 4) and, as an A/B, of CHUNK_B), and tg128 after DEPTH tokens.
# Logs go to $OUT.
# Usage: [TYPE=q4_k_m] [DEPTH=8192] [CHUNK_B=512] [SKIP_TEST=1] [NEXT=1]
#        [LAYERS=N (a cut model of N blocks: per-layer timing; default the full 48)]
#        [TYPE2=q8_0 (a second model of that type, for the q2_* items)]
#        [BENCH="pp512 pp4096 ab depth next512 next4096 p512 p4096 legacy512 legacy4096
#                tile64_512 tile64_4096 nofuse512 pfl1_512 pipe512 pipe4096 c512_4096
#                c2048_4096 q2_512 q2_4096"]
#        [PROF=0|1 (default 1: the prefill's per-phase times, SPARK_CUDA_PREFILL_PROF)]
#   bench/cuda_batch/h200_run.sh
# The p*/legacy*/tile64*/nofuse*/pfl1*/c*/q2_* items are prefill only (-n 0); legacy: the
# first GEMM kernels in chunks of 512 (SPARK_CUDA_PREFILL_GEMM=legacy, the code before
# session 4), tile64: 64-row tiles in the grouped expert GEMMs, nofuse: q, k, v in three
# launches and gate, up in two, pfl1: L1 prefetch of the next weight blocks, pipe: the staged
# cp.async kernels for Q4_K / Q5_K (not yet run on a GPU), cN: chunks of N tokens (default
# 2048 since session 4).
set -o pipefail
B=/tmp/b
OUT=${OUT:-/tmp/out}
TOK=$PWD/.tok
TYPE=${TYPE:-q4_k_m}
CUT=${LAYERS:+--layers $LAYERS}
t0=$(date +%s)
stamp() { echo "[+$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSPARK_TOKENIZER_DIR=$TOK -DCMAKE_BUILD_TYPE=Release >/tmp/cfg.log 2>&1 ||
    { tail -30 /tmp/cfg.log; exit 1; }
ninja -C $B spark-agent test_cuda_batch >$OUT/build.log 2>&1 ||
    { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
stamp "built"
(/usr/bin/time -f "gen $TYPE ${CUT:-full}: %e s" $B/spark-agent model gen --preset qwen3-30b-a3b \
    --type $TYPE $CUT -s 1 -o /tmp/30b.gguf --tokenizer-dir $TOK && touch /tmp/gen.done &&
    if [ -n "$TYPE2" ]; then
        /usr/bin/time -f "gen $TYPE2 ${CUT:-full}: %e s" $B/spark-agent model gen \
            --preset qwen3-30b-a3b --type $TYPE2 $CUT -s 1 -o /tmp/30b_2.gguf --tokenizer-dir $TOK
    fi) >$OUT/gen.log 2>&1 &
gen=$!
if [ -z "$SKIP_TEST" ]; then
    SPARK_TOKENIZER_DIR=$TOK timeout 240 \
        $B/tests/engine/test_cuda_batch 2>&1 | tee $OUT/test.log
    rc=$?
    echo "test_cuda_batch rc=$rc"
    if [ $rc != 0 ]; then # the per-op decode step as a control (SPARK_CUDA_FUSED=0)
        SPARK_CUDA_FUSED=0 SPARK_TOKENIZER_DIR=$TOK timeout 60 $B/tests/engine/test_cuda_batch \
            tiny f32 2>&1 | grep -v "^gemm" | tee $OUT/test_unfused.log
        echo "test_cuda_batch tiny f32 (SPARK_CUDA_FUSED=0) rc=$?"
    fi
    if [ -n "$NEXT" ]; then # the kernels behind SPARK_CUDA_PREFILL_NEXT=1
        SPARK_CUDA_PREFILL_NEXT=1 SPARK_TOKENIZER_DIR=$TOK timeout 240 \
            $B/tests/engine/test_cuda_batch 2>&1 | grep -v "^gemm" | tee $OUT/test_next.log
        echo "test_cuda_batch (SPARK_CUDA_PREFILL_NEXT=1) rc=$?"
    fi
    stamp "test done"
fi
wait $gen
[ -e /tmp/gen.done ] || { echo "gen failed"; tail -5 $OUT/gen.log; exit 1; }
stamp "model generated"; tail -2 $OUT/gen.log
export SPARK_DEVICE=cuda SPARK_CUDA_PREFILL_PROF=${PROF:-1}
M=/tmp/30b.gguf
bench() { echo "== $b: $*" | tee -a $OUT/bench.log; timeout 150 $B/spark-agent bench -m $M "$@" 2>&1 |
    grep -v "^\[" | tee -a $OUT/bench.log; }
G=SPARK_CUDA_PREFILL_GEMM
for b in ${BENCH:-pp512 pp4096 ab depth}; do
    case $b in
    pp512) bench -p 512 -n 128 -r 3 ;;
    pp4096) bench -p 4096 -n 0 -r 2 ;;
    ab) SPARK_CUDA_PREFILL_CHUNK=${CHUNK_B:-512} bench -p 4096 -n 0 -r 2 ;;
    depth) bench -d ${DEPTH:-8192} -p 0 -n 128 -r 2 ;;
    next512) SPARK_CUDA_PREFILL_NEXT=1 bench -p 512 -n 0 -r 3 ;;
    next4096) SPARK_CUDA_PREFILL_NEXT=1 bench -p 4096 -n 0 -r 2 ;;
    p512) bench -p 512 -n 0 -r 3 ;;
    p4096) bench -p 4096 -n 0 -r 2 ;;
    legacy512) export $G=legacy && bench -p 512 -n 0 -r 3; unset $G ;;
    legacy4096) export $G=legacy && SPARK_CUDA_PREFILL_CHUNK=512 bench -p 4096 -n 0 -r 2
        unset $G ;;
    tile64_512) export $G=tile64 && bench -p 512 -n 0 -r 3; unset $G ;;
    tile64_4096) export $G=tile64 && bench -p 4096 -n 0 -r 2; unset $G ;;
    nofuse512) export $G=nofuse && bench -p 512 -n 0 -r 3; unset $G ;;
    pfl1_512) export $G=pfl1 && bench -p 512 -n 0 -r 3; unset $G ;;
    pipe512) export $G=pipe && bench -p 512 -n 0 -r 3; unset $G ;;
    pipe4096) export $G=pipe && bench -p 4096 -n 0 -r 2; unset $G ;;
    c512_4096) SPARK_CUDA_PREFILL_CHUNK=512 bench -p 4096 -n 0 -r 2 ;;
    c2048_4096) SPARK_CUDA_PREFILL_CHUNK=2048 bench -p 4096 -n 0 -r 2 ;;
    q2_512) M=/tmp/30b_2.gguf bench -p 512 -n 0 -r 3 ;;
    q2_4096) M=/tmp/30b_2.gguf bench -p 4096 -n 0 -r 2 ;;
    esac
    stamp "$b done"
done
