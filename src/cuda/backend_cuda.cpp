// The flashattn::cuda backend: what only CUDA knows (dtype support, device,
// alignment), the exact workspace layout, and the dispatch from runtime
// params to the compiled (dtype, head-dim class, diagonal mask) launchers.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend.hpp"
#include "cuda/launch.hpp"
#include "cuda/sm90/tensor_map.hpp"
#include "cuda/tile_config.hpp"
#include "flashattn_cuda_config.hpp"  // generated: FLASHATTN_CUDA_HAS_HEADDIM_<d>, _HAS_FP16, _HAS_BF16

namespace flashattn::cuda {
namespace {

constexpr size_t kWorkspaceAlignment = 256;
// dQ is accumulated in fp32 for at most this many bytes at a time; longer
// problems run the backward in passes over slices of query heads, which keeps
// the extra memory of a long-sequence backward near the O(N) floor.
constexpr size_t kDqAccumBudgetBytes = size_t(256) << 20;

size_t align_up(size_t bytes) { return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment; }

bool dtype_compiled(fa_dtype dtype) {
  return (dtype == FA_DTYPE_FP16 && FLASHATTN_CUDA_HAS_FP16) || (dtype == FA_DTYPE_BF16 && FLASHATTN_CUDA_HAS_BF16);
}

template <class Fn>
fa_status dispatch_dtype(fa_dtype dtype, Fn&& fn) {
#if FLASHATTN_CUDA_HAS_FP16
  if (dtype == FA_DTYPE_FP16) return fn(fp16_tag{});
#endif
#if FLASHATTN_CUDA_HAS_BF16
  if (dtype == FA_DTYPE_BF16) return fn(bf16_tag{});
#endif
  (void)fn;
  return fail(FA_ERROR_UNSUPPORTED, "q: dtype %s is not supported by this CUDA build", dtype == FA_DTYPE_FP16 ? "fp16" : "bf16");
}

template <class Fn>
fa_status dispatch_bool(bool value, Fn&& fn) {
  return value ? fn(std::true_type{}) : fn(std::false_type{});
}

template <class Fn>
fa_status dispatch_head_dim(int head_dim_class_value, Fn&& fn) {
  switch (head_dim_class_value) {
#if FLASHATTN_CUDA_HAS_HEADDIM_64
    case 64: return fn(std::integral_constant<int, 64>{});
#endif
#if FLASHATTN_CUDA_HAS_HEADDIM_128
    case 128: return fn(std::integral_constant<int, 128>{});
#endif
#if FLASHATTN_CUDA_HAS_HEADDIM_192
    case 192: return fn(std::integral_constant<int, 192>{});
#endif
#if FLASHATTN_CUDA_HAS_HEADDIM_256
    case 256: return fn(std::integral_constant<int, 256>{});
#endif
    default: break;
  }
  return fail(FA_ERROR_INTERNAL, "head-dim class %d: expected a compiled class", head_dim_class_value);
}

// Causal or sliding window: tiles near a diagonal need the full mask.
bool mask_diagonal(const AttnParams& params) { return params.window_left >= 0 || params.window_right >= 0; }

// Makes device_index current for the call and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device_index) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device_index) {
      status_ = cudaSetDevice(device_index);
      switched_ = status_ == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = 0;
  bool switched_ = false;
  cudaError_t status_ = cudaSuccess;
};

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }
bool strides_multiple_of_8(const TensorLayout& layout) {
  return layout.batch % 8 == 0 && layout.row % 8 == 0 && layout.head % 8 == 0;
}

// Rows are moved in 16-byte chunks. An empty tensor is never read or written.
fa_status check_operand(const char* name, const void* data, const TensorLayout& layout, int64_t rows) {
  if (rows == 0) return FA_OK;
  if (!aligned16(data) || !strides_multiple_of_8(layout))
    return fail(FA_ERROR_UNSUPPORTED,
                "%s: the CUDA backend expects a 16-byte aligned data pointer and batch/row/head strides that are "
                "multiples of 8 elements, got pointer %p and strides (%" PRId64 ", %" PRId64 ", %" PRId64 ")",
                name, data, layout.batch, layout.row, layout.head);
  return FA_OK;
}

// Head-dim class of the sm90 forward for D, Dv (64, 128, 256; 192 runs as
// 256), or 0 when that class is not compiled.
int sm90_head_dim_class(int64_t head_dim, int64_t head_dim_v) {
  const int64_t needed = std::max(head_dim, head_dim_v);
  if (needed <= 64 && FLASHATTN_CUDA_HAS_SM90_HEADDIM_64) return 64;
  if (needed <= 128 && FLASHATTN_CUDA_HAS_SM90_HEADDIM_128) return 128;
  if (needed <= 256 && FLASHATTN_CUDA_HAS_SM90_HEADDIM_256) return 256;
  return 0;
}

template <class Fn>
fa_status dispatch_sm90_head_dim(int head_dim_class_value, Fn&& fn) {
  switch (head_dim_class_value) {
#if FLASHATTN_CUDA_HAS_SM90_HEADDIM_64
    case 64: return fn(std::integral_constant<int, 64>{});
#endif
#if FLASHATTN_CUDA_HAS_SM90_HEADDIM_128
    case 128: return fn(std::integral_constant<int, 128>{});
#endif
#if FLASHATTN_CUDA_HAS_SM90_HEADDIM_256
    case 256: return fn(std::integral_constant<int, 256>{});
#endif
    default: break;
  }
  return fail(FA_ERROR_INTERNAL, "sm90 head-dim class %d: expected a compiled class", head_dim_class_value);
}

// Compute capability major * 10 + minor of a device, cached (a call costs microseconds).
int compute_capability(int device_index) {
  static std::atomic<int> cached[64];
  if (device_index < 0 || device_index >= 64) return 0;
  int value = cached[device_index].load(std::memory_order_relaxed);
  if (value == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index) != cudaSuccess)
      return 0;
    value = major * 10 + minor;
    cached[device_index].store(value, std::memory_order_relaxed);
  }
  return value;
}

// The Hopper forward serves compute capability 9.0 (sm_90a code runs nowhere
// else) for everything but dropout, when its head-dim class is compiled and
// TMA can describe the operands. FLASHATTN_CUDA_FWD=sm80 forces the FA2 path
// (A/B benchmarks in one process).
bool use_sm90_forward(const FwdParams& params) {
  const char* forced = std::getenv("FLASHATTN_CUDA_FWD");
  if (forced != nullptr && std::strcmp(forced, "sm80") == 0) return false;
  if (params.dropout.enabled || params.total_q == 0 || params.total_k == 0) return false;
  if (sm90_head_dim_class(params.head_dim, params.head_dim_v) == 0) return false;
  if (compute_capability(params.device_index) != 90) return false;
  const int64_t batch = params.is_varlen ? 1 : params.batch;
  return tma_describable(params.q, params.q_layout, params.heads, batch) &&
         tma_describable(params.k, params.k_layout, params.heads_kv, batch) &&
         tma_describable(params.v, params.v_layout, params.heads_kv, batch);
}

// Head-dim class of the sm90 backward for D, Dv (64, 128, 256), or 0 when none is compiled.
int sm90_bwd_head_dim_class(int64_t head_dim, int64_t head_dim_v) {
  const int64_t needed = std::max(head_dim, head_dim_v);
  if (needed <= 64 && FLASHATTN_CUDA_HAS_SM90_BWD_HEADDIM_64) return 64;
  if (needed <= 128 && FLASHATTN_CUDA_HAS_SM90_BWD_HEADDIM_128) return 128;
  if (needed <= 256 && FLASHATTN_CUDA_HAS_SM90_BWD_HEADDIM_256) return 256;
  return 0;
}

// The Hopper backward serves compute capability 9.0 for head dims up to 256
// without softcap, ALiBi or dropout, when TMA can describe Q, dO, K and V.
// FLASHATTN_CUDA_BWD=sm80 forces the FA2 backward everywhere (A/B in one process).
bool use_sm90_backward(const BwdParams& params) {
  const char* forced = std::getenv("FLASHATTN_CUDA_BWD");
  if (forced != nullptr && std::strcmp(forced, "sm80") == 0) return false;
  if (params.dropout.enabled || params.softcap > 0.0f || params.alibi_slopes != nullptr) return false;
  if (params.total_q == 0 || params.total_k == 0) return false;
  if (sm90_bwd_head_dim_class(params.head_dim, params.head_dim_v) == 0) return false;
  if (compute_capability(params.device_index) != 90) return false;
  const int64_t batch = params.is_varlen ? 1 : params.batch;
  return tma_describable(params.q, params.q_layout, params.heads, batch) &&
         tma_describable(params.dout, params.dout_layout, params.heads, batch) &&
         tma_describable(params.k, params.k_layout, params.heads_kv, batch) &&
         tma_describable(params.v, params.v_layout, params.heads_kv, batch);
}

template <class Fn>
fa_status dispatch_sm90_bwd_head_dim(int head_dim_class_value, Fn&& fn) {
  switch (head_dim_class_value) {
#if FLASHATTN_CUDA_HAS_SM90_BWD_HEADDIM_64
    case 64: return fn(std::integral_constant<int, 64>{});
#endif
#if FLASHATTN_CUDA_HAS_SM90_BWD_HEADDIM_128
    case 128: return fn(std::integral_constant<int, 128>{});
#endif
#if FLASHATTN_CUDA_HAS_SM90_BWD_HEADDIM_256
    case 256: return fn(std::integral_constant<int, 256>{});
#endif
    default: break;
  }
  return fail(FA_ERROR_INTERNAL, "sm90 backward head-dim class %d: expected a compiled class", head_dim_class_value);
}

}  // namespace

int sm90_schedule_override() {
  const char* name = std::getenv("FLASHATTN_SM90_SCHEDULE");
  if (name != nullptr && name[0] == 'v' && name[1] >= '1' && name[1] <= '3' && name[2] == '\0') return name[1] - '0';
  return 0;
}

// The persistent sm90 forward (one CTA per SM looping over tiles, K/V pipeline
// running on across tiles, src/cuda/sm90/tile_scheduler.cuh) is built for the
// plain kernels under schedules v2 and v3; softcap/ALiBi and v1 stay one tile
// per CTA. FLASHATTN_SM90_PERSISTENT=1 turns it on per call, =0 off (A/B in
// one process). Default:
// - class 128 up to 8,192 keys, where the next tile's Q/K loads, issued during
//   this one's epilogue, save most of a CTA's serial start and end: session 13
//   (H200, runs 1-2, an older kernel) 1.08-1.09x one tile per CTA at 1k, equal
//   at 4k, 0.94-0.97x at 8k-16k; session 15 (runs 3 and 5) 1.03-1.04x at 2k;
//   on the H100 with today's kernels 1.03-1.04x at 4k and at 8k 1.01-1.06x in
//   every run of sessions 24-26 (bf16 and fp16), 0.96-1.01x at 16k (up to
//   4,096 keys until session 26; no H200 has run these kernels at 8k);
// - class 64 at every length and class 256 from 2,049 keys on: since the
//   conditional rescale (session 15, runs 1-3, same rounds) persistent / tile
//   was 1.03-1.05x at class 64 with 1k keys, 1.00-1.04x at 4k, 0.98-1.01x at
//   8k-16k (so up to 4,096 keys until session 26); with the row sums on the
//   tensor cores (session 26, H100) 1.05-1.10x at 8k-16k; at class 256
//   0.97-0.98x with 1k keys, 1.02-1.06x at 4k-16k;
// Never under a diagonal mask. Causal class 128 was persistent from 1,025 to
// 8,192 queries (H200, session 15: 1.01-1.05x at 2k-8k) until its kernels got
// the conditional rescale: then one tile per CTA led at every length (H100,
// session 24, bf16 and fp16: 1.11-1.14x at 2k, 1.07-1.08x at 4k, 1.10-1.14x at
// 8k, 1.17-1.20x at 16k). At classes 64 and 256 and under sliding windows it
// trails or was not measured.
constexpr int64_t kSm90PersistentMaxKeys128 = 8192, kSm90PersistentMinKeys256 = 2049;

bool sm90_forward_persistent(const FwdParams& params, int head_dim_class, bool mask_diagonal) {
  if (params.softcap > 0.0f || params.alibi_slopes != nullptr || sm90_schedule_override() == 1) return false;
  const int64_t m_blocks = (params.seqlen_q + kSm90FwdBlockM - 1) / kSm90FwdBlockM;
  // Tile numbers are 32-bit: every index (paired, up to m_blocks + 1 per pair) and one stride past the last.
  if ((m_blocks + 1) * params.heads * params.batch > INT32_MAX - 4096) return false;
  const char* forced = std::getenv("FLASHATTN_SM90_PERSISTENT");
  if (forced != nullptr && std::strcmp(forced, "1") == 0) return true;
  if (forced != nullptr && std::strcmp(forced, "0") == 0) return false;
  if (std::getenv("FLASHATTN_SM90_FWD_CONSUMERS") != nullptr) return false;  // the consumer count asked for
  if (mask_diagonal) return false;
  if (head_dim_class == 64) return true;
  if (head_dim_class == 128) return params.seqlen_k <= kSm90PersistentMaxKeys128;
  return head_dim_class == 256 && params.seqlen_k >= kSm90PersistentMinKeys256;
}

// Consumer warpgroups of the sm90 forward, measured on the H200 (BENCHMARKS.md,
// session 6 runs 2 and final, round-robin timing). Hdim 64: without a diagonal
// mask three (192-row tiles, as FA3): +8-27 % over two at every N, the softmax
// of one warpgroup overlapping the GEMMs of two; with one, one (64-row tiles,
// two CTAs per SM): +7-10 % over two at every N. Three under a diagonal mask
// trailed one at every N while its diagonal kernel spilled 80 bytes (0.71x of
// two at 1k); since it spills none, it leads at long causal rows (below).
// Hdim 128 (session 12, run 2, same process): one (64 x 64 tiles, two CTAs per
// SM) under a diagonal mask up to 1k queries, +13 % over two there (short
// rows: one CTA's start and end hide behind the other's GEMMs), but 0.78-0.92x
// of two at 4k-16k and without a mask; two elsewhere.
// Hdim 64 under a diagonal mask with no left window: three from 4,097 queries
// on (session 16, run 1, once the masked tiles' compares were 32-bit and the
// three-consumer diagonal kernel stopped spilling): 1.05-1.08x one at 8k and
// 16k, 0.98-1.01x at 4k, 0.84-0.99x at 1k-2k.
constexpr int64_t kSm90ThreeConsumersMinCausalQueries64 = 4096;

int sm90_forward_consumers(const FwdParams& params, int head_dim_class, bool mask_diagonal) {
  if (params.softcap > 0.0f || params.alibi_slopes != nullptr || sm90_schedule_override() != 0) return 2;
  if (head_dim_class != 64 && head_dim_class != 128) return 2;
  const char* forced = std::getenv("FLASHATTN_SM90_FWD_CONSUMERS");
  const bool long_causal_rows = params.window_left < 0 && params.seqlen_q > kSm90ThreeConsumersMinCausalQueries64;
  int consumers = head_dim_class == 64 ? (mask_diagonal && !long_causal_rows ? 1 : 3)
                                       : (mask_diagonal && params.seqlen_q <= 1024 ? 1 : 2);
  if (forced != nullptr && std::strcmp(forced, "3") == 0 && head_dim_class == 64) consumers = 3;
  if (forced != nullptr && std::strcmp(forced, "2") == 0) consumers = 2;
  if (forced != nullptr && std::strcmp(forced, "1") == 0) consumers = 1;
  return consumers == 1 && sm90_forward_persistent(params, head_dim_class, mask_diagonal) ? 2 : consumers;
}

fa_status device_multiprocessors_and_l2(int device_index, int* multiprocessors, int* l2_bytes) {
  static std::atomic<int> cached_sms[64], cached_l2[64];
  if (device_index < 0 || device_index >= 64)
    return fail(FA_ERROR_BACKEND, "CUDA: device index %d out of range", device_index);
  int sms = cached_sms[device_index].load(std::memory_order_acquire);  // published after l2
  int l2 = cached_l2[device_index].load(std::memory_order_relaxed);
  if (sms == 0) {
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_index));
    cached_l2[device_index].store(l2, std::memory_order_relaxed);
    cached_sms[device_index].store(sms, std::memory_order_release);
  }
  *multiprocessors = sms;
  *l2_bytes = l2;
  return FA_OK;
}

const char* fwd_kernel_path(const FwdParams& params) {
  if (!use_sm90_forward(params)) return "cuda-sm80";
  const bool persistent = sm90_forward_persistent(params, sm90_head_dim_class(params.head_dim, params.head_dim_v),
                                                  mask_diagonal(params));
  return persistent ? "cuda-sm90-persistent" : "cuda-sm90";
}

const char* bwd_kernel_path(const BwdParams& params) {
  return use_sm90_backward(params) ? "cuda-sm90" : "cuda-sm80";
}

int head_dim_class(int64_t head_dim, int64_t head_dim_v) {
  const int64_t needed = std::max(head_dim, head_dim_v);
  const int classes[] = {
#if FLASHATTN_CUDA_HAS_HEADDIM_64
      64,
#endif
#if FLASHATTN_CUDA_HAS_HEADDIM_128
      128,
#endif
#if FLASHATTN_CUDA_HAS_HEADDIM_192
      192,
#endif
#if FLASHATTN_CUDA_HAS_HEADDIM_256
      256,
#endif
      0};
  for (int value : classes)
    if (value >= needed) return value;
  return 0;
}

namespace {
// The sm90 deterministic backward's dQ copies (sm90/bwd_items.hpp, BwdItems).
// Without a mask it starts each key tile's CTA at its own query tile and needs
// two copies: on the H200 that order ran 1.07-1.24x the plain descending one
// with 8-32 key tiles (session 7) and 1.00-1.03x with 128-256 (session 8;
// BENCHMARKS.md); the kernel's products (M + 1) C of query and key tiles stay
// in 32 bits. Under a causal mask (no left window: the first key tiles see the
// most queries) the key tiles form kMaxDqCopies = 2 groups, one copy each,
// launched longest group first. Against one group (the order before), two ran
// 1.01-1.03x at 4k and 16k causal and 1.00 at 1k; four ran the same at 4k and
// 16k and 0.99 at 1k for twice the memory (H200, session 10, BENCHMARKS.md).
void set_deterministic_dq_order(BwdWorkspace& layout, const BwdParams& params, bool sm90, int head_dim_class_value) {
  layout.dq_copies = 1;
  layout.key_group_tiles = 0;
  if (!sm90 || !params.deterministic) return;
  const int64_t block_n = sm90_bwd_block_n(head_dim_class_value);
  const int64_t key_tiles = (params.seqlen_k + block_n - 1) / block_n;
  const int64_t query_tiles = (params.seqlen_q + kSm90BwdBlockM - 1) / kSm90BwdBlockM;
  const bool dense = params.window_left < 0 && params.window_right < 0;
  if (dense) {
    layout.dq_copies = (query_tiles + 1) * key_tiles < (int64_t(1) << 31) ? 2 : 1;
  } else if (params.window_left < 0 && key_tiles > 1) {
    const int64_t group_tiles = (key_tiles + kMaxDqCopies - 1) / kMaxDqCopies;
    layout.key_group_tiles = static_cast<int>(group_tiles);
    layout.dq_copies = static_cast<int>((key_tiles + group_tiles - 1) / group_tiles);
  }
}
}  // namespace

BwdWorkspace bwd_workspace_layout(const BwdParams& params, int head_dim_class_value, bool sm90) {
  BwdWorkspace layout;
  set_deterministic_dq_order(layout, params, sm90, head_dim_class_value);
  const int64_t group = params.heads / params.heads_kv;
  const size_t bytes_per_head = size_t(params.total_q) * head_dim_class_value * sizeof(float) * layout.dq_copies;
  int64_t heads = bytes_per_head == 0 ? params.heads : int64_t(kDqAccumBudgetBytes / bytes_per_head);
  heads = std::max<int64_t>(group, heads / group * group);
  layout.heads_per_pass = static_cast<int>(std::min<int64_t>(heads, params.heads));
  // Semaphores for the smaller query tile of the two backward families.
  const int block_m = std::min(bwd_tile_config(head_dim_class_value).block_m, kSm90BwdBlockM);
  const int64_t m_blocks = (params.seqlen_q + block_m - 1) / block_m;
  layout.dq_accum_bytes = bytes_per_head * layout.heads_per_pass;
  layout.delta_bytes = size_t(params.heads) * size_t(params.total_q) * sizeof(float);
  layout.semaphore_bytes =
      params.deterministic ? size_t(params.batch) * layout.heads_per_pass * m_blocks * kSemaphoresPerQueryTile * 4 : 0;
  layout.dq_accum_offset = 0;
  layout.delta_offset = align_up(layout.dq_accum_offset + layout.dq_accum_bytes);
  layout.semaphore_offset = align_up(layout.delta_offset + layout.delta_bytes);
  layout.total = layout.semaphore_offset + layout.semaphore_bytes;
  return layout;
}

fa_status check_dtype_and_device(fa_dtype dtype, int device_index) {
  if (dtype != FA_DTYPE_FP16 && dtype != FA_DTYPE_BF16)
    return fail(FA_ERROR_UNSUPPORTED, "q: dtype fp32 is not supported on CUDA; expected fp16 or bf16");
  if (!dtype_compiled(dtype))
    return fail(FA_ERROR_UNSUPPORTED, "q: dtype %s is not compiled into this CUDA build (FLASHATTN_CUDA_DTYPES)",
                dtype == FA_DTYPE_FP16 ? "fp16" : "bf16");
  int device_count = 0;
  const cudaError_t count_status = cudaGetDeviceCount(&device_count);
  if (count_status != cudaSuccess || device_index < 0 || device_index >= device_count)
    return fail(FA_ERROR_BACKEND, "q: expected a CUDA device index in [0, %d), got %d (%s)", device_count,
                device_index, cudaGetErrorString(count_status));
  int major = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index));
  if (major < 8)
    return fail(FA_ERROR_UNSUPPORTED, "q: the CUDA backend needs compute capability 8.0 or newer, device %d has %d.x",
                device_index, major);
  return FA_OK;
}

fa_status check_supported(const AttnParams& params) {
  FA_TRY(check_dtype_and_device(params.dtype, params.device_index));
  if (head_dim_class(params.head_dim, params.head_dim_v) == 0)
    return fail(FA_ERROR_UNSUPPORTED,
                "q: head dims D = %" PRId64 ", Dv = %" PRId64
                " need a head-dim class this build did not compile (FLASHATTN_CUDA_HEADDIMS)",
                params.head_dim, params.head_dim_v);
  if (params.seqlen_q > INT32_MAX || params.seqlen_k > INT32_MAX)
    return fail(FA_ERROR_UNSUPPORTED, "q: sequence lengths beyond 2^31 - 1 are not supported on CUDA");
  FA_TRY(check_operand("q", params.q, params.q_layout, params.total_q));
  FA_TRY(check_operand("k", params.k, params.k_layout, params.total_k));
  FA_TRY(check_operand("v", params.v, params.v_layout, params.total_k));
  FA_TRY(check_operand("out", params.o, params.o_layout, params.total_q));
  return FA_OK;
}

size_t fwd_workspace_bytes(const FwdParams&) { return 0; }

fa_status fwd(const FwdParams& params, void*) {
  if (params.total_q == 0) return FA_OK;
  DeviceGuard guard(params.device_index);
  FA_CUDA_CHECK(guard.status());
  const cudaStream_t stream = static_cast<cudaStream_t>(params.stream);
  if (use_sm90_forward(params))
    return dispatch_dtype(params.dtype, [&](auto tag) {
      return dispatch_sm90_head_dim(sm90_head_dim_class(params.head_dim, params.head_dim_v), [&](auto head_dim) {
        return dispatch_bool(mask_diagonal(params), [&](auto diagonal) {
          return run_fwd_sm90<decltype(tag), decltype(head_dim)::value, decltype(diagonal)::value>(params, stream);
        });
      });
    });
  return dispatch_dtype(params.dtype, [&](auto tag) {
    return dispatch_head_dim(head_dim_class(params.head_dim, params.head_dim_v), [&](auto head_dim) {
      return dispatch_bool(mask_diagonal(params), [&](auto diagonal) {
        return run_fwd<decltype(tag), decltype(head_dim)::value, decltype(diagonal)::value>(params, stream);
      });
    });
  });
}

// The width of the fp32 dQ workspace rows: the head-dim class of the backward
// that will run (sm90 when `sm90`). The two families' classes differ where D or
// Dv is in (128, 192] (sm80 class 192, sm90 class 256).
int bwd_accum_head_dim(const BwdParams& params, bool sm90) {
  return sm90 ? sm90_bwd_head_dim_class(params.head_dim, params.head_dim_v)
              : head_dim_class(params.head_dim, params.head_dim_v);
}

size_t bwd_workspace_bytes(const BwdParams& params) {
  const bool sm90 = use_sm90_backward(params);
  return bwd_workspace_layout(params, bwd_accum_head_dim(params, sm90), sm90).total;
}

fa_status bwd(const BwdParams& params, void* workspace) {
  FA_TRY(check_operand("dout", params.dout, params.dout_layout, params.total_q));
  FA_TRY(check_operand("dq", params.dq, params.dq_layout, params.total_q));
  FA_TRY(check_operand("dk", params.dk, params.dk_layout, params.total_k));
  FA_TRY(check_operand("dv", params.dv, params.dv_layout, params.total_k));
  DeviceGuard guard(params.device_index);
  FA_CUDA_CHECK(guard.status());
  const cudaStream_t stream = static_cast<cudaStream_t>(params.stream);
  const bool sm90 = use_sm90_backward(params);
  const BwdWorkspace layout = bwd_workspace_layout(params, bwd_accum_head_dim(params, sm90), sm90);
  if (sm90)
    return dispatch_dtype(params.dtype, [&](auto tag) {
      return dispatch_sm90_bwd_head_dim(sm90_bwd_head_dim_class(params.head_dim, params.head_dim_v), [&](auto head_dim) {
        return dispatch_bool(mask_diagonal(params), [&](auto diagonal) {
          return run_bwd_sm90<decltype(tag), decltype(head_dim)::value, decltype(diagonal)::value>(params, layout,
                                                                                                   workspace, stream);
        });
      });
    });
  return dispatch_dtype(params.dtype, [&](auto tag) {
    return dispatch_head_dim(head_dim_class(params.head_dim, params.head_dim_v), [&](auto head_dim) {
      return dispatch_bool(mask_diagonal(params), [&](auto diagonal) {
        return run_bwd<decltype(tag), decltype(head_dim)::value, decltype(diagonal)::value>(params, layout, workspace,
                                                                                           stream);
      });
    });
  });
}

void* device_alloc(size_t bytes, int device_index) {
  DeviceGuard guard(device_index);
  if (guard.status() != cudaSuccess) return nullptr;
  void* pointer = nullptr;
  return cudaMalloc(&pointer, bytes) == cudaSuccess ? pointer : nullptr;
}

void device_free(void* pointer, int device_index) {
  DeviceGuard guard(device_index);
  cudaFree(pointer);
}

}  // namespace flashattn::cuda
