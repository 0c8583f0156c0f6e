"""Turns the CUDA decode headers into host C++ for the emulator (see run.sh).

cp.async becomes a plain 16-byte copy (or zero fill), extern shared arrays point at the emulated
block's shared memory, CUDA includes are dropped, mma.sync comes from mma_shim.hpp; everything else
is compiled as written.
usage: python3 make_host_headers.py SRC_DIR OUT_DIR
"""
import sys

src, out = sys.argv[1], sys.argv[2]
kk = open(f"{src}/cuda/decode/kvcache_kernel.cuh").read()
kk = kk.replace("#include <cuda_bf16.h>\n", "").replace("#include <cuda_fp16.h>\n", "")
a = kk.index("__device__ __forceinline__ void cp_async_16")
b = kk.index("__device__ __forceinline__ float warp_max")
kk = kk[:a] + """inline void cp_async_16(void* smem, const void* gmem, bool valid) {
  if (valid) std::memcpy(smem, gmem, 16); else std::memset(smem, 0, 16);
}
inline void cp_async_16_l2_256(void* smem, const void* gmem, bool valid) { cp_async_16(smem, gmem, valid); }
inline void cp_async_commit() {}
template <int kPending> inline void cp_async_wait() {}

""" + kk[b:]
# Every header: device includes become the host versions written here (or mma_shim.hpp), extern
# shared arrays point at the emulated block's shared memory, static shared arrays become statics
# (one per kernel serves all threads: the emulator runs one block at a time).
REPLACEMENTS = [
    ('#include "cuda/decode/kvcache_kernel.cuh"\n', '#include "kvcache_kernel_host.hpp"\n'),
    ('#include "cuda/decode/block_merge.cuh"\n', '#include "block_merge_host.hpp"\n'),
    ('#include "cuda/decode/query_staging.cuh"\n', '#include "query_staging_host.hpp"\n'),
    ('#include "cuda/sm80/mma.cuh"\n', '#include "mma_shim.hpp"\n'),
    ('#include "cuda/decode/kvcache_launch.hpp"\n', ""),
    ("extern __shared__ __align__(16) unsigned char smem[];", "unsigned char* smem = emu::block_smem;"),
    ("extern __shared__ __align__(16) uint4 smem_chunks[];",
     "uint4* smem_chunks = reinterpret_cast<uint4*>(emu::block_smem);"),
    ("__shared__ float ", "static float "),
    ("__shared__ float4 ", "static float4 "),
]


def write_host(text, name):
    for old, new in REPLACEMENTS:
        text = text.replace(old, new)
    open(f"{out}/{name}", "w").write(text)


# kvcache_kernel.cuh reaches split_plan.hpp's constants (kKeysPerTile, kMaxSplits, and through cache_walk.hpp the
# Ring enum) through kvcache_launch.hpp, which needs the CUDA runtime; the host copy includes split_plan.hpp itself.
kk = kk.replace('#include "cuda/decode/kvcache_launch.hpp"\n', '#include "cuda/decode/split_plan.hpp"\n')
write_host(kk, "kvcache_kernel_host.hpp")
for header, name in (("block_merge.cuh", "block_merge_host.hpp"), ("split_kv_warp.cuh", "split_kv_warp_host.hpp"),
                     ("query_staging.cuh", "query_staging_host.hpp"), ("split_kv_mma.cuh", "split_kv_mma_host.hpp")):
    write_host(open(f"{src}/cuda/decode/{header}").read(), name)
