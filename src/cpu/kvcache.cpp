// The KV-cache entry points of the CPU backend (src/backend.hpp): the exact
// workspace size and the choice between the baseline, the AVX2 and the
// AVX-512 builds of kvcache_impl.hpp, made from the same ISA level as the
// forward (kernels.hpp: run-time features, capped by FLASHATTN_CPU_ISA).
#include "backend.hpp"
#include "cpu/kernels.hpp"
#include "cpu/kvcache_impl.hpp"

namespace flashattn {
namespace cpu {

fa_status fwd_kvcache_avx2(const KvCacheParams& params, void* workspace);    // kvcache_avx2.cpp
fa_status fwd_kvcache_avx512(const KvCacheParams& params, void* workspace);  // kvcache_avx512.cpp

// Every build carves the same layout, so the size does not depend on the choice.
size_t fwd_kvcache_workspace_bytes(const KvCacheParams& params) { return kvcache_workspace_bytes(params); }

fa_status fwd_kvcache(const KvCacheParams& params, void* workspace) {
  switch (isa_level()) {
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
