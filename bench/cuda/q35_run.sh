#!/usr/bin/env bash
# One call on the GPU machine (device tool) for qwen35moe: the binaries (carried in $BIN when
# they run there, else an engine-only build for sm_90 here), the qwen35 gpu test, the random
# Qwen3.5-35B-A3B-shaped model (generated in the background meanwhile) and its batch-1 decode
# benchmark (tg128). Logs go to $OUT.
# Usage: [BIN=DIR] [TYPE=q4_k_m] [DEPTH=N] [MTP=1 [ALT="V ..."]] [LAYERS=N] bash bench/cuda/q35_run.sh
#   DEPTH: also tg128 after N tokens (one repetition after the warm-up).
#   MTP=1: the model with its MTP block (preset qwen35-35b-a3b-mtp), test_cuda_mtp too, and the
#     bench's MTP figures (draft / verify step costs, the computed tok/s table, the device loop).
#   LAYERS=N: a cut-down model of N blocks (a multiple of 4) for quick per-layer timing.
#   ALT="V ..." (with MTP=1): test_cuda_mtp once more with SPARK_CUDA_MTP_FUSED=<first V>, and
#     the bench's MTP figures again for each V in the same process (bench_q35 -a V ...), e.g.
#     `MTP=1 ALT="1 delta moe attn pf" bash bench/cuda/q35_run.sh`: the verify pass per token
#     (unset) against its fused launches (all, then each part alone).
#   BIN holds spark-agent, test_cuda_qwen35 (test_cuda_mtp) and bench_q35 built elsewhere.
set -o pipefail
OUT=${OUT:-/tmp/out}
TOK=$PWD/.tok # tokenizer.json + tokenizer_config.json, carried
TYPE=${TYPE:-q4_k_m}
BIN=${BIN:-/nonexistent}
PRESET=qwen35-35b-a3b
TESTS=test_cuda_qwen35
if [ -n "$MTP" ]; then
    PRESET=qwen35-35b-a3b-mtp
    TESTS="test_cuda_qwen35 test_cuda_mtp"
fi
CUT=${LAYERS:+--layers $LAYERS}
t0=$(date +%s)
stamp() { echo "[+$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv,noheader
echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') (+ working tree)"
if ! "$BIN/spark-agent" --version >/dev/null 2>&1; then
    stamp "no runnable carried binaries ($("$BIN/spark-agent" --version 2>&1 | head -1)): building"
    B=/tmp/b
    cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release -DSPARK_TOKENIZER_DIR=$TOK >/tmp/cfg.log 2>&1 ||
        { tail -30 /tmp/cfg.log; exit 1; }
    ninja -C $B spark-agent $TESTS >$OUT/build.log 2>&1 ||
        { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
    cc -O2 -std=c17 -D_GNU_SOURCE -Iengine -c bench/cuda/bench_q35.c -o $B/bench_q35.o &&
        nvcc -o $B/bench_q35 $B/bench_q35.o $B/engine/libengine.a -lpthread -lm || exit 1
    BIN=/tmp/bin
    mkdir -p $BIN && cp $B/spark-agent $B/bench_q35 $BIN/
    for t in $TESTS; do cp $B/tests/engine/$t $BIN/; done
fi
stamp "binaries ready: $("$BIN/spark-agent" --version | head -1)"
(/usr/bin/time -f "gen $TYPE: %e s" "$BIN/spark-agent" model gen --preset $PRESET $CUT \
    --type $TYPE -s 1 -o /tmp/q35-$TYPE.gguf --tokenizer-dir $TOK) >$OUT/gen.log 2>&1 &
gen=$!
for t in $TESTS; do
    SPARK_TOKENIZER_DIR=$TOK "$BIN/$t" 2>&1 | tee $OUT/$t.log
    echo "$t rc=$?"
done
ALT_ARGS=
if [ -n "$MTP" ] && [ -n "$ALT" ]; then
    for v in $ALT; do ALT_ARGS="$ALT_ARGS -a $v"; done
    v=${ALT%% *}
    SPARK_CUDA_MTP_FUSED=$v SPARK_TOKENIZER_DIR=$TOK "$BIN/test_cuda_mtp" 2>&1 |
        tee $OUT/test_cuda_mtp-alt.log
    echo "test_cuda_mtp (SPARK_CUDA_MTP_FUSED=$v) rc=$?"
fi
stamp "tests done"
wait $gen || { echo "gen failed"; tail -5 $OUT/gen.log; exit 1; }
stamp "model generated: $(grep -v '^\[' $OUT/gen.log | tail -1)"
"$BIN/bench_q35" /tmp/q35-$TYPE.gguf -n 128 -r 5 $ALT_ARGS 2>&1 | tee $OUT/bench.log
stamp "bench done"
if [ -n "$DEPTH" ]; then
    "$BIN/bench_q35" /tmp/q35-$TYPE.gguf -n 128 -r 1 -d $DEPTH 2>&1 | tee -a $OUT/bench.log
    stamp "bench at depth $DEPTH done"
fi
