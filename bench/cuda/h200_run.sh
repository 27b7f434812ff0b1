#!/usr/bin/env bash
# One call on the GPU machine (device tool): engine-only build with CUDA for sm_90, the gpu
# tests, the random-weight Qwen3-30B-A3B model (generated in the background meanwhile), and
# the decode benchmark. Logs go to $OUT. Usage: bench/cuda/h200_run.sh [TYPE...] (q4_k_m)
set -o pipefail
B=/tmp/b
OUT=${OUT:-/tmp/out}
TOK=$PWD/.tok # tokenizer.json + tokenizer_config.json, carried (no node_modules there)
types=${*:-q4_k_m}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release >$OUT/cfg.log 2>&1 || { tail -30 $OUT/cfg.log; exit 1; }
ninja -C $B spark-agent >$OUT/build.log 2>&1 || { grep -B2 -A12 -m3 error $OUT/build.log; exit 1; }
(for t in $types; do
    /usr/bin/time -f "gen $t: %e s" $B/spark-agent model gen --preset qwen3-30b-a3b --type $t \
        -s 1 -o /tmp/30b-$t.gguf --tokenizer-dir $TOK || exit 1
done) >$OUT/gen.log 2>&1 &
gen=$!
ninja -C $B test_cuda_ops test_cuda_forward >>$OUT/build.log 2>&1 || { grep -A12 -m3 error $OUT/build.log; }
export SPARK_TOKENIZER_DIR=$TOK
$B/tests/engine/test_cuda_ops 2>&1 | tee $OUT/ops.log
echo "test_cuda_ops rc=$?"
$B/tests/engine/test_cuda_forward 2>&1 | tee $OUT/fwd.log
echo "test_cuda_forward rc=$?"
wait $gen
cat $OUT/gen.log | grep -v "^\[" | tail -5
for t in $types; do
    bash bench/cuda/run.sh $B /tmp/30b-$t.gguf -n 128 -r 5 2>&1 | tee -a $OUT/bench.log
    [ -n "$DEPTH" ] && $B/bench_decode /tmp/30b-$t.gguf -n 128 -r 3 -d $DEPTH 2>&1 | tee -a $OUT/bench.log
done
if [ -n "$NCU" ]; then
    t=${types%% *}
    ncu --clock-control none -k regex:"mv_kernel|ffn_up_kernel|ffn_down_kernel|att_kernel" -c 6 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        $B/bench_decode /tmp/30b-$t.gguf -n 2 -r 1 >$OUT/ncu.txt 2>&1
    grep -E "^  [a-z_]+kernel|Duration|Memory Throughput|Achieved Occupancy|Registers Per|Stall|stalled" \
        $OUT/ncu.txt | head -60
fi
if [ -n "$SANITIZE" ]; then
    timeout 150 compute-sanitizer --tool memcheck $B/tests/engine/test_cuda_ops >$OUT/memcheck.log 2>&1
    echo "memcheck test_cuda_ops rc=$?"; tail -4 $OUT/memcheck.log
fi
