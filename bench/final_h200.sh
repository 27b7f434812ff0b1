#!/usr/bin/env bash
# The session's closing call on the GPU machine (device tool), from a clean export of a commit:
# an engine-only Release build for sm_90, every gpu-labelled test, then the full-size figures of
# issues 5 and 11 on random-weight models generated there meanwhile (Qwen3-30B-A3B Q4_K_M and
# Qwen3.5-35B-A3B Q4_K_M with its MTP block). One summary on stdout, every log in $OUT/logs.tgz.
# Usage (device tool, carry [".tok", ".clean"]): cd .clean && ln -sfn ../.tok .tok &&
#        [SKIP="tests q3 q35 q35pp batch depth"] [LIMIT_S=N] bash bench/final_h200.sh
#   SKIP: parts left out; LIMIT_S: a part that would start after this many seconds is skipped
#   (said in the summary), so the call ends inside the device tool's limit.
set -o pipefail
OUT=${OUT:-/tmp/out}
L=/tmp/logs
mkdir -p "$OUT" $L
TOK=$PWD/.tok
B=/tmp/bf
LIMIT_S=${LIMIT_S:-520}
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
stamp() { echo "[+$(el) s] $*"; }
want() { # part name: not skipped and time left
    case " $SKIP " in *" $1 "*) echo "SKIPPED $1 (SKIP)"; return 1 ;; esac
    [ "$(el)" -lt "$LIMIT_S" ] || { echo "SKIPPED $1 (time: $(el) s of $LIMIT_S)"; return 1; }
}
finish() { tar -czf $OUT/logs.tgz -C $L . 2>/dev/null; stamp "end"; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "# commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo '?')"
cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release -DSPARK_TOKENIZER_DIR=$TOK >$L/cfg.log 2>&1 ||
    { tail -30 $L/cfg.log; exit 1; }
ninja -C $B spark-agent >$L/build.log 2>&1 || { grep -B2 -A12 -m3 error $L/build.log; exit 1; }
stamp "spark-agent built"
G=$B/spark-agent
(/usr/bin/time -f "gen 30b: %e s" $G model gen --preset qwen3-30b-a3b --type q4_k_m -s 1 -t 8 \
    -o /tmp/30b.gguf --tokenizer-dir $TOK && touch /tmp/30b.done) >$L/gen30.log 2>&1 &
(/usr/bin/time -f "gen q35: %e s" $G model gen --preset qwen35-35b-a3b-mtp --type q4_k_m -s 1 \
    -t 8 -o /tmp/q35.gguf --tokenizer-dir $TOK && touch /tmp/q35.done) >$L/genq35.log 2>&1 &
GPU_TESTS="test_cuda_ops test_cuda_forward test_cuda_batch test_cuda_batch_paged test_cuda_qwen35
    test_cuda_q35_prefill test_cuda_mtp"
ninja -C $B $GPU_TESTS >>$L/build.log 2>&1 || { grep -B2 -A12 -m3 error $L/build.log; exit 1; }
for b in bench_decode bench_q35; do
    cc -O2 -std=c17 -D_GNU_SOURCE -Iengine -c bench/cuda/$b.c -o $B/$b.o &&
        nvcc -o $B/$b $B/$b.o $B/engine/libengine.a -lpthread -lm || exit 1
done
stamp "all built"
export SPARK_TOKENIZER_DIR=$TOK
if want tests; then
    (cd $B && timeout 170 ctest -L gpu -j 4 --timeout 150 --output-on-failure >$L/ctest.log 2>&1)
    echo "ctest -L gpu rc=$?"
    grep -E "tests passed|Test +#|Failed|\*\*\*" $L/ctest.log | head -20
    stamp "gpu tests done"
fi
waitfile() { # done-file, gen log: until generated, failed, or out of time
    while [ ! -f $1 ] && [ "$(el)" -lt "$LIMIT_S" ] && ! grep -qi "error\|non-zero status" $2; do
        sleep 2
    done
    [ -f $1 ] || { echo "no model: $(tail -2 $2)"; return 1; }
}
run() { # label, timeout, command...: the command's table/summary lines
    local label=$1 t=$2
    shift 2
    echo "## $label"
    timeout $t "$@" >$L/$label.log 2>&1
    local rc=$?
    grep -E "^\| |tok/s|us per|verify|draft|MTP|computed|aggregate|GB/s" $L/$label.log |
        grep -v "^spark-agent: info" | head -40
    [ $rc = 0 ] || echo "($label rc=$rc)"
}
# most important first: the part that runs out of time is the last one
if want q3 && waitfile /tmp/30b.done $L/gen30.log; then
    stamp "$(grep gen $L/gen30.log | tail -1)"
    run q3_tg128 120 $B/bench_decode /tmp/30b.gguf -n 128 -r 2 -a 0 ${DEC_ALT:+-e "$DEC_ALT"}
    SPARK_DEVICE=cuda run q3_pp512 60 $G bench -m /tmp/30b.gguf -p 512 -n 0 -r 3
    stamp "q3 done"
fi
if want q35 && waitfile /tmp/q35.done $L/genq35.log; then
    stamp "$(grep gen $L/genq35.log | tail -1)"
    run q35_tg128_mtp 150 $B/bench_q35 /tmp/q35.gguf -n 128 -r 2 ${MTP_ALT:+-a $MTP_ALT}
    stamp "q35 decode done"
fi
if want q35pp && [ -f /tmp/q35.done ]; then
    SPARK_DEVICE=cuda run q35_pp4096 60 $G bench -m /tmp/q35.gguf -p 4096 -n 0 -r 2
    SPARK_DEVICE=cuda run q35_pp32768 90 $G bench -m /tmp/q35.gguf -p 32768 -n 0 -r 1
    stamp "q35 prefill done"
fi
if want batch && [ -f /tmp/30b.done ]; then
    SPARK_DEVICE=cuda SPARK_SCHED_GPU_BATCH=1 run b8 90 $G bench -m /tmp/30b.gguf -B 8 -p 128 -n 64 -r 1
    SPARK_DEVICE=cuda SPARK_SCHED_GPU_BATCH=1 run b32 120 $G bench -m /tmp/30b.gguf -B 32 -p 128 -n 64 -r 1
    stamp "batch done"
fi
if want depth && [ -f /tmp/30b.done ]; then
    run q3_depth8k 90 $B/bench_decode /tmp/30b.gguf -n 128 -r 1 -d 8192 -a 0
    SPARK_DEVICE=cuda run q3_pp4096 60 $G bench -m /tmp/30b.gguf -p 4096 -n 0 -r 2
    SPARK_DEVICE=cuda run q35_depth4k 90 $G bench -m /tmp/q35.gguf -p 0 -n 128 -r 1 -d 4096
    stamp "depth done"
fi
