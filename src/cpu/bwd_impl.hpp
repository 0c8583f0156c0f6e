// FlashAttention-2 backward on the CPU, instantiated once per ISA kernel set,
// in one of two schemes. Both give results bitwise equal for any thread count
// (each output element is summed in a fixed order by one work item), and the
// choice between them depends on the shape alone (dispatch.cpp, bwd_scheme),
// never on the thread count, or the bits would.
//
// Owned groups (bwd_group.hpp), from 16 (batch, kv head) groups on: one
// thread computes all gradients of a group, five products per (Q tile, K/V
// tile) pair. Its parallelism is the group count: with fewer groups than
// threads some idle, and since the choice cannot look at the thread count,
// the threshold is where it pays on up to ~16 threads: with T threads and G
// groups it takes ceil(G / T) groups of 5 products against G / T of 7 for
// the split passes, a loss only where ceil(G / T) > 1.4 G / T (G = 16: at
// T = 12..15 and T >= 23, counting products alone). Its memory is O(S * D)
// per thread (the group's K, V and dK, dV sums).
//
// Split passes (below), with fewer groups: work items finer than a group,
// at the price of recomputing S and dP for dQ, seven products per pair.
//
// Why two passes: dK and dV of a K/V tile sum over query tiles and the query
// heads of its GQA group, dQ of a Q tile sums over K/V tiles. Accumulating dQ
// from the K/V-parallel loop (atomics, or per-thread copies reduced at the
// end) makes the result depend on the thread count or on timing. Instead,
// per (batch, kv head):
//   pass 1  for each query head h of the group, in order: stage Q, dO,
//           LSE and delta = rowsum(dO * O) of h; then items (K/V tile) add
//           the contributions of h's Q tiles, in order, to the kv head's dK,
//           dV accumulators and store them after the last head
//   pass 2  items (query head, Q tile) compute dQ over their K/V tiles (K, V
//           staged with the first head's rows) in order and store it; they
//           need nothing from pass 1 and share a loop with its last head
// Every output element is produced by one work item whose arithmetic does not
// depend on which thread runs it, so results are bitwise equal for any thread
// count, with O(S * D) shared memory and no reduction buffer. The price is
// recomputing S and dP in pass 2.
//
// Per element, with P = exp(S - LSE) and M the dropout factors (0 or 1/(1-p)):
//   dV += (P o M)^T dO,  dP = (dO V^T) o M,  dS = P o (dP - delta),
//   softcap s = c tanh(u / c), u = scale q.k:  dS_u = dS (1 - tanh^2),
//   dK += dS_u^T Q * scale,  dQ += dS_u K * scale (scale applied at the store).
// ALiBi shifts s by a constant and has no gradient. Rows with LSE = +inf give
// P = 0 and so contribute nothing.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "cpu/bwd_group.hpp"
#include "cpu/scratch.hpp"
#include "cpu/tile_ops.hpp"

namespace flashattn {
namespace cpu {
namespace {

// Rows [chunk * kBlockM, +kBlockM) of Q, dO, LSE (log2 units) and
// delta = rowsum(dO * O) of query head h, into the team's shared arrays.
template <class Isa>
void stage_query_chunk(const BwdParams& p, const StagedQ& sq, const Sequence& seq, int64_t b, int64_t h,
                       int64_t chunk, float* row_tmp) {
  const int d = static_cast<int>(p.head_dim);
  const int dv = static_cast<int>(p.head_dim_v);
  const RowsView q_rows = rows_view(p.q, p.dtype, p.q_layout, b, seq.q_row0, h);
  const RowsView do_rows = rows_view(p.dout, p.dtype, p.dout_layout, b, seq.q_row0, h);
  const RowsView o_rows = rows_view(p.o, p.dtype, p.o_layout, b, seq.q_row0, h);
  const float* lse = lse_row(p, seq, b, h);
  const int64_t r0 = chunk * kBlockM;
  const int count = static_cast<int>(std::min<int64_t>(kBlockM, seq.seqlen_q - r0));
  load_tile<Isa>(q_rows, r0, count, d, sq.q + r0 * d, d);
  load_tile<Isa>(do_rows, r0, count, dv, sq.dout + r0 * dv, dv);
  for (int64_t r = r0; r < r0 + count; ++r) {
    load_tile<Isa>(o_rows, r, 1, dv, row_tmp, dv);
    const float* dout = sq.dout + r * dv;
    float sum = 0.0f;
    for (int c = 0; c < dv; ++c) sum += dout[c] * row_tmp[c];
    sq.delta[r] = sum;
    sq.lse2[r] = lse[r * p.lse_layout.row] * kLog2e;
  }
}

// Query head h's rows (and, with_kv, the kv head's K and V rows) staged by
// the team in one worksharing loop, whose closing barrier publishes them.
template <class Isa>
void stage_step(const BwdParams& p, const StagedQ& sq, const StagedKv& kv, const Sequence& seq, int64_t b,
                int64_t h, bool with_kv, float* row_tmp) {
  const int64_t h_kv = h / (p.heads / p.heads_kv);
  const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_v);
  const RowsView k_rows = rows_view(p.k, p.dtype, p.k_layout, b, seq.k_row0, h_kv);
  const RowsView v_rows = rows_view(p.v, p.dtype, p.v_layout, b, seq.k_row0, h_kv);
  const int64_t q_chunks = ceil_div(seq.seqlen_q, kBlockM);
  const int64_t k_chunks = with_kv ? ceil_div(seq.seqlen_k, kBlockN) : 0;
#pragma omp for schedule(static)
  for (int64_t chunk = 0; chunk < q_chunks + 2 * k_chunks; ++chunk) {
    if (chunk < q_chunks) {
      stage_query_chunk<Isa>(p, sq, seq, b, h, chunk, row_tmp);
      continue;
    }
    const int64_t kv_chunk = chunk - q_chunks;
    const int64_t r0 = kv_chunk % k_chunks * kBlockN;
    const int count = static_cast<int>(std::min<int64_t>(kBlockN, seq.seqlen_k - r0));
    if (kv_chunk < k_chunks)
      load_tile<Isa>(k_rows, r0, count, d, kv.k + r0 * d, d);
    else
      load_tile<Isa>(v_rows, r0, count, dv, kv.v + r0 * dv, dv);
  }
}

// Adds query head h's contribution to dK, dV of the K/V tiles of its kv head
// from key k_begin on (kKvTilesPerItem of them, fewer at the end); the first
// head of the group starts the sums, the last stores them. Per Q tile, its Q
// and dO are packed once (AMX) for all the item's K/V tiles.
template <class Isa>
void bwd_kv_tiles(Isa& isa, const BwdParams& p, const BwdKvScratch& w, const StagedQ& sq, const Sequence& seq,
                  int64_t b, int64_t h, int64_t k_begin, bool first_head, bool last_head) {
  const int d = static_cast<int>(p.head_dim);
  const int dv = static_cast<int>(p.head_dim_v);
  const int64_t h_kv = h / (p.heads / p.heads_kv);
  const int tiles = static_cast<int>(std::min<int64_t>(kKvTilesPerItem, ceil_div(seq.seqlen_k - k_begin, kBlockN)));
  const ScoreContext ctx = score_context(p, seq, b, h);
  const MaskPolicy& mask = ctx.mask;
  int64_t row_begin = seq.seqlen_q, row_end = 0;
  for (int t = 0; t < tiles; ++t) {
    const int64_t k0 = k_begin + t * kBlockN;
    const int nk = static_cast<int>(std::min<int64_t>(kBlockN, seq.seqlen_k - k0));
    if (first_head) {
      std::fill(sq.dk + k0 * d, sq.dk + (k0 + nk) * d, 0.0f);
      std::fill(sq.dv + k0 * dv, sq.dv + (k0 + nk) * dv, 0.0f);
    }
    float* k_t = w.k_t + t * d * kBlockN;    // (d, nk)
    float* v_t = w.v_t + t * dv * kBlockN;  // (dv, nk)
    load_tile_transposed<Isa>(rows_view(p.k, p.dtype, p.k_layout, b, seq.k_row0, h_kv), k0, nk, d, k_t, kBlockN,
                              w.row_tmp);
    load_tile_transposed<Isa>(rows_view(p.v, p.dtype, p.v_layout, b, seq.k_row0, h_kv), k0, nk, dv, v_t, kBlockN,
                              w.row_tmp);
    isa.pin_b(2 * t, k_t, d, nk, kBlockN);
    isa.pin_b(2 * t + 1, v_t, dv, nk, kBlockN);
    // Query rows that can see a key of [k0, k0 + nk): the inverse of key_begin/key_end.
    const int64_t first = mask.window_right >= 0 ? k0 - mask.shift - mask.window_right : 0;
    const int64_t last = mask.window_left >= 0 ? k0 + nk - mask.shift + mask.window_left : seq.seqlen_q;
    row_begin = std::min(row_begin, std::max<int64_t>(first, 0));
    row_end = std::max(row_end, std::min<int64_t>(last, seq.seqlen_q));
  }

  for (int64_t m0 = row_begin / kBlockM * kBlockM; m0 < row_end; m0 += kBlockM) {
    const int mq = static_cast<int>(std::min<int64_t>(kBlockM, seq.seqlen_q - m0));
    SharedOperand q_tile_operands[4] = {w.q_a, w.dout_a, w.q_b, w.dout_b};
    for (int slot = 0; slot < 4; ++slot) {
      SharedOperand& op = q_tile_operands[slot];
      op.source = (slot % 2 == 0 ? sq.q + m0 * d : sq.dout + m0 * dv);
      op.rows = mq;
      if (op.packed != nullptr) Isa::pack_chunk(op, 0, mq);
      isa.share(slot, op);
    }
    for (int t = 0; t < tiles; ++t) {
      const int64_t k0 = k_begin + t * kBlockN;
      const int nk = static_cast<int>(std::min<int64_t>(kBlockN, seq.seqlen_k - k0));
      if (mask.key_begin(m0) >= k0 + nk || mask.key_end(m0 + mq) <= k0) continue;
      const float* k_t = w.k_t + t * d * kBlockN;
      const float* v_t = w.v_t + t * dv * kBlockN;
      float* dk = sq.dk + k0 * d;       // (nk, d)
      float* dv_acc = sq.dv + k0 * dv;  // (nk, dv)
      const bool masked = !mask.tile_fully_visible(m0, m0 + mq, k0, k0 + nk);
      const QueryRange queries = masked ? visible_queries(mask, m0, mq, k0, nk) : QueryRange{0, mq};
      const int64_t q0 = m0 + queries.lo;  // first query row of the tile that sees a key
      const int nq = queries.hi - queries.lo;
      if (nq == 0) continue;
      const float* q = sq.q + q0 * d;        // (nq, d)
      const float* dout = sq.dout + q0 * dv;  // (nq, dv)
      const float* lse2 = sq.lse2 + q0;
      const float* delta = sq.delta + q0;

      isa.gemm(nq, nk, d, q, d, 1, k_t, kBlockN, w.s, kBlockN, false);  // S (nq, nk)
      const float factor = shape_scores<false>(w.s, kBlockN, ctx, q0, nq, k0, nk, masked, w.tanh);
      for (int i = 0; i < nq; ++i) isa.exp2_sub_scalar(w.s + i * kBlockN, nk, factor, lse2[i]);  // P
      isa.gemm(nq, nk, dv, dout, dv, 1, v_t, kBlockN, w.dp, kBlockN, false);  // dO V^T (nq, nk)

      // 0/1 mask: P^T dO takes the mask, 1/(1-p) scales dV at the store.
      if (ctx.dropout.enabled) dropout_factors<false>(w.drop, kBlockN, ctx, q0, nq, k0, nk, 1.0f);
      const float kept = ctx.dropout.enabled ? ctx.dropout.keep_scale : 1.0f;
      for (int i = 0; i < nq; ++i) {
        const float row_delta = delta[i];
        float* s_row = w.s + i * kBlockN;
        float* dp_row = w.dp + i * kBlockN;
        if (ctx.dropout.enabled) {
          const float* drop_row = w.drop + i * kBlockN;
          for (int j = 0; j < nk; ++j) {
            const float prob = s_row[j];
            dp_row[j] = prob * (dp_row[j] * (drop_row[j] * kept) - row_delta);
            s_row[j] = prob * drop_row[j];
          }
        } else {
          for (int j = 0; j < nk; ++j) dp_row[j] = s_row[j] * (dp_row[j] - row_delta);
        }
        if (w.tanh != nullptr) {
          const float* t_row = w.tanh + i * kBlockN;
          for (int j = 0; j < nk; ++j) dp_row[j] *= 1.0f - t_row[j] * t_row[j];
        }
      }
      // dV += P^T dO (nk, dv), with P kept exact where rows see few keys, as
      // the forward's P V (fwd_impl.hpp).
      if (masked && sees_few_keys(mask, q0, nq))
        isa.gemm_exact_a(nk, dv, nq, w.s, 1, kBlockN, dout, dv, dv_acc, dv);
      else
        isa.gemm(nk, dv, nq, w.s, 1, kBlockN, dout, dv, dv_acc, dv, true);
      isa.gemm(nk, d, nq, w.dp, 1, kBlockN, q, d, dk, d, true);          // dK += dS^T Q (nk, d)
    }
    for (int slot = 0; slot < 4; ++slot) isa.unshare(slot);
  }
  for (int slot = 0; slot < 2 * tiles; ++slot) isa.unpin_b(slot);
  if (last_head) {
    const float kept = p.dropout.enabled ? p.dropout.keep_scale : 1.0f;
    for (int t = 0; t < tiles; ++t) {
      const int64_t k0 = k_begin + t * kBlockN;
      const int nk = static_cast<int>(std::min<int64_t>(kBlockN, seq.seqlen_k - k0));
      store_tile<Isa>(p.dk, p.dtype, p.dk_layout, b, seq.k_row0 + k0, h_kv, nk, d, sq.dk + k0 * d, d,
                      p.softmax_scale, w.row_tmp);
      store_tile<Isa>(p.dv, p.dtype, p.dv_layout, b, seq.k_row0 + k0, h_kv, nk, dv, sq.dv + k0 * dv, dv, kept,
                      w.row_tmp);
    }
  }
}

// dQ of queries [m0, m0 + mq) of head h. Scores are key-major, like the forward.
template <class Isa>
void bwd_q_tile(Isa& isa, const BwdParams& p, const BwdQScratch& w, const StagedKv& kv, const Sequence& seq,
                int64_t b, int64_t h, int64_t m0) {
  const int mq = static_cast<int>(std::min<int64_t>(kBlockM, seq.seqlen_q - m0));
  const int d = static_cast<int>(p.head_dim);
  const int dv = static_cast<int>(p.head_dim_v);
  const ScoreContext ctx = score_context(p, seq, b, h);

  load_tile_transposed<Isa>(rows_view(p.q, p.dtype, p.q_layout, b, seq.q_row0, h), m0, mq, d, w.q_t, kBlockM,
                            w.row_tmp);
  const RowsView do_rows = rows_view(p.dout, p.dtype, p.dout_layout, b, seq.q_row0, h);
  const RowsView o_rows = rows_view(p.o, p.dtype, p.o_layout, b, seq.q_row0, h);
  const float* lse = lse_row(p, seq, b, h);
  load_tile_transposed<Isa>(do_rows, m0, mq, dv, w.dout_t, kBlockM, w.row_tmp);
  for (int i = 0; i < mq; ++i) {
    load_tile<Isa>(do_rows, m0 + i, 1, dv, w.row_tmp, dv);
    load_tile<Isa>(o_rows, m0 + i, 1, dv, w.row_tmp2, dv);
    float sum = 0.0f;
    for (int c = 0; c < dv; ++c) sum += w.row_tmp[c] * w.row_tmp2[c];
    w.delta[i] = sum;
    w.lse2[i] = lse[(m0 + i) * p.lse_layout.row] * kLog2e;
  }
  isa.pin_b(0, w.q_t, d, mq, kBlockM);
  isa.pin_b(1, w.dout_t, dv, mq, kBlockM);
  std::fill(w.dq, w.dq + static_cast<int64_t>(mq) * d, 0.0f);

  const int64_t key_begin = ctx.mask.key_begin(m0);
  const int64_t key_end = ctx.mask.key_end(m0 + mq);
  for (int64_t k0 = key_begin / kBlockN * kBlockN; k0 < key_end; k0 += kBlockN) {
    const int nk = static_cast<int>(std::min<int64_t>(kBlockN, seq.seqlen_k - k0));
    const float* k_tile = kv.k + k0 * d;   // (nk, d)
    const float* v_tile = kv.v + k0 * dv;  // (nk, dv)
    const bool masked = !ctx.mask.tile_fully_visible(m0, m0 + mq, k0, k0 + nk);
    const QueryRange queries = masked ? visible_queries(ctx.mask, m0, mq, k0, nk) : QueryRange{0, mq};
    const int q_lo = queries.lo, nq = queries.hi - queries.lo;
    if (nq == 0) continue;
    float* s_t = w.s_t + q_lo;    // (nk, nq), ld kBlockM
    float* dp_t = w.dp_t + q_lo;  // (nk, nq)
    float* tanh_t = w.tanh != nullptr ? w.tanh + q_lo : nullptr;
    const float* delta = w.delta + q_lo;
    isa.gemm(nk, nq, d, k_tile, d, 1, w.q_t + q_lo, kBlockM, s_t, kBlockM, false);  // S^T (nk, nq)
    const float factor = shape_scores<true>(s_t, kBlockM, ctx, m0 + q_lo, nq, k0, nk, masked, tanh_t);
    recompute_probabilities(isa, s_t, nk, nq, factor, w.lse2 + q_lo, masked);  // P^T
    isa.gemm(nk, nq, dv, v_tile, dv, 1, w.dout_t + q_lo, kBlockM, dp_t, kBlockM, false);  // (dO V^T)^T

    if (ctx.dropout.enabled)
      dropout_factors<true>(w.drop + q_lo, kBlockM, ctx, m0 + q_lo, nq, k0, nk, ctx.dropout.keep_scale);
    for (int j = 0; j < nk; ++j) {
      const float* p_row = s_t + j * kBlockM;
      float* dp_row = dp_t + j * kBlockM;
      if (ctx.dropout.enabled) {
        const float* drop_row = w.drop + q_lo + j * kBlockM;
        for (int i = 0; i < nq; ++i) dp_row[i] = p_row[i] * (dp_row[i] * drop_row[i] - delta[i]);
      } else {
        for (int i = 0; i < nq; ++i) dp_row[i] = p_row[i] * (dp_row[i] - delta[i]);
      }
      if (tanh_t != nullptr) {
        const float* t_row = tanh_t + j * kBlockM;
        for (int i = 0; i < nq; ++i) dp_row[i] *= 1.0f - t_row[i] * t_row[i];
      }
    }
    isa.gemm(nq, d, nk, dp_t, 1, kBlockM, k_tile, d, w.dq + static_cast<int64_t>(q_lo) * d, d, true);  // dQ += dS K
  }
  isa.unpin_b(0);
  isa.unpin_b(1);
  store_tile<Isa>(p.dq, p.dtype, p.dq_layout, b, seq.q_row0 + m0, h, mq, d, w.dq, d, p.softmax_scale, w.row_tmp);
}

// Synchronization, per (batch, kv head) step with buffers X = step % 2:
//   stage Q rows of head 0, K and V into X            one barrier
//   for each further head g: its pass-1 items, then   two barriers
//     stage its Q rows into X
//   the last head's pass-1 items and all pass-2 items  no closing barrier
// in one dynamic loop. The next step stages into the other buffers, which
// no thread still reads: every thread passed this step's staging barrier,
// so all finished the previous step. Threads: team_size, capped by the
// largest step's final loop (see run_fwd on spinning waits).
template <class Isa>
fa_status run_bwd_split(const BwdParams& p, void* workspace) {
  char* base = align_workspace(workspace);
  ScratchArena shared(base);
  StagedQ staged_q[2];
  StagedKv staged_kv[2];
  for (int x = 0; x < 2; ++x) {
    staged_q[x] = carve_staged_q(shared, p);
    staged_kv[x] = carve_staged_kv(shared, p);
  }
  char* thread_base = base + bwd_shared_bytes(p);
  const size_t thread_bytes = bwd_thread_bytes(p);
  const int64_t group = p.heads / p.heads_kv;
  int64_t max_items = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = sequence_of(p, b);
    max_items = std::max(max_items, ceil_div(seq.seqlen_k, kBlockN * kKvTilesPerItem) + group * ceil_div(seq.seqlen_q, kBlockM));
  }
  const int team = team_size(p, max_items);
#pragma omp parallel num_threads(team) if (team > 1)
  {
    char* mine = thread_base + static_cast<size_t>(omp_get_thread_num()) * thread_bytes;
    ScratchArena kv_arena(mine), q_arena(mine);
    const BwdKvScratch kv_w = carve_bwd_kv(kv_arena, p);
    const BwdQScratch q_w = carve_bwd_q(q_arena, p);
    Isa kv_isa(kv_w.isa), q_isa(q_w.isa);
    int64_t step = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence seq = sequence_of(p, b);
      const int64_t q_tiles = ceil_div(seq.seqlen_q, kBlockM);
      const int64_t kv_items = ceil_div(seq.seqlen_k, kBlockN * kKvTilesPerItem);
      for (int64_t h_kv = 0; h_kv < p.heads_kv; ++h_kv, ++step) {
        const StagedQ& sq = staged_q[step % 2];
        const StagedKv& kv = staged_kv[step % 2];
        const int64_t h0 = h_kv * group;
        stage_step<Isa>(p, sq, kv, seq, b, h0, true, kv_w.row_tmp);
        for (int64_t g = 0; g + 1 < group; ++g) {
#pragma omp for schedule(dynamic, 1)
          for (int64_t kv_item = 0; kv_item < kv_items; ++kv_item)
            bwd_kv_tiles<Isa>(kv_isa, p, kv_w, sq, seq, b, h0 + g, kv_item * kKvTilesPerItem * kBlockN, g == 0, false);
          stage_step<Isa>(p, sq, kv, seq, b, h0 + g + 1, false, kv_w.row_tmp);
        }
        // Pass-1 items first (under a causal mask the first K/V tiles see
        // the most queries), then dQ items, last Q tiles first.
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t item = 0; item < kv_items + group * q_tiles; ++item) {
          if (item < kv_items) {
            bwd_kv_tiles<Isa>(kv_isa, p, kv_w, sq, seq, b, h0 + group - 1, item * kKvTilesPerItem * kBlockN,
                              group == 1, true);
            continue;
          }
          const int64_t q_item = item - kv_items;
          const int64_t q_tile = q_tiles - 1 - q_item % q_tiles;
          bwd_q_tile<Isa>(q_isa, p, q_w, kv, seq, b, h0 + q_item / q_tiles, q_tile * kBlockM);
        }
      }
    }
    if (p.is_varlen) {
#pragma omp single nowait
      zero_unused_rows<Isa>(p, q_w.row_tmp);
    }
  }
  return FA_OK;
}

template <class Isa>
fa_status run_bwd(const BwdParams& p, void* workspace) {
  return bwd_scheme(p) == BwdScheme::kOwnedGroups ? run_bwd_groups<Isa>(p, workspace)
                                                   : run_bwd_split<Isa>(p, workspace);
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
