#!/usr/bin/env bash
# Emulates the decode kernels on the CPU under AddressSanitizer (no GPU needed):
#   bash dev/kvcache_emulator/run.sh        from the repository root
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
python3 "$root/dev/kvcache_emulator/make_host_headers.py" "$root/src" "$work"
cp "$root/dev/kvcache_emulator/shim.hpp" "$root/dev/kvcache_emulator/mma_shim.hpp" "$root/dev/kvcache_emulator/main.cpp" "$work/"
g++ -std=c++20 -O1 -g -fsanitize=address -pthread -I"$root/src" -I"$root/include" -I"$work" "$work/main.cpp" -o "$work/emu"
for args in "300" "4096" "1008 16" "1000 16 7" "4096 0 28" "37 1 3" "5 0 2" "0 0 1" "0 0 4" "300 0 1 1" "1000 16 5 1" \
  "300 0 1 2" "1000 16 7 2" "37 1 3 2" "4096 0 28 2" "0 0 4 2" "5 0 2 2"; do
  "$work/emu" $args
done
