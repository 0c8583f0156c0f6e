// The KV-cache attention (kvcache_impl.hpp) for bf16 caches on CPUs with
// AVX512-BF16: the chunk's products on VDPBF16PS (kvcache_chunk_bf16.hpp),
// K and V read as bf16 where they lie in the cache. As kvcache_avx512.cpp,
// only this file is compiled for the extension (through the target pragma),
// and it runs only after kvcache.cpp has seen the features at run time.
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

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

// As in kvcache_avx512.cpp: GCC 12's intrinsic headers seed results with
// `__m512 __Y = __Y;` and warn about it where they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#define FLASHATTN_KVCACHE_AVX512 1
#define FLASHATTN_KVCACHE_BF16_DOT 1
#include "cpu/kvcache_impl.hpp"

namespace flashattn {
namespace cpu {

fa_status fwd_kvcache_avx512_bf16(const KvCacheParams& params, void* workspace) {
  return run_kvcache(params, workspace);
}

}  // namespace cpu
}  // namespace flashattn

#pragma GCC diagnostic pop
