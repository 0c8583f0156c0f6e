// The backward's owned-groups scheme (bwd_impl.hpp says when it runs): one
// thread computes every gradient of a (batch, kv head) group, five matrix
// products per (Q tile, K/V tile) pair and no recomputation.
//
// The thread stages the group's K and V rows once and zeroes its dK, dV
// sums; then for each query head of the group, in order, and each of its Q
// tiles, in order, it stages Q, dO (rows and transposed), LSE and delta and
// walks the K/V tiles the mask lets the tile see, in order:
//   S^T = K Q^T, P^T = exp2(S^T - LSE)      (kBlockN, kBlockM), key-major
//   dP^T = V dO^T, dS^T = P^T o (dP^T - delta)
//   dV[tile] += P^T dO,  dK[tile] += dS^T Q  (the group's sums)
//   dQ^T += K^T dS^T                         (the Q tile's sum)
// storing dQ after the tile's last K/V tile, dK and dV after the group's last
// Q tile. Every sum is taken in that fixed order by one thread, so the bits
// do not depend on the thread count or on which thread takes the group.
#pragma once

#include <omp.h>

#include <algorithm>

#include "cpu/scratch.hpp"
#include "cpu/tile_ops.hpp"

namespace flashattn {
namespace cpu {
namespace {

// Pin slots of softmax_grad's packings: P^T and dS^T as A operands, dS^T as
// a B operand (B slots 0-3 hold Q^T, dO^T, dO and Q).
constexpr int kPinnedProbsA = 0, kPinnedDsA = 1, kPinnedDsB = 4;

// A view of fp32 rows staged in scratch, for load_tile_transposed.
inline RowsView staged_rows(const float* rows, int cols) {
  return RowsView{reinterpret_cast<const char*>(rows), int64_t{cols} * 4, FA_DTYPE_FP32};
}

// Q tile [m0, m0 + mq) of query head h: its dQ, and its share of the group's
// dK and dV sums.
template <class Isa>
void group_q_tile(Isa& isa, const BwdParams& p, const BwdGroupScratch& w, const Sequence& seq, int64_t b, int64_t h,
                  int64_t m0) {
  const int mq = static_cast<int>(std::min<int64_t>(kBlockM, seq.seqlen_q - m0));
  const int d = static_cast<int>(p.head_dim);
  const int dv = static_cast<int>(p.head_dim_v);
  const ScoreContext ctx = score_context(p, seq, b, h);

  load_tile<Isa>(rows_view(p.q, p.dtype, p.q_layout, b, seq.q_row0, h), m0, mq, d, w.q, d);
  load_tile<Isa>(rows_view(p.dout, p.dtype, p.dout_layout, b, seq.q_row0, h), m0, mq, dv, w.dout, dv);
  load_tile_transposed<Isa>(staged_rows(w.q, d), 0, mq, d, w.q_t, kBlockM, w.row_tmp);
  load_tile_transposed<Isa>(staged_rows(w.dout, dv), 0, mq, dv, w.dout_t, kBlockM, w.row_tmp);
  const RowsView o_rows = rows_view(p.o, p.dtype, p.o_layout, b, seq.q_row0, h);
  const float* lse = lse_row(p, seq, b, h);
  for (int i = 0; i < mq; ++i) {
    load_tile<Isa>(o_rows, m0 + i, 1, dv, w.row_tmp2, dv);
    const float* dout = w.dout + static_cast<int64_t>(i) * dv;
    float sum = 0.0f;
    for (int c = 0; c < dv; ++c) sum += dout[c] * w.row_tmp2[c];
    w.delta[i] = sum;
    w.lse2[i] = lse[(m0 + i) * p.lse_layout.row] * kLog2e;
  }
  isa.pin_b(0, w.q_t, d, mq, kBlockM);
  isa.pin_b(1, w.dout_t, dv, mq, kBlockM);
  // dO and Q rows as the B operands of dV += P^T dO and dK += dS^T Q: the
  // same for every K/V tile that the whole Q tile sees.
  isa.pin_b(2, w.dout, mq, dv, dv);
  isa.pin_b(3, w.q, mq, d, d);
  for (int c = 0; c < d; ++c) std::fill(w.dq_t + c * kBlockM, w.dq_t + c * kBlockM + mq, 0.0f);

  const float kept = ctx.dropout.enabled ? ctx.dropout.keep_scale : 1.0f;
  const int64_t key_begin = ctx.mask.key_begin(m0);
  const int64_t key_end = ctx.mask.key_end(m0 + mq);
  for (int64_t k0 = key_begin / kBlockN * kBlockN; k0 < key_end; k0 += kBlockN) {
    const int nk = static_cast<int>(std::min<int64_t>(kBlockN, seq.seqlen_k - k0));
    const float* k_tile = w.k + k0 * d;   // (nk, d)
    const float* v_tile = w.v + k0 * dv;  // (nk, dv)
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
    isa.gemm(nk, nq, dv, v_tile, dv, 1, w.dout_t + q_lo, kBlockM, dp_t, kBlockM, false);  // dP^T (nk, nq)

    // Without dropout, softcap or exact P, a kernel set may compute dS^T and
    // pack it and P^T for the three products in one pass (AMX).
    const bool exact_p = masked && sees_few_keys(ctx.mask, m0 + q_lo, nq);
    const bool packed = !ctx.dropout.enabled && tanh_t == nullptr && !exact_p &&
                        isa.softmax_grad(s_t, dp_t, kBlockM, nk, nq, delta, kPinnedProbsA, kPinnedDsA, kPinnedDsB);
    // 0/1 mask: P^T dO takes the mask, 1/(1-p) scales dV at the store (as
    // the split scheme's dK/dV pass, dropout_factors).
    if (ctx.dropout.enabled) dropout_factors<true>(w.drop + q_lo, kBlockM, ctx, m0 + q_lo, nq, k0, nk, 1.0f);
    for (int j = 0; !packed && j < nk; ++j) {  // softmax_grad did these rows when packed
      float* p_row = s_t + j * kBlockM;
      float* dp_row = dp_t + j * kBlockM;
      if (ctx.dropout.enabled) {
        const float* drop_row = w.drop + q_lo + j * kBlockM;
        for (int i = 0; i < nq; ++i) {
          const float prob = p_row[i];
          dp_row[i] = prob * (dp_row[i] * (drop_row[i] * kept) - delta[i]);
          p_row[i] = prob * drop_row[i];
        }
      } else {
        for (int i = 0; i < nq; ++i) dp_row[i] = p_row[i] * (dp_row[i] - delta[i]);
      }
      if (tanh_t != nullptr) {
        const float* t_row = tanh_t + j * kBlockM;
        for (int i = 0; i < nq; ++i) dp_row[i] *= 1.0f - t_row[i] * t_row[i];
      }
    }
    // dV += P^T dO (nk, dv), P kept exact where rows see few keys (fwd_impl.hpp).
    const float* dout = w.dout + static_cast<int64_t>(q_lo) * dv;
    float* dv_acc = w.dv + k0 * dv;
    if (exact_p)
      isa.gemm_exact_a(nk, dv, nq, s_t, kBlockM, 1, dout, dv, dv_acc, dv);
    else
      isa.gemm(nk, dv, nq, s_t, kBlockM, 1, dout, dv, dv_acc, dv, true);
    isa.gemm(nk, d, nq, dp_t, kBlockM, 1, w.q + static_cast<int64_t>(q_lo) * d, d, w.dk + k0 * d, d,
             true);                                                                                     // dK += dS^T Q
    // dQ^T += K^T dS^T (d, nq): dS^T is then a B operand read by rows, where
    // dQ += dS K read it transposed as an A operand (16 x 16 transposes per
    // block when packed for AMX).
    isa.gemm(d, nq, nk, k_tile, 1, d, dp_t, kBlockM, w.dq_t + q_lo, kBlockM, true);
    if (packed) {
      isa.unpin_a(kPinnedProbsA);
      isa.unpin_a(kPinnedDsA);
      isa.unpin_b(kPinnedDsB);
    }
  }
  for (int slot = 0; slot < 4; ++slot) isa.unpin_b(slot);
  for (int c = 0; c < d; ++c) {
    float* dq_row = w.dq_t + c * kBlockM;
    for (int i = 0; i < mq; ++i) dq_row[i] *= p.softmax_scale;
  }
  store_tile_transposed<Isa>(p.dq, p.dtype, p.dq_layout, b, seq.q_row0 + m0, h, mq, d, w.dq_t, kBlockM, w.row_tmp);
}

// Every gradient of kv head h_kv of sequence b and of its query heads.
template <class Isa>
void group_grads(Isa& isa, const BwdParams& p, const BwdGroupScratch& w, int64_t b, int64_t h_kv) {
  const Sequence seq = sequence_of(p, b);
  const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_v);
  const int nk = static_cast<int>(seq.seqlen_k);
  load_tile<Isa>(rows_view(p.k, p.dtype, p.k_layout, b, seq.k_row0, h_kv), 0, nk, d, w.k, d);
  load_tile<Isa>(rows_view(p.v, p.dtype, p.v_layout, b, seq.k_row0, h_kv), 0, nk, dv, w.v, dv);
  std::fill(w.dk, w.dk + seq.seqlen_k * d, 0.0f);
  std::fill(w.dv, w.dv + seq.seqlen_k * dv, 0.0f);
  const SharedOperand* packed[] = {&w.k_a, &w.v_a, &w.kt_a};
  for (int slot = 0; slot < 3; ++slot) {
    if (packed[slot]->packed == nullptr) continue;
    for (int64_t chunk = 0; chunk * kBlockN < nk; ++chunk)
      Isa::pack_chunk(*packed[slot], chunk, static_cast<int>(std::min<int64_t>(kBlockN, nk - chunk * kBlockN)));
    isa.share(slot, *packed[slot]);
  }
  const int64_t group = p.heads / p.heads_kv;
  for (int64_t h = h_kv * group; h < (h_kv + 1) * group; ++h)
    for (int64_t m0 = 0; m0 < seq.seqlen_q; m0 += kBlockM) group_q_tile<Isa>(isa, p, w, seq, b, h, m0);
  for (int slot = 0; slot < 3; ++slot) isa.unshare(slot);
  const float kept = p.dropout.enabled ? p.dropout.keep_scale : 1.0f;
  store_tile<Isa>(p.dk, p.dtype, p.dk_layout, b, seq.k_row0, h_kv, nk, d, w.dk, d, p.softmax_scale, w.row_tmp);
  store_tile<Isa>(p.dv, p.dtype, p.dv_layout, b, seq.k_row0, h_kv, nk, dv, w.dv, dv, kept, w.row_tmp);
}

// Groups are handed out dynamically: which thread takes one changes nothing
// in its bits. The team has at most one thread per group.
template <class Isa>
fa_status run_bwd_groups(const BwdParams& p, void* workspace) {
  char* thread_base = align_workspace(workspace) + bwd_shared_bytes(p);
  const size_t thread_bytes = bwd_thread_bytes(p);
  const int64_t groups = p.batch * p.heads_kv;
  const int team = team_size(p, groups);
#pragma omp parallel num_threads(team) if (team > 1)
  {
    ScratchArena arena(thread_base + static_cast<size_t>(omp_get_thread_num()) * thread_bytes);
    const BwdGroupScratch w = carve_bwd_group(arena, p);
    Isa isa(w.isa);
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t item = 0; item < groups; ++item) group_grads<Isa>(isa, p, w, item / p.heads_kv, item % p.heads_kv);
    if (p.is_varlen) {
#pragma omp single nowait
      zero_unused_rows<Isa>(p, w.row_tmp);
    }
  }
  return FA_OK;
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
