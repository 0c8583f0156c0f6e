#!/usr/bin/env bash
# Builds the library and runs every test that can run here: the Release
# build's full suite, then the AddressSanitizer + UBSan build's suite without
# the tests labelled `slow`. GPU tests skip themselves, with the reason, where
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
