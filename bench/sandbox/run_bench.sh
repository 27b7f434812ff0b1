#!/usr/bin/env bash
# Spawn overhead of the sandbox vs plain fork/exec vs bubblewrap (not a test; figures for the
# issue). usage: bench/sandbox/run_bench.sh BUILD_DIR [ROUNDS_TRUE [ROUNDS_MAKE [BIG_MIB]]]
# BUILD_DIR is a configured build of this tree (for sandbox/libsandbox.a).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: run_bench.sh BUILD_DIR [ROUNDS_TRUE [ROUNDS_MAKE [BIG_MIB]]]}
cmake --build "$build" --target sandbox >/dev/null
command -v bwrap >/dev/null || { echo "bwrap not installed (apt-get install bubblewrap)"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=c17 -D_GNU_SOURCE -I"$src/sandbox" "$src/bench/sandbox/bench_spawn.c" \
    "$build/sandbox/libsandbox.a" $(pkg-config --libs libseccomp) -lpthread -o "$tmp/bench_spawn"
mkdir "$tmp/ws"
echo "# $(uname -srm), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), uid $(id -u)"
"$tmp/bench_spawn" "$tmp/ws" "${2:-100}" "${3:-20}" "${4:-512}"
