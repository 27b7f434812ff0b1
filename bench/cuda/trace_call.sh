#!/usr/bin/env bash
# A device call that only records launch timelines (no default build, no tests): the
# -DSPARK_CUDA_TRACE=ON engine build with bench_q35 / bench_decode, the full Qwen3.5-35B-A3B and
# Qwen3-30B-A3B Q4_K_M models generated meanwhile, 4 traced decode steps of each
# (SPARK_BENCH_TRACE) summarised by bench/cuda/trace_summary.py, Qwen3.5's MTP timing round
# (SPARK_BENCH_TRACE_MTP: a draft step and verify passes of 1..5 tokens, every launch in order,
# $OUT/sum-mtp.txt.gz), then EXTRA (bash) if given.
# Usage (device tool, carry [".tok", ".clean"]): cd .clean && ln -sfn ../.tok .tok &&
#        bash bench/cuda/trace_call.sh [EXTRA]
OUT=${OUT:-/tmp/out}
L=/tmp/logs
mkdir -p "$OUT" $L
TOK=$PWD/.tok
BT=/tmp/bt
t0=$(date +%s)
stamp() { echo "[+$(($(date +%s) - t0)) s] $*"; }
finish() { tar -czf $OUT/logs.tgz -C $L . 2>/dev/null; stamp "end"; }
trap finish EXIT
echo "# commit $(cat COMMIT 2>/dev/null || echo '?')"
cmake -S . -B $BT -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release -DSPARK_CUDA_TRACE=ON -DSPARK_TOKENIZER_DIR=$TOK >$L/cfg.log 2>&1 ||
    { tail -30 $L/cfg.log; exit 1; }
ninja -C $BT spark-agent >$L/build.log 2>&1 || { grep -B2 -A12 -m3 error $L/build.log; exit 1; }
stamp "built"
for m in q35full:"--preset qwen35-35b-a3b-mtp --type q4_k_m" q3full:"--preset qwen3-30b-a3b --type q4_k_m"; do
    $BT/spark-agent model gen ${m#*:} -s 1 -t 8 -o /tmp/${m%%:*}.gguf --tokenizer-dir $TOK \
        >$L/gen-${m%%:*}.log 2>&1 &
done
for b in bench_decode bench_q35; do
    cc -O2 -std=c17 -D_GNU_SOURCE -Iengine -c bench/cuda/$b.c -o $BT/$b.o &&
        nvcc -o $BT/$b $BT/$b.o $BT/engine/libengine.a -lpthread -lm || exit 1
done
wait
stamp "models: $(ls /tmp/*.gguf | tr '\n' ' ')"
export SPARK_TOKENIZER_DIR=$TOK
SPARK_BENCH_TRACE=$OUT/tr-q35.txt SPARK_BENCH_TRACE_MTP=/tmp/tr-mtp.txt timeout 150 \
    $BT/bench_q35 /tmp/q35full.gguf -n 32 -r 1 >$L/tq35.log 2>&1
stamp "traced q35 rc=$?"; grep -E "^trace|tg32" $L/tq35.log
python3 bench/cuda/trace_summary.py $OUT/tr-q35.txt --steps >$OUT/sum-q35.txt
sed -n 5,22p $OUT/sum-q35.txt
# the MTP timing round (draft, verify m = 1..5): every launch in order (the raw file is large)
[ -f /tmp/tr-mtp.txt ] && python3 bench/cuda/trace_summary.py /tmp/tr-mtp.txt --all |
    gzip >$OUT/sum-mtp.txt.gz && rm -f /tmp/tr-mtp.txt
SPARK_BENCH_TRACE=$OUT/tr-q3.txt timeout 120 $BT/bench_decode /tmp/q3full.gguf -n 32 -r 1 -a 0 >$L/tq3.log 2>&1
stamp "traced q3 rc=$?"; grep -E "^trace|tg32" $L/tq3.log
python3 bench/cuda/trace_summary.py $OUT/tr-q3.txt --steps >$OUT/sum-q3.txt
sed -n 5,16p $OUT/sum-q3.txt
gzip $OUT/tr-q35.txt $OUT/tr-q3.txt
[ -n "$1" ] && . "$1"
