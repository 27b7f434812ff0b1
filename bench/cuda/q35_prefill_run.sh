#!/usr/bin/env bash
# One call on the GPU machine (device tool) for the qwen35moe prefill pass: an engine-only build
# for sm_90 (or the binaries in $BIN), the prefill and qwen35 gpu tests, then on a random
# Qwen3.5-35B-A3B-shaped model (generated in the background meanwhile): prefill tok/s at 512,
# 4096 and 32768 tokens (spark-agent bench -p N -n 0, SPARK_DEVICE=cuda), pp512 through the
# decode step for comparison (SPARK_CUDA_Q35_PREFILL=0), a per-phase profile of pp4096
# (SPARK_CUDA_PREFILL_PROF=1), pp4096 in 2048-token chunks, pp32768 with the SIMT attention
# (SPARK_CUDA_Q35_ATT_TC=0), and decode tok/s at depth 0 and 4096.
# Logs go to $OUT.
# Usage: [BIN=DIR] [TYPE=q4_k_m] [LAYERS=N] [TESTS=0] [AB=0] [PP="512 4096 32768"] \
#        bash bench/cuda/q35_prefill_run.sh
#   TESTS=0: skip the two gpu tests; AB=0: skip the profile and the A/B runs (2048-token chunks,
#     SIMT attention at 32K, the decode step's pp512); full model: ~60 s to generate, ~30 s per
#     pp32768 run pair.
#   LAYERS=N: a cut-down model of N blocks (a multiple of 4): per-layer costs scale, so the full
#     model's time is about 40/N x (t - head) + head.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TOK=$PWD/.tok # tokenizer.json + tokenizer_config.json, carried
TYPE=${TYPE:-q4_k_m}
BIN=${BIN:-/nonexistent}
PP=${PP:-512 4096 32768}
CUT=${LAYERS:+--layers $LAYERS}
t0=$(date +%s)
stamp() { echo "[+$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') (+ working tree)"
if ! "$BIN/spark-agent" --version >/dev/null 2>&1; then
    B=/tmp/b
    cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release -DSPARK_TOKENIZER_DIR=$TOK >/tmp/cfg.log 2>&1 ||
        { tail -30 /tmp/cfg.log; exit 1; }
    ninja -C $B spark-agent test_cuda_q35_prefill test_cuda_qwen35 >$OUT/build.log 2>&1 ||
        { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
    BIN=$B
    cp $B/tests/engine/test_cuda_q35_prefill $B/tests/engine/test_cuda_qwen35 $B/ 2>/dev/null
fi
stamp "binaries ready"
(/usr/bin/time -f "gen $TYPE: %e s" "$BIN/spark-agent" model gen --preset qwen35-35b-a3b $CUT \
    --type $TYPE -s 1 -o /tmp/q35-$TYPE.gguf --tokenizer-dir $TOK) >$OUT/gen.log 2>&1 &
gen=$!
if [ "${TESTS:-1}" != 0 ]; then
    for t in test_cuda_q35_prefill test_cuda_qwen35; do
        SPARK_TOKENIZER_DIR=$TOK timeout 120 "$BIN/$t" >$OUT/$t.log 2>&1
        echo "$t rc=$?"
        grep -E "CHECK failed|prefill|state|decode steps|qwen35-tiny" $OUT/$t.log | head -40
    done
    stamp "tests done"
fi
wait $gen || { echo "gen failed"; tail -5 $OUT/gen.log; exit 1; }
stamp "model generated: $(grep -v '^\[' $OUT/gen.log | tail -1)"
M=/tmp/q35-$TYPE.gguf
export SPARK_DEVICE=cuda
for n in $PP; do
    r=3
    [ "$n" -gt 8192 ] && r=1
    timeout 120 "$BIN/spark-agent" bench -m $M -p $n -n 0 -r $r 2>&1 | grep -E "^\| |GPU" |
        tee -a $OUT/bench.log
    stamp "pp$n done"
done
if [ "${AB:-1}" != 0 ]; then
    SPARK_CUDA_PREFILL_PROF=1 timeout 60 "$BIN/spark-agent" bench -m $M -p 4096 -n 0 -r 1 2>&1 |
        grep -E "prefill profile" | tee -a $OUT/bench.log
    SPARK_CUDA_PREFILL_CHUNK=2048 timeout 60 "$BIN/spark-agent" bench -m $M -p 4096 -n 0 -r 1 \
        2>&1 | grep -E "pp4096" | sed 's/$/  (SPARK_CUDA_PREFILL_CHUNK=2048)/' |
        tee -a $OUT/bench.log
    SPARK_CUDA_Q35_ATT_TC=0 timeout 90 "$BIN/spark-agent" bench -m $M -p 32768 -n 0 -r 1 2>&1 |
        grep -E "pp32768" | sed 's/$/  (SPARK_CUDA_Q35_ATT_TC=0: SIMT attention)/' |
        tee -a $OUT/bench.log
    SPARK_CUDA_Q35_PREFILL=0 timeout 60 "$BIN/spark-agent" bench -m $M -p 512 -n 0 -r 1 2>&1 |
        grep -E "pp512" | sed 's/$/  (SPARK_CUDA_Q35_PREFILL=0: decode steps)/' |
        tee -a $OUT/bench.log
fi
timeout 120 "$BIN/spark-agent" bench -m $M -p 0 -n 128 -r 3 2>&1 | grep -E "tg128" |
    tee -a $OUT/bench.log
timeout 120 "$BIN/spark-agent" bench -m $M -p 0 -n 128 -r 3 -d 4096 2>&1 | grep -E "tg128" |
    tee -a $OUT/bench.log
stamp "bench done"
