#!/bin/sh
# spark-agent run / sessions with the scripted backend in a temporary git repository: exit
# codes, the --json event stream, the transcript under XDG_STATE_HOME, --resume, refusals,
# usage errors, undo of the agent's edit.
set -u
CLI=${SPARK_CLI:?SPARK_CLI not set}
T=$(mktemp -d /tmp/test_loop_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
export XDG_STATE_HOME="$T/state"
mkdir "$T/repo" && cd "$T/repo" || exit 1
printf 'hello\n' > a.txt
git init -q && git add a.txt && git -c user.name=t -c user.email=t@t commit -qm init
cat > "$T/edit.json" <<'J'
["<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>",
 "<tool_call>\n{\"name\": \"edit_file\", \"arguments\": {\"path\": \"a.txt\", \"old_text\": \"hello\", \"new_text\": \"bye\"}}\n</tool_call>",
 "Changed hello to bye."]
J
out=$("$CLI" run --script "$T/edit.json" --json "change hello to bye"); rc=$?
check "run exits 0 on an answer (rc=$rc)" '[ $rc -eq 0 ]'
check "json stream ends with stop/answer" 'echo "$out" | tail -1 | grep -q "\"type\":\"stop\",\"reason\":\"answer\""'
check "edit applied" '[ "$(cat a.txt)" = bye ]'
id=$(ls "$XDG_STATE_HOME/spark-agent/sessions" | sed -n 's/\.jsonl$//p' | head -1)
check "transcript written" '[ -n "$id" ] && [ $(wc -l < "$XDG_STATE_HOME/spark-agent/sessions/$id.jsonl") -eq 7 ]'
check "sessions lists it" '"$CLI" sessions | grep -q "$id .*change hello to bye"'
check "sessions --json" '"$CLI" sessions --json | grep -q "\"id\":\"$id\",\"messages\":6"'
check "sessions show" '"$CLI" sessions show "$id" | head -1 | grep -q "\"type\":\"session\""'
# resume: the new task is appended to the same transcript
printf '["Still bye."]\n' > "$T/one.json"
"$CLI" run --script "$T/one.json" --resume "$id" "is it bye?" > /dev/null 2>&1; rc=$?
check "resume exits 0" '[ $rc -eq 0 ]'
check "resumed transcript grew" '[ $(wc -l < "$XDG_STATE_HOME/spark-agent/sessions/$id.jsonl") -eq 9 ]'
"$CLI" run --script "$T/one.json" --resume nosuch "x" > /dev/null 2>&1; rc=$?
check "unknown session fails (rc=$rc)" '[ $rc -eq 1 ]'
# undo restores the checkpoint taken before the first edit
"$CLI" undo > /dev/null; rc=$?
check "undo restores (rc=$rc)" '[ $rc -eq 0 ] && [ "$(cat a.txt)" = hello ]'
# read-only: the edit is refused and reported; the step budget then stops the run
out=$("$CLI" run --script "$T/edit.json" --approval read-only --max-steps 2 --json "x"); rc=$?
check "read-only run stops on the step budget (rc=$rc)" '[ $rc -eq 1 ]'
check "refusal reported" 'echo "$out" | grep -q "\"type\":\"refused\",\"name\":\"edit_file\""'
check "file untouched" '[ "$(cat a.txt)" = hello ]'
# approvals on a terminal (tests/agent/pty_run): "ask" prompts; n refuses, y runs
PTY=${SPARK_BINARY_DIR:?SPARK_BINARY_DIR not set}/tests/agent/pty_run
"$PTY" -t 60 -o "$T/pty.out" 'wait:[y/N] ' 'send:n\r' -- \
    "$CLI" run --script "$T/edit.json" --approval ask 'x'
check "pty: asked about the edit" 'grep -q "allow edit_file" "$T/pty.out"'
check "pty: declined edit not applied" '[ "$(cat a.txt)" = hello ]'
check "pty: refusal reported" 'grep -q "the user declined" "$T/pty.out"'
"$PTY" -t 60 -o "$T/pty.out" 'wait:[y/N] ' 'send:y\r' -- \
    "$CLI" run --script "$T/edit.json" --approval ask 'x'
rc=$?
check "pty: accepted edit applied (rc=$rc)" '[ $rc -eq 0 ] && [ "$(cat a.txt)" = bye ]'
git checkout -q a.txt
# chat: a REPL on stdin (not a terminal: asks are refusals), slash commands
printf '["first answer", "second answer"]\n' > "$T/two.json"
out=$(printf 'hello\n/session\n/nope\nagain\n/exit\n' | "$CLI" chat --script "$T/two.json" 2>"$T/chat.err"); rc=$?
check "chat exits 0 (rc=$rc)" '[ $rc -eq 0 ]'
check "chat answers both" '[ "$out" = "first answer
second answer" ]'
check "chat /session prints the transcript path" 'grep -q "spark-agent/sessions/.*jsonl" "$T/chat.err"'
check "chat unknown slash command" 'grep -q "unknown command /nope" "$T/chat.err"'
# usage errors
"$CLI" run > /dev/null 2>&1; rc=$?
check "run without a task is a usage error (rc=$rc)" '[ $rc -eq 2 ]'
"$CLI" run --approval yolo --script "$T/one.json" x > /dev/null 2>&1; rc=$?
check "bad approval mode is a usage error (rc=$rc)" '[ $rc -eq 2 ]'
"$CLI" run --max-steps 0 x > /dev/null 2>&1; rc=$?
check "bad --max-steps (rc=$rc)" '[ $rc -eq 2 ]'
printf '{' > "$T/bad.json"
"$CLI" run --script "$T/bad.json" x > /dev/null 2>&1; rc=$?
check "malformed script fails (rc=$rc)" '[ $rc -eq 1 ]'
[ $fail -eq 0 ] && echo "test_loop_cli: ok"
exit $fail
