#!/usr/bin/env bash
# The spark-agent command's contract: help, version, unknown commands, commands not built yet,
# and doctor with and without a GPU. Runs against $SPARK_CLI.
set -u
cli=${SPARK_CLI:?SPARK_CLI must point at the spark-agent binary}
fails=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
check() { # check NAME CONDITION-RESULT
    if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
expect_rc() { # expect_rc NAME WANT CMD...
    local name=$1 want=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    [ "$rc" = "$want" ]; check "$name (exit $rc, want $want)" $?
}
has() { grep -q -- "$2" "$tmp/$1"; }

expect_rc "help" 0 "$cli" --help
for c in run chat serve complete model bench doctor sandbox tool undo sessions version help; do
    has out "^  $c "; check "help lists $c" $?
done
expect_rc "no arguments is a usage error" 2 "$cli"
expect_rc "unknown command" 2 "$cli" frobnicate
has err "unknown command 'frobnicate'"; check "unknown command is named" $?
expect_rc "version" 0 "$cli" version
has out "^spark-agent [0-9]"; check "version prints the version" $?
has out "^build: "; check "version prints the build" $?

# A command whose module is not in this build must say so and exit 2, never pretend.
if "$cli" --help | grep -q '^  run .*(not available)'; then
    expect_rc "run not available yet" 2 "$cli" run "fix it"
    grep -qE "not available yet|not in this build" "$tmp/err"; check "run says it is not available" $?
fi

# doctor, in an isolated config home so the user's config does not leak in.
export XDG_CONFIG_HOME="$tmp/cfg"; mkdir -p "$XDG_CONFIG_HOME/spark-agent"
unset SPARK_MODEL SPARK_DEVICE
printf 'sandbox = off\n' >"$XDG_CONFIG_HOME/spark-agent/config"
"$cli" doctor >"$tmp/out" 2>"$tmp/err"; rc=$?
cat "$tmp/out"
has out "^CPU: "; check "doctor reports the CPU" $?
has out "CPU kernels: "; check "doctor reports the CPU kernel path" $?
has out "^GPU: "; check "doctor reports the GPU" $?
if nvidia-smi -L >/dev/null 2>&1; then
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
    has out "compute capability"; check "doctor lists the GPU's compute capability" $?
    grep -qF -- "$gpu_name" "$tmp/out"; check "doctor names the GPU ($gpu_name)" $?
    SPARK_DEVICE=cuda "$cli" doctor >"$tmp/out" 2>&1
    check "doctor with SPARK_DEVICE=cuda and a GPU passes" $?
else
    echo "note: no GPU on this machine (nvidia-smi -L failed); checking the no-GPU report"
    has out "no GPU: generation will run on the CPU"; check "doctor says no GPU plainly" $?
    check "doctor passes when nothing asked for is missing" "$rc"
    expect_rc "doctor fails when the config asks for cuda without a GPU" 1 \
        env SPARK_DEVICE=cuda "$cli" doctor
    has out "PROBLEM: device = cuda"; check "doctor names the missing GPU" $?
fi
if "$cli" version | grep -q engine-only; then
    has out "^Sandbox: not in this build"; check "doctor says the sandbox is not built" $?
else
    has out "^Sandbox: user namespaces"; check "doctor reports the sandbox" $?
    has out "^Libraries: jansson"; check "doctor reports library versions" $?
fi
has out "embedded Qwen3 tokenizer"; check "doctor reports the embedded tokenizer" $?
# the prefix cache: the KV pool, its type and the persisted prefixes (a directory doctor reads,
# never creates)
pfx="$tmp/cache/spark-agent/prefixes"
env XDG_CACHE_HOME="$tmp/cache" "$cli" doctor >"$tmp/out" 2>&1
has out "^Prefix cache: KV pool auto .*from default), f16 KV (from default)"
check "doctor reports the prefix cache's pool and KV type" $?
has out "persisted prefixes: $pfx (none yet)"; check "doctor says no prefix is persisted" $?
[ ! -e "$pfx" ]; check "doctor does not create the prefixes directory" $?
mkdir -p "$pfx"
head -c 4096 /dev/zero >"$pfx/a.kvp"; head -c 2097152 /dev/zero >"$pfx/b.kvp"; : >"$pfx/b.kvp.x1"
env XDG_CACHE_HOME="$tmp/cache" SPARK_KV_CACHE=64 SPARK_KV_TYPE=q8_0 "$cli" doctor >"$tmp/out" 2>&1
has out "^Prefix cache: KV pool 64 MiB (from SPARK_KV_CACHE), q8_0 KV (from SPARK_KV_TYPE)"
check "doctor reports a configured pool and KV type" $?
has out "persisted prefixes: $pfx: 2 files, 2.0 MiB (and 1 other file)"
check "doctor counts the persisted prefixes and their size" $?
env XDG_CACHE_HOME="$tmp/cache" SPARK_KV_CACHE=0 "$cli" doctor >"$tmp/out" 2>&1
has out "^Prefix cache: OFF (kv_cache = 0 from SPARK_KV_CACHE)"; check "doctor: prefix cache off" $?
# A model that loads is described; a file that is not a model is a problem.
expect_rc "model gen for doctor" 0 "$cli" model gen --preset tiny --type q8_0 -o "$tmp/m.gguf"
expect_rc "doctor loads a configured model" 0 env SPARK_MODEL="$tmp/m.gguf" "$cli" doctor
has out "loads: qwen3moe"; check "doctor describes the loaded model" $?
head -c 100 /dev/urandom >"$tmp/junk.gguf"
expect_rc "doctor fails on a file that is not a model" 1 env SPARK_MODEL="$tmp/junk.gguf" "$cli" doctor
has out "PROBLEM: model $tmp/junk.gguf does not load"; check "doctor says why the model does not load" $?
expect_rc "doctor fails on a missing model" 1 env SPARK_MODEL="$tmp/none.gguf" "$cli" doctor
has out "PROBLEM: model $tmp/none.gguf"; check "doctor names the missing model" $?
printf 'modle = x\n' >"$XDG_CONFIG_HOME/spark-agent/config"
expect_rc "doctor fails on a malformed config" 1 "$cli" doctor
has out "config:1: cannot parse"; check "doctor gives file and line of the bad config" $?

echo "$fails failure(s)"
[ "$fails" = 0 ]
