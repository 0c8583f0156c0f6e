// FlashAttention-2 forward for sm80+: one CTA per (query tile, head, batch).
// Q stays in shared memory; K and V tiles stream through two stages with
// cp.async: tile n-2 loads during the whole of tile n's S = Q K^T, softmax
// and O += P V (the 8-warp configs run one CTA per SM, so no other CTA hides
// a load that would only overlap part of an iteration). The online softmax
// lives in registers; O and the fp32 LSE are written once at the end.
#pragma once

#include "cuda/sm80/kernel_traits.cuh"

namespace flashattn::sm80 {

template <typename T_, int kHeadDim_, bool kMaskDiagonal_>
struct FwdTraits {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_;
  // true: causal or sliding window, tiles near the diagonal are masked;
  // false: only the last key tile of a sequence can be masked (its length).
  static constexpr bool kMaskDiagonal = kMaskDiagonal_;
  static constexpr FwdTileConfig kConfig = fwd_tile_config(kHeadDim, kMaskDiagonal);
  static constexpr int kBlockM = kConfig.block_m, kBlockN = kConfig.block_n, kWarps = kConfig.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMTiles = kWarpRows / 16;
  static constexpr int kNTilesS = kBlockN / 8;    // S: (kWarpRows, kBlockN) per warp
  static constexpr int kNTilesO = kHeadDim / 8;   // O: (kWarpRows, kHeadDim) per warp
  static_assert(kWarpRows % 16 == 0, "each warp owns whole m16 tiles");
  using TileQ = SmemTile<kBlockM, kHeadDim>;   // (kBlockM, kHeadDim), later O
  using TileKV = SmemTile<kBlockN, kHeadDim>;  // (kBlockN, kHeadDim)
  static constexpr int kStages = 2;  // K/V buffers
  static constexpr int kSmemBytes = TileQ::kBytes + 2 * kStages * TileKV::kBytes;
};

// kVariant: see Extras (kernel_traits.cuh).
template <class Traits, Extras kVariant>
__global__ void __launch_bounds__(Traits::kThreads, 1) fwd_kernel(const __grid_constant__ FwdParams params) {
  constexpr bool kExtras = kVariant != Extras::kNone;
  using T = typename Traits::T;
  using TileQ = typename Traits::TileQ;
  using TileKV = typename Traits::TileKV;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kThreads = Traits::kThreads;
  constexpr int kMTiles = Traits::kMTiles, kNTilesS = Traits::kNTilesS, kNTilesO = Traits::kNTilesO;
  constexpr int kHeadDim = Traits::kHeadDim;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (kBlockM, kHeadDim)
  T* sK = sQ + TileQ::kElements;                          // kStages x (kBlockN, kHeadDim)
  T* sV = sK + Traits::kStages * TileKV::kElements;       // kStages x (kBlockN, kHeadDim)

  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const SequenceBounds seq = sequence_bounds(params, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.len_q) return;
  const int rows = min(kBlockM, seq.len_q - m0);
  const int h_kv = static_cast<int>(h / (params.heads / params.heads_kv));
  const int dim = static_cast<int>(params.head_dim), dim_v = static_cast<int>(params.head_dim_v);
  const MaskPolicy mask =
      MaskPolicy::make(seq.len_q, seq.len_k, params.align_bottom_right, params.window_left, params.window_right);

  const T* q_tile = static_cast<const T*>(params.q) + row_offset(params.q_layout, b, seq.q_row0 + m0, h);
  const T* k_head = static_cast<const T*>(params.k) + row_offset(params.k_layout, b, seq.k_row0, h_kv);
  const T* v_head = static_cast<const T*>(params.v) + row_offset(params.v_layout, b, seq.k_row0, h_kv);
  T* o_tile = static_cast<T*>(params.o) + row_offset(params.o_layout, b, seq.q_row0 + m0, h);
  float* lse_tile = params.lse == nullptr ? nullptr : params.lse + row_offset(params.lse_layout, b, seq.q_row0 + m0, h);

  const int64_t key_begin = mask.key_begin(m0), key_end = mask.key_end(m0 + rows);
  if (key_end <= key_begin) {  // no row of the tile sees a key: O = 0, LSE = +inf
    for (int i = tid; i < rows * (dim_v / 8); i += kThreads)
      *reinterpret_cast<uint4*>(o_tile + (i / (dim_v / 8)) * params.o_layout.row + (i % (dim_v / 8)) * 8) =
          make_uint4(0, 0, 0, 0);
    if (lse_tile != nullptr)
      for (int i = tid; i < rows; i += kThreads) lse_tile[i * params.lse_layout.row] = __int_as_float(0x7f800000);
    return;
  }
  const int n_block_min = static_cast<int>(key_begin / kBlockN);
  const int n_block_max = static_cast<int>((key_end + kBlockN - 1) / kBlockN);

  const ScoreTransform transform = make_score_transform(params, b, h);
  const float log2_scale = transform.log2_scale();
  const bool dropout = params.dropout.enabled;
  const uint32_t batch_head = static_cast<uint32_t>(b * params.heads + h);

  const int g = lane >> 2, t = lane & 3;
  const int warp_row0 = warp * Traits::kWarpRows;  // first tile row of this warp

  float acc_o[kMTiles][kNTilesO][4];  // (kWarpRows, kHeadDim)
  clear(acc_o);
  // row_sum is Kahan-compensated (row_error holds what the last additions lost):
  // a 256k-key row adds 4k tile sums per thread, which in plain fp32 costs
  // ~1e-4 relative error in the LSE.
  float row_max[kMTiles][2], row_sum[kMTiles][2], row_error[kMTiles][2];
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) row_max[mi][r] = -INFINITY, row_sum[mi][r] = 0.0f, row_error[mi][r] = 0.0f;

  auto load_kv = [&](int n_block, int stage) {
    const int n0 = n_block * kBlockN;
    load_tile_async<TileKV, kThreads>(sK + stage * TileKV::kElements, k_head + int64_t(n0) * params.k_layout.row,
                                      params.k_layout.row, seq.len_k - n0, dim, tid);
    load_tile_async<TileKV, kThreads>(sV + stage * TileKV::kElements, v_head + int64_t(n0) * params.v_layout.row,
                                      params.v_layout.row, seq.len_k - n0, dim_v, tid);
  };
  // One commit group per tile (empty past the last one), so "tile n landed" is
  // always cp.async.wait_group 1.
  load_tile_async<TileQ, kThreads>(sQ, q_tile, params.q_layout.row, rows, dim, tid);
  load_kv(n_block_max - 1, 0);
  cp_async_commit();
  if (n_block_max - 2 >= n_block_min) load_kv(n_block_max - 2, 1);
  cp_async_commit();

  const DropoutKeys<kVariant, !Traits::kMaskDiagonal> dropout_keys(params.dropout, tid);

  auto step = [&](int n_block, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int n0 = n_block * kBlockN;
    const int stage = (n_block_max - 1 - n_block) & 1;
    const T* sKs = sK + stage * TileKV::kElements;
    const T* sVs = sV + stage * TileKV::kElements;
    cp_async_wait<1>();
    __syncthreads();  // K(n), V(n) landed for every thread's copies

    float acc_s[kMTiles][kNTilesS][4];  // (kWarpRows, kBlockN)
    clear(acc_s);
    gemm_ss<kMTiles, kNTilesS, kHeadDim / 16, false, false, TileQ, TileKV>(acc_s, sQ, warp_row0, sKs, 0, lane);
    const auto& dropout_config = dropout_keys.config();

    // Scores, mask, online softmax. Invariant after each tile: row_max is the
    // max of the row's scores so far (kernel units), acc_o and row_sum are
    // sums of exp2((s - row_max) * log2_scale); a new max rescales both by
    // exp2((old - new) * log2_scale). A row that has seen only masked keys
    // keeps row_max = -inf and is rescaled by nothing (offset 0).
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t i = m0 + warp_row0 + mi * 16 + g + r * 8;
        // Row i sees keys [key_begin(i), key_end(i + 1)): as offsets from the
        // thread's first column, each element is two 32-bit compares.
        const int64_t column0 = n0 + 2 * t;
        const int first_visible =
            Traits::kMaskDiagonal ? MaskPolicy::offset_in_tile(mask.key_begin(i), column0, kBlockN) : 0;
        const int end_visible =
            MaskPolicy::offset_in_tile(Traits::kMaskDiagonal ? mask.key_end(i + 1) : seq.len_k, column0, kBlockN);
        float tile_max = -INFINITY;
#pragma unroll
        for (int ni = 0; ni < kNTilesS; ++ni) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& s = acc_s[mi][ni][r * 2 + c];
            if constexpr (kExtras) {
              if (transform.active) s = transform.apply(s, mask, i, column0 + ni * 8 + c);
            }
            if constexpr (kMasked) {
              const int offset = ni * 8 + c;
              if (offset < first_visible || offset >= end_visible) s = -INFINITY;
            }
            tile_max = fmaxf(tile_max, s);
          }
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[mi][r], tile_max);
        const float safe_max = new_max == -INFINITY ? 0.0f : new_max;
        const float offset = safe_max * log2_scale;
        // The difference first: an unchanged max gives exactly exp2(0) = 1. As
        // old * c - offset, ptxas contracts it into an FFMA whose result is the
        // rounding error of offset, a factor 1 +- 1e-7 that then compounds over
        // every key tile (1e-4 of LSE error at 256k keys).
        const float correction = exp2_approx((row_max[mi][r] - safe_max) * log2_scale);
        row_max[mi][r] = new_max;
        row_sum[mi][r] *= correction;
        row_error[mi][r] *= correction;
#pragma unroll
        for (int nd = 0; nd < kNTilesO; ++nd) {
          acc_o[mi][nd][r * 2] *= correction;
          acc_o[mi][nd][r * 2 + 1] *= correction;
        }
        float sum = 0.0f;
#pragma unroll
        for (int ni = 0; ni < kNTilesS; ++ni) {
          float& p0 = acc_s[mi][ni][r * 2];
          float& p1 = acc_s[mi][ni][r * 2 + 1];
          p0 = exp2_approx(p0 * log2_scale - offset);
          p1 = exp2_approx(p1 * log2_scale - offset);
          sum += p0 + p1;
          if (kExtras && dropout) {  // the denominator keeps every p; dropped ones leave only the numerator
            const uint32_t j0 = static_cast<uint32_t>(n0 + ni * 8 + 2 * t);
            const Philox4 words = dropout_words(dropout_config, batch_head, static_cast<uint32_t>(i), j0 & ~3u);
            const uint32_t lo = (j0 & 2u) ? words.z : words.x, hi = (j0 & 2u) ? words.w : words.y;
            if (lo >= dropout_config.keep_threshold) p0 = 0.0f;
            if (hi >= dropout_config.keep_threshold) p1 = 0.0f;
          }
        }
        const float addend = sum - row_error[mi][r];
        const float total = row_sum[mi][r] + addend;
        row_error[mi][r] = (total - row_sum[mi][r]) - addend;
        row_sum[mi][r] = total;
      }
    }

    uint32_t a_p[kMTiles][kNTilesS / 2][4];  // P as A fragments, (kWarpRows, kBlockN)
    accumulator_to_a<T>(a_p, acc_s);
    gemm_rs<kMTiles, kNTilesO, kNTilesS / 2, true, TileKV>(acc_o, a_p, sVs, 0, lane);
    __syncthreads();  // every warp is done with this stage: refill it with tile n-2
    if (n_block - 2 >= n_block_min) load_kv(n_block - 2, stage);
    cp_async_commit();
  };

  // Trip counts of the masking policy: masked tiles at the top (the diagonal
  // or the sequence end), unmasked ones in the middle, masked ones at the
  // bottom (the left edge of a sliding window). Fully masked tiles lie
  // outside [n_block_min, n_block_max) and are never visited.
  auto visible_tile = [&](int n_block) {
    return mask.tile_fully_visible(m0, m0 + rows, int64_t(n_block) * kBlockN, int64_t(n_block + 1) * kBlockN);
  };
  int n_block = n_block_max - 1;
  for (; n_block >= n_block_min && !visible_tile(n_block); --n_block) step(n_block, std::true_type{});
  for (; n_block >= n_block_min && visible_tile(n_block); --n_block) step(n_block, std::false_type{});
  for (; n_block >= n_block_min; --n_block) step(n_block, std::true_type{});

  // Epilogue: one final rescale by 1 / row_sum (and 1 / (1 - p) for dropout),
  // O through this warp's own rows of sQ (no other warp reads them any more),
  // then 16-byte stores.
  const float keep_scale = dropout ? params.dropout.keep_scale : 1.0f;
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[mi][r] - row_error[mi][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inverse = sum > 0.0f ? keep_scale / sum : 0.0f;
#pragma unroll
      for (int nd = 0; nd < kNTilesO; ++nd) {
        acc_o[mi][nd][r * 2] *= inverse;
        acc_o[mi][nd][r * 2 + 1] *= inverse;
      }
      const int row = warp_row0 + mi * 16 + g + r * 8;
      if (lse_tile != nullptr && t == 0 && row < rows) {
        const float offset = row_max[mi][r] == -INFINITY ? 0.0f : row_max[mi][r] * log2_scale;
        lse_tile[row * params.lse_layout.row] = sum > 0.0f ? (offset + __log2f(sum)) * kLn2 : INFINITY;
      }
    }
  }
  store_accumulator<T, TileQ>(sQ, acc_o, warp_row0, 0, lane);
  __syncwarp();
  store_tile<TileQ>(o_tile, params.o_layout.row, sQ, warp_row0, min(warp_row0 + Traits::kWarpRows, rows), dim_v,
                    lane, 32);
}

}  // namespace flashattn::sm80
