#!/usr/bin/env bash
# Builds the library and runs every test that can run here: the Release
# build's full suite, the AddressSanitizer + UBSan build's suite without the
# tests labelled `slow`, then the Python package's tests. GPU tests skip themselves, with the reason, where
# no GPU is present. Installs missing build tools first (scripts/setup.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
jobs=${FLASHATTN_JOBS:-$(nproc)}

cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$root/build" -j "$jobs"
ctest --test-dir "$root/build" --output-on-failure -j 1

cmake -S "$root" -B "$root/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLASHATTN_SANITIZE=ON -DFLASHATTN_CUDA=OFF -DFLASHATTN_BUILD_BENCH=OFF
cmake --build "$root/build-asan" -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$root/build-asan" --output-on-failure -j 1 -LE slow

# The Python package: pip install ./ and pytest. Without a GPU the package is
# built CPU-only (the C++ build above already compiled every CUDA kernel).
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  python_cuda=${FLASHATTN_CUDA:-AUTO}
else
  python_cuda=${FLASHATTN_CUDA:-OFF}
fi
FLASHATTN_CUDA=$python_cuda bash "$root/python/ci_test.sh"
