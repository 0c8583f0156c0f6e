#!/usr/bin/env bash
# Builds the library (with CUDA when nvcc is found) and runs the demo on the
# default device: the GPU when one is present, else the CPU. Arguments go to
# the demo (see examples/demo.cpp).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$root/build" -j "${FLASHATTN_JOBS:-$(nproc)}" --target demo
"$root/build/examples/demo" "$@"
