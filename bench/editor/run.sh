#!/bin/sh
# Keystroke -> ghost text latency and requests saved, see typing.lua. Usage (from the repo):
#   SPARK_CLI=build/spark-agent sh bench/editor/run.sh          # the tiny model, debounce 120 ms
#   SPARK_BENCH_DEBOUNCE=0 SPARK_CLI=... sh bench/editor/run.sh  # no debounce
# Other knobs: SPARK_BENCH_MODEL (a model file), SPARK_BENCH_TOKENS (max tokens, default 16).
here=$(cd "$(dirname "$0")" && pwd)
root="$here/../.."
export SPARK_TEST_DIR="$root/tests/editor-plugins"
exec nvim --headless -u NONE -i NONE -n \
    --cmd "set rtp^=$root/editor-plugins/nvim" \
    --cmd "lua package.path = '$root/tests/editor-plugins/nvim/?.lua;' .. package.path" \
    -c "luafile $here/typing.lua"
