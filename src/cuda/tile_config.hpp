// Tile sizes of every sm80 kernel, one constexpr function per pass; host code
// (workspace sizes) and device code read the same numbers.
#pragma once

#include "flashattn_cuda_config.hpp"  // generated: compiled classes, tuning overrides

namespace flashattn::cuda {

// Forward: each warp owns block_m / warps query rows (a multiple of 16) and
// the whole K/V tile. Register budget per thread (fp32): O is
// (block_m / warps) * head_dim / 32, S is (block_m / warps) * block_n / 32;
// with ~60 registers of fragments and addresses, O + S <= 160 is what fits
// in 255 registers without spills (ptxas -v; 128 x 64 on 4 warps, O 128 + S 64,
// spilled ~1 KB).
struct FwdTileConfig {
  int block_m, block_n, warps;
};
// Tuning knobs for A/B builds (scripts/device_run.sh builds an alternative
// library with them); the defaults are the measured winners.
#ifndef FLASHATTN_CUDA_FWD128_TILE
#define FLASHATTN_CUDA_FWD128_TILE 128, 64, 4
#endif
#ifndef FLASHATTN_CUDA_BWD64_TILE
#define FLASHATTN_CUDA_BWD64_TILE 128, 128, 8, 4, 4, 4, 2
#endif
#ifndef FLASHATTN_CUDA_BWD64_EXTRAS_TILE
#define FLASHATTN_CUDA_BWD64_EXTRAS_TILE 128, 64, 8, 4, 4, 4, 2
#endif
#ifndef FLASHATTN_CUDA_BWD128_TILE
#define FLASHATTN_CUDA_BWD128_TILE 64, 128, 8, 4, 4, 2, 2
#endif
#ifndef FLASHATTN_CUDA_BWD128_EXTRAS_TILE
#define FLASHATTN_CUDA_BWD128_EXTRAS_TILE 64, 64, 8, 4, 4, 2, 2
#endif
#ifndef FLASHATTN_CUDA_BWD256_TILE
#define FLASHATTN_CUDA_BWD256_TILE 64, 64, 8, 4, 2, 2, 1
#endif

// mask_diagonal: the kernel of causal / sliding-window masks.
constexpr FwdTileConfig fwd_tile_config(int head_dim, bool mask_diagonal) {
  if (head_dim <= 64) return {128, 64, 4};  // O 64 + S 64
  // hdim 128, no diagonal: 128 x 64 on 4 warps (O 128 + S 64; some spill
  // traffic, yet 1.00-1.12x the 64 x 64 tile's rate in the v4 A/B run). Under a
  // diagonal mask the 64-row tile wastes less work on masked rows and stays
  // ahead (0.87-1.0x for 128 rows): O 64 + S 32, no spills, 2 CTAs per SM.
  if (head_dim <= 128) return mask_diagonal ? FwdTileConfig{64, 64, 4} : FwdTileConfig{FLASHATTN_CUDA_FWD128_TILE};
  return {128, 64, 8};  // 192: O 96 + S 32; 256: O 128 + S 32
}

// Backward: one CTA owns block_n keys of one K/V head and loops over the query
// heads of its group and the query tiles. S^T and dP^T are (block_n, block_m)
// on s_warps_n x (warps / s_warps_n) warps; dK and dV (block_n, head_dim) on
// dkv_warps_n x (warps / dkv_warps_n); dQ (block_m, head_dim) on dq_warps_m x
// (warps / dq_warps_m).
struct BwdTileConfig {
  int block_m, block_n, warps;
  int s_warps_n, dkv_warps_n, dq_warps_m;
  int q_stages;  // Q / dO buffers: 2 prefetches the next query tile during the current one
};
// 128-key tiles halve the dQ atomics per flop against 64-key tiles; the warp
// shapes of hdim 128 are FA2's (S^T 4 x 2 warps, dK/dV 4 x 2, dQ 2 x 4). The A/B
// run of dev/cuda_fa2_log.md v4 measured these against the v3 tiles (64 x 128 /
// 8,8,4 for hdim 64, 128 x 64 for 128, 64 x 64 with 4,4,4 for 256):
// fwd+bwd +5-20 % at hdim 64, +20-28 % at 128, +3-6 % at 256.
// large_smem: the variant for devices with more than 209 KiB of shared memory
// per block (H100 / H200); it differs only at hdim 256. extras: the kernels
// with softcap, ALiBi or dropout (sm80::Extras other than kNone), which on
// Hopper run every softcap, ALiBi and dropout backward. With them the 128-key
// tiles spilled (ptxas sm_90a: 652-976 B at hdim 64, 156-232 B at hdim 128);
// 64-key tiles do not. On the H100 (session 48, bf16 4k fwd+bwd against the
// 128-key tiles) they ran 1.08-1.26x at hdim 64, and at hdim 128 1.04-1.06x
// under a diagonal mask but 0.88-0.92x without one, so there they are only
// the diagonal kernels' (mask_diagonal). block_m, which the workspace layout
// reads, is the same in all of them.
constexpr BwdTileConfig bwd_tile_config(int head_dim, bool large_smem = false, bool extras = false,
                                        bool mask_diagonal = false) {
  if (head_dim <= 64) {
    if (extras) return {FLASHATTN_CUDA_BWD64_EXTRAS_TILE};  // smem 113 KiB
    return {FLASHATTN_CUDA_BWD64_TILE};                      // smem 162 KiB
  }
  if (head_dim <= 128) {
    if (extras && mask_diagonal) return {FLASHATTN_CUDA_BWD128_EXTRAS_TILE};  // smem 113 KiB
    return {FLASHATTN_CUDA_BWD128_TILE};                                       // smem 161 KiB
  }
  if (head_dim <= 192) return {64, 64, 8, 4, 4, 4, 1};       // smem 113 KiB
  // One Q/dO stage keeps hdim 256 within an A100's 163 KiB (145 KiB); two stages
  // (209 KiB) prefetch the next query tile: +6-8 % non-causal on the H200.
  if (large_smem) return {64, 64, 8, 4, 2, 2, 2};
  return {FLASHATTN_CUDA_BWD256_TILE};
}
static_assert(bwd_tile_config(64, false, true).block_m == bwd_tile_config(64).block_m &&
                  bwd_tile_config(128, false, true, true).block_m == bwd_tile_config(128).block_m,
              "the workspace layout reads one block_m per head-dim class");

}  // namespace flashattn::cuda
