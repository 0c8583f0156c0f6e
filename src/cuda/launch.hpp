// Host-side declarations of the kernel launchers. Each (dtype, head-dim class,
// diagonal mask) triple is instantiated in its own generated translation unit
// (src/cuda/CMakeLists.txt); backend_cuda.cpp dispatches to them.
#pragma once

#include <cuda_runtime.h>

#include "common/error.hpp"
#include "common/params.hpp"

// Every CUDA runtime call of the backend goes through this check.
#define FA_CUDA_CHECK(expr)                                                                              \
  do {                                                                                                   \
    const cudaError_t fa_cuda_status = (expr);                                                           \
    if (fa_cuda_status != cudaSuccess)                                                                   \
      return ::flashattn::fail(FA_ERROR_BACKEND, "CUDA: %s failed: %s (%s:%d)", #expr,                   \
                               cudaGetErrorString(fa_cuda_status), __FILE__, __LINE__);                  \
  } while (0)

namespace flashattn::cuda {

struct fp16_tag {};
struct bf16_tag {};

// Deterministic backward: the most dQ copies (sm90/bwd_items.hpp: 2 in the
// rotated order without a mask, one per key-tile group under a causal mask),
// and semaphores per query tile, one per dQ copy and consumer warpgroup of the
// sm90 kernels (the sm80 kernel needs one).
constexpr int kMaxDqCopies = 2;
constexpr int kSemaphoresPerQueryTile = 2 * kMaxDqCopies;

// Layout of the backward workspace (byte offsets; sizes exact).
struct BwdWorkspace {
  size_t dq_accum_offset = 0, dq_accum_bytes = 0;  // fp32 (dq_copies, total_q, heads_per_pass, kHeadDim)
  size_t delta_offset = 0, delta_bytes = 0;        // fp32 (H, total_q): rowsum(dO * O)
  // int32 (B, heads_per_pass, m_blocks, kSemaphoresPerQueryTile), deterministic only
  size_t semaphore_offset = 0, semaphore_bytes = 0;
  size_t total = 0;
  int heads_per_pass = 0;  // query heads whose dQ is accumulated per pass (a multiple of H / Hkv)
  // The sm90 deterministic backward's dQ copies (BwdItems): 2 without a mask
  // (rotated order), one per group of key_group_tiles key tiles under a causal mask (2 groups).
  int dq_copies = 1;
  int key_group_tiles = 0;
};

// What every CUDA entry point checks first: fp16 or bf16, compiled into this
// build, on a device index that exists with compute capability 8.0 or newer.
fa_status check_dtype_and_device(fa_dtype dtype, int device_index);

// Head-dimension class of the compiled kernels for D, Dv, or 0 if none fits.
int head_dim_class(int64_t head_dim, int64_t head_dim_v);
// sm90: the layout of the sm90 backward (else the sm80 one).
BwdWorkspace bwd_workspace_layout(const BwdParams& params, int head_dim_class, bool sm90);

template <typename Tag, int kHeadDim, bool kMaskDiagonal>
fa_status run_fwd(const FwdParams& params, cudaStream_t stream);

// Hopper forward (sm_90a, src/cuda/sm90/): head-dim classes 64, 128, 256.
template <typename Tag, int kHeadDim, bool kMaskDiagonal>
fa_status run_fwd_sm90(const FwdParams& params, cudaStream_t stream);
// Its smallest query tile (rows per CTA tile): the host bounds tile numbers with it.
constexpr int kSm90FwdBlockM = 64;
// Consumer warpgroups of the sm90 forward: 2 (128-row tiles), at head-dim
// class 64 also 3 (192-row tiles) or 1 (64-row tiles, two CTAs per SM, one
// tile per CTA), at class 128 also 1 (64-row, 64-key tiles, two CTAs per SM);
// FLASHATTN_SM90_FWD_CONSUMERS=1|2|3 picks per call, else the default: at class
// 64, 3 for the dense kernels and 1 for the diagonal-mask ones (3 without a
// left window above 4,096 queries); at class 128, 1 for the diagonal-mask
// kernels up to 1024 queries; 2 elsewhere.
// Always 2 with softcap / ALiBi or a schedule override, and 1 becomes 2 when
// the persistent kernel runs.
int sm90_forward_consumers(const FwdParams& params, int head_dim_class, bool mask_diagonal);
// FLASHATTN_SM90_SCHEDULE=v1|v2|v3 as 1, 2, 3; 0 when unset or anything else.
int sm90_schedule_override();
// Whether the sm90 forward of params runs the persistent kernel
// (FLASHATTN_SM90_PERSISTENT=0|1, else the default: without a mask, class 64
// at every length, class 128 up to 8,192 keys, class 256 from 2,049 on; never
// under a diagonal mask, where FLASHATTN_SM90_FWD_CONSUMERS asks for a consumer
// count, for softcap/ALiBi or schedule v1). The launcher and fa_fwd_kernel_path both ask this.
bool sm90_forward_persistent(const FwdParams& params, int head_dim_class, bool mask_diagonal);
// Multiprocessor count and L2 size in bytes of a device (cached after the first query).
fa_status device_multiprocessors_and_l2(int device_index, int* multiprocessors, int* l2_bytes);

template <typename Tag, int kHeadDim, bool kMaskDiagonal>
fa_status run_bwd(const BwdParams& params, const BwdWorkspace& layout, void* workspace, cudaStream_t stream);

// Hopper backward (sm_90a, src/cuda/sm90/bwd_kernel*.cuh): head-dim classes 64, 128, 256.
template <typename Tag, int kHeadDim, bool kMaskDiagonal>
fa_status run_bwd_sm90(const BwdParams& params, const BwdWorkspace& layout, void* workspace, cudaStream_t stream);
// Its smallest query tile (classes 128 and 256; 128 rows at class 64): the
// deterministic semaphores are sized for it.
constexpr int kSm90BwdBlockM = 64;
// Its key tile per head-dim class: 64 keys at class 256 (bwd_kernel_wide.cuh), 128 below.
constexpr int sm90_bwd_block_n(int head_dim_class) { return head_dim_class > 128 ? 64 : 128; }
}  // namespace flashattn::cuda
