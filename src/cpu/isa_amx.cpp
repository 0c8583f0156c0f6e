// The AMX kernel sets for bf16, fp32 and fp16 tensors: the AVX-512 kernels
// with a gemm that runs on AMX tiles (TDPBF16PS, 16x16 fp32 += 16x32 bf16 *
// 32x16 bf16); for fp32 and fp16 on operands split into three bf16 pieces
// (AmxKernels<3>), by rounding, or by truncation where the product's other
// operand was split by rounding (amx_pieces.hpp, split_pieces_as).
//
// The algorithm hands gemm fp32 tiles; gemm converts its operands to bf16
// (round to nearest even) into the packed layouts AMX reads and accumulates
// in fp32. For Q, K, V, dO this is exact (they came from bf16); P and dS are
// rounded to bf16 before their products, as flash-attn does on GPUs, except
// P V of the forward's masked tiles (gemm_exact_a, see fwd_impl.hpp).
//   A packed: bf16 (m16, k32), m16/k32 = m, k rounded up to 16/32, stored
//             as 16 x 32 tiles of 1 KiB, row tiles outer: tile (i / 16,
//             l / 32), so row i (a multiple of 16) starts at i * k32
//   B packed: pairs (k32 / 2, n16) of bf16 words, (B[2t][j], B[2t+1][j]),
//             the "VNNI" layout of TDPBF16PS, stored as 16 x 16 tiles of
//             1 KiB, column tiles outer: tile (j / 16, t / 16)
// Each tile load then reads one contiguous KiB (measured: +20% AMX
// throughput over row-major packing, whose 16 rows sit a row apart).
// Padding is zero, so padded rows and columns add nothing.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cpuid.h>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/half.hpp"
#include "common/mask.hpp"
#include "common/params.hpp"
#include "common/philox.hpp"
#include "cpu/config.hpp"
#include "cpu/kernels.hpp"
#include "cpu/scratch.hpp"

namespace flashattn {
namespace cpu {

// CPUID.(7,0).EDX: bit 22 AMX-BF16, bit 24 AMX-TILE; then Linux must grant
// this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM).
bool amx_supported() {
  static const bool supported = [] {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if ((edx & (1u << 22)) == 0 || (edx & (1u << 24)) == 0) return false;
    if (!avx512_supported() || !__builtin_cpu_supports("avx512bf16")) return false;
#if defined(__linux__)
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return supported;
}

}  // namespace cpu
}  // namespace flashattn

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,amx-tile,amx-bf16")
// GCC 12's intrinsic headers seed results with `__m512i __Y = __Y;` and then
// warn about it; the warnings say nothing about this file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "cpu/amx_gemm.hpp"
#include "cpu/amx_pieces.hpp"
#include "cpu/avx512_kernels.hpp"
#include "cpu/bwd_impl.hpp"
#include "cpu/fwd_impl.hpp"

namespace flashattn {
namespace cpu {
namespace {

// bf16 tensors (kPieces = 1) take the cheaper exp2 (avx512_kernels.hpp).
template <int kPieces>
struct AmxKernels : Avx512KernelSet<kPieces == 1 ? 4 : 6> {
  using Base = Avx512KernelSet<kPieces == 1 ? 4 : 6>;
  using Products = SplitProducts<kPieces>;
  // A packed operand is kPieces planes of the layout above, one per piece.
  struct PinnedB {
    const float* source = nullptr;
    int k = 0, n = 0;
    int64_t ldb = 0;
    uint32_t* packed = nullptr;
  };

  uint16_t* a_packed;  // kPieces x (kMaxGemmRows, kMaxGemmDim) bf16
  uint32_t* b_packed;  // kPieces x (kMaxGemmDim / 2, kMaxGemmRows) bf16 pairs
  float* c_staging;    // (kMaxGemmRows, kMaxGemmDim)
  PinnedB pinned[kPinnedOperands];
  // A operands packed ahead of their gemm (softmax_grad): rows of a (m, k),
  // lda apart, in pack_a's layout (m16, k32).
  struct PinnedA {
    const float* source = nullptr;
    int m = 0, k = 0;
    int64_t lda = 0;
    uint16_t* packed = nullptr;
  };
  PinnedA pinned_a[kPinnedAOperands];
  SharedOperand shared[kSharedOperands];  // packed once by the team (scratch.hpp)
  static inline const AmxTileConfig kTileConfig{};

  explicit AmxKernels(void* scratch) : Base(scratch) {
    ScratchArena arena(static_cast<char*>(scratch));
    const size_t b_bytes = size_t{kMaxGemmDim} * kMaxGemmRows * 2 * kPieces;
    a_packed = static_cast<uint16_t*>(arena.take_bytes(size_t{kMaxGemmRows} * kMaxGemmDim * 2 * kPieces));
    b_packed = static_cast<uint32_t*>(arena.take_bytes(b_bytes));
    for (PinnedB& pin : pinned) pin.packed = static_cast<uint32_t*>(arena.take_bytes(b_bytes));
    for (PinnedA& pin : pinned_a)
      pin.packed = static_cast<uint16_t*>(arena.take_bytes(size_t{kMaxGemmRows} * kMaxGemmDim * 2 * kPieces));
    c_staging = arena.take_floats(int64_t{kMaxGemmRows} * kMaxGemmDim);
  }

  void pin_b(int slot, const float* b, int k, int n, int64_t ldb) {
    PinnedB& pin = pinned[slot];
    pack_b<kPieces>(k, n, b, ldb, round_up(std::max(k, 1), 32), round_up(n, 16), pin.packed);
    pin.source = b;
    pin.k = k;
    pin.n = n;
    pin.ldb = ldb;
  }

  void unpin_b(int slot) { pinned[slot].source = nullptr; }
  void unpin_a(int slot) { pinned_a[slot].source = nullptr; }

  // dS^T = P^T o (dP^T - delta) for rows (keys) of n queries, ld apart,
  // packed while in registers as the A operands of dV += P^T dO (P^T, pin
  // a_slot_p) and dK += dS^T Q (a_slot_ds) and the B operand of
  // dQ^T += K^T dS^T (pin b_slot); neither p nor dp is written. One pass
  // instead of the product loop and three packing passes over the tiles.
  // bf16 only: with fp32's three pieces the 24 live piece vectors spill, and
  // the fused pass measured 0.93-0.97x of the separate ones (bf16: 1.09-1.10x
  // at 4,8,1024,64, 1.00x at 1,16,4096,128).
  bool softmax_grad(const float* p, float* dp, int64_t ld, int rows, int n, const float* delta, int a_slot_p,
                    int a_slot_ds, int b_slot) {
    if constexpr (kPieces != 1) return false;
    const int m16 = round_up(rows, 16), k32 = round_up(n, 32), n16 = round_up(n, 16), pairs = round_up(rows, 32) / 2;
    PinnedA& pin_p = pinned_a[a_slot_p];
    PinnedA& pin_ds = pinned_a[a_slot_ds];
    PinnedB& pin_b = pinned[b_slot];
    const int64_t a_plane = int64_t{m16} * k32, b_plane = int64_t{n16} * pairs;
    const auto store_a_row = [&](uint16_t* packed, int row, int l, const __m512 lo[kPieces], const __m512 hi[kPieces]) {
      uint16_t* dst = packed + static_cast<int64_t>(row / 16) * 16 * k32 + (row % 16) * 32 + l / 32 * 512;
      for (int piece = 0; piece < kPieces; ++piece)
        _mm512_storeu_si512(dst + piece * a_plane, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi[piece], lo[piece])));
    };
    for (int t = 0; t < pairs; ++t) {
      for (int l = 0; l < k32; l += 32) {
        // [row 2t + r of the pair][half of the 32 columns][piece]
        __m512 prob_pieces[2][2][kPieces], ds_pieces[2][2][kPieces];
        for (int half = 0; half < 2; ++half) {
          const __mmask16 mask = lanes_mask(n - l - 16 * half);
          const __m512 dl = _mm512_maskz_loadu_ps(mask, delta + l + 16 * half);
          for (int r = 0; r < 2; ++r) {
            const int row = 2 * t + r;
            __m512 prob = _mm512_setzero_ps(), ds = _mm512_setzero_ps();
            if (row < rows) {
              prob = _mm512_maskz_loadu_ps(mask, p + row * ld + l + 16 * half);
              const __m512 grad = _mm512_maskz_loadu_ps(mask, dp + row * ld + l + 16 * half);
              ds = _mm512_mul_ps(prob, _mm512_sub_ps(grad, dl));
            }
            split_pieces<kPieces>(prob, prob_pieces[r][half]);
            split_pieces<kPieces>(ds, ds_pieces[r][half]);
          }
        }
        for (int r = 0; r < 2; ++r) {
          if (2 * t + r >= m16) continue;
          store_a_row(pin_p.packed, 2 * t + r, l, prob_pieces[r][0], prob_pieces[r][1]);
          store_a_row(pin_ds.packed, 2 * t + r, l, ds_pieces[r][0], ds_pieces[r][1]);
        }
        for (int half = 0; half < 2; ++half) {
          const int j0 = l + 16 * half;
          if (j0 >= n16) continue;
          uint32_t* dst = pin_b.packed + static_cast<int64_t>(j0) * pairs + t * 16;
          for (int piece = 0; piece < kPieces; ++piece)
            _mm512_storeu_si512(dst + piece * b_plane, pair_rows(ds_pieces[0][half][piece], ds_pieces[1][half][piece]));
        }
      }
    }
    pin_p = PinnedA{p, rows, n, ld, pin_p.packed};
    pin_ds = PinnedA{dp, rows, n, ld, pin_ds.packed};
    pin_b.source = dp;
    pin_b.k = rows;
    pin_b.n = n;
    pin_b.ldb = ld;
    return true;
  }

  // Probabilities of two consecutive keys (rows 2t, 2t + 1 of P^T) added to
  // the column sums and stored as pair row t of a packed B operand, each
  // piece in its plane.
  static void pack_probability_pair(__m512 p0, __m512 p1, uint32_t* pair_row, int64_t plane, __m512& total) {
    total = _mm512_add_ps(total, _mm512_add_ps(p0, p1));
    if constexpr (kPieces == 3) {
      store_truncated_pairs(p0, p1, pair_row, plane);
      return;
    }
    __m512 pieces0[kPieces], pieces1[kPieces];
    split_pieces<kPieces>(p0, pieces0);
    split_pieces<kPieces>(p1, pieces1);
    for (int piece = 0; piece < kPieces; ++piece)
      _mm512_storeu_si512(pair_row + piece * plane, pair_rows(pieces0[piece], pieces1[piece]));
  }

  // With a pin slot, P^T is packed as pack_b would pack it (pairs of rows,
  // one 16-column tile after another, each tile's pairs contiguous) while its
  // exp2 is still in registers, and pinned as the B operand at x; x itself is
  // not written. That drops P^T's fp32 store and pack_b's pass over it.
  void exp2_tile_sum(float* x, int64_t ld, int rows, int n, float mul, const float* sub, float* sum, int pin_slot,
                     bool finite) {
    if (pin_slot < 0) {
      Base::exp2_tile_sum(x, ld, rows, n, mul, sub, sum, pin_slot, finite);
      return;
    }
    if (finite)
      pack_exp2_tile_sum<true>(x, ld, rows, n, mul, sub, sum, pin_slot);
    else
      pack_exp2_tile_sum<false>(x, ld, rows, n, mul, sub, sum, pin_slot);
  }

  template <bool kFinite>
  void pack_exp2_tile_sum(float* x, int64_t ld, int rows, int n, float mul, const float* sub, float* sum,
                          int pin_slot) {
    PinnedB& pin = pinned[pin_slot];
    const int pairs = round_up(rows, 32) / 2;
    const int64_t plane = int64_t{round_up(n, 16)} * pairs;
    const __m512 factor = _mm512_set1_ps(mul);
    for (int j0 = 0; j0 < n; j0 += 16) {
      const __mmask16 mask = lanes_mask(n - j0);
      const __m512 subtrahend = _mm512_maskz_loadu_ps(mask, sub + j0);
      __m512 total = _mm512_setzero_ps();
      uint32_t* tile_pairs = pin.packed + int64_t{j0} * pairs;  // (pairs, 16) of this column tile
      const auto probability_of_row = [&](int r) {
        if (r >= rows) return _mm512_setzero_ps();
        return Base::template probability<kFinite>(_mm512_maskz_loadu_ps(mask, x + r * ld + j0), factor, subtrahend,
                                                    mask);
      };
      for (int t = 0; t < pairs; ++t) {
        pack_probability_pair(probability_of_row(2 * t), probability_of_row(2 * t + 1), tile_pairs + t * 16, plane,
                              total);
      }
      _mm512_mask_storeu_ps(sum + j0, mask, _mm512_add_ps(_mm512_maskz_loadu_ps(mask, sum + j0), total));
    }
    pin.source = x;
    pin.k = rows;
    pin.n = n;
    pin.ldb = ld;
  }

  // The exp2 polynomial of the plain tiles (exp2_unmasked_ps).
  static constexpr int kPlainDegree = kPieces == 1 ? 3 : 5;
  // Queries per panel of the pipelined key tile.
  static constexpr int kPanel = 64;

  // One or two whole key tiles of fwd_q_tile's loop (PlainTile: no mask,
  // raw scores) in panels of kPanel queries. The softmax is column-wise, so
  // each panel is independent of the others until O^T: step s computes S^T
  // of panel s (into a ring of two (keys, kPanel) buffers, 32 KiB each for
  // one tile, which the softmax reads back from L1 rather than from the
  // 128 KiB score tile in L2; 64 KiB for two) and O^T += V^T P^T of panel
  // s - 2 on the tile unit (k = all the keys: two tiles halve O^T's tile
  // loads and stores per key, measured +5-7 % at 4k), and runs the
  // softmax of panel s - 1 on the vector units with the gemm blocks spread
  // over its checkpoints. The tile unit and the vector ports overlap only
  // when interleaved finely (dev/amx_microbench.cpp: exp2 pairs between the
  // k steps of a block hide behind its products, a whole block then the
  // pairs do not overlap at all), but blocks cut into k steps measured
  // slower here; whole blocks between runs of 8 pairs measured 5-7% faster
  // at 1k (bf16 and fp32) and 1-2% at 4k than the same steps run one after
  // another. Panels of 64 measured 2-6% faster than 32 (K and V^T tiles
  // reused for twice the queries) and than 128. The exp2 is
  // exp2_unmasked_ps: no score of a plain tile is -inf. The state update is
  // the loop's (move_references, rescale_queries). False, doing nothing,
  // where K or V^T is not a shared packing or Q^T not pinned in slot 0.
  template <class Tile>
  bool fwd_plain_tile(const Tile& t) {
    const PinnedB& q_pin = pinned[0];
    if (q_pin.source != t.q_t || q_pin.k != t.d || q_pin.n != t.nq) return false;
    const int keys = t.tiles * kBlockN;
    // K per key tile (S^T's rows), V^T's key tiles as one A operand.
    const uint16_t* k_packed[2] = {};
    int k_row_length = 0, v_row_length = 0;
    int64_t k_plane = 0, v_plane = 0, v_chunk_stride = 0;
    const uint16_t* vt_packed = nullptr;
    for (int tile = 0; tile < t.tiles; ++tile) {
      k_packed[tile] = find_packed_a(kBlockN, t.d, t.k_tile + int64_t{tile} * kBlockN * t.d, t.d, 1, k_row_length,
                                     k_plane);
      const uint16_t* vt =
          find_packed_a(t.dv, kBlockN, t.v_tile + int64_t{tile} * kBlockN * t.dv, 1, t.dv, v_row_length, v_plane);
      if (k_packed[tile] == nullptr || vt == nullptr) return false;
      if (tile == 0) vt_packed = vt;
      else v_chunk_stride = vt - vt_packed;
    }

    const int d32 = round_up(t.d, 32);
    const int pairs = keys / 2;
    PinnedB& p_pin = pinned[kPinnedP];
    const int64_t p_plane = int64_t{t.nq} * pairs;
    p_pin = PinnedB{t.s_t, keys, t.nq, kBlockM, p_pin.packed};
    float* ring[2] = {t.s_t, t.s_t + int64_t{keys} * kPanel};
    const int panels = (t.nq + kPanel - 1) / kPanel;
    const auto width = [&](int panel) { return std::min(kPanel, t.nq - panel * kPanel); };
    const auto scores = [&](int panel, int tile) {  // rows of S^T (kBlockN, width) = K Q^T
      const int c0 = panel * kPanel;
      return PackedGemm{k_packed[tile], k_row_length, k_plane, q_pin.packed + int64_t{c0} * (d32 / 2),
                        int64_t{d32} * 8, int64_t{t.nq} * (d32 / 2), kBlockN, width(panel), d32,
                        ring[panel % 2] + int64_t{tile} * kBlockN * kPanel, kPanel, false};
    };
    const auto output = [&](int panel) {  // O^T (dv, width) += V^T P^T
      const int c0 = panel * kPanel;
      PackedGemm g{vt_packed, v_row_length, v_plane, p_pin.packed + int64_t{c0} * pairs, int64_t{keys} * 8,
                   p_plane, round_up(t.dv, 16), width(panel), keys, t.o_t + c0, kBlockM, true};
      g.a_chunk_k = kBlockN;
      g.a_chunk_stride = v_chunk_stride;
      return g;
    };

    _tile_loadconfig(&kTileConfig);
    for (int step = 0; step <= panels + 1; ++step) {
      BlockSchedule<kPieces> schedule;
      for (int tile = 0; step < panels && tile < t.tiles; ++tile) schedule.add(scores(step, tile));
      if (step >= 2) schedule.add(output(step - 2));
      if (step >= 1 && step <= panels) panel_softmax(t, keys, (step - 1) * kPanel, width(step - 1),
                                                     ring[(step - 1) % 2], p_pin.packed, p_plane, schedule);
      schedule.run_share(1, 1);
    }
    _tile_release();
    p_pin.source = nullptr;
    return true;
  }

  // The softmax of queries [c0, c0 + width) of a plain tile, their scores
  // in s (kBlockN, kPanel): as column_max, move_references,
  // rescale_queries and exp2_tile_sum with a pin slot do it (but with
  // exp2_unmasked_ps), with `schedule`'s blocks run in shares along the way.
  template <class Tile>
  void panel_softmax(const Tile& t, int keys, int c0, int width, const float* s, uint32_t* p_packed, int64_t p_plane,
                     BlockSchedule<kPieces>& schedule) {
    const int pairs = keys / 2;
    constexpr int kRowsPerCheck = 16, kPairsPerCheck = 8;
    static_assert(kBlockN % kRowsPerCheck == 0 && kBlockN / 2 % kPairsPerCheck == 0, "whole runs between checks");
    const int vectors = width / 16;
    const int checks = keys / kRowsPerCheck + vectors * (pairs / kPairsPerCheck);
    int check = 0;
    // The maxima in registers: one instantiation per vector count, so
    // that the loop over them unrolls (with a run-time count they spilled).
    const auto column_maxima = [&](auto vector_count) {
      constexpr int kVectors = decltype(vector_count)::value;
      __m512 best[kVectors];
      for (__m512& column_best : best) column_best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int r0 = 0; r0 < keys; r0 += kRowsPerCheck) {
        for (int r = r0; r < r0 + kRowsPerCheck; ++r)
          for (int v = 0; v < kVectors; ++v) best[v] = _mm512_max_ps(_mm512_loadu_ps(s + r * kPanel + 16 * v), best[v]);
        schedule.run_share(++check, checks);
      }
      for (int v = 0; v < kVectors; ++v) _mm512_storeu_ps(t.tile_max + c0 + 16 * v, best[v]);
    };
    static_assert(kPanel == 64, "column_maxima instantiates 1 to 4 vectors");
    switch (vectors) {
      case 1: column_maxima(std::integral_constant<int, 1>{}); break;
      case 2: column_maxima(std::integral_constant<int, 2>{}); break;
      case 3: column_maxima(std::integral_constant<int, 3>{}); break;
      default: column_maxima(std::integral_constant<int, 4>{}); break;
    }
    if (move_references(t.tile_max + c0, t.row_max + c0, t.alpha + c0, width, t.factor))
      rescale_queries<AmxKernels>(t.alpha + c0, t.tile_max + c0, t.row_sum + c0, t.o_t + c0, t.dv, width);

    const __m512 factor = _mm512_set1_ps(t.factor);
    for (int v = 0; v < vectors; ++v) {
      const __m512 subtrahend = _mm512_loadu_ps(t.tile_max + c0 + 16 * v);
      __m512 total = _mm512_setzero_ps();
      uint32_t* tile_pairs = p_packed + int64_t{c0 + 16 * v} * pairs;  // (pairs, 16) of this column tile
      // The gemm blocks run between runs of pairs, not inside them: a call
      // clobbers every zmm register, and inside the loop body it made each
      // pair reload its constants.
      for (int pair0 = 0; pair0 < pairs; pair0 += kPairsPerCheck) {
        for (int pair = pair0; pair < pair0 + kPairsPerCheck; ++pair) {
          const __m512 p0 = exp2_unmasked_ps<kPlainDegree>(
              _mm512_fmsub_ps(_mm512_loadu_ps(s + 2 * pair * kPanel + 16 * v), factor, subtrahend));
          const __m512 p1 = exp2_unmasked_ps<kPlainDegree>(
              _mm512_fmsub_ps(_mm512_loadu_ps(s + (2 * pair + 1) * kPanel + 16 * v), factor, subtrahend));
          pack_probability_pair(p0, p1, tile_pairs + pair * 16, p_plane, total);
        }
        schedule.run_share(++check, checks);
      }
      float* sum = t.row_sum + c0 + 16 * v;
      _mm512_storeu_ps(sum, _mm512_add_ps(_mm512_loadu_ps(sum), total));
    }
  }

  // bf16 rows (src: a RowsView, rows from first_row) packed straight into a
  // shared operand's chunk or a pin slot, as pack_chunk and pin_b would pack
  // them staged as fp32: the fp32 rows are then never written, and every
  // gemm that reads them must find the packing (as each does in the
  // forward). fp32 rows are split into pieces from the tensor itself. False,
  // doing nothing, for fp16 and for a B operand's rows.
  template <class Rows>
  static bool pack_chunk_from_rows(const SharedOperand& op, int64_t chunk, int rows, const Rows& src, int64_t first_row) {
    if (op.role == OperandRole::kRowsB) return false;
    const char* base = src.base + first_row * src.row_stride_bytes;
    uint16_t* dst = op.chunk_packed(chunk, kPieces);
    if (src.dtype == FA_DTYPE_FP32) {  // split into pieces straight from the tensor's rows
      const float* rows_fp32 = reinterpret_cast<const float*>(base);
      const int64_t stride = src.row_stride_bytes / 4;
      if (op.role == OperandRole::kRowsA)
        pack_a<kPieces>(rows, op.cols, rows_fp32, stride, 1, op.plane_rows(), op.plane_row_length(), dst);
      else
        pack_a<kPieces>(op.cols, rows, rows_fp32, 1, stride, op.plane_rows(), op.plane_row_length(), dst);
      return true;
    }
    if (kPieces != 1 || src.dtype != FA_DTYPE_BF16) return false;
    if (op.role == OperandRole::kRowsA)
      pack_bf16_rows_a(base, src.row_stride_bytes, rows, op.cols, op.plane_rows(), op.plane_row_length(), dst);
    else
      pack_bf16_rows_transposed_a(base, src.row_stride_bytes, rows, op.cols, op.plane_rows(), op.plane_row_length(),
                                  dst);
    return true;
  }

  // B = the transpose of `rows` rows of `cols` bf16, pinned under the name
  // of its fp32 copy b (k = cols, n = rows, ldb), which is not written.
  template <class Rows>
  bool pin_b_from_rows(int slot, const Rows& src, int64_t first_row, int rows, int cols, const float* b, int64_t ldb) {
    if (kPieces != 1 || src.dtype != FA_DTYPE_BF16) return false;
    PinnedB& pin = pinned[slot];
    pack_bf16_rows_transposed_b(src.base + first_row * src.row_stride_bytes, src.row_stride_bytes, rows, cols,
                                round_up(std::max(cols, 1), 32), round_up(rows, 16), pin.packed);
    pin.source = b;
    pin.k = cols;
    pin.n = rows;
    pin.ldb = ldb;
    return true;
  }

  // Packs chunk `chunk` (its first `rows` staged rows) of a shared operand.
  static void pack_chunk(const SharedOperand& op, int64_t chunk, int rows) {
    const float* src = op.source + chunk * op.chunk_floats();
    uint16_t* dst = op.chunk_packed(chunk, kPieces);
    if (op.role == OperandRole::kRowsA)
      pack_a<kPieces>(rows, op.cols, src, op.cols, 1, op.plane_rows(), op.plane_row_length(), dst);
    else if (op.role == OperandRole::kTransposedA)
      pack_a<kPieces>(op.cols, rows, src, 1, op.cols, op.plane_rows(), op.plane_row_length(), dst);
    else
      pack_b<kPieces>(rows, op.cols, src, op.cols, op.chunk_rows, op.plane_row_length() / 2, reinterpret_cast<uint32_t*>(dst));
  }

  void share(int slot, const SharedOperand& op) { shared[slot] = op.packed != nullptr ? op : SharedOperand{}; }
  void unshare(int slot) { shared[slot] = SharedOperand{}; }

  // Where the gemm operand at `x` lies in a shared operand: its chunk and
  // the staged row within it (false: not shared, or not at a row).
  static bool locate(const SharedOperand& op, const float* x, int64_t& chunk, int& row) {
    if (op.source == nullptr || x < op.source) return false;
    const int64_t offset = x - op.source;
    if (offset >= op.rows * op.cols) return false;
    chunk = offset / op.chunk_floats();
    const int64_t within = offset % op.chunk_floats();
    if (within % op.cols != 0) return false;
    row = static_cast<int>(within / op.cols);
    return true;
  }

  // The packed A operand, its row length and plane size where it is packed
  // already: a pinned A operand, or a window of a shared operand (rows from a
  // multiple of 16 within one chunk, or a whole transposed chunk); else null.
  const uint16_t* find_packed_a(int m, int k, const float* a, int64_t a_row, int64_t a_col, int& row_length,
                                int64_t& plane) const {
    const int m16 = round_up(m, 16), k32 = round_up(std::max(k, 1), 32);
    for (const PinnedA& pin : pinned_a) {
      if (pin.source != a || a_col != 1 || a_row != pin.lda || m != pin.m || k != pin.k) continue;
      row_length = k32;
      plane = int64_t{m16} * k32;
      return pin.packed;
    }
    for (const SharedOperand& op : shared) {
      int64_t chunk = 0;
      int row = 0;
      if (op.role == OperandRole::kRowsB || !locate(op, a, chunk, row)) continue;
      const bool rows = op.role == OperandRole::kRowsA;
      if (rows ? (a_col != 1 || a_row != op.cols || k != op.cols || row % 16 != 0 || row + m16 > op.chunk_rows)
               : (a_row != 1 || a_col != op.cols || m != op.cols || row != 0 || k > op.chunk_rows))
        continue;
      row_length = op.plane_row_length();
      plane = int64_t{op.plane_rows()} * row_length;
      return op.chunk_packed(chunk, kPieces) + static_cast<int64_t>(row) * row_length;
    }
    return nullptr;
  }

  // The packed B operand, its column tile stride (uint32) and its plane size: a
  // pinned operand, or a column window of one that starts on a 16-column
  // tile, is used as packed; null where b is not packed.
  const uint32_t* find_packed_b(int k, int n, const float* b, int64_t ldb, int k32, int64_t& col_stride,
                                int64_t& plane) {
    // Rows of a shared operand: whole rows from an even one (a multiple of
    // 16) within one chunk.
    for (const SharedOperand& op : shared) {
      int64_t chunk = 0;
      int row = 0;
      if (op.role != OperandRole::kRowsB || !locate(op, b, chunk, row)) continue;
      if (ldb != op.cols || n != op.cols || row % 32 != 0 || row + k32 > op.chunk_rows) continue;
      col_stride = int64_t{op.chunk_rows} * 8;
      plane = int64_t{op.plane_rows()} * op.plane_row_length() / 2;
      return reinterpret_cast<const uint32_t*>(op.chunk_packed(chunk, kPieces)) + row / 32 * 256;
    }
    for (const PinnedB& pin : pinned) {
      if (pin.source == nullptr || pin.k != k || pin.ldb != ldb || b < pin.source) continue;
      const int64_t offset = b - pin.source;
      if (offset % 16 != 0 || offset + n > pin.n) continue;
      col_stride = int64_t{k32} * 8;
      plane = round_up(pin.n, 16) * int64_t{k32 / 2};
      return pin.packed + offset * (k32 / 2);
    }
    return nullptr;
  }

  void gemm(int m, int n, int k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
            float* c, int64_t ldc, bool accumulate) {
    if (m <= 0 || n <= 0) return;
    const int m16 = round_up(m, 16), n16 = round_up(n, 16), k32 = round_up(std::max(k, 1), 32);
    int a_row_length = k32;
    int64_t a_plane = int64_t{m16} * k32;
    const uint16_t* a_pieces = find_packed_a(m, k, a, a_row, a_col, a_row_length, a_plane);
    int64_t b_col_stride = int64_t{k32} * 8, b_plane = int64_t{n16} * (k32 / 2);
    const uint32_t* b_pairs = find_packed_b(k, n, b, ldb, k32, b_col_stride, b_plane);
    // An operand packed here against one packed before (pinned or shared,
    // split by rounding) is split by truncation, which keeps each product to
    // 2^-23 (split_pieces_as): in the passes that is P or dS against an input.
    // Two operands packed here are both rounded.
    if (a_pieces == nullptr) {
      if (b_pairs != nullptr)
        pack_a<kPieces, Split::kTruncate>(m, k, a, a_row, a_col, m16, k32, a_packed);
      else
        pack_a<kPieces>(m, k, a, a_row, a_col, m16, k32, a_packed);
      a_pieces = a_packed;
    }
    if (b_pairs == nullptr) {
      if (a_pieces != a_packed)
        pack_b<kPieces, Split::kTruncate>(k, n, b, ldb, k32, n16, b_packed);
      else
        pack_b<kPieces>(k, n, b, ldb, k32, n16, b_packed);
      b_pairs = b_packed;
    }
    // Tiles write whole 16 x 16 blocks: straight into C when they fit its
    // rows and columns, else through the staging tile. Padded staging
    // elements hold stale values; each output element depends only on its
    // own input element, so they never reach C.
    const bool direct = m == m16 && n == n16;
    float* target = direct ? c : c_staging;
    const int64_t ld = direct ? ldc : n16;
    if (!direct && accumulate)
      for (int i = 0; i < m; ++i) std::memcpy(c_staging + i * ld, c + i * ldc, sizeof(float) * n);

    const PackedGemm blocks{a_pieces, a_row_length, a_plane, b_pairs, b_col_stride, b_plane, m16, n16, k32, target, ld,
                            accumulate};
    _tile_loadconfig(&kTileConfig);
    for (int index = 0; index < blocks.blocks(); ++index) run_block<kPieces>(blocks, index);
    _tile_release();
    if (!direct)
      for (int i = 0; i < m; ++i) std::memcpy(c + i * ldc, c_staging + i * ld, sizeof(float) * n);
  }

  // bf16 pieces: A = hi + lo with hi = bf16(A): C += hi B + lo B keeps the
  // product of A to ~2^-16 relative instead of bf16's 2^-9. lo replaces A in
  // place. Split fp32 pieces are exact already.
  void gemm_exact_a(int m, int n, int k, float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
                    float* c, int64_t ldc) {
    gemm(m, n, k, a, a_row, a_col, b, ldb, c, ldc, true);
    if constexpr (kPieces == 1) {
      // Contiguous runs of A: rows (a_col == 1) or columns (a_row == 1).
      const bool by_rows = a_col == 1;
      const int runs = by_rows ? m : k, length = by_rows ? k : m;
      const int64_t stride = by_rows ? a_row : a_col;
      for (int r = 0; r < runs; ++r) {
        float* run = a + r * stride;
        for (int i = 0; i < length; i += 16) {
          const __mmask16 mask = lanes_mask(length - i);
          const __m512 x = _mm512_maskz_loadu_ps(mask, run + i);
          _mm512_mask_storeu_ps(run + i, mask, _mm512_sub_ps(x, round_to_bf16(x)));
        }
      }
      gemm(m, n, k, a, a_row, a_col, b, ldb, c, ldc, true);
    }
  }

  // The same for a B that holds P (the forward's O^T = V^T P^T).
  void gemm_exact_b(int m, int n, int k, const float* a, int64_t a_row, int64_t a_col, float* b, int64_t ldb,
                    float* c, int64_t ldc) {
    gemm(m, n, k, a, a_row, a_col, b, ldb, c, ldc, true);
    if constexpr (kPieces == 1) {
      for (int l = 0; l < k; ++l) {
        float* row = b + l * ldb;
        for (int j = 0; j < n; j += 16) {
          const __mmask16 mask = lanes_mask(n - j);
          const __m512 x = _mm512_maskz_loadu_ps(mask, row + j);
          _mm512_mask_storeu_ps(row + j, mask, _mm512_sub_ps(x, round_to_bf16(x)));
        }
      }
      gemm(m, n, k, a, a_row, a_col, b, ldb, c, ldc, true);
    }
  }
};

}  // namespace

IsaBackend amx_backend() { return IsaBackend{"amx", &run_fwd<AmxKernels<1>>, &run_bwd<AmxKernels<1>>}; }
IsaBackend amx_split_backend() {
  return IsaBackend{"amx-split", &run_fwd<AmxKernels<kAmxSplitPieces>>, &run_bwd<AmxKernels<kAmxSplitPieces>>};
}

}  // namespace cpu
}  // namespace flashattn

#pragma GCC diagnostic pop
#pragma GCC pop_options
