#!/usr/bin/env bash
# spark-agent tool / undo end to end: schemas valid for ajv (strict), exit codes, search
# agreeing with ripgrep on this tree, and edit -> undo in a scratch git repository.
set -uo pipefail
cli="${SPARK_CLI:?}"
src="${SPARK_SOURCE_DIR:?}"
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2" >&2; fail=1; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --list: every schema compiles under ajv's strict mode
"$cli" tool --list > "$tmp/tools.json"
check '[ $? -eq 0 ]' "tool --list"
if command -v node >/dev/null && [ -d "${SPARK_NODE_MODULES:-}/ajv" ]; then
    NODE_PATH="$SPARK_NODE_MODULES" node -e '
        const Ajv = require("ajv"); const ajv = new Ajv({strict: true, allErrors: true});
        const tools = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
        let bad = 0;
        for (const t of tools) {
            try { ajv.compile(t.function.parameters); }
            catch (e) { console.error(t.function.name + ": " + e.message); bad++; }
        }
        if (tools.length < 19) { console.error("only " + tools.length + " tools"); bad++; }
        process.exit(bad ? 1 : 0);' "$tmp/tools.json"
    check '[ $? -eq 0 ]' "schemas compile with ajv (strict)"
else
    echo "FAIL: node or ajv missing (scripts/install-deps.sh installs both)" >&2; fail=1
fi
"$cli" tool --schema search | grep -q '"pattern"'; check '[ $? -eq 0 ]' "tool --schema"

# exit codes
"$cli" tool no_such_tool '{}' >/dev/null 2>&1; check '[ $? -eq 2 ]' "unknown tool exits 2"
"$cli" tool read_file '{"path":' >/dev/null 2>&1; check '[ $? -eq 2 ]' "bad JSON exits 2"
out=$(cd "$src" && "$cli" tool read_file '{"path":"../../etc/passwd"}' 2>/dev/null)
check '[ $? -eq 1 ]' "refused path exits 1"
check '[[ "$out" == *path_refused* ]]' "refused path prints the error JSON"
out=$(cd "$src" && echo '{"path":"README.md","start_line":1,"end_line":1}' | "$cli" tool read_file -)
check '[[ "$out" == *"spark-agent"* ]]' "arguments from stdin"

# search agrees with ripgrep (same tree, same ignore rules, matching lines)
if command -v rg >/dev/null; then
    for spec in 'tool_err|' 'json_[a-z_]+_new|' 'TOOL_E|-i'; do
        pat=${spec%|*}; flag=${spec#*|}
        want=$(cd "$src" && rg $flag -c -- "$pat" tools tests/tools | awk -F: '{s+=$NF} END {print s+0}')
        icase=false; [ "$flag" = "-i" ] && icase=true
        got=$(cd "$src" && for d in tools tests/tools; do
                  "$cli" tool search "{\"pattern\":\"$pat\",\"path\":\"$d\",\"case_insensitive\":$icase,\"max_results\":1000000}"
              done | grep -o '"match_count":[0-9]*' | awk -F: '{s+=$2} END {print s+0}')
        check '[ "$want" = "$got" ] && [ "$want" -gt 0 ]' "search '$pat' $flag: ripgrep $want lines, spark-agent $got"
    done
else
    echo "FAIL: ripgrep (rg) missing (scripts/install-deps.sh installs it)" >&2; fail=1
fi

# edit (auto checkpoint) then undo, in a scratch repository
repo="$tmp/repo"
mkdir -p "$repo" && cd "$repo"
export HOME="$tmp" GIT_CONFIG_NOSYSTEM=1
git init -q . && git config user.name T && git config user.email t@example.com
printf 'one\ntwo\n' > f.txt && git add f.txt && git commit -qm init
printf 'staged\n' > s.txt && git add s.txt
"$cli" tool edit_file '{"path":"f.txt","old_text":"two","new_text":"TWO"}' >/dev/null
check '[ "$(cat f.txt)" = "$(printf "one\nTWO")" ]' "edit applied"
"$cli" tool create_file '{"path":"extra.txt","content":"x"}' >/dev/null
"$cli" undo --list | grep -q 'before edit_file'; check '[ $? -eq 0 ]' "undo --list shows the checkpoint"
# each command is its own session: undo puts back the state before the last one
"$cli" undo >/dev/null; check '[ $? -eq 0 ]' "undo exits 0"
check '[ ! -e extra.txt ]' "undo removed the new file"
check '[ "$(cat f.txt)" = "$(printf "one\nTWO")" ]' "undo kept the earlier edit"
"$cli" undo 1 >/dev/null; check '[ $? -eq 0 ]' "undo 1 exits 0"
check '[ "$(cat f.txt)" = "$(printf "one\ntwo")" ]' "undo 1 restored f.txt"
check '[ "$(git diff --cached --name-only)" = "s.txt" ]' "undo kept the staged file staged"
check '[ -z "$(git status --porcelain --untracked-files=all | grep -v "^A  s.txt")" ]' "nothing else changed"
cd "$tmp" && mkdir plain && cd plain
"$cli" undo >/dev/null 2>&1; check '[ $? -eq 1 ]' "undo outside a repository exits 1"

[ $fail -eq 0 ] && echo "test_tools_cli: all checks passed"
exit $fail
