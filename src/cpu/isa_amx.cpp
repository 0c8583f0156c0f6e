// The AMX kernel sets for bf16 and fp32 tensors: the AVX-512 kernels with a
// gemm that runs on AMX tiles (TDPBF16PS, 16x16 fp32 += 16x32 bf16 * 32x16
// bf16); for fp32 on operands split into three bf16 pieces (AmxKernels<3>).
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
    pack_b(k, n, b, ldb, round_up(std::max(k, 1), 32), round_up(n, 16), pin.packed);
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

  // With a pin slot, P^T is packed as pack_b would pack it (pairs of rows,
  // one 16-column tile after another, each tile's pairs contiguous) while its
  // exp2 is still in registers, and pinned as the B operand at x; x itself is
  // not written. That drops P^T's fp32 store and pack_b's pass over it.
  void exp2_tile_sum(float* x, int64_t ld, int rows, int n, float mul, const float* sub, float* sum, int pin_slot) {
    if (pin_slot < 0) {
      Base::exp2_tile_sum(x, ld, rows, n, mul, sub, sum, pin_slot);
      return;
    }
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
        return Base::probability(_mm512_maskz_loadu_ps(mask, x + r * ld + j0), factor, subtrahend, mask);
      };
      for (int t = 0; t < pairs; ++t) {
        const __m512 p0 = probability_of_row(2 * t), p1 = probability_of_row(2 * t + 1);
        total = _mm512_add_ps(total, _mm512_add_ps(p0, p1));
        __m512 pieces0[kPieces], pieces1[kPieces];
        split_pieces<kPieces>(p0, pieces0);
        split_pieces<kPieces>(p1, pieces1);
        for (int piece = 0; piece < kPieces; ++piece)
          _mm512_storeu_si512(tile_pairs + piece * plane + t * 16, pair_rows(pieces0[piece], pieces1[piece]));
      }
      _mm512_mask_storeu_ps(sum + j0, mask, _mm512_add_ps(_mm512_maskz_loadu_ps(mask, sum + j0), total));
    }
    pin.source = x;
    pin.k = rows;
    pin.n = n;
    pin.ldb = ld;
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
        pack_a(rows, op.cols, rows_fp32, stride, 1, op.plane_rows(), op.plane_row_length(), dst);
      else
        pack_a(op.cols, rows, rows_fp32, 1, stride, op.plane_rows(), op.plane_row_length(), dst);
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
      pack_a(rows, op.cols, src, op.cols, 1, op.plane_rows(), op.plane_row_length(), dst);
    else if (op.role == OperandRole::kTransposedA)
      pack_a(op.cols, rows, src, 1, op.cols, op.plane_rows(), op.plane_row_length(), dst);
    else
      pack_b(rows, op.cols, src, op.cols, op.chunk_rows, op.plane_row_length() / 2, reinterpret_cast<uint32_t*>(dst));
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

  // The packed A operand, its row length and plane size: a window of a
  // shared operand (rows from a multiple of 16 within one chunk, or a whole
  // transposed chunk), else packed here.
  const uint16_t* packed_a(int m, int k, const float* a, int64_t a_row, int64_t a_col, int m16, int k32, int& row_length,
                           int64_t& plane) {
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
    pack_a(m, k, a, a_row, a_col, m16, k32, a_packed);
    row_length = k32;
    plane = int64_t{m16} * k32;
    return a_packed;
  }

  // The packed B operand, its column tile stride (uint32) and its plane size: a
  // pinned operand, or a column window of one that starts on a 16-column
  // tile, is used as packed.
  const uint32_t* packed_b(int k, int n, const float* b, int64_t ldb, int k32, int n16, int64_t& col_stride,
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
    pack_b(k, n, b, ldb, k32, n16, b_packed);
    col_stride = int64_t{k32} * 8;
    plane = static_cast<int64_t>(n16) * (k32 / 2);
    return b_packed;
  }

  // A element (i, l) at a[i * a_row + l * a_col] -> dst planes (m16, k32).
  static void pack_a(int m, int k, const float* a, int64_t a_row, int64_t a_col, int m16, int k32,
                     uint16_t* dst_rows) {
    const int64_t plane = static_cast<int64_t>(m16) * k32;
    if (a_col == 1) {
      for (int i = 0; i < m16; ++i) {
        uint16_t* dst = dst_rows + static_cast<int64_t>(i / 16) * 16 * k32 + (i % 16) * 32;
        const float* src = a + i * a_row;
        for (int l = 0; l < k32; l += 32) {
          __m512 lo[kPieces], hi[kPieces];
          split_pieces<kPieces>(load_or_zero(src + l, i < m, lanes_mask(k - l)), lo);
          split_pieces<kPieces>(load_or_zero(src + l + 16, i < m, lanes_mask(k - l - 16)), hi);
          for (int piece = 0; piece < kPieces; ++piece)
            _mm512_storeu_si512(dst + piece * plane + l / 32 * 512,
                                reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi[piece], lo[piece])));
        }
      }
      return;
    }
    // Transposed source (a_row == 1, the only other layout the algorithm uses): pair rows l, l+1 of the (k, m) source,
    // then transpose 16 x 16 blocks of pairs into rows of A.
    const int pairs = k32 / 2;
    for (int i0 = 0; i0 < m16; i0 += 16) {
      const __mmask16 mask = lanes_mask(m - i0);
      for (int t0 = 0; t0 < pairs; t0 += 16) {
        __m512i block[kPieces][16];
        for (int t = 0; t < 16; ++t) {
          const int l = 2 * (t0 + t);
          __m512 r0[kPieces], r1[kPieces];
          split_pieces<kPieces>(load_or_zero(a + l * a_col + i0 * a_row, l < k, mask), r0);
          split_pieces<kPieces>(load_or_zero(a + (l + 1) * a_col + i0 * a_row, l + 1 < k, mask), r1);
          for (int piece = 0; piece < kPieces; ++piece) block[piece][t] = pair_rows(r0[piece], r1[piece]);
        }
        for (int piece = 0; piece < kPieces; ++piece) {
          transpose16x16(block[piece]);
          for (int i = 0; i < 16; ++i)
            _mm512_storeu_si512(dst_rows + piece * plane + static_cast<int64_t>(i0) * k32 + t0 / 16 * 512 + i * 32,
                                block[piece][i]);
        }
      }
    }
  }

  // B (k, n) row-major -> dst planes (k32 / 2, n16) of pairs; column tile
  // j / 16 starts at j * k32 / 2.
  static void pack_b(int k, int n, const float* b, int64_t ldb, int k32, int n16, uint32_t* dst_rows) {
    const int64_t plane = static_cast<int64_t>(n16) * (k32 / 2);
    // One tile (16 pair rows, 16 columns) at a time: its KiB is written in
    // order (row by row, a 4 KiB stride would alias in L1).
    for (int t0 = 0; t0 < k32 / 2; t0 += 16) {
      for (int j = 0; j < n16; j += 16) {
        const __mmask16 mask = lanes_mask(n - j);
        uint32_t* dst = dst_rows + static_cast<int64_t>(j) * (k32 / 2) + t0 / 16 * 256;
        for (int t = t0; t < t0 + 16; ++t) {
          const int l = 2 * t;
          __m512 r0[kPieces], r1[kPieces];
          split_pieces<kPieces>(load_or_zero(b + l * ldb + j, l < k, mask), r0);
          split_pieces<kPieces>(load_or_zero(b + (l + 1) * ldb + j, l + 1 < k, mask), r1);
          for (int piece = 0; piece < kPieces; ++piece)
            _mm512_storeu_si512(dst + piece * plane + (t - t0) * 16, pair_rows(r0[piece], r1[piece]));
        }
      }
    }
  }

  // C blocks of (16 * kRowTiles, 16 * kColTiles): per piece product and
  // 32-wide k step, A and B tiles are loaded once and feed
  // kRowTiles * kColTiles products.
  template <int kRowTiles, int kColTiles>
  void amx_block(const uint16_t* a_rows_packed, int a_row_length, int64_t a_plane, const uint32_t* b_pairs,
                 int64_t b_col_stride, int64_t b_plane, int i0, int j0, int k32, float* c, int64_t ldc, bool accumulate) {
    float* c00 = c + i0 * ldc + j0;
    const int64_t c_stride = ldc * 4;
    if (accumulate) {
      _tile_loadd(0, c00, c_stride);
      if (kColTiles > 1) _tile_loadd(1, c00 + 16, c_stride);
      if (kRowTiles > 1) _tile_loadd(2, c00 + 16 * ldc, c_stride);
      if (kRowTiles > 1 && kColTiles > 1) _tile_loadd(3, c00 + 16 * ldc + 16, c_stride);
    } else {
      _tile_zero(0);
      if (kColTiles > 1) _tile_zero(1);
      if (kRowTiles > 1) _tile_zero(2);
      if (kRowTiles > 1 && kColTiles > 1) _tile_zero(3);
    }
    constexpr int64_t kTileStride = 64;  // bytes per tile row: tiles are contiguous
    const uint16_t* a_rows = a_rows_packed + static_cast<int64_t>(i0) * a_row_length;
    const uint32_t* b_cols = b_pairs + static_cast<int64_t>(j0 / 16) * b_col_stride;
    const auto load_a = [&](int piece, int l) {
      _tile_loadd(4, a_rows + piece * a_plane + l / 32 * 512, kTileStride);
      if (kRowTiles > 1) _tile_loadd(5, a_rows + piece * a_plane + 16 * a_row_length + l / 32 * 512, kTileStride);
    };
    const auto load_b = [&](int piece, int l) {
      const uint32_t* b_tile = b_cols + piece * b_plane + l / 32 * 256;
      _tile_loadd(6, b_tile, kTileStride);
      if (kColTiles > 1) _tile_loadd(7, b_tile + b_col_stride, kTileStride);
    };
    const auto multiply = [] {
      _tile_dpbf16ps(0, 4, 6);
      if (kColTiles > 1) _tile_dpbf16ps(1, 4, 7);
      if (kRowTiles > 1) _tile_dpbf16ps(2, 5, 6);
      if (kRowTiles > 1 && kColTiles > 1) _tile_dpbf16ps(3, 5, 7);
    };
    if constexpr (Products::kSmall > 0) {
      for (int l = 0; l < k32; l += 32) {
#pragma GCC unroll 8
        for (int step = 0; step < Products::kSmall; ++step) {
          if (step == 0 || Products::a[step] != Products::a[step - 1]) load_a(Products::a[step], l);
          if (step == 0 || Products::b[step] != Products::b[step - 1]) load_b(Products::b[step], l);
          multiply();
        }
      }
    }
    for (int l = 0; l < k32; l += 32) {
      load_a(0, l);
      load_b(0, l);
      multiply();
    }
    _tile_stored(0, c00, c_stride);
    if (kColTiles > 1) _tile_stored(1, c00 + 16, c_stride);
    if (kRowTiles > 1) _tile_stored(2, c00 + 16 * ldc, c_stride);
    if (kRowTiles > 1 && kColTiles > 1) _tile_stored(3, c00 + 16 * ldc + 16, c_stride);
  }

  void gemm(int m, int n, int k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
            float* c, int64_t ldc, bool accumulate) {
    if (m <= 0 || n <= 0) return;
    const int m16 = round_up(m, 16), n16 = round_up(n, 16), k32 = round_up(std::max(k, 1), 32);
    int a_row_length = 0;
    int64_t a_plane = 0;
    const uint16_t* a_pieces = packed_a(m, k, a, a_row, a_col, m16, k32, a_row_length, a_plane);
    int64_t b_col_stride = 0, b_plane = 0;
    const uint32_t* b_pairs = packed_b(k, n, b, ldb, k32, n16, b_col_stride, b_plane);
    // Tiles write whole 16 x 16 blocks: straight into C when they fit its
    // rows and columns, else through the staging tile. Padded staging
    // elements hold stale values; each output element depends only on its
    // own input element, so they never reach C.
    const bool direct = m == m16 && n == n16;
    float* target = direct ? c : c_staging;
    const int64_t ld = direct ? ldc : n16;
    if (!direct && accumulate)
      for (int i = 0; i < m; ++i) std::memcpy(c_staging + i * ld, c + i * ldc, sizeof(float) * n);

    static const AmxTileConfig config;
    _tile_loadconfig(&config);
    run_blocks(a_pieces, a_row_length, a_plane, b_pairs, b_col_stride, b_plane, m16, n16, k32, target, ld, accumulate);
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

  void run_blocks(const uint16_t* a_rows, int a_row_length, int64_t a_plane, const uint32_t* b_pairs,
                  int64_t b_col_stride, int64_t b_plane, int m16, int n16, int k32, float* target, int64_t ld,
                  bool accumulate) {
    int i0 = 0;
    for (; i0 + 32 <= m16; i0 += 32) {
      int j0 = 0;
      for (; j0 + 32 <= n16; j0 += 32)
        amx_block<2, 2>(a_rows, a_row_length, a_plane, b_pairs, b_col_stride, b_plane, i0, j0, k32, target, ld,
                        accumulate);
      if (j0 < n16)
        amx_block<2, 1>(a_rows, a_row_length, a_plane, b_pairs, b_col_stride, b_plane, i0, j0, k32, target, ld,
                        accumulate);
    }
    if (i0 < m16) {
      int j0 = 0;
      for (; j0 + 32 <= n16; j0 += 32)
        amx_block<1, 2>(a_rows, a_row_length, a_plane, b_pairs, b_col_stride, b_plane, i0, j0, k32, target, ld,
                        accumulate);
      if (j0 < n16)
        amx_block<1, 1>(a_rows, a_row_length, a_plane, b_pairs, b_col_stride, b_plane, i0, j0, k32, target, ld,
                        accumulate);
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
