#!/usr/bin/env bash
# A device call of session 5's decode/prefill work (issues 5 and 11), from a clean export of a
# commit: engine-only Release build for sm_90 (spark-agent, every gpu test, bench_decode,
# bench_q35), cut-down models generated meanwhile, then the steps of a plan file (bash, sourced)
# that calls the functions below. Logs in $OUT (at most 8 files come back: the logs are packed
# into $OUT/logs.tgz, summaries on stdout).
# Usage (device tool, carry [".tok", ".clean"]): cd .clean && ln -sfn ../.tok .tok &&
#        [Q3_LAYERS=12] [Q35_LAYERS=8] [LIMIT_S=N] bash bench/cuda/s5_call.sh PLAN
#   LIMIT_S: a step that would start after N seconds is skipped (said on stdout)
#   CUDA_FLAGS: extra nvcc flags of the build (-lineinfo: racecheck / memcheck name source lines;
#   the same SASS)
#   PREBUILT: a pack of bench/cuda/prebuilt.sh (a local build's objects; .tgz or .txz): linked,
#   not compiled. Plans unpack other packs (a base build's) with `unpack PACK DIR`.
#   TRACE=1: the build is -DSPARK_CUDA_TRACE=ON (launch timelines; its kernels are slower) and
#   builds no gpu tests: for bench/cuda/trace.plan
# Plan functions:
#   t NAME TIMEOUT [VAR=VALUE...] TEST [ARGS...]   a gpu test binary (tests/engine/TEST)
#   dec NAME TIMEOUT MODEL [bench_decode args...]    MODEL: q3 (the Qwen3 cut), q3full, q3q8
#   q35 NAME TIMEOUT MODEL [bench_q35 args...]       MODEL: q35 (the Qwen3.5 cut), q35full
#   sa NAME TIMEOUT [VAR=VALUE...] -- spark-agent args ({q3} etc. replaced by the model path)
#   want_model q3|q3full|q3q8|q35|q35full           generate it (call before use; background)
set -o pipefail
OUT=${OUT:-/tmp/out}
L=/tmp/logs
mkdir -p "$OUT" $L
TOK=$PWD/.tok
B=/tmp/b
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
stamp() { echo "[+$(el) s] $*"; }
late() { # NAME: true (and says so) once LIMIT_S seconds have passed: the step is skipped
    [ "$(el)" -lt "${LIMIT_S:-100000}" ] && return 1
    echo "SKIPPED $1 (time: $(el) s of ${LIMIT_S} s)"
}
finish() { tar -czf $OUT/logs.tgz -C $L . 2>/dev/null; stamp "end"; }
unpack() { # PACK DIR: a prebuilt.sh pack, gzip (.tgz) or xz (.txz: xz, else Python's lzma)
    mkdir -p "$2" || return 1
    case $1 in
    *.txz)
        if command -v xz >/dev/null; then
            xz -dc "$1"
        else
            python3 -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"
        fi | tar -x -C "$2" ;;
    *) tar -xzf "$1" -C "$2" ;;
    esac
}
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "# commit $(cat COMMIT 2>/dev/null || echo '?')"
G=$B/spark-agent
LK="$B/engine/libengine.a -lpthread -lm -ldl -lrt"
if [ -n "${PREBUILT:-}" ]; then # bench/cuda/prebuilt.sh's objects: linked, not compiled
    unpack "$PREBUILT" $B || exit 1
    echo "# prebuilt objects of $(cat $B/PREBUILT_COMMIT)"
    [ "$(cat $B/PREBUILT_COMMIT)" = "$(cat COMMIT 2>/dev/null)" ] ||
        echo "WARNING: the objects are not of the export's commit"
    nvcc -o $G $B/agent/cli/CMakeFiles/spark-agent.dir/*.o $LK || exit 1
    stamp "spark-agent linked"
else
    cmake -S . -B $B -G Ninja -DSPARK_ENGINE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release -DSPARK_WERROR=ON -DSPARK_TOKENIZER_DIR=$TOK \
        -DSPARK_CUDA_TRACE=$([ "${TRACE:-0}" = 1 ] && echo ON || echo OFF) \
        ${CUDA_FLAGS:+"-DCMAKE_CUDA_FLAGS=$CUDA_FLAGS"} >$L/cfg.log 2>&1 ||
        { tail -30 $L/cfg.log; exit 1; }
    ninja -C $B spark-agent >$L/build.log 2>&1 || { grep -B2 -A12 -m3 error $L/build.log; exit 1; }
    stamp "spark-agent built"
fi
declare -A MP=([q3]=/tmp/q3.gguf [q3full]=/tmp/q3full.gguf [q3q8]=/tmp/q3q8.gguf
    [q35]=/tmp/q35.gguf [q35full]=/tmp/q35full.gguf)
want_model() {
    local m=$1 a
    case $m in
    q3) a="--preset qwen3-30b-a3b --type q4_k_m --layers ${Q3_LAYERS:-12}" ;;
    q3full) a="--preset qwen3-30b-a3b --type q4_k_m" ;;
    q3q8) a="--preset qwen3-30b-a3b --type q8_0" ;;
    q35) a="--preset qwen35-35b-a3b-mtp --type q4_k_m --layers ${Q35_LAYERS:-8}" ;;
    q35full) a="--preset qwen35-35b-a3b-mtp --type q4_k_m" ;;
    esac
    (/usr/bin/time -f "gen $m: %e s" $G model gen $a -s 1 -t 8 -o ${MP[$m]} --tokenizer-dir $TOK &&
        touch ${MP[$m]}.done) >$L/gen-$m.log 2>&1 &
}
waitm() {
    while [ ! -f ${MP[$1]}.done ] && ! grep -qi "error\|non-zero" $L/gen-$1.log 2>/dev/null; do
        sleep 1
    done
    [ -f ${MP[$1]}.done ] || { echo "no model $1: $(tail -2 $L/gen-$1.log)"; return 1; }
}
if [ -n "${PREBUILT:-}" ]; then
    for d in $B/tests/engine/CMakeFiles/test_cuda_*.dir; do
        nvcc -o $B/tests/engine/$(basename $d .dir) $d/*.o $B/tests/engine/libengine_test_support.a \
            $LK &
    done
    for b in bench_decode bench_q35; do nvcc -o $B/$b $B/$b.o $LK & done
    wait
else
    GPU_TESTS=$(cd $B && ctest -N -L gpu | awk '/Test +#/ {print $3}')
    [ "${TRACE:-0}" = 1 ] || ninja -C $B $GPU_TESTS >>$L/build.log 2>&1 ||
        { grep -B2 -A12 -m3 error $L/build.log; exit 1; }
    for b in bench_decode bench_q35; do
        cc -O2 -std=c17 -D_GNU_SOURCE -Iengine -c bench/cuda/$b.c -o $B/$b.o &&
            nvcc -o $B/$b $B/$b.o $LK || exit 1
    done
fi
stamp "all built"
export SPARK_TOKENIZER_DIR=$TOK
t() { # NAME TIMEOUT [VAR=V...] TEST [ARGS]
    local name=$1 to=$2
    late $name && return
    shift 2
    local envs=()
    while [[ $1 == *=* ]]; do envs+=("$1"); shift; done
    env "${envs[@]}" timeout $to $B/tests/engine/"$@" >$L/t-$name.log 2>&1
    local rc=$?
    echo "test $name rc=$rc [${envs[*]} $*] $(grep -ch "FAIL" $L/t-$name.log) FAIL lines"
    [ $rc = 0 ] || grep -h "FAIL\|error" $L/t-$name.log | head -8
}
dec() { # NAME TIMEOUT MODEL ARGS
    local name=$1 to=$2 m=$3
    late $name && return
    shift 3
    waitm $m || return
    timeout $to $B/bench_decode ${MP[$m]} "$@" >$L/d-$name.log 2>&1
    echo "## dec $name rc=$? ($m $*)"
    grep -E "variant|tg128|tok/s|weights read" $L/d-$name.log | grep -v "^spark-agent: info" | head -24
}
q35() { # NAME TIMEOUT MODEL ARGS
    local name=$1 to=$2 m=$3
    late $name && return
    shift 3
    waitm $m || return
    timeout $to $B/bench_q35 ${MP[$m]} "$@" >$L/q-$name.log 2>&1
    echo "## q35 $name rc=$? ($m $*)"
    grep -E "variant|tok/s|us|verify|draft|computed|\|" $L/q-$name.log | grep -v "^spark-agent: info" | head -30
}
sa() { # NAME TIMEOUT [VAR=V...] -- ARGS ({q3} ... replaced)
    local name=$1 to=$2
    late $name && return
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local args=() a k
    for a in "$@"; do
        for k in "${!MP[@]}"; do
            [ "$a" = "{$k}" ] && { waitm $k || return; a=${MP[$k]}; }
        done
        args+=("$a")
    done
    env "${envs[@]}" timeout $to $G "${args[@]}" >$L/s-$name.log 2>&1
    echo "## sa $name rc=$? [${envs[*]}]"
    grep -E "^\| " $L/s-$name.log | grep -v "^| model\|^| --\|^| -\{3\}" | tail -3
}
. "$1"
wait
