// The interface every backend implements. Params arrive validated and
// normalized (src/api.cpp); a backend reports its own failures through fail().
#pragma once

#include <cstddef>

#include "common/kvcache_params.hpp"
#include "common/params.hpp"

namespace flashattn {

namespace cpu {
size_t fwd_workspace_bytes(const FwdParams& params);
fa_status fwd(const FwdParams& params, void* workspace);
size_t bwd_workspace_bytes(const BwdParams& params);
fa_status bwd(const BwdParams& params, void* workspace);
// "cuda-sm90" or "cuda-sm80": the backward kernel family bwd() runs for params.
const char* bwd_kernel_path(const BwdParams& params);
size_t fwd_kvcache_workspace_bytes(const KvCacheParams& params);
fa_status fwd_kvcache(const KvCacheParams& params, void* workspace);
}  // namespace cpu

#if defined(FLASHATTN_WITH_CUDA)
namespace cuda {
// Checks what only the CUDA backend knows (dtype support, device capability).
fa_status check_supported(const AttnParams& params);
size_t fwd_workspace_bytes(const FwdParams& params);
fa_status fwd(const FwdParams& params, void* workspace);
// "cuda-sm90" or "cuda-sm80": the forward kernel family fwd() runs for params.
const char* fwd_kernel_path(const FwdParams& params);
size_t bwd_workspace_bytes(const BwdParams& params);
fa_status bwd(const BwdParams& params, void* workspace);
// "cuda-sm90" or "cuda-sm80": the backward kernel family bwd() runs for params.
const char* bwd_kernel_path(const BwdParams& params);
fa_status check_kvcache_supported(const KvCacheParams& params);
size_t fwd_kvcache_workspace_bytes(const KvCacheParams& params);
fa_status fwd_kvcache(const KvCacheParams& params, void* workspace);
void* device_alloc(size_t bytes, int device_index);
void device_free(void* ptr, int device_index);
}  // namespace cuda
#endif

}  // namespace flashattn
