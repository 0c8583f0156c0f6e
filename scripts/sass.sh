#!/usr/bin/env bash
# SASS of a CUDA object or library without a GPU or a CUDA toolkit's cuobjdump: fetches NVIDIA's
# cuobjdump and nvdisasm wheels from PyPI once (into build-deps/cuobjdump, ignored by git) and runs
# cuobjdump, which finds nvdisasm beside it.
#   bash scripts/sass.sh build/CMakeFiles/flashattn.dir/src/cuda/generated/kvcache_bf16_hdim128.cu.o > k.sass
#   bash scripts/sass.sh --list build/libflashattn.so        (the cubins it holds, one per architecture and unit)
# The cubin's own SASS: instruction counts, LDGSTS / LDSM / HMMA / HGMMA, spills (ptxas -v says registers).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tool_dir="$root/build-deps/cuobjdump"
tool=$(find "$tool_dir" -type f -name cuobjdump 2>/dev/null | head -1 || true)
if [ -z "$tool" ]; then
  mkdir -p "$tool_dir"
  python3 -m pip download --quiet --no-deps -d "$tool_dir" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  for wheel in "$tool_dir"/*.whl; do python3 -m zipfile -e "$wheel" "$tool_dir/wheels"; done
  tool=$(find "$tool_dir" -type f -name cuobjdump | head -1)
  chmod +x "$tool" "$(dirname "$tool")/nvdisasm"
fi
if [ "${1:-}" = "--list" ]; then
  shift
  exec "$tool" -lelf "$@"
fi
exec "$tool" -sass "$@"
