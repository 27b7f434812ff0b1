#!/usr/bin/env bash
# Prefix-cache replay benchmark (not a test): builds bench/kv/kv_replay.c against an existing
# build's engine library and runs it (see the C file for the arguments).
#
#   bench/kv/replay.sh [-b BUILD_DIR] [PRESET [TYPE [TURNS [SYSTEM [NEW [ANSWER]]]]]]
#
# Defaults: build/, preset tiny, type q8_0, 20 turns, 512 system tokens, 96 new and 32 answer
# tokens per turn.
set -euo pipefail
build=build
if [ "${1:-}" = -b ]; then build=$2; shift 2; fi
src=$(cd "$(dirname "$0")/../.." && pwd)
exe=${TMPDIR:-/tmp}/spark_kv_replay
cmake --build "$build" --target engine >/dev/null
cc -std=c17 -O2 -I"$src/engine" -I"$src/engine/core" -I"$build/generated" \
    "$src/bench/kv/kv_replay.c" "$build/engine/libengine.a" -lm -lpthread -o "$exe"
echo "# $(date -u +%FT%TZ) $(git -C "$src" rev-parse --short HEAD)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$exe" "${1:-tiny}" "${2:-q8_0}" "${3:-20}" "${4:-512}" "${5:-96}" "${6:-32}"
