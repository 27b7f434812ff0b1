#!/usr/bin/env bash
# Search benchmark: spark-agent's search tool against ripgrep, same tree, same patterns, side by
# side in one run. Not a test: run by hand, e.g.
#   bench/tools/search_bench.sh build/spark-agent            (tree: copies of /usr/include and
#                                                             /usr/lib/python3.11 in $TMPDIR)
#   bench/tools/search_bench.sh build/spark-agent DIR        (any tree)
# Both tools print every matching line (rg to /dev/null, spark-agent as JSON to /dev/null);
# the best of RUNS wall and CPU (user+sys) times are reported with the matching-line counts,
# which must agree.
set -euo pipefail
cli=$(realpath "${1:?usage: search_bench.sh SPARK_AGENT [TREE]}")
tree=${2:-}
runs=${RUNS:-3}
if [ -z "$tree" ]; then
    tree="${TMPDIR:-/tmp}/spark-search-bench"
    if [ ! -d "$tree" ]; then
        mkdir -p "$tree"
        cp -r /usr/include "$tree/include"
        cp -r /usr/lib/python3.11 "$tree/python3.11" 2>/dev/null || true
    fi
fi
command -v rg >/dev/null || { echo "ripgrep (rg) is not installed" >&2; exit 1; }
files=$(find "$tree" -type f | wc -l)
size=$(du -sh "$tree" | cut -f1)
echo "tree: $tree ($files files, $size), $(nproc) CPUs, best of $runs runs"
# best "WALL CPU" of RUNS runs of "$@" (CPU = user + sys; less sensitive to a loaded machine)
best() {
    local bw=999999 bc=999999 s e w c
    for _ in $(seq "$runs"); do
        s=$(date +%s.%N)
        c=$( { TIMEFORMAT="%U %S"; time "$@" >/dev/null 2>&1 || true; } 2>&1 | awk "{print \$1 + \$2}")
        e=$(date +%s.%N)
        w=$(echo "$e - $s" | bc -l)
        bw=$(echo "if ($w < $bw) $w else $bw" | bc -l)
        bc=$(echo "if ($c < $bc) $c else $bc" | bc -l)
    done
    printf '%.3f %.3f\n' "$bw" "$bc"
}
printf '%-28s %8s %8s %6s %8s %8s %6s %9s %9s\n' pattern "rg wall" "sp wall" ratio "rg cpu" \
    "sp cpu" ratio "rg lines" "sp lines"
# name | rg flags | pattern | spark JSON flags
while IFS='|' read -r name rgflags pat jflags; do
    [ -z "$name" ] && continue
    rg_lines=$(cd "$tree" && { rg $rgflags -c -- "$pat" . || true; } | awk -F: '{s+=$NF} END {print s+0}')
    pj=$(printf '%s' "$pat" | sed 's/\\/\\\\/g; s/"/\\"/g')
    args="{\"pattern\":\"$pj\",\"max_results\":1000000$jflags}"
    sp_lines=$(cd "$tree" && "$cli" tool search "$args" | grep -o '"match_count":[0-9]*' | cut -d: -f2)
    read -r w_rg c_rg < <(cd "$tree" && best rg $rgflags -- "$pat" .)
    read -r w_sp c_sp < <(cd "$tree" && best "$cli" tool --no-checkpoint search "$args")
    printf '%-28s %8s %8s %6.2f %8s %8s %6.2f %9s %9s\n' "$name" "$w_rg" "$w_sp" \
        "$(echo "$w_sp / $w_rg" | bc -l)" "$c_rg" "$c_sp" "$(echo "$c_sp / $c_rg" | bc -l)" \
        "$rg_lines" "$sp_lines"
done <<'PATTERNS'
literal PyObject_GetAttr|-F|PyObject_GetAttr|,"literal":true
literal rare zzyzx_nothing|-F|zzyzx_nothing|,"literal":true
regex ^#define [A-Z_]+_H$||^#define [A-Z_]+_H$|
regex \w+_alloc\(||\w+_alloc\(|
case-insensitive mutex|-i|mutex|,"case_insensitive":true
case-insensitive literal|-i -F|struct timespec|,"case_insensitive":true,"literal":true
PATTERNS
