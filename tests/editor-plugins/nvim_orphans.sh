#!/bin/sh
# No `spark-agent serve` started by the Neovim plugin (:SparkStart) outlives its Neovim, however
# Neovim ends: killed (SIGKILL), os.exit (no job teardown: how the Lua harness exits) or :qa!.
# Needs nvim and the built spark-agent (SPARK_CLI).
if ! command -v nvim >/dev/null 2>&1; then
    echo "SKIP: nvim is not installed"
    exit 77
fi
if [ ! -x "$SPARK_CLI" ]; then
    echo "FAIL: spark-agent is not built ($SPARK_CLI)"
    exit 1
fi
here=$(cd "$(dirname "$0")" && pwd)
plugin="$here/../../editor-plugins/nvim"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# the pids of the `serve` processes listening on port $1 (from their command lines)
serve_pids() {
    pgrep -f -- " serve .*--port $1( |\$)" | tr '\n' ' '
}

for mode in kill exit quit; do
    rm -f "$tmp/port" "$tmp/port.go"
    SPARK_ORPHAN_OUT="$tmp/port" SPARK_ORPHAN_MODE=$mode \
        nvim --headless -u NONE -i NONE -n --cmd "set rtp^=$plugin" \
        -c "luafile $here/nvim/orphan_start.lua" </dev/null >"$tmp/nvim.log" 2>&1 &
    nv=$!
    end=$(($(date +%s) + 150))
    while [ ! -s "$tmp/port" ] && kill -0 $nv 2>/dev/null && [ "$(date +%s)" -lt $end ]; do
        sleep 0.1
    done
    if [ ! -s "$tmp/port" ]; then
        echo "not ok - $mode: the plugin's server did not come up"
        cat "$tmp/nvim.log"
        kill -9 $nv 2>/dev/null
        fails=$((fails + 1))
        continue
    fi
    port=$(cat "$tmp/port")
    if [ -z "$(serve_pids "$port")" ]; then
        echo "not ok - $mode: no serve process found on port $port (the check cannot see it)"
        fails=$((fails + 1))
    fi
    # Neovim ends (it waits for port.go before its own exit)
    if [ $mode = kill ]; then kill -9 $nv; else : >"$tmp/port.go"; fi
    wait $nv 2>/dev/null
    # the server drains (no request is running) and exits; give a loaded machine 30 s
    end=$(($(date +%s) + 30))
    while [ -n "$(serve_pids "$port")" ] && [ "$(date +%s)" -lt $end ]; do
        sleep 0.2
    done
    left=$(serve_pids "$port")
    if [ -n "$left" ]; then
        echo "not ok - $mode: serve on port $port outlived Neovim (pid $left)"
        kill $left
        fails=$((fails + 1))
    else
        echo "ok - $mode: no serve process on port $port after Neovim ended"
    fi
done
exit $((fails > 0))
