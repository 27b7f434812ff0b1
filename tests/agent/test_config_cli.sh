#!/bin/sh
# Approval settings of run/chat: --approval > SPARK_APPROVAL > `approval =` in the config file >
# the command's default; per-tool rules from the file, then SPARK_APPROVAL_RULES, then
# --approval-rules (later rules win); config errors name the file and line.
set -u
CLI=${SPARK_CLI:?SPARK_CLI not set}
T=$(mktemp -d /tmp/test_config_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
export XDG_STATE_HOME="$T/state" XDG_CONFIG_HOME="$T/config"
unset SPARK_APPROVAL SPARK_APPROVAL_RULES
mkdir -p "$T/repo" "$T/config/spark-agent" && cd "$T/repo" || exit 1
CONF="$T/config/spark-agent/config"
printf 'hello\n' > a.txt
git init -q && git add a.txt && git -c user.name=t -c user.email=t@t commit -qm init
cat > "$T/edit.json" <<'J'
["<tool_call>\n{\"name\": \"edit_file\", \"arguments\": {\"path\": \"a.txt\", \"old_text\": \"hello\", \"new_text\": \"bye\"}}\n</tool_call>",
 "done"]
J
# run the edit script; print "applied" or "refused" (and restore the file)
edit() {
    out=$("$CLI" run "$@" --script "$T/edit.json" --json "x" 2>"$T/err"); rc=$?
    if [ "$(cat a.txt)" = bye ]; then echo applied; git checkout -q a.txt
    elif echo "$out" | grep -q '"type":"refused","name":"edit_file"'; then echo refused
    else echo "other rc=$rc: $(cat "$T/err")"; fi
}
check "default (auto-edit) applies" '[ "$(edit)" = applied ]'
printf '# settings\napproval = read-only   # no edits\n' > "$CONF"
check "file approval = read-only refuses" '[ "$(edit)" = refused ]'
check "SPARK_APPROVAL beats the file" '[ "$(SPARK_APPROVAL=auto-edit edit)" = applied ]'
check "--approval beats SPARK_APPROVAL" \
    '[ "$(SPARK_APPROVAL=auto-edit edit --approval read-only)" = refused ]'
check "transcript records the mode" \
    'grep -q "\"approval\":\"read-only\"" "$XDG_STATE_HOME"/spark-agent/sessions/*.jsonl'
# rules: file deny, environment allow, flag deny; a '#' inside a JSON value is not a comment
printf 'approval = auto-edit\napproval_rules = {"edit_*": "deny", "x#y": "ask"}  \n' > "$CONF"
check "file rule denies" '[ "$(edit)" = refused ]'
check "SPARK_APPROVAL_RULES beats the file rule" \
    '[ "$(SPARK_APPROVAL_RULES="{\"edit_file\":\"allow\"}" edit)" = applied ]'
check "--approval-rules beats the environment" \
    '[ "$(SPARK_APPROVAL_RULES="{\"edit_file\":\"allow\"}" edit --approval-rules "{\"edit_file\":\"deny\"}")" = refused ]'
printf '%s\n' '["<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>", "ok"]' > "$T/read.json"
check "rules are per tool (read_file still runs)" \
    '"$CLI" run --script "$T/read.json" --json x | grep -q "\"type\":\"tool_result\",\"name\":\"read_file\",\"ok\":true"'
# errors: file and line; exit 1 for a bad file, 2 for a bad flag or variable
printf 'threads = 1\napproval = yolo\n' > "$CONF"
"$CLI" run --script "$T/edit.json" x > /dev/null 2>"$T/err"; rc=$?
check "bad approval in the file fails (rc=$rc)" '[ $rc -eq 1 ] && grep -q "config:2: unknown approval mode .yolo." "$T/err"'
printf '\napproval_rules = {"edit_file": "maybe"}\n' > "$CONF"
"$CLI" run --script "$T/edit.json" x > /dev/null 2>"$T/err"; rc=$?
check "bad rule value in the file (rc=$rc)" '[ $rc -eq 1 ] && grep -q "config:2 (approval_rules): approval rule \"edit_file\"" "$T/err"'
printf 'approval_rules = {"edit_file": \n' > "$CONF"
"$CLI" run --script "$T/edit.json" x > /dev/null 2>"$T/err"; rc=$?
check "malformed rules JSON (rc=$rc)" '[ $rc -eq 1 ] && grep -q "config:1 (approval_rules): approval rules: not a JSON object" "$T/err"'
printf 'approval_rules = edit_file\n' > "$CONF"
"$CLI" run --script "$T/edit.json" x > /dev/null 2>"$T/err"; rc=$?
check "rules that are not an object (rc=$rc)" '[ $rc -eq 1 ] && grep -q "config:1: cannot parse" "$T/err"'
printf 'mcp.a = {"command": "x"}\nmcp.a = {"command": "y"}\n' > "$CONF"
"$CLI" run --script "$T/edit.json" x > /dev/null 2>"$T/err"; rc=$?
check "a repeated MCP server name (rc=$rc)" '[ $rc -eq 1 ] && grep -q "config:2: cannot parse" "$T/err"'
rm -f "$CONF"
SPARK_APPROVAL=yolo "$CLI" run --script "$T/edit.json" x > /dev/null 2>"$T/err"; rc=$?
check "bad SPARK_APPROVAL is a usage error (rc=$rc)" '[ $rc -eq 2 ] && grep -q "SPARK_APPROVAL: unknown approval mode" "$T/err"'
SPARK_APPROVAL_RULES='[1]' "$CLI" run --script "$T/edit.json" x > /dev/null 2>"$T/err"; rc=$?
check "bad SPARK_APPROVAL_RULES (rc=$rc)" '[ $rc -eq 2 ] && grep -q "SPARK_APPROVAL_RULES: approval rules" "$T/err"'
"$CLI" run --approval-rules '{"*x": "allow"}' --script "$T/edit.json" x > /dev/null 2>"$T/err"
rc=$?
check "bad --approval-rules pattern (rc=$rc)" '[ $rc -eq 2 ] && grep -q "may only end a pattern" "$T/err"'
[ $fail -eq 0 ] && echo "test_config_cli: ok"
exit $fail
