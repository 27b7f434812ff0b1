#!/usr/bin/env bash
# Repo map benchmark: files per second parsed (tree-sitter, all worker threads) and the wall
# time of the whole repo_map call. Not a test: run by hand, e.g.
#   bench/tools/repo_map_bench.sh build/spark-agent                 (this repository)
#   bench/tools/repo_map_bench.sh build/spark-agent /usr/lib/python3.11
set -euo pipefail
cli=$(realpath "${1:?usage: repo_map_bench.sh SPARK_AGENT [TREE]}")
tree=$(realpath "${2:-$(dirname "$0")/../..}")
runs=${RUNS:-3}
tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.t"' EXIT
echo "tree: $tree, $(nproc) CPUs, best of $runs runs"
best_fps=0
for _ in $(seq "$runs"); do
    s=$(date +%s.%N)
    TIMEFORMAT='%U %S'
    { time (cd "$tree" && "$cli" tool --no-checkpoint repo_map '{"max_tokens":4096}' > "$tmp"); } 2> "$tmp.t"
    e=$(date +%s.%N)
    out=$(cat "$tmp")
    cpu=$(awk '{print $1 + $2}' "$tmp.t")
    files=$(echo "$out" | grep -o '"files_parsed":[0-9]*' | cut -d: -f2)
    secs=$(echo "$out" | grep -o '"parse_seconds":[0-9.e-]*' | cut -d: -f2)
    fps=$(echo "$files / $secs" | bc -l)
    printf 'files %s  parse+extract %.3f s wall (%.0f files/s)  whole call %.3f s wall, %.2f s CPU (%.0f files per CPU-second)  symbols %s\n' \
        "$files" "$secs" "$fps" "$(echo "$e - $s" | bc -l)" "$cpu" "$(echo "$files / $cpu" | bc -l)" \
        "$(echo "$out" | grep -o '"symbols_total":[0-9]*' | cut -d: -f2)"
    if [ "$(echo "$fps > $best_fps" | bc -l)" = 1 ]; then best_fps=$fps; fi
done
printf 'best: %.0f files/s\n' "$best_fps"
