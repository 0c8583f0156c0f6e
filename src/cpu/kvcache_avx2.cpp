// The AVX2 build of the KV-cache attention (kvcache_impl.hpp). Only this
// file is compiled for AVX2 + FMA + F16C (through the target pragma, never
// -march), and it runs only after kvcache.cpp has seen the features at run
// time. Standard and shared headers come before the pragma, so their inline
// functions stay baseline code; the implementation after it has internal
// linkage.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "backend.hpp"
#include "common/half.hpp"
#include "common/kvcache_params.hpp"
#include "cpu/config.hpp"

#pragma GCC target("avx2,fma,f16c")

// The chunk's two products in intrinsics (kvcache_chunk_avx2.hpp).
#define FLASHATTN_KVCACHE_AVX2 1
#include "cpu/kvcache_impl.hpp"

namespace flashattn {
namespace cpu {

fa_status fwd_kvcache_avx2(const KvCacheParams& params, void* workspace) { return run_kvcache(params, workspace); }

}  // namespace cpu
}  // namespace flashattn
