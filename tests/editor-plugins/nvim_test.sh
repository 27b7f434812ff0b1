#!/bin/sh
# Run one Lua test file in headless Neovim with the plugin and the harness on the path. Skips
# (77) only when nvim itself is missing.
if ! command -v nvim >/dev/null 2>&1; then
    echo "SKIP: nvim is not installed (scripts/install-deps.sh installs Debian's neovim)"
    exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
plugin="$here/../../editor-plugins/nvim"
export SPARK_TEST_DIR="$here"
exec nvim --headless -u NONE -i NONE -n \
    --cmd "set rtp^=$plugin" \
    --cmd "lua package.path = '$here/nvim/?.lua;' .. package.path" \
    -c "luafile $1"
