"""Turns the CUDA decode headers into host C++ for the emulator (see run.sh).

cp.async becomes a plain 16-byte copy (or zero fill), extern shared arrays point at the emulated
block's shared memory, CUDA includes are dropped; everything else is compiled as written.
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
open(f"{out}/kvcache_kernel_host.hpp", "w").write(kk)
sw = open(f"{src}/cuda/decode/split_kv_warp.cuh").read()
sw = sw.replace('#include "cuda/decode/kvcache_kernel.cuh"\n', '#include "kvcache_kernel_host.hpp"\n')
sw = sw.replace('#include "cuda/decode/kvcache_launch.hpp"\n', "namespace flashattn::cuda::decode { constexpr int kKeysPerTile = 64; }\n")
sw = sw.replace("extern __shared__ __align__(16) uint4 smem_chunks[];",
                "uint4* smem_chunks = reinterpret_cast<uint4*>(emu::block_smem);")
open(f"{out}/split_kv_warp_host.hpp", "w").write(sw)
