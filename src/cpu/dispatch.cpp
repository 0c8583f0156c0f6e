// The four functions of the CPU backend (src/backend.hpp): exact workspace
// sizes and the choice of the ISA build, made once per process from what the
// CPU reports at run time (the library itself is built for the baseline).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend.hpp"
#include "cpu/kernels.hpp"
#include "cpu/scratch.hpp"

namespace flashattn {
namespace cpu {
namespace {

IsaLevel detected_level() {
  if (!avx2_supported()) return IsaLevel::kGeneric;
  if (!avx512_supported()) return IsaLevel::kAvx2;
  if (!avx512_bf16_supported()) return IsaLevel::kAvx512;
  if (!amx_supported()) return IsaLevel::kAvx512Bf16;
  return IsaLevel::kAmx;
}

IsaLevel capped_level() {
  const char* cap = std::getenv("FLASHATTN_CPU_ISA");
  if (cap == nullptr) return IsaLevel::kAmx;
  if (std::strcmp(cap, "generic") == 0) return IsaLevel::kGeneric;
  if (std::strcmp(cap, "avx2") == 0) return IsaLevel::kAvx2;
  if (std::strcmp(cap, "avx512") == 0) return IsaLevel::kAvx512;
  if (std::strcmp(cap, "avx512bf16") == 0) return IsaLevel::kAvx512Bf16;
  return IsaLevel::kAmx;
}

// AMX multiplies bf16: bf16 tensors directly, fp32 and fp16 as split bf16
// pieces (an fp16 value is two bf16 pieces exactly, its third piece is 0;
// measured 1.2-1.7x the AVX-512 FMAs, dev/cpu_tuning.md). AVX2 runs every
// dtype as fp32 FMAs; bf16 tensors take its build with the shorter exp2
// polynomial (avx2_kernels.hpp).
IsaBackend selected_backend(const AttnParams& p) {
  switch (isa_level()) {
    case IsaLevel::kAmx:
      return p.dtype == FA_DTYPE_BF16 ? amx_backend() : amx_split_backend();
    case IsaLevel::kAvx512Bf16:
    case IsaLevel::kAvx512:
      return avx512_backend();
    case IsaLevel::kAvx2:
      return p.dtype == FA_DTYPE_BF16 ? avx2_bf16_backend() : avx2_backend();
    case IsaLevel::kGeneric:
      break;
  }
  return generic_backend();
}

size_t threads_of(const AttnParams& p) { return static_cast<size_t>(p.num_threads > 0 ? p.num_threads : 1); }

}  // namespace

IsaLevel isa_level() {
  static const IsaLevel level = std::min(detected_level(), capped_level());
  return level;
}

// Owned groups from this many (batch, kv head) groups on (bwd_impl.hpp says
// why 16); FLASHATTN_CPU_BWD=split or =groups forces a scheme, so that the
// tests run both on their shapes.
constexpr int64_t kMinOwnedGroups = 16;
BwdScheme bwd_scheme(const AttnParams& p) {
  static const char* const forced = std::getenv("FLASHATTN_CPU_BWD");
  if (forced != nullptr && std::strcmp(forced, "split") == 0) return BwdScheme::kSplitPasses;
  if (forced != nullptr && std::strcmp(forced, "groups") == 0) return BwdScheme::kOwnedGroups;
  return p.batch * p.heads_kv >= kMinOwnedGroups ? BwdScheme::kOwnedGroups : BwdScheme::kSplitPasses;
}

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
