// FlashAttention-2 forward on the CPU, instantiated once per ISA kernel set.
//
// Per step (batch, one or more kv heads) the team stages K and V as
// contiguous fp32 rows (scratch.hpp), then runs work items (query head, Q
// tile) in parallel. An item loads its Q tile once, transposed, and loops over the
// K/V tiles the mask lets it see:
//   S^T = K Q^T          (kBlockN, kBlockM), key-major so that the row-wise
//                        softmax statistics are vertical vector operations
//   online softmax       running reference m (the maximum up to a slack,
//                        kRescaleSlack) and sum l per query in fp32, log2 units
//   O^T = O^T * alpha + V^T P^T (Dv, kBlockM), transposed like S^T: P^T is
//                        S^T's storage, the rescale a vector op per row of
//                        O^T, and with AMX P^T is packed as a B operand
//                        (pairs of rows) as its exp2 is computed, K and V^T
//                        A operands packed once per step (stage_kv)
// and O is divided by l once at the end. A tile seen whole by every query,
// with raw scores (PlainTile), may instead go to the kernel set in one call
// (AMX: panels of queries, products interleaved with the softmax).
// Invariant after each tile: for every query, O = sum_j exp2(s_j - m) v_j and
// l = sum_j exp2(s_j - m) over the keys seen so far; a tile whose maximum
// exceeds m by more than kRescaleSlack moves m to it, m', and rescales both
// by alpha = exp2(m - m').
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "cpu/scratch.hpp"
#include "cpu/tile_ops.hpp"

namespace flashattn {
namespace cpu {
namespace {

// On a masked tile (the diagonal of a causal mask, a window's edges) a run
// of kMaskedRun keys is seen by queries from some column on, and a run of
// kMaskedRun queries sees keys up to some row: S^T is computed per key run
// from its first visible query (on the 16 grid, where AMX reuses the pinned
// Q^T), O^T += V^T P^T per query run over the keys up to its last visible
// one (both need window_right >= 0). What is skipped is masked: scores
// that shape_scores sets to -inf, and products with P = 0 at the end of the
// key sum, so O keeps its value (and a non-finite V at a masked key no longer
// reaches it as 0 * inf). On a 256 x 128 diagonal tile this skips most of
// the masked triangle (11% of the causal work at N = 1024).
constexpr int kMaskedRun = 32;

// The running maximum m of a query moves only when a tile's maximum exceeds
// it by more than kRescaleSlack (log2 units): until then P = exp2(s - m) <=
// 2^kRescaleSlack, harmless in fp32 and bf16, and O and l keep their scale.
// O = P V / l is unchanged (m cancels) and LSE = m + log2(l) holds for any m.
// With a strict maximum nearly every tile of random inputs moved some query's
// m and rescaled the whole (dv, kBlockM) O^T; now it is rare.
constexpr float kRescaleSlack = 8.0f;

// The pin slot of P^T (slot 0 holds Q^T).
constexpr int kPinnedP = 1;

// The reference update of a tile's queries: tile_max holds the raw column
// maxima of S^T and becomes the subtrahends of exp2, row_max the new
// references, alpha the old ones. m moves only when the tile's maximum
// exceeds it by more than kRescaleSlack (see the top); a query that has seen
// no visible key keeps m = -inf and the subtrahend 0 instead of -inf keeps
// exp2(s - m') at 0 rather than NaN. True when some reference moved.
inline bool move_references(float* tile_max, float* row_max, float* alpha, int n, float factor) {
  bool moved = false;
  for (int i = 0; i < n; ++i) {
    const float seen = tile_max[i] * factor;
    const float new_max = seen > row_max[i] + kRescaleSlack ? seen : row_max[i];
    moved = moved || new_max != row_max[i];
    alpha[i] = row_max[i];
    row_max[i] = new_max;
    tile_max[i] = new_max == kNegInf ? 0.0f : new_max;  // now the subtrahend
  }
  return moved;
}

// l and the columns of O^T (dv, n), ld kBlockM, times alpha = exp2(m - m')
// as one vector exp2 over the queries (m = -inf: alpha = 0, O and l are 0).
template <class Isa>
void rescale_queries(float* alpha, const float* subtrahend, float* row_sum, float* o_t, int dv, int n) {
  Isa::exp2_sub_vec(alpha, n, 1.0f, subtrahend);
  for (int i = 0; i < n; ++i) row_sum[i] *= alpha[i];
  for (int c = 0; c < dv; ++c) {
    float* o_row = o_t + c * kBlockM;
    for (int i = 0; i < n; ++i) o_row[i] *= alpha[i];
  }
}

// One or two consecutive key tiles that every query of the Q tile sees
// whole, with raw scores (no softcap, ALiBi or dropout) and full (kBlockN
// keys each, a multiple of 16 queries): a kernel set may run them at once
// (fwd_plain_tile) as one tile of tiles * kBlockN keys, with the state update
// of fwd_q_tile's loop.
struct PlainTile {
  const float* k_tile;  // (tiles * kBlockN, d), the shared operand's rows
  const float* v_tile;  // (tiles * kBlockN, dv), read as V^T
  const float* q_t;     // (d, kBlockM), pinned in slot 0
  int d = 0, dv = 0, nq = 0;
  int tiles = 1;        // key tiles, 1 or 2 (consecutive, both plain)
  float factor = 1.0f;  // scores to log2 units
  float* s_t;           // (kBlockN, kBlockM) scratch, as many floats as the loop's S^T
  float* o_t;           // (dv, kBlockM), rows up to a multiple of 16
  float* row_max;
  float* row_sum;
  float* tile_max;
  float* alpha;
};

template <class Isa>
void masked_scores(Isa& isa, const MaskPolicy& mask, const float* k_tile, int d, const float* q_t, int64_t m0,
                   int q_lo, int q_hi, int64_t k0, int nk, float* s_t) {
  for (int j0 = 0; j0 < nk; j0 += kMaskedRun) {
    const int rows = std::min(kMaskedRun, nk - j0);
    const int64_t first_query = k0 + j0 - mask.shift - mask.window_right - m0;
    const int lo = static_cast<int>(std::clamp<int64_t>(first_query, q_lo, q_hi)) / 16 * 16;
    if (lo >= q_hi) continue;
    isa.gemm(rows, q_hi - lo, d, k_tile + static_cast<int64_t>(j0) * d, d, 1, q_t + lo, kBlockM,
             s_t + static_cast<int64_t>(j0) * kBlockM + lo, kBlockM, false);
  }
}

template <class Isa>
void masked_output(Isa& isa, const MaskPolicy& mask, const float* v_tile, int dv, float* s_t, float* o_t, int64_t m0,
                   int q_lo, int q_hi, int64_t k0, int nk) {
  for (int c0 = q_lo; c0 < q_hi; c0 += kMaskedRun) {
    const int cols = std::min(kMaskedRun, q_hi - c0);
    const int keys = static_cast<int>(std::clamp<int64_t>(mask.key_end(m0 + c0 + cols) - k0, 0, nk));
    if (keys == 0) continue;
    isa.gemm(dv, cols, keys, v_tile, 1, dv, s_t + c0, kBlockM, o_t + c0, kBlockM, true);
  }
}

template <class Isa>
void fwd_q_tile(Isa& isa, const FwdParams& p, const FwdScratch& w, const StagedKv& kv, const Sequence& seq,
                int64_t b, int64_t h, int64_t m0) {
  const int mq = static_cast<int>(std::min<int64_t>(kBlockM, seq.seqlen_q - m0));
  const int d = static_cast<int>(p.head_dim);
  const int dv = static_cast<int>(p.head_dim_v);
  const ScoreContext ctx = score_context(p, seq, b, h);

  const RowsView q_rows = rows_view(p.q, p.dtype, p.q_layout, b, seq.q_row0, h);
  // With AMX and bf16, Q^T is packed straight from Q's rows and w.q_t is
  // only the pin's name.
  if (!isa.pin_b_from_rows(0, q_rows, m0, mq, d, w.q_t, kBlockM)) {
    load_tile_transposed<Isa>(q_rows, m0, mq, d, w.q_t, kBlockM, w.row_tmp);
    isa.pin_b(0, w.q_t, d, mq, kBlockM);
  }

  // Padding rows too: AMX tiles of O^T load and store whole 16-row tiles.
  for (int c = 0; c < round_up_to(dv, 16); ++c) std::fill(w.o_t + c * kBlockM, w.o_t + c * kBlockM + mq, 0.0f);
  std::fill(w.row_max, w.row_max + mq, kNegInf);
  std::fill(w.row_sum, w.row_sum + mq, 0.0f);
  isa.share(0, kv.k_a);
  isa.share(1, kv.vt_a);

  // Tiles stay on the kBlockN grid (dropout needs k0 % 4 == 0); tiles fully
  // outside [key_begin, key_end) are never visited.
  const int64_t key_begin = ctx.mask.key_begin(m0);
  const int64_t key_end = ctx.mask.key_end(m0 + mq);
  for (int64_t k0 = key_begin / kBlockN * kBlockN; k0 < key_end; k0 += kBlockN) {
    const int nk = static_cast<int>(std::min<int64_t>(kBlockN, seq.seqlen_k - k0));
    const float* k_tile = kv.k + k0 * d;   // (nk, d)
    const float* v_tile = kv.v + k0 * dv;  // (nk, dv); read as V^T (dv, nk)
    const bool masked = !ctx.mask.tile_fully_visible(m0, m0 + mq, k0, k0 + nk);
    // On a masked tile only some queries see one of its keys; the others
    // keep their state untouched.
    const QueryRange queries = masked ? visible_queries(ctx.mask, m0, mq, k0, nk) : QueryRange{0, mq};
    const int q_lo = queries.lo, q_hi = queries.hi;
    const int nq = q_hi - q_lo;
    if (nq == 0) continue;
    const bool raw_scores = !ctx.dropout.enabled && !(ctx.softcap > 0.0f) && !ctx.has_alibi;
    if (!masked && raw_scores && nk == kBlockN && mq % 16 == 0) {
      // Two plain tiles in a row go together (P V over 2 kBlockN keys).
      const int64_t k1 = k0 + kBlockN;
      const bool pair = k1 + kBlockN <= std::min(key_end, seq.seqlen_k) &&
                        ctx.mask.tile_fully_visible(m0, m0 + mq, k1, k1 + kBlockN);
      const PlainTile tile{k_tile, v_tile, w.q_t, d, dv, mq, pair ? 2 : 1, ctx.scale * kLog2e, w.s_t, w.o_t,
                           w.row_max, w.row_sum, w.tile_max, w.alpha};
      if (isa.fwd_plain_tile(tile)) {
        k0 += (tile.tiles - 1) * kBlockN;
        continue;
      }
    }
    float* s_t = w.s_t + q_lo;  // (nk, nq), ld kBlockM
    float* row_max = w.row_max + q_lo;
    float* row_sum = w.row_sum + q_lo;
    float* tile_max = w.tile_max + q_lo;
    float* alpha = w.alpha + q_lo;
    float* o_t = w.o_t + q_lo;  // (dv, nq), ld kBlockM
    // Without a right window edge no run can be skipped.
    const bool trimmed = masked && ctx.mask.window_right >= 0;
    if (trimmed)
      masked_scores(isa, ctx.mask, k_tile, d, w.q_t, m0, q_lo, q_hi, k0, nk, w.s_t);
    else
      isa.gemm(nk, nq, d, k_tile, d, 1, w.q_t + q_lo, kBlockM, s_t, kBlockM, false);  // S^T (nk, nq)
    const float factor = shape_scores<true>(s_t, kBlockM, ctx, m0 + q_lo, nq, k0, nk, masked, nullptr);

    isa.column_max(s_t, kBlockM, nk, nq, tile_max);
    const bool rescale = move_references(tile_max, row_max, alpha, nq, factor);
    const bool exact_output = masked && sees_few_keys(ctx.mask, m0 + q_lo, nq);
    // Where P^T only feeds the plain P V gemm, a kernel set may keep it packed.
    const bool packed_p = !ctx.dropout.enabled && !exact_output && !trimmed;
    if (rescale) rescale_queries<Isa>(alpha, tile_max, row_sum, o_t, dv, nq);
    isa.exp2_tile_sum(s_t, kBlockM, nk, nq, factor, tile_max, row_sum, packed_p ? kPinnedP : -1, !masked);
    // The normalizer l uses the undropped P; only P V sees the dropout mask.
    if (ctx.dropout.enabled) {
      float* drop = w.drop + q_lo;
      dropout_factors<true>(drop, kBlockM, ctx, m0 + q_lo, nq, k0, nk, 1.0f);
      for (int j = 0; j < nk; ++j)
        for (int i = 0; i < nq; ++i) s_t[j * kBlockM + i] *= drop[j * kBlockM + i];
    }
    // O^T += V^T P^T (dv, nq). A row that sees only a few keys would, with P
    // rounded to bf16, get an O off the fp32 normalizer l by up to 2^-9 in
    // one direction; the backward's D = dO . O then breaks sum_j dS_j = 0 of
    // that row and dQ, dK pick up the error (2x the bf16 reference on
    // top-left causal, Sq != Sk). Over many keys the rounding averages out.
    if (exact_output)
      isa.gemm_exact_b(dv, nq, nk, v_tile, 1, dv, s_t, kBlockM, o_t, kBlockM);
    else if (trimmed)
      masked_output(isa, ctx.mask, v_tile, dv, w.s_t, w.o_t, m0, q_lo, q_hi, k0, nk);
    else
      isa.gemm(dv, nq, nk, v_tile, 1, dv, s_t, kBlockM, o_t, kBlockM, true);
    if (packed_p) isa.unpin_b(kPinnedP);
  }
  isa.unpin_b(0);
  isa.unshare(0);
  isa.unshare(1);

  // 1/(1-p) of the kept probabilities, factored out of P V (dropout_factors).
  const float kept = ctx.dropout.enabled ? ctx.dropout.keep_scale : 1.0f;
  for (int i = 0; i < mq; ++i) {
    const float sum = w.row_sum[i];
    w.alpha[i] = sum == 0.0f ? 0.0f : kept / sum;  // a NaN sum (NaN input) stays NaN
  }
  for (int c = 0; c < dv; ++c) {
    float* o_row = w.o_t + c * kBlockM;
    for (int i = 0; i < mq; ++i) o_row[i] *= w.alpha[i];
  }
  store_tile_transposed<Isa>(p.o, p.dtype, p.o_layout, b, seq.q_row0 + m0, h, mq, dv, w.o_t, kBlockM, w.row_tmp);
  if (p.lse != nullptr) {
    float* lse = p.lse + b * p.lse_layout.batch + (seq.q_row0 + m0) * p.lse_layout.row + h * p.lse_layout.head;
    for (int i = 0; i < mq; ++i) {
      const float sum = w.row_sum[i];
      // No visible key: log(0) = -inf would make exp(s - LSE) undefined in the
      // backward; +inf makes every recomputed probability exactly 0.
      lse[i * p.lse_layout.row] = sum == 0.0f ? kPosInf : (w.row_max[i] + std::log2(sum)) * kLn2;
    }
  }
}

// Per step (batch, fwd_heads_per_step kv heads) the team stages K and V into
// one of two buffers (one barrier publishes them) and takes the step's items
// without a closing barrier: a thread that runs out moves on to staging the
// next step into the other buffer. Staging step s + 2 reuses this step's
// buffer, and no thread starts it before all have passed the barrier of step
// s + 1, i.e. finished their items of step s. One barrier per step, and no
// more threads than team_size allows: with spinning OpenMP waits on an
// oversubscribed machine each barrier can cost a scheduler slice.
template <class Isa>
fa_status run_fwd(const FwdParams& p, void* workspace) {
  char* base = align_workspace(workspace);
  ScratchArena shared(base);
  const StagedKvHeads staged[2] = {carve_staged_kv_heads(shared, p), carve_staged_kv_heads(shared, p)};
  char* thread_base = base + fwd_shared_bytes(p);
  const size_t thread_bytes = fwd_thread_bytes(p);
  const int64_t group = p.heads / p.heads_kv;
  const int64_t per_step = fwd_heads_per_step(p);
  int64_t max_items = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    max_items = std::max(max_items, per_step * group * ceil_div(sequence_of(p, b).seqlen_q, kBlockM));
  const int team = team_size(p, max_items);
#pragma omp parallel num_threads(team) if (team > 1)
  {
    ScratchArena arena(thread_base + static_cast<size_t>(omp_get_thread_num()) * thread_bytes);
    const FwdScratch w = carve_fwd(arena, p);
    Isa isa(w.isa);
    int64_t step = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence seq = sequence_of(p, b);
      if (seq.seqlen_q == 0) continue;
      const int64_t q_tiles = ceil_div(seq.seqlen_q, kBlockM);
      for (int64_t h_kv0 = 0; h_kv0 < p.heads_kv; h_kv0 += per_step, ++step) {
        const StagedKvHeads& kv = staged[step % 2];
        const int64_t heads = std::min(per_step, p.heads_kv - h_kv0);
        stage_kv<Isa>(p, seq, b, h_kv0, heads, kv);
        // Last Q tiles (of every head) first: under a causal mask they see
        // the most keys, and starting with them balances the dynamic schedule.
        const int64_t q_heads = heads * group;
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t item = 0; item < q_heads * q_tiles; ++item) {
          const int64_t q_tile = q_tiles - 1 - item / q_heads;
          const int64_t local = item % q_heads;  // query head within the step
          fwd_q_tile<Isa>(isa, p, w, kv.head(local / group), seq, b, h_kv0 * group + local, q_tile * kBlockM);
        }
      }
    }
  }
  return FA_OK;
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
