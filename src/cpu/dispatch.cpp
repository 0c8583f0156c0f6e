// The four functions of the CPU backend (src/backend.hpp): exact workspace
// sizes and the choice of the ISA build, made once per process from what the
// CPU reports at run time (the library itself is built for the baseline).
#include <cstdlib>
#include <cstring>

#include "backend.hpp"
#include "cpu/kernels.hpp"
#include "cpu/scratch.hpp"

namespace flashattn {
namespace cpu {
namespace {

// FLASHATTN_CPU_ISA=generic or =avx512 caps the choice (to test the
// portable and the AVX-512 builds on a machine that has more).
enum class IsaLevel { kGeneric, kAvx512, kAmx };

IsaLevel isa_level() {
  static const IsaLevel level = [] {
    const char* cap = std::getenv("FLASHATTN_CPU_ISA");
    const bool cap_generic = cap != nullptr && std::strcmp(cap, "generic") == 0;
    const bool cap_avx512 = cap != nullptr && std::strcmp(cap, "avx512") == 0;
    if (cap_generic || !avx512_supported()) return IsaLevel::kGeneric;
    if (cap_avx512 || !amx_supported()) return IsaLevel::kAvx512;
    return IsaLevel::kAmx;
  }();
  return level;
}

// AMX multiplies bf16: bf16 tensors directly, fp32 as split bf16 pieces;
// fp16 stays on AVX-512 FMAs.
IsaBackend selected_backend(const AttnParams& p) {
  const IsaLevel level = isa_level();
  if (level == IsaLevel::kAmx && p.dtype == FA_DTYPE_BF16) return amx_backend();
  if (level == IsaLevel::kAmx && p.dtype == FA_DTYPE_FP32) return amx_split_backend();
  return level == IsaLevel::kGeneric ? generic_backend() : avx512_backend();
}

size_t threads_of(const AttnParams& p) { return static_cast<size_t>(p.num_threads > 0 ? p.num_threads : 1); }

}  // namespace

// Layout: [alignment slack][staged K/V][per-thread regions]; see scratch.hpp.
size_t fwd_workspace_bytes(const FwdParams& params) {
  return kWorkspaceSlack + fwd_shared_bytes(params) + threads_of(params) * fwd_thread_bytes(params);
}

fa_status fwd(const FwdParams& params, void* workspace) { return selected_backend(params).fwd(params, workspace); }

// Layout: [alignment slack][staged rows][per-thread regions].
size_t bwd_workspace_bytes(const BwdParams& params) {
  return kWorkspaceSlack + bwd_shared_bytes(params) + threads_of(params) * bwd_thread_bytes(params);
}

fa_status bwd(const BwdParams& params, void* workspace) { return selected_backend(params).bwd(params, workspace); }

}  // namespace cpu
}  // namespace flashattn
