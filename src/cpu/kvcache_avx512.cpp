// The AVX-512 build of the KV-cache attention (kvcache_impl.hpp). Only this
// file is compiled for AVX-512 (through the target pragma, never -march), and
// it runs only after kvcache.cpp has seen the features at run time. Standard
// and shared headers come before the pragma, so their inline functions stay
// baseline code; the implementation after it has internal linkage.
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

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")

// GCC 12's intrinsic headers seed results with `__m512 __Y = __Y;` and then
// warn about it where they are inlined; the warnings say nothing about this file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The chunk's two products in intrinsics (kvcache_chunk_avx512.hpp).
#define FLASHATTN_KVCACHE_AVX512 1
#include "cpu/kvcache_impl.hpp"

namespace flashattn {
namespace cpu {

fa_status fwd_kvcache_avx512(const KvCacheParams& params, void* workspace) { return run_kvcache(params, workspace); }

}  // namespace cpu
}  // namespace flashattn

#pragma GCC diagnostic pop
