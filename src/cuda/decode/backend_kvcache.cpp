// The KV-cache entry points of the CUDA backend (src/backend.hpp): what only
// CUDA knows (dtype, compiled head dims, alignment), the split-KV plan and its
// exact workspace, and the dispatch to the (dtype, head-dim class) launchers.
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <type_traits>

#include "backend.hpp"
#include "cuda/decode/kvcache_launch.hpp"
#include "flashattn_cuda_config.hpp"  // generated: FLASHATTN_CUDA_HAS_HEADDIM_<d>, _HAS_FP16, _HAS_BF16, _DECODE_KERNEL

namespace flashattn::cuda {
namespace {

using decode::KvCachePlan;

constexpr size_t kAlignment = 256;
using decode::kMaxSplits;

size_t align_up(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// Head-dim classes of the decode kernel: 64, 128, 256 (a 192 build serves D <= 128 only).
int kvcache_head_dim_class(int64_t head_dim, int64_t head_dim_v) {
  const int64_t needed = std::max(head_dim, head_dim_v);
  const int classes[] = {
#if FLASHATTN_CUDA_HAS_HEADDIM_64
      64,
#endif
#if FLASHATTN_CUDA_HAS_HEADDIM_128
      128,
#endif
#if FLASHATTN_CUDA_HAS_HEADDIM_256
      256,
#endif
      0};
  for (int value : classes)
    if (value >= needed) return value;
  return 0;
}

// The DRAM's peak bandwidth in bytes per second from the device's attributes (0 where it does not
// say): double data rate over the bus, the memory clock in kHz. H100 SXM 3.35e12, H200 4.8e12.
double dram_bytes_per_second(int device_index) {
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device_index) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device_index) != cudaSuccess) {
    cudaGetLastError();  // an attribute this driver does not report: no bandwidth rule, not an error
    return 0.0;
  }
  return 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
}

// The L2's 256-byte fetch was measured faster on the H100 (3.35 TB/s) and slower on the H200 (4.8 TB/s);
// a GPU whose bandwidth is unknown keeps the sector fetch.
bool wide_fetch_pays(double dram_bytes_per_second) {
  return dram_bytes_per_second > 0.0 && dram_bytes_per_second < 4.0e12;
}

fa_status make_plan(const KvCacheParams& p, KvCachePlan* plan) {
  const int64_t rows = p.seqlen_q * (p.heads / p.heads_kv);
  const int head_dim_class = kvcache_head_dim_class(p.head_dim, p.head_dim_v);
  const decode::DecodeKernel kernel = decode::decode_kernel(FLASHATTN_CUDA_DECODE_KERNEL, head_dim_class);
  const int block_rows = decode::rows_per_block(rows, kernel);
  plan->row_blocks = static_cast<int>(std::max<int64_t>(1, (rows + block_rows - 1) / block_rows));
  plan->rows_padded = plan->row_blocks * block_rows;
  const int64_t blocks = p.batch * p.heads_kv * plan->row_blocks;
  const int64_t max_by_keys = std::max<int64_t>(1, (p.capacity + decode::kKeysPerTile - 1) / decode::kKeysPerTile);
  int sm_count = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, p.device_index));
  FA_CUDA_CHECK(
      cudaDeviceGetAttribute(&plan->smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, p.device_index));
  plan->ring = decode::mma_ring(head_dim_class, plan->smem_per_block);
  const double dram = dram_bytes_per_second(p.device_index);  // the split rule's and the fetch rule's
  if (p.num_splits > 0) {
    plan->splits = static_cast<int>(std::min<int64_t>({p.num_splits, max_by_keys, kMaxSplits}));
  } else {
    const int slots = sm_count * decode::split_blocks_per_sm(rows, kernel, head_dim_class, p.paged);
    // The DRAM rule for the mma kernel, whose blocks' bytes in flight it counts (paged: dram_rule_covers).
    const bool unsplit_draws_the_dram =
        kernel == decode::DecodeKernel::kMma && decode::dram_rule_covers(p.paged, p.capacity) &&
        decode::grid_draws_the_dram(blocks, decode::mma_bytes_in_flight(plan->ring, head_dim_class), dram);
    plan->splits = decode::choose_splits(blocks, p.capacity, slots, unsplit_draws_the_dram);
  }
  // Where more blocks than SMs stream a contiguous cache, two share an SM and the DRAM serves a row's
  // chunks at once if the L2 fetches the row: H100, session 31 (v23), B = 64 0.4-0.7 % faster at 32k
  // and 128k keys, and B = 8 128k (64 blocks, one an SM) 0.45-0.9 % slower, which keeps the sector fetch.
  // On the H200 the same fetch read 2.5-6.4 % behind cuDNN where the sector fetch is level with it
  // (session 32 runs 7-8): only below 4 TB/s. Session 38, H100: B = 64 0.3-0.6 % faster, level with cuDNN.
  const decode::FetchRequest fetch = decode::requested_fetch();
  const bool wide_by_rule = int64_t(plan->splits) * blocks > sm_count && wide_fetch_pays(dram);
  plan->wide_fetch = kernel == decode::DecodeKernel::kMma && !p.paged &&
                     (fetch == decode::FetchRequest::kWide || (fetch == decode::FetchRequest::kRule && wide_by_rule));
  if (plan->splits > 1) {
    const size_t partial_rows = size_t(plan->splits) * size_t(p.batch * p.heads_kv) * plan->rows_padded;
    plan->o_partial_bytes = partial_rows * size_t(p.head_dim_v) * sizeof(float);
    plan->lse_partial_bytes = partial_rows * sizeof(float);
    plan->lse_offset = align_up(plan->o_partial_bytes);
    plan->total = plan->lse_offset + plan->lse_partial_bytes;
  }
  return FA_OK;
}

fa_status check_aligned(const char* name, const void* data, const TensorLayout& layout, bool present) {
  if (!present) return FA_OK;
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0 || layout.batch % 8 != 0 || layout.row % 8 != 0 ||
      layout.head % 8 != 0)
    return fail(FA_ERROR_UNSUPPORTED,
                "%s: the CUDA backend expects a 16-byte aligned data pointer and batch/row/head strides that are "
                "multiples of 8 elements, got pointer %p and strides (%" PRId64 ", %" PRId64 ", %" PRId64 ")",
                name, data, layout.batch, layout.row, layout.head);
  return FA_OK;
}

template <class Tag, class Fn>
fa_status dispatch_head_dim(int head_dim_class, Fn&& fn) {
#if FLASHATTN_CUDA_HAS_HEADDIM_64
  if (head_dim_class == 64) return fn(Tag{}, std::integral_constant<int, 64>{});
#endif
#if FLASHATTN_CUDA_HAS_HEADDIM_128
  if (head_dim_class == 128) return fn(Tag{}, std::integral_constant<int, 128>{});
#endif
#if FLASHATTN_CUDA_HAS_HEADDIM_256
  if (head_dim_class == 256) return fn(Tag{}, std::integral_constant<int, 256>{});
#endif
  (void)fn;
  return fail(FA_ERROR_INTERNAL, "kvcache: head-dim class %d: expected a compiled class", head_dim_class);
}

template <class Fn>
fa_status dispatch(const KvCacheParams& p, Fn&& fn) {
  const int head_dim_class = kvcache_head_dim_class(p.head_dim, p.head_dim_v);
#if FLASHATTN_CUDA_HAS_FP16
  if (p.dtype == FA_DTYPE_FP16) return dispatch_head_dim<fp16_tag>(head_dim_class, fn);
#endif
#if FLASHATTN_CUDA_HAS_BF16
  if (p.dtype == FA_DTYPE_BF16) return dispatch_head_dim<bf16_tag>(head_dim_class, fn);
#endif
  (void)fn;
  return fail(FA_ERROR_INTERNAL, "kvcache: dtype code %d: expected a compiled dtype", static_cast<int>(p.dtype));
}

}  // namespace

fa_status check_kvcache_supported(const KvCacheParams& p) {
  FA_TRY(check_dtype_and_device(p.dtype, p.device_index));
  if (kvcache_head_dim_class(p.head_dim, p.head_dim_v) == 0)
    return fail(FA_ERROR_UNSUPPORTED,
                "q: head dims D = %" PRId64 ", Dv = %" PRId64
                " need a decode head-dim class (64, 128, 256) this build did not compile (FLASHATTN_CUDA_HEADDIMS)",
                p.head_dim, p.head_dim_v);
  if (p.head_dim % 8 != 0 || p.head_dim_v % 8 != 0)
    return fail(FA_ERROR_UNSUPPORTED,
                "q: the CUDA decode kernels copy 16-byte chunks of a head: expected D and Dv multiples of 8, got "
                "D = %" PRId64 ", Dv = %" PRId64,
                p.head_dim, p.head_dim_v);
  if (p.capacity > INT32_MAX)
    return fail(FA_ERROR_UNSUPPORTED, "k_cache: cache capacities beyond 2^31 - 1 positions are not supported on CUDA");
  FA_TRY(check_aligned("k_cache", p.k_cache, p.k_cache_layout, p.cache_batch > 0));
  FA_TRY(check_aligned("v_cache", p.v_cache, p.v_cache_layout, p.cache_batch > 0));
  return FA_OK;
}

size_t fwd_kvcache_workspace_bytes(const KvCacheParams& p) {
  KvCachePlan plan;
  return make_plan(p, &plan) == FA_OK ? plan.total : 0;
}

fa_status fwd_kvcache(const KvCacheParams& p, void* workspace) {
  int previous = 0;
  FA_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != p.device_index) FA_CUDA_CHECK(cudaSetDevice(p.device_index));
  KvCachePlan plan;
  fa_status status = make_plan(p, &plan);
  if (status == FA_OK) {
    status = dispatch(p, [&](auto tag, auto head_dim) {
      return decode::run_kvcache<decltype(tag), decltype(head_dim)::value>(p, plan, workspace,
                                                                            static_cast<cudaStream_t>(p.stream));
    });
  }
  if (previous != p.device_index) cudaSetDevice(previous);
  return status;
}

}  // namespace flashattn::cuda
