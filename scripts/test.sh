#!/usr/bin/env bash
# Install, build and run every test: the README's test command, and what CI runs.
#   1. dependencies (scripts/install-deps.sh)
#   2. release build with -Werror (CUDA compiled when nvcc is present), all tests
#   3. an engine-only build (SPARK_ENGINE_ONLY=ON), its unit tests
#   4. an ASan+UBSan build of the C code (CUDA off: the sanitizers do not cover device code),
#      all tests but the `slow` label
# Environment: SPARK_CUDA_ARCHS (default 90: one architecture keeps CI inside its time budget),
#              SPARK_JOBS (default: all cores), SPARK_SKIP_SANITIZE=1 to skip step 4 locally.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${SPARK_JOBS:-$(nproc)}
archs=${SPARK_CUDA_ARCHS:-90}

scripts/install-deps.sh

# ctest, then the reason each skipped test printed: a skip must never hide in a green run.
run_ctest() {
    local dir=$1; shift
    set +e
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" "$@" 2>&1 | tee "$dir/ctest.log"
    local rc=${PIPESTATUS[0]}
    set -e
    local t
    for t in $(sed -nE 's/.*Test +#[0-9]+: ([^ ]+) .*\*\*\*(Skipped|Not Run).*/\1/p' "$dir/ctest.log"); do
        echo "-- skipped $t: $(ctest --test-dir "$dir" -R "^${t}\$" -V 2>&1 \
            | sed -nE 's/^[0-9]+: //p' | grep -vE "^(Test command|Test timeout)" | tail -n 1 | tr '\n' ' ')"
    done
    return "$rc"
}

echo "== build (release, -Werror) =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARK_WERROR=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$archs" >/dev/null
cmake --build build -j "$jobs"
echo "== tests (release) =="
run_ctest build

echo "== build (engine only: C compiler, pthreads, libm; what the GPU machine builds) =="
cmake -S . -B build-engine-only -G Ninja -DSPARK_ENGINE_ONLY=ON -DSPARK_CUDA=OFF \
    -DSPARK_WERROR=ON >/dev/null
cmake --build build-engine-only -j "$jobs"
run_ctest build-engine-only -L unit

if [ "${SPARK_SKIP_SANITIZE:-0}" != 1 ]; then
    echo "== build (ASan + UBSan) =="
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSPARK_WERROR=ON \
        -DSPARK_SANITIZE=ON -DSPARK_CUDA=OFF -DCMAKE_C_COMPILER=clang >/dev/null
    cmake --build build-asan -j "$jobs"
    echo "== tests (ASan + UBSan) =="
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_ctest build-asan -LE slow
fi
echo "== all tests passed =="
