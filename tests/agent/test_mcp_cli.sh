#!/bin/sh
# spark-agent run with an MCP server from the config file (tests/agent/mcp_server.mjs on the
# official SDK): the scripted model calls its tool, the policy asks (refused without a terminal)
# or a rule allows; config errors; a server that cannot start; --no-mcp.
set -u
CLI=${SPARK_CLI:?SPARK_CLI not set}
SRC=${SPARK_SOURCE_DIR:?SPARK_SOURCE_DIR not set}
if ! command -v node > /dev/null 2>&1 ||
   [ ! -f "$SRC/tests/node_modules/@modelcontextprotocol/sdk/package.json" ]; then
    echo "skip: node or @modelcontextprotocol/sdk (tests/node_modules) is not installed"
    exit 77
fi
T=$(mktemp -d /tmp/test_mcp_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
export XDG_STATE_HOME="$T/state" XDG_CONFIG_HOME="$T/config"
unset SPARK_APPROVAL SPARK_APPROVAL_RULES
mkdir -p "$T/repo" "$T/config/spark-agent" && cd "$T/repo" || exit 1
CONF="$T/config/spark-agent/config"
git init -q
if ! "$CLI" sandbox -- true > /dev/null 2>&1; then
    printf 'sandbox = off\n' > "$CONF"
    export SPARK_UNSANDBOXED=1
    echo "note: the sandbox does not work here: the server runs unsandboxed"
fi
# node_modules may be a symbolic link: its target must be visible in the sandbox too
NM=$(cd "$SRC/tests/node_modules" && pwd -P)
server="{\"command\": \"node\", \"args\": [\"$SRC/tests/agent/mcp_server.mjs\"], \"read_only_paths\": [\"$SRC/tests\", \"$NM\"], \"env\": {\"SPARK_MCP_TEST\": \"from config\"}}"
printf 'mcp.t = %s\n' "$server" >> "$CONF"
cat > "$T/add.json" <<'J'
["<tool_call>\n{\"name\": \"mcp__t__add\", \"arguments\": {\"a\": 20, \"b\": 22}}\n</tool_call>",
 "<tool_call>\n{\"name\": \"mcp__t__env\", \"arguments\": {\"name\": \"SPARK_MCP_TEST\"}}\n</tool_call>",
 "42."]
J
out=$("$CLI" run --script "$T/add.json" --json "add" 2>"$T/err"); rc=$?
check "run exits 0 (rc=$rc: $(cat "$T/err"))" '[ $rc -eq 0 ]'
check "the MCP tool is refused without a terminal (auto-edit asks)" \
    'echo "$out" | grep -q "\"type\":\"tool_call\",\"name\":\"mcp__t__add\".*\"decision\":\"deny\""'
out=$("$CLI" run --script "$T/add.json" --json --approval-rules '{"mcp__t__*": "allow"}' "add" \
      2>"$T/err"); rc=$?
check "allowed by a rule (rc=$rc)" '[ $rc -eq 0 ]'
check "the MCP tool's result" \
    'echo "$out" | grep -q "\"type\":\"tool_result\",\"name\":\"mcp__t__add\",\"ok\":true,\"content\":\"{\\\\\"text\\\\\":\\\\\"42\\\\\"}\""'
check "env from the config reaches the server" 'echo "$out" | grep -q "from config"'
out=$("$CLI" run --script "$T/add.json" --json --approval full-auto "add" 2>"$T/err")
check "full-auto runs MCP tools" 'echo "$out" | grep -q "\"name\":\"mcp__t__add\",\"ok\":true"'
out=$("$CLI" run --no-mcp --script "$T/add.json" --json --approval full-auto "add" 2>"$T/err")
check "--no-mcp: the tool is unknown" 'echo "$out" | grep -q "\"type\":\"invalid_call\",\"name\":\"mcp__t__add\""'
# errors
printf 'mcp.bad = {"command": "no-such-mcp-server-xyz"}\n' >> "$CONF"
"$CLI" run --script "$T/add.json" x > /dev/null 2>"$T/err"; rc=$?
check "a server that cannot start fails the run (rc=$rc)" \
    '[ $rc -eq 1 ] && grep -q "MCP server bad exited with status 127.*not found" "$T/err"'
grep -v '^mcp.bad' "$CONF" > "$T/c" && mv "$T/c" "$CONF"
printf 'mcp.odd = {"command": "x", "cwd": "/"}\n' >> "$CONF"
"$CLI" run --script "$T/add.json" x > /dev/null 2>"$T/err"; rc=$?
check "an unknown key (rc=$rc)" '[ $rc -eq 1 ] && grep -q "mcp.odd: unknown key \"cwd\"" "$T/err"'
grep -v '^mcp.odd' "$CONF" > "$T/c" && mv "$T/c" "$CONF"
printf 'mcp.odd = {"args": ["x"]}\n' >> "$CONF"
"$CLI" run --script "$T/add.json" x > /dev/null 2>"$T/err"; rc=$?
check "no command (rc=$rc)" '[ $rc -eq 1 ] && grep -q "mcp.odd: needs \"command\"" "$T/err"'
printf 'mcp.x y = {"command": "x"}\n' > "$CONF"
"$CLI" run --script "$T/add.json" x > /dev/null 2>"$T/err"; rc=$?
check "a bad server name (rc=$rc)" '[ $rc -eq 1 ] && grep -q "config:1: cannot parse" "$T/err"'
[ $fail -eq 0 ] && echo "test_mcp_cli: ok"
exit $fail
