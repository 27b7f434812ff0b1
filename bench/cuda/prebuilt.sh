#!/usr/bin/env bash
# Pack a local engine-only sm_90 build (BUILD, default build-pgemm) for a device call, so the call
# links instead of compiling (~100 s of device time less): libengine.a, the gpu tests' and
# spark-agent's objects, bench_decode.o and bench_q35.o, as OUT (default .clean2/pre.tgz; a name
# ending in .txz: xz, ~30% smaller, so three packs fit the device tool's carry). The
# call: PREBUILT=../.clean2/pre.tgz bash bench/cuda/s5_call.sh PLAN (carry .clean2 too). The
# build must be of the exported commit's tree (checked: its COMMIT file against HEAD).
set -eo pipefail
B=${1:-build-pgemm}
OUT=${2:-.clean2/pre.tgz}
ninja -C "$B" spark-agent $(cd "$B" && ctest -N -L gpu | awk '/Test +#/ {print "tests/engine/" $3}')
for b in bench_decode bench_q35; do
    cc -O2 -std=c17 -D_GNU_SOURCE -Iengine -c bench/cuda/$b.c -o "$B/$b.o"
done
git diff --quiet HEAD -- engine tests agent || { echo "prebuilt: the tree differs from HEAD" >&2; exit 1; }
git rev-parse --short HEAD >"$B/PREBUILT_COMMIT"
mkdir -p "$(dirname "$OUT")"
case $OUT in
*.txz) Z="xz -9 -T0" ;;
*) Z="gzip" ;;
esac
(cd "$B" && tar -cf - PREBUILT_COMMIT engine/libengine.a tests/engine/libengine_test_support.a \
    bench_decode.o bench_q35.o agent/cli/CMakeFiles/spark-agent.dir/*.o \
    tests/engine/CMakeFiles/test_cuda_*.dir/*.o) | $Z >"$OUT"
ls -la "$OUT"
