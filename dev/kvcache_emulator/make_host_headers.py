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
inline void cp_async_commit() {}
template <int kPending> inline void cp_async_wait() {}

""" + kk[b:]
kk = kk.replace("extern __shared__ __align__(16) unsigned char smem[];", "unsigned char* smem = emu::block_smem;")
# Static shared arrays: one static per kernel serves all threads (the emulator runs one block at a time).
kk = kk.replace("__shared__ float weights[", "static float weights[")
kk = kk.replace('#include "cuda/decode/kvcache_launch.hpp"\n',
                "namespace flashattn::cuda::decode { constexpr int kKeysPerTile = 64; constexpr int kMaxSplits = 128; }\n")
open(f"{out}/kvcache_kernel_host.hpp", "w").write(kk)
bm = open(f"{src}/cuda/decode/block_merge.cuh").read()
bm = bm.replace('#include "cuda/decode/kvcache_kernel.cuh"\n', '#include "kvcache_kernel_host.hpp"\n')
open(f"{out}/block_merge_host.hpp", "w").write(bm)
sw = open(f"{src}/cuda/decode/split_kv_warp.cuh").read()
sw = sw.replace('#include "cuda/decode/kvcache_kernel.cuh"\n', '#include "kvcache_kernel_host.hpp"\n')
sw = sw.replace('#include "cuda/decode/kvcache_launch.hpp"\n', "")
sw = sw.replace('#include "cuda/decode/block_merge.cuh"\n', '#include "block_merge_host.hpp"\n')
sw = sw.replace("extern __shared__ __align__(16) uint4 smem_chunks[];",
                "uint4* smem_chunks = reinterpret_cast<uint4*>(emu::block_smem);")
open(f"{out}/split_kv_warp_host.hpp", "w").write(sw)
# The tensor-core kernel: mma.sync and the bf16 pair packing come from mma_shim.hpp.
sm = open(f"{src}/cuda/decode/split_kv_mma.cuh").read()
sm = sm.replace('#include "cuda/decode/kvcache_kernel.cuh"\n', '#include "kvcache_kernel_host.hpp"\n')
sm = sm.replace('#include "cuda/decode/block_merge.cuh"\n', '#include "block_merge_host.hpp"\n')
sm = sm.replace('#include "cuda/decode/kvcache_launch.hpp"\n', "")
sm = sm.replace('#include "cuda/sm80/mma.cuh"\n', '#include "mma_shim.hpp"\n')
sm = sm.replace("extern __shared__ __align__(16) unsigned char smem[];", "unsigned char* smem = emu::block_smem;")
open(f"{out}/split_kv_mma_host.hpp", "w").write(sm)
