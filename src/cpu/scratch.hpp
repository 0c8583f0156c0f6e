// Per-thread scratch tiles of the forward and backward passes, carved from
// the workspace. The same carve functions size the workspace (null arena base)
// and hand out the pointers, so fwd_workspace_bytes is exact.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/params.hpp"
#include "cpu/config.hpp"

namespace flashattn {
namespace cpu {

struct FwdScratch {
  float* q_t;       // (D, kBlockM)  Q tile transposed: B operand of S^T = K Q^T
  float* k;         // (kBlockN, D)
  float* v;         // (kBlockN, Dv)
  float* s_t;       // (kBlockN, kBlockM) scores, then probabilities, one row per key
  float* drop;      // (kBlockN, kBlockM) dropout factors (0 or 1/(1-p)); only with dropout
  float* o;         // (kBlockM, Dv) unnormalized output
  float* row_max;   // (kBlockM) running max, log2 units
  float* row_sum;   // (kBlockM) running sum of exp2
  float* tile_max;  // (kBlockM)
  float* alpha;     // (kBlockM) rescale of the previous accumulators
  float* row_tmp;   // (max(D, Dv)) one converted row
};

inline FwdScratch carve_fwd(ScratchArena& arena, const AttnParams& p) {
  FwdScratch s;
  s.q_t = arena.take_floats(p.head_dim * kBlockM);
  s.k = arena.take_floats(kBlockN * p.head_dim);
  s.v = arena.take_floats(kBlockN * p.head_dim_v);
  s.s_t = arena.take_floats(kBlockN * kBlockM);
  s.drop = p.dropout.enabled ? arena.take_floats(kBlockN * kBlockM) : nullptr;
  s.o = arena.take_floats(kBlockM * p.head_dim_v);
  s.row_max = arena.take_floats(kBlockM);
  s.row_sum = arena.take_floats(kBlockM);
  s.tile_max = arena.take_floats(kBlockM);
  s.alpha = arena.take_floats(kBlockM);
  s.row_tmp = arena.take_floats(std::max(p.head_dim, p.head_dim_v));
  return s;
}

// Pass 1 of the backward (dK, dV of one K/V tile): scores are query-major.
struct BwdKvScratch {
  float* k_t;    // (D, kBlockN)  B operand of S = Q K^T
  float* v_t;    // (Dv, kBlockN) B operand of dP = dO V^T
  float* q;      // (kBlockM, D)
  float* dout;   // (kBlockM, Dv)
  float* s;      // (kBlockM, kBlockN) scores, then P (dropped)
  float* dp;     // (kBlockM, kBlockN) dP, then dS
  float* tanh;   // (kBlockM, kBlockN) tanh of the capped score; only with softcap
  float* drop;   // (kBlockM, kBlockN) dropout factors; only with dropout
  float* dk;     // (kBlockN, D)
  float* dv;     // (kBlockN, Dv)
  float* lse2;   // (kBlockM) LSE in log2 units
  float* delta;  // (kBlockM) rowsum(dO * O)
  float* row_tmp;
};

// Pass 2 (dQ of one Q tile): scores are key-major, like the forward.
struct BwdQScratch {
  float* q_t;     // (D, kBlockM)
  float* dout_t;  // (Dv, kBlockM)
  float* k;       // (kBlockN, D)
  float* v;       // (kBlockN, Dv)
  float* s_t;     // (kBlockN, kBlockM)
  float* dp_t;    // (kBlockN, kBlockM) dP^T, then dS^T
  float* tanh;    // (kBlockN, kBlockM)
  float* drop;    // (kBlockN, kBlockM)
  float* dq;      // (kBlockM, D)
  float* lse2;    // (kBlockM)
  float* delta;   // (kBlockM)
  float* row_tmp;
};

inline BwdKvScratch carve_bwd_kv(ScratchArena& arena, const AttnParams& p) {
  const int64_t tile = kBlockM * kBlockN;
  BwdKvScratch s;
  s.k_t = arena.take_floats(p.head_dim * kBlockN);
  s.v_t = arena.take_floats(p.head_dim_v * kBlockN);
  s.q = arena.take_floats(kBlockM * p.head_dim);
  s.dout = arena.take_floats(kBlockM * p.head_dim_v);
  s.s = arena.take_floats(tile);
  s.dp = arena.take_floats(tile);
  s.tanh = p.softcap > 0.0f ? arena.take_floats(tile) : nullptr;
  s.drop = p.dropout.enabled ? arena.take_floats(tile) : nullptr;
  s.dk = arena.take_floats(kBlockN * p.head_dim);
  s.dv = arena.take_floats(kBlockN * p.head_dim_v);
  s.lse2 = arena.take_floats(kBlockM);
  s.delta = arena.take_floats(kBlockM);
  s.row_tmp = arena.take_floats(std::max(p.head_dim, p.head_dim_v));
  return s;
}

inline BwdQScratch carve_bwd_q(ScratchArena& arena, const AttnParams& p) {
  const int64_t tile = kBlockM * kBlockN;
  BwdQScratch s;
  s.q_t = arena.take_floats(p.head_dim * kBlockM);
  s.dout_t = arena.take_floats(p.head_dim_v * kBlockM);
  s.k = arena.take_floats(kBlockN * p.head_dim);
  s.v = arena.take_floats(kBlockN * p.head_dim_v);
  s.s_t = arena.take_floats(tile);
  s.dp_t = arena.take_floats(tile);
  s.tanh = p.softcap > 0.0f ? arena.take_floats(tile) : nullptr;
  s.drop = p.dropout.enabled ? arena.take_floats(tile) : nullptr;
  s.dq = arena.take_floats(kBlockM * p.head_dim);
  s.lse2 = arena.take_floats(kBlockM);
  s.delta = arena.take_floats(kBlockM);
  s.row_tmp = arena.take_floats(std::max(p.head_dim, p.head_dim_v));
  return s;
}

inline size_t fwd_thread_bytes(const AttnParams& p) {
  ScratchArena arena;
  carve_fwd(arena, p);
  return arena.used();
}

// The passes run one after the other, so each thread's region serves all three.
inline size_t bwd_thread_bytes(const AttnParams& p) {
  ScratchArena kv, q;
  carve_bwd_kv(kv, p);
  carve_bwd_q(q, p);
  return std::max(kv.used(), q.used());
}

// delta = rowsum(dO * O) for every (head, row): H * total_q floats, O(N).
inline size_t bwd_shared_bytes(const AttnParams& p) {
  ScratchArena arena;
  arena.take_floats(p.heads * p.total_q);
  return arena.used();
}

}  // namespace cpu
}  // namespace flashattn
