// Tile-level building blocks shared by the forward and backward passes:
// where a sequence lives, loading and storing tiles with dtype conversion,
// turning raw dot products into masked log2-domain scores, dropout factors.
//
// Everything here is templated on the ISA kernel set `Isa` (gemm, exp2,
// conversion) and lives in an anonymous namespace: each ISA translation unit
// compiles its own copy with its own target flags, and no symbol is shared
// between them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/mask.hpp"
#include "common/params.hpp"
#include "common/philox.hpp"
#include "cpu/config.hpp"
#include "cpu/scratch.hpp"

namespace flashattn {
namespace cpu {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Rows of sequence b: dense tensors use the batch stride and row 0, varlen
// tensors batch stride 0 and row cu_seqlens[b].
struct Sequence {
  int64_t q_row0 = 0, k_row0 = 0, seqlen_q = 0, seqlen_k = 0;
};

inline Sequence sequence_of(const AttnParams& p, int64_t b) {
  Sequence s;
  if (p.is_varlen) {
    s.q_row0 = p.cu_seqlens_q[b];
    s.k_row0 = p.cu_seqlens_k[b];
    s.seqlen_q = p.cu_seqlens_q[b + 1] - s.q_row0;
    s.seqlen_k = p.cu_seqlens_k[b + 1] - s.k_row0;
  } else {
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
  }
  return s;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threads worth starting for a call whose steps have at most max_items work
// items: no idle ones, and none for less than kMinFlopsPerThread of work
// (~20 us of one core in fp32), where waking a thread, and on a busy machine
// its spinning waits, costs more than it saves. Kept low so that most test
// cases still run threaded; results do not depend on the count.
constexpr double kMinFlopsPerThread = 2e6;
inline int team_size(const AttnParams& p, int64_t max_items) {
  double flops = 0.0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = sequence_of(p, b);
    flops += 2.0 * static_cast<double>(s.seqlen_q) * static_cast<double>(s.seqlen_k) *
             static_cast<double>(p.head_dim + p.head_dim_v);
  }
  flops *= static_cast<double>(p.heads);
  const int64_t by_work = std::max<int64_t>(1, static_cast<int64_t>(flops / kMinFlopsPerThread));
  return static_cast<int>(std::clamp<int64_t>(std::min(max_items, by_work), 1, p.num_threads));
}

// A strided (rows, cols) view of one head of one sequence of a tensor.
struct RowsView {
  const char* base;
  int64_t row_stride_bytes;
  fa_dtype dtype;
};

inline RowsView rows_view(const void* data, fa_dtype dtype, const TensorLayout& layout, int64_t b, int64_t row0,
                          int64_t h) {
  const int64_t size = element_size(dtype);
  const int64_t offset = b * layout.batch + row0 * layout.row + h * layout.head;
  return RowsView{static_cast<const char*>(data) + offset * size, layout.row * size, dtype};
}

// dst (rows, cols) with leading dimension ld, fp32.
template <class Isa>
void load_tile(const RowsView& src, int64_t first_row, int rows, int cols, float* dst, int64_t ld) {
  for (int r = 0; r < rows; ++r)
    Isa::load_row(src.base + (first_row + r) * src.row_stride_bytes, src.dtype, dst + r * ld, cols);
}

// dst (cols, ld): the tile transposed, so its rows become GEMM B-operand rows.
// Blocks of kTransposeRows source rows go through row_tmp
// (kTransposeRows, cols), so each destination row receives 16 consecutive
// floats (one cache line) per block instead of one float per source row.
template <class Isa>
void load_tile_transposed(const RowsView& src, int64_t first_row, int rows, int cols, float* dst, int64_t ld,
                          float* row_tmp) {
  for (int r0 = 0; r0 < rows; r0 += kTransposeRows) {
    const int count = std::min(kTransposeRows, rows - r0);
    for (int r = 0; r < count; ++r)
      Isa::load_row(src.base + (first_row + r0 + r) * src.row_stride_bytes, src.dtype, row_tmp + r * cols, cols);
    Isa::transpose(row_tmp, cols, count, cols, dst + r0, ld);
  }
}

// K and V rows of kv heads [h_kv0, h_kv0 + heads) of sequence b into the
// team's shared buffers, and with an AMX dtype each chunk packed as an A
// operand (K, and V transposed: StagedKvHeads): one worksharing loop whose
// closing barrier publishes them.
template <class Isa>
void stage_kv(const AttnParams& p, const Sequence& seq, int64_t b, int64_t h_kv0, int64_t heads,
              const StagedKvHeads& kv) {
  const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_v);
  const int64_t chunks = ceil_div(seq.seqlen_k, kBlockN);
#pragma omp for schedule(static)
  for (int64_t chunk = 0; chunk < 2 * heads * chunks; ++chunk) {
    const int64_t head = chunk / (2 * chunks);
    const bool is_v = chunk / chunks % 2 == 1;
    const int64_t index = chunk % chunks;
    const int64_t r0 = index * kBlockN;
    const int count = static_cast<int>(std::min<int64_t>(kBlockN, seq.seqlen_k - r0));
    const StagedKv dst = kv.head(head);
    // With AMX (bf16 and fp32) the chunk is packed straight from the tensor
    // and the fp32 rows are left unwritten (no gemm reads them: each finds
    // the packing).
    const RowsView src = is_v ? rows_view(p.v, p.dtype, p.v_layout, b, seq.k_row0, h_kv0 + head)
                              : rows_view(p.k, p.dtype, p.k_layout, b, seq.k_row0, h_kv0 + head);
    const SharedOperand& op = is_v ? dst.vt_a : dst.k_a;
    if (op.packed != nullptr && Isa::pack_chunk_from_rows(op, index, count, src, r0)) continue;
    const int cols = is_v ? dv : d;
    load_tile<Isa>(src, r0, count, cols, (is_v ? dst.v : dst.k) + r0 * cols, cols);
    if (op.packed != nullptr) Isa::pack_chunk(op, index, count);
  }
}

// Writes rows of src * scale.
template <class Isa>
void store_tile(void* data, fa_dtype dtype, const TensorLayout& layout, int64_t b, int64_t row0, int64_t h,
                int rows, int cols, const float* src, int64_t ld, float scale, float* row_tmp) {
  const RowsView view = rows_view(data, dtype, layout, b, row0, h);
  char* base = const_cast<char*>(view.base);
  for (int r = 0; r < rows; ++r) {
    const float* row = src + r * ld;
    for (int c = 0; c < cols; ++c) row_tmp[c] = row[c] * scale;
    Isa::store_row(row_tmp, dtype, base + r * view.row_stride_bytes, cols);
  }
}

// Writes rows of the transposed tile src (cols, rows), ld: blocks of
// kTransposeRows rows gather one cache line of each src row into row_tmp
// (kTransposeRows, cols) first.
template <class Isa>
void store_tile_transposed(void* data, fa_dtype dtype, const TensorLayout& layout, int64_t b, int64_t row0, int64_t h,
                           int rows, int cols, const float* src, int64_t ld, float* row_tmp) {
  const RowsView view = rows_view(data, dtype, layout, b, row0, h);
  char* base = const_cast<char*>(view.base);
  for (int r0 = 0; r0 < rows; r0 += kTransposeRows) {
    const int count = std::min(kTransposeRows, rows - r0);
    Isa::transpose(src + r0, ld, cols, count, row_tmp, cols);
    for (int r = 0; r < count; ++r)
      Isa::store_row(row_tmp + r * cols, dtype, base + (r0 + r) * view.row_stride_bytes, cols);
  }
}

template <class Isa>
void zero_rows(void* data, fa_dtype dtype, const TensorLayout& layout, int64_t heads, int64_t row_begin,
               int64_t row_end, int cols, float* row_tmp) {
  for (int c = 0; c < cols; ++c) row_tmp[c] = 0.0f;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t row = row_begin; row < row_end; ++row)
      store_tile<Isa>(data, dtype, layout, 0, row, h, 1, cols, row_tmp, 0, 1.0f, row_tmp);
}

// Varlen rows after the last sequence belong to no sequence, and to no work
// item of the backward: their gradient is 0.
template <class Isa>
void zero_unused_rows(const BwdParams& p, float* row_tmp) {
  const int64_t q_used = p.cu_seqlens_q[p.batch], k_used = p.cu_seqlens_k[p.batch];
  zero_rows<Isa>(p.dq, p.dtype, p.dq_layout, p.heads, q_used, p.total_q, static_cast<int>(p.head_dim), row_tmp);
  zero_rows<Isa>(p.dk, p.dtype, p.dk_layout, p.heads_kv, k_used, p.total_k, static_cast<int>(p.head_dim), row_tmp);
  zero_rows<Isa>(p.dv, p.dtype, p.dv_layout, p.heads_kv, k_used, p.total_k, static_cast<int>(p.head_dim_v), row_tmp);
}

// LSE of query row 0 of sequence b, head h; row i at i * lse_layout.row.
inline const float* lse_row(const BwdParams& p, const Sequence& seq, int64_t b, int64_t h) {
  return p.lse + b * p.lse_layout.batch + seq.q_row0 * p.lse_layout.row + h * p.lse_layout.head;
}

// What turns q.k into a score for one (sequence, query head).
struct ScoreContext {
  MaskPolicy mask;
  float scale = 1.0f;
  float softcap = 0.0f;
  float slope = 0.0f;
  bool has_alibi = false;
  DropoutConfig dropout;
  uint32_t batch_head = 0;  // b * H + h, the dropout stream
};

inline ScoreContext score_context(const AttnParams& p, const Sequence& seq, int64_t b, int64_t h) {
  ScoreContext ctx;
  ctx.mask = MaskPolicy::make(seq.seqlen_q, seq.seqlen_k, p.align_bottom_right, p.window_left, p.window_right);
  ctx.scale = p.softmax_scale;
  ctx.softcap = p.softcap;
  ctx.has_alibi = p.alibi_slopes != nullptr;
  if (ctx.has_alibi) ctx.slope = p.alibi_slopes[b * p.alibi_batch_stride + h];
  ctx.dropout = p.dropout;
  ctx.batch_head = static_cast<uint32_t>(b * p.heads + h);
  return ctx;
}

// Queries [lo, hi) of the Q tile [m0, m0 + mq) that can see a key of
// [k0, k0 + nk), the inverse of key_begin/key_end; lo is rounded down to a
// multiple of 16 so AMX can reuse packed Q^T columns from there.
struct QueryRange {
  int lo = 0, hi = 0;
};

inline QueryRange visible_queries(const MaskPolicy& mask, int64_t m0, int mq, int64_t k0, int nk) {
  QueryRange range{0, mq};
  if (mask.window_right >= 0)
    range.lo = static_cast<int>(std::clamp<int64_t>(k0 - mask.shift - mask.window_right - m0, 0, mq)) / 16 * 16;
  if (mask.window_left >= 0)
    range.hi = static_cast<int>(std::clamp<int64_t>(k0 + nk - mask.shift + mask.window_left - m0, range.lo, mq));
  return range;
}

// Whether some query of [q0, q0 + nq) sees fewer than kFewKeys keys in all:
// for such rows the bf16 rounding of P does not average out over the keys
// (see fwd_impl.hpp). The visible count is piecewise linear and concave in
// the row, so its minimum is at an end of the range.
constexpr int64_t kFewKeys = 2 * kBlockN;
inline bool sees_few_keys(const MaskPolicy& mask, int64_t q0, int nq) {
  const auto count = [&](int64_t i) { return mask.key_end(i + 1) - mask.key_begin(i); };
  return std::min(count(q0), count(q0 + nq - 1)) < kFewKeys;
}

// Score tiles are stored key-major (s[key * ld + query], the forward and the
// dQ pass) or query-major (s[query * ld + key], the dK/dV pass).
template <bool kKeyMajor>
inline int64_t score_index(int64_t ld, int qi, int kj) {
  return kKeyMajor ? kj * ld + qi : qi * ld + kj;
}

// Turns raw q.k of the tile at (q0, k0) into scores and returns the factor
// that maps them to log2 units: exp2(x * factor) = exp(s). Without softcap
// and ALiBi the tile stays raw and the factor is scale * log2(e), folded into
// the exp2 that follows (one FMA per element). With them, s is computed here
// and stored times log2(e). Invisible elements become -inf when `masked`.
// tanh_out (same layout) receives tanh(scale * q.k / softcap) for the
// backward's derivative 1 - tanh^2.
template <bool kKeyMajor>
float shape_scores(float* s, int64_t ld, const ScoreContext& ctx, int64_t q0, int nq, int64_t k0, int nk,
                   bool masked, float* tanh_out) {
  const int outer = kKeyMajor ? nk : nq;
  const int inner = kKeyMajor ? nq : nk;
  const bool has_softcap = ctx.softcap > 0.0f;
  float factor = ctx.scale * kLog2e;
  if (has_softcap || ctx.has_alibi) {
    const float cap_inv = has_softcap ? ctx.scale / ctx.softcap : 0.0f;
    for (int o = 0; o < outer; ++o) {
      for (int n = 0; n < inner; ++n) {
        const int qi = kKeyMajor ? n : o;
        const int kj = kKeyMajor ? o : n;
        const int64_t idx = score_index<kKeyMajor>(ld, qi, kj);
        float score;
        if (has_softcap) {
          const float t = std::tanh(s[idx] * cap_inv);
          if (tanh_out != nullptr) tanh_out[idx] = t;
          score = ctx.softcap * t;
        } else {
          score = ctx.scale * s[idx];
        }
        if (ctx.has_alibi) score -= ctx.slope * ctx.mask.alibi_distance(q0 + qi, k0 + kj);
        s[idx] = score * kLog2e;
      }
    }
    factor = 1.0f;
  }
  if (masked) {
    // Each row of the tile sees one contiguous run of the other index:
    // query i sees keys [i + shift - window_left, i + shift + window_right],
    // key j is seen by queries [j - shift - window_right, j - shift + window_left].
    const MaskPolicy& mask = ctx.mask;
    for (int o = 0; o < outer; ++o) {
      int64_t first, last;  // visible inner indices, inclusive, absolute
      if (kKeyMajor) {
        const int64_t j = k0 + o;
        first = mask.window_right >= 0 ? j - mask.shift - mask.window_right : q0;
        last = mask.window_left >= 0 ? j - mask.shift + mask.window_left : q0 + inner - 1;
        if (j >= mask.seqlen_k) last = first - 1;
        first -= q0;
        last -= q0;
      } else {
        const int64_t i = q0 + o;
        first = mask.window_left >= 0 ? i + mask.shift - mask.window_left : k0;
        last = mask.window_right >= 0 ? i + mask.shift + mask.window_right : k0 + inner - 1;
        last = std::min<int64_t>(last, mask.seqlen_k - 1);
        first -= k0;
        last -= k0;
      }
      const int begin = static_cast<int>(std::clamp<int64_t>(first, 0, inner));
      const int end = static_cast<int>(std::clamp<int64_t>(last + 1, begin, inner));
      float* row = s + o * ld;
      for (int n = 0; n < begin; ++n) row[n] = kNegInf;
      for (int n = end; n < inner; ++n) row[n] = kNegInf;
    }
  }
  return factor;
}

// The backward's P^T = exp2(S^T * factor - LSE) over rows (keys) of n
// queries, ld kBlockM. Only a masked tile holds -inf scores; the others take
// the kernel set's cheaper exp2 for finite arguments where it has one.
template <class Isa>
void recompute_probabilities(Isa& isa, float* s_t, int rows, int n, float factor, const float* lse2, bool masked) {
  for (int j = 0; j < rows; ++j) {
    float* row = s_t + static_cast<int64_t>(j) * kBlockM;
    if (masked)
      isa.exp2_sub_vec(row, n, factor, lse2);
    else
      isa.exp2_sub_vec_unmasked(row, n, factor, lse2);
  }
}

// drop[...] = keep ? kept : 0 for the tile at (q0, k0); k0 is a multiple of
// 4 (tiles start on the kBlockN grid), so one Philox call covers 4 columns.
// kept is 1/(1-p), or 1 where a product rounds P to bf16 (AMX): P * 1/(1-p)
// would round with a bias (1.111 -> 1.109 at p = 0.1) that no longer matches
// the fp32 normalizer and breaks sum_j dS_j = 0 in the backward, so those
// products take the 0/1 mask and 1/(1-p) is applied to their fp32 result.
template <bool kKeyMajor>
void dropout_factors(float* drop, int64_t ld, const ScoreContext& ctx, int64_t q0, int nq, int64_t k0, int nk,
                     float kept) {
  const DropoutConfig& cfg = ctx.dropout;
  for (int qi = 0; qi < nq; ++qi) {
    for (int kj = 0; kj < nk; kj += 4) {
      const Philox4 words = dropout_words(cfg, ctx.batch_head, static_cast<uint32_t>(q0 + qi),
                                          static_cast<uint32_t>(k0 + kj));
      const uint32_t lanes[4] = {words.x, words.y, words.z, words.w};
      const int count = nk - kj < 4 ? nk - kj : 4;
      for (int lane = 0; lane < count; ++lane)
        drop[score_index<kKeyMajor>(ld, qi, kj + lane)] = lanes[lane] < cfg.keep_threshold ? kept : 0.0f;
    }
  }
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
