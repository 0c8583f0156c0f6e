// The KV-cache entry points of the CPU backend (src/backend.hpp): the exact
// workspace size and the choice between the baseline, the AVX2, the AVX-512
// and (bf16 caches) the AVX512-BF16 builds of kvcache_impl.hpp, made from the
// same ISA level as the forward (kernels.hpp: run-time features, capped by
// FLASHATTN_CPU_ISA).
#include "backend.hpp"
#include "cpu/kernels.hpp"
#include "cpu/kvcache_impl.hpp"

namespace flashattn {
namespace cpu {

fa_status fwd_kvcache_avx2(const KvCacheParams& params, void* workspace);    // kvcache_avx2.cpp
fa_status fwd_kvcache_avx512(const KvCacheParams& params, void* workspace);  // kvcache_avx512.cpp
fa_status fwd_kvcache_avx512_bf16(const KvCacheParams& params, void* workspace);  // kvcache_avx512bf16.cpp

// Every build carves the same layout, so the size does not depend on the choice.
size_t fwd_kvcache_workspace_bytes(const KvCacheParams& params) { return kvcache_workspace_bytes(params); }

fa_status fwd_kvcache(const KvCacheParams& params, void* workspace) {
  switch (isa_level()) {
    case IsaLevel::kAvx512Bf16:
      if (params.dtype == FA_DTYPE_BF16) return fwd_kvcache_avx512_bf16(params, workspace);
      return fwd_kvcache_avx512(params, workspace);
    // An AMX CPU keeps the AVX-512 build for bf16 caches too: the AVX512-BF16 build was timed
    // on a Zen 4 only (dev/cpu_tuning.md, session 27); FLASHATTN_CPU_ISA=avx512bf16 picks it.
    case IsaLevel::kAmx:
    case IsaLevel::kAvx512:
      return fwd_kvcache_avx512(params, workspace);
    case IsaLevel::kAvx2:
      return fwd_kvcache_avx2(params, workspace);
    case IsaLevel::kGeneric:
      break;
  }
  return run_kvcache(params, workspace);
}

}  // namespace cpu
}  // namespace flashattn
