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

echo "== build (release, -Werror) =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARK_WERROR=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$archs" >/dev/null
cmake --build build -j "$jobs"
echo "== tests (release) =="
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== build (engine only: C compiler, pthreads, libm; what the GPU machine builds) =="
cmake -S . -B build-engine-only -G Ninja -DSPARK_ENGINE_ONLY=ON -DSPARK_CUDA=OFF \
    -DSPARK_WERROR=ON >/dev/null
cmake --build build-engine-only -j "$jobs"
ctest --test-dir build-engine-only --output-on-failure -j "$jobs" -L unit

if [ "${SPARK_SKIP_SANITIZE:-0}" != 1 ]; then
    echo "== build (ASan + UBSan) =="
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSPARK_WERROR=ON \
        -DSPARK_SANITIZE=ON -DSPARK_CUDA=OFF -DCMAKE_C_COMPILER=clang >/dev/null
    cmake --build build-asan -j "$jobs"
    echo "== tests (ASan + UBSan) =="
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE slow
fi
echo "== all tests passed =="
