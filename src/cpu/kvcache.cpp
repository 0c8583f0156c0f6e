// The KV-cache entry points of the CPU backend (src/backend.hpp): the exact
// workspace size and the choice between the baseline and the AVX-512 build of
// kvcache_impl.hpp, made from what the CPU reports at run time
// (FLASHATTN_CPU_ISA=generic keeps the baseline build, as for the forward).
#include <cstdlib>
#include <cstring>

#include "backend.hpp"
#include "cpu/kernels.hpp"
#include "cpu/kvcache_impl.hpp"

namespace flashattn {
namespace cpu {

fa_status fwd_kvcache_avx512(const KvCacheParams& params, void* workspace);  // kvcache_avx512.cpp

namespace {

bool use_avx512() {
  static const bool use = [] {
    const char* cap = std::getenv("FLASHATTN_CPU_ISA");
    return avx512_supported() && !(cap != nullptr && std::strcmp(cap, "generic") == 0);
  }();
  return use;
}

}  // namespace

// Both builds carve the same layout, so the size does not depend on the choice.
size_t fwd_kvcache_workspace_bytes(const KvCacheParams& params) { return kvcache_workspace_bytes(params); }

fa_status fwd_kvcache(const KvCacheParams& params, void* workspace) {
  return use_avx512() ? fwd_kvcache_avx512(params, workspace) : run_kvcache(params, workspace);
}

}  // namespace cpu
}  // namespace flashattn
