#!/usr/bin/env bash
# Emulates the decode kernels on the CPU under AddressSanitizer (no GPU needed):
#   bash dev/kvcache_emulator/run.sh        from the repository root
# Arguments of a case: S page splits kernel [head dim] [reversed table] [padded strides] [left pad] (main.cpp).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
python3 "$root/dev/kvcache_emulator/make_host_headers.py" "$root/src" "$work"
cp "$root/dev/kvcache_emulator/shim.hpp" "$root/dev/kvcache_emulator/mma_shim.hpp" "$root/dev/kvcache_emulator/main.cpp" "$work/"
g++ -std=c++20 -O1 -g -fsanitize=address -pthread -I"$root/src" -I"$root/include" -I"$work" "$work/main.cpp" -o "$work/emu"
cases=("300" "4096" "1008 16" "1000 16 7" "4096 0 28" "37 1 3" "5 0 2" "0 0 1" "0 0 4" "300 0 1 1" "1000 16 5 1"
  "300 0 1 2" "1000 16 7 2" "37 1 3 2" "4096 0 28 2" "0 0 4 2" "5 0 2 2")
# The mma kernel's page walks (cache_walk.hpp): pages around one slab (15 short, 16 and 17 long) and
# longer, key counts that end inside a slab, 1-7 splits; reversed block tables, padded strides, hdim 64,
# left pads (a lane's streams straddle pages of 16 rows only then).
cases+=("1000 15 3 2" "1000 16 1 2" "1003 17 7 2" "777 24 5 2" "1000 48 2 2" "1500 100 4 2" "2500 1000 6 2"
  "1000 15 2 2 128 1" "1000 16 3 2 128 1" "1003 17 7 2 128 1 1" "777 24 5 2 128 1" "1000 48 1 2 128 1 1"
  "2500 1000 6 2 128 1 1" "1000 0 3 2 128 0 1"
  "300 0 1 2 64" "1000 0 5 2 64 0 1" "1000 15 4 2 64 1" "1000 16 3 2 64" "1003 17 7 2 64 1" "600 48 1 2 64 1 1"
  "2500 1000 5 2 64 1"
  "1000 16 3 2 128 0 0 5" "1003 17 7 2 128 1 1 9" "777 16 2 2 64 1 0 3" "1000 100 4 2 128 0 0 90"
  "500 0 2 2 128 0 0 7" "1000 15 3 2 128 1 0 4")
# The contiguous walk with the L2's 256-byte fetch (kContiguousWide): the same bits as the plain walk's cases.
cases+=("4096 0 28 2 128 0 0 0 3" "1000 0 3 2 128 0 1 0 3" "300 0 1 2 64 0 0 0 3" "500 0 2 2 128 0 0 7 3")
# The compact ring's instance on every walk.
cases+=("300 0 1 2 128 0 0 0 2" "1000 0 3 2 128 0 1 0 2" "1000 16 3 2 128 1 0 5 2" "1003 17 7 2 128 1 1 9 2"
  "1000 15 3 2 128 1 0 4 2" "2500 1000 6 2 128 1 1 0 2" "1000 16 3 2 64 0 0 0 2")
for args in "${cases[@]}"; do
  "$work/emu" $args
done
