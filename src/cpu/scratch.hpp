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

// Packing buffers of the AMX kernel sets, per bf16 piece of an operand (1
// for bf16 tensors, kAmxSplitPieces for fp32 and fp16): A (256 x 256) bf16
// plus the pinned A operands, B (128 x 256) bf16 pairs plus the pinned B
// operands of the same size; and a (256 x 256) fp32 C staging tile: every
// gemm of the passes has m <= 256 and k, n <= 256. Counted for every call,
// AMX or not, so the size depends on the params alone.
constexpr int kMaxGemmRows = 256;  // max(kBlockM, kBlockN)
constexpr int kMaxGemmDim = 256;   // FA_MAX_HEAD_DIM
constexpr int kKvTilesPerItem = 2;                 // backward dK/dV items (bwd_impl.hpp)
constexpr int kPinnedOperands = 2 * kKvTilesPerItem + 1;  // K^T and V^T of each; dS^T (bwd_group.hpp)
constexpr int kPinnedAOperands = 2;  // P^T and dS^T as A operands (bwd_group.hpp)
constexpr int kSharedOperands = 4;  // shared packed operands in use at once (SharedOperand)
constexpr int kAmxSplitPieces = 3;
static_assert(kBlockM <= kMaxGemmRows && kBlockN <= kMaxGemmRows, "gemm rows exceed the AMX packing buffers");
// bf16 pieces of an operand: bf16 tensors 1; fp32 and fp16 tensors 3 (an
// fp16 value's third piece is 0, dispatch.cpp).
inline int amx_pieces(fa_dtype dtype) { return dtype == FA_DTYPE_BF16 ? 1 : kAmxSplitPieces; }
inline size_t isa_scratch_bytes(const AttnParams& p) {
  const size_t pieces = static_cast<size_t>(amx_pieces(p.dtype));
  const size_t a = size_t{kMaxGemmRows} * kMaxGemmDim * 2 * pieces;
  const size_t b = size_t{kMaxGemmDim} * kMaxGemmRows * 2 * pieces;
  const size_t c = size_t{kMaxGemmRows} * kMaxGemmDim * 4;
  return (1 + kPinnedAOperands) * a + (1 + kPinnedOperands) * b + c +
         (3 + kPinnedOperands + kPinnedAOperands) * kScratchAlignment;
}

// Staged rows that are a gemm operand of many work items are packed once
// per step by the team, chunk by chunk, in the AMX kernel set's layouts
// (isa_amx.cpp: bf16 pieces, planes per piece), so that no item repacks
// them per tile. Roles of the staged rows (chunk_rows per chunk, cols
// floats each) in the operand:
//   kRowsA        rows of A              planes (chunk_rows, k32 = cols rounded to 32)
//   kTransposedA  columns of A (V^T)     planes (cols rounded to 16, k32 = chunk_rows)
//   kRowsB        rows of B              planes of pairs (chunk_rows / 2, n16 = cols rounded to 16)
// The packings are carved for every call, AMX or not: the sizes come from
// the params alone.
inline int round_up_to(int64_t value, int multiple) {
  return static_cast<int>((value + multiple - 1) / multiple * multiple);
}
enum class OperandRole { kRowsA, kTransposedA, kRowsB };
struct SharedOperand {
  OperandRole role = OperandRole::kRowsA;
  const float* source = nullptr;
  int chunk_rows = 0, cols = 0;
  int64_t rows = 0;    // staged rows from source
  int64_t chunks = 0;  // of the packed copy
  uint16_t* packed = nullptr;

  // One piece plane of a chunk: plane_rows x plane_row_length bf16.
  int plane_rows() const {
    return role == OperandRole::kRowsA ? chunk_rows
           : role == OperandRole::kTransposedA ? round_up_to(cols, 16)
                                               : chunk_rows / 2;
  }
  int plane_row_length() const {
    return role == OperandRole::kRowsA ? round_up_to(cols, 32)
           : role == OperandRole::kTransposedA ? chunk_rows
                                               : 2 * round_up_to(cols, 16);
  }
  int64_t chunk_bf16(int pieces) const { return int64_t{pieces} * plane_rows() * plane_row_length(); }
  int64_t chunk_floats() const { return int64_t{chunk_rows} * cols; }
  uint16_t* chunk_packed(int64_t chunk, int pieces) const { return packed + chunk * chunk_bf16(pieces); }
};

// Staged rows (rows, cols) at source with a packed copy carved from arena.
inline SharedOperand carve_shared_operand(ScratchArena& arena, const AttnParams& p, OperandRole role,
                                          const float* source, int64_t rows, int chunk_rows, int64_t cols) {
  SharedOperand op;
  op.role = role;
  op.source = source;
  op.chunk_rows = chunk_rows;
  op.cols = static_cast<int>(cols);
  op.rows = rows;
  op.chunks = (rows + chunk_rows - 1) / chunk_rows;
  const int pieces = amx_pieces(p.dtype);
  if (pieces > 0)
    op.packed = static_cast<uint16_t*>(arena.take_bytes(static_cast<size_t>(op.chunks * op.chunk_bf16(pieces)) * 2));
  return op;
}

// The same operand for the staged rows `floats` further on and their chunks
// `chunks` further on (the next head of a multi-head buffer).
inline SharedOperand shifted(SharedOperand op, int64_t floats, int64_t chunks, int pieces) {
  op.source += floats;
  if (op.packed != nullptr) op.packed += chunks * op.chunk_bf16(pieces);
  return op;
}

// Per (batch, kv head) step, the K/V rows (forward, dQ pass) or the Q
// and dO rows of one query head (dK/dV pass) are converted once into
// contiguous fp32 arrays that all threads read. Tiles are then plain
// pointers into them: no per-tile conversion, and sequential rows the
// hardware prefetchers follow, where (B, S, H, D) storage puts rows H * D
// elements apart. O(S * D) memory.
struct StagedKv {
  float* k;  // (seqlen_k, D)
  float* v;  // (seqlen_k, Dv)
  // Forward only: K and V^T packed as A operands (StagedKvHeads).
  SharedOperand k_a, vt_a;
};

inline StagedKv carve_staged_kv(ScratchArena& arena, const AttnParams& p) {
  StagedKv s;
  s.k = arena.take_floats(p.seqlen_k * p.head_dim);
  s.v = arena.take_floats(p.seqlen_k * p.head_dim_v);
  return s;
}

struct StagedQ {
  float* q;      // (seqlen_q, D)
  float* dout;   // (seqlen_q, Dv)
  float* lse2;   // (seqlen_q) LSE in log2 units
  float* delta;  // (seqlen_q) rowsum(dO * O)
  float* dk;     // (seqlen_k, D) dK accumulators of the kv head
  float* dv;     // (seqlen_k, Dv)
};

inline StagedQ carve_staged_q(ScratchArena& arena, const AttnParams& p) {
  StagedQ s;
  s.q = arena.take_floats(p.seqlen_q * p.head_dim);
  s.dout = arena.take_floats(p.seqlen_q * p.head_dim_v);
  s.lse2 = arena.take_floats(p.seqlen_q);
  s.delta = arena.take_floats(p.seqlen_q);
  s.dk = arena.take_floats(p.seqlen_k * p.head_dim);
  s.dv = arena.take_floats(p.seqlen_k * p.head_dim_v);
  return s;
}

struct FwdScratch {
  void* isa;        // kernel-set scratch (isa_scratch_bytes)
  float* q_t;       // (D, kBlockM)  Q tile transposed: B operand of S^T = K Q^T
  float* s_t;       // (kBlockN, kBlockM) scores, then probabilities, one row per key
  float* drop;      // (kBlockN, kBlockM) dropout factors (0 or 1/(1-p)); only with dropout
  float* o_t;       // (Dv, kBlockM) unnormalized output, transposed; rows up to a multiple of 16 (AMX tiles)
  float* row_max;   // (kBlockM) running max, log2 units
  float* row_sum;   // (kBlockM) running sum of exp2
  float* tile_max;  // (kBlockM)
  float* alpha;     // (kBlockM) rescale of the previous accumulators
  float* row_tmp;   // (kTransposeRows, max(D, Dv)) converted rows
};

inline FwdScratch carve_fwd(ScratchArena& arena, const AttnParams& p) {
  FwdScratch s;
  s.isa = arena.take_bytes(isa_scratch_bytes(p));
  s.q_t = arena.take_floats(p.head_dim * kBlockM);
  s.s_t = arena.take_floats(kBlockN * kBlockM);
  s.drop = p.dropout.enabled ? arena.take_floats(kBlockN * kBlockM) : nullptr;
  s.o_t = arena.take_floats(kBlockM * round_up_to(p.head_dim_v, 16));
  s.row_max = arena.take_floats(kBlockM);
  s.row_sum = arena.take_floats(kBlockM);
  s.tile_max = arena.take_floats(kBlockM);
  s.alpha = arena.take_floats(kBlockM);
  s.row_tmp = arena.take_floats(kTransposeRows * std::max(p.head_dim, p.head_dim_v));
  return s;
}

// Pass 1 of the backward (dK, dV of kKvTilesPerItem K/V tiles): scores are
// query-major.
struct BwdKvScratch {
  void* isa;
  float* k_t;   // (kKvTilesPerItem, D, kBlockN)  B operands of S = Q K^T
  float* v_t;   // (kKvTilesPerItem, Dv, kBlockN) B operands of dP = dO V^T
  // One Q tile's Q and dO packed (AMX dtypes) as A operands of S and dP and
  // as B operands of dK += dS^T Q and dV += P^T dO, once for all the item's
  // K/V tiles; source and packed set by bwd_impl.hpp per Q tile.
  SharedOperand q_a, dout_a, q_b, dout_b;
  float* s;     // (kBlockM, kBlockN) scores, then P (dropped)
  float* dp;    // (kBlockM, kBlockN) dP, then dS
  float* tanh;  // (kBlockM, kBlockN) tanh of the capped score; only with softcap
  float* drop;  // (kBlockM, kBlockN) dropout factors; only with dropout
  float* row_tmp;  // (kTransposeRows, max(D, Dv))
};

// Pass 2 (dQ of one Q tile): scores are key-major, like the forward.
struct BwdQScratch {
  void* isa;
  float* q_t;     // (D, kBlockM)
  float* dout_t;  // (Dv, kBlockM)
  float* s_t;     // (kBlockN, kBlockM)
  float* dp_t;    // (kBlockN, kBlockM) dP^T, then dS^T
  float* tanh;    // (kBlockN, kBlockM)
  float* drop;    // (kBlockN, kBlockM)
  float* dq;      // (kBlockM, D)
  float* lse2;    // (kBlockM)
  float* delta;   // (kBlockM)
  float* row_tmp;   // (kTransposeRows, max(D, Dv))
  float* row_tmp2;  // (max(D, Dv))
};

inline BwdKvScratch carve_bwd_kv(ScratchArena& arena, const AttnParams& p) {
  const int64_t tile = kBlockM * kBlockN;
  BwdKvScratch s;
  s.isa = arena.take_bytes(isa_scratch_bytes(p));
  s.k_t = arena.take_floats(kKvTilesPerItem * p.head_dim * kBlockN);
  s.v_t = arena.take_floats(kKvTilesPerItem * p.head_dim_v * kBlockN);
  s.q_a = carve_shared_operand(arena, p, OperandRole::kRowsA, nullptr, kBlockM, kBlockM, p.head_dim);
  s.dout_a = carve_shared_operand(arena, p, OperandRole::kRowsA, nullptr, kBlockM, kBlockM, p.head_dim_v);
  s.q_b = carve_shared_operand(arena, p, OperandRole::kRowsB, nullptr, kBlockM, kBlockM, p.head_dim);
  s.dout_b = carve_shared_operand(arena, p, OperandRole::kRowsB, nullptr, kBlockM, kBlockM, p.head_dim_v);
  s.s = arena.take_floats(tile);
  s.dp = arena.take_floats(tile);
  s.tanh = p.softcap > 0.0f ? arena.take_floats(tile) : nullptr;
  s.drop = p.dropout.enabled ? arena.take_floats(tile) : nullptr;
  s.row_tmp = arena.take_floats(kTransposeRows * std::max(p.head_dim, p.head_dim_v));
  return s;
}

inline BwdQScratch carve_bwd_q(ScratchArena& arena, const AttnParams& p) {
  const int64_t tile = kBlockM * kBlockN;
  BwdQScratch s;
  s.isa = arena.take_bytes(isa_scratch_bytes(p));
  s.q_t = arena.take_floats(p.head_dim * kBlockM);
  s.dout_t = arena.take_floats(p.head_dim_v * kBlockM);
  s.s_t = arena.take_floats(tile);
  s.dp_t = arena.take_floats(tile);
  s.tanh = p.softcap > 0.0f ? arena.take_floats(tile) : nullptr;
  s.drop = p.dropout.enabled ? arena.take_floats(tile) : nullptr;
  s.dq = arena.take_floats(kBlockM * p.head_dim);
  s.lse2 = arena.take_floats(kBlockM);
  s.delta = arena.take_floats(kBlockM);
  s.row_tmp = arena.take_floats(kTransposeRows * std::max(p.head_dim, p.head_dim_v));
  s.row_tmp2 = arena.take_floats(std::max(p.head_dim, p.head_dim_v));
  return s;
}

inline size_t fwd_thread_bytes(const AttnParams& p) {
  ScratchArena arena;
  carve_fwd(arena, p);
  return arena.used();
}

// The forward stages several kv heads per step (at least one):
// - as many as fit kStageBudget, so that small problems pay one barrier per
//   few heads (4 MiB: 8 heads of 1024 keys at D = Dv = 64);
// - with many threads, enough for kItemsPerThread Q tiles per thread, within
//   kStageBudgetPerThread per thread. A step's items end at the next step's
//   barrier, so a step of about one item per thread lasts as long as its
//   longest: 16 threads on the 16 causal Q tiles of one 4k head are busy 136
//   of 256 tile-times (53 %). With four per thread, longest first, the last
//   items to start are the shortest. The memory stays O(threads * kBlockM *
//   (D + Dv)) where the Q tiles are few per head (short sequences) and is
//   capped by the per-thread budget where they are not (a few queries
//   against a long cache).
// Which thread takes an item never changes its bits, so neither does the count.
constexpr int64_t kStageBudget = int64_t{4} << 20;
constexpr int64_t kItemsPerThread = 4;
constexpr int64_t kStageBudgetPerThread = int64_t{2} << 20;
inline int64_t fwd_heads_per_step(const AttnParams& p) {
  const int64_t head_bytes = std::max<int64_t>(p.seqlen_k * (p.head_dim + p.head_dim_v) * 4, 1);
  const int64_t threads = std::max<int64_t>(p.num_threads, 1);
  const int64_t items_per_head =
      std::max<int64_t>(p.heads / std::max<int64_t>(p.heads_kv, 1) * ((p.seqlen_q + kBlockM - 1) / kBlockM), 1);
  const int64_t for_items = std::min((kItemsPerThread * threads + items_per_head - 1) / items_per_head,
                                     threads * kStageBudgetPerThread / head_bytes);
  return std::clamp<int64_t>(std::max(kStageBudget / head_bytes, for_items), 1, p.heads_kv);
}

// Staged rows of fwd_heads_per_step kv heads; head i's at k + i * k_head,
// and packed as the A operands of S^T = K Q^T (K) and O^T = V^T P^T (V^T).
struct StagedKvHeads {
  float* k;
  float* v;
  int64_t k_head = 0, v_head = 0;  // floats per head: seqlen_k * D, seqlen_k * Dv
  int64_t chunks = 0;              // kBlockN chunks per head
  int pieces = 0;
  SharedOperand k_a, vt_a;         // of head 0
  StagedKv head(int64_t i) const {
    StagedKv kv;
    kv.k = k + i * k_head;
    kv.v = v + i * v_head;
    kv.k_a = shifted(k_a, i * k_head, i * chunks, pieces);
    kv.vt_a = shifted(vt_a, i * v_head, i * chunks, pieces);
    return kv;
  }
};

inline StagedKvHeads carve_staged_kv_heads(ScratchArena& arena, const AttnParams& p) {
  StagedKvHeads s;
  const int64_t heads = fwd_heads_per_step(p);
  s.k_head = p.seqlen_k * p.head_dim;
  s.v_head = p.seqlen_k * p.head_dim_v;
  s.k = arena.take_floats(heads * s.k_head);
  s.v = arena.take_floats(heads * s.v_head);
  s.chunks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  s.pieces = amx_pieces(p.dtype);
  s.k_a = carve_shared_operand(arena, p, OperandRole::kRowsA, s.k, heads * s.chunks * kBlockN, kBlockN, p.head_dim);
  s.vt_a = carve_shared_operand(arena, p, OperandRole::kTransposedA, s.v, heads * s.chunks * kBlockN, kBlockN,
                                p.head_dim_v);
  s.k_a.chunks = s.vt_a.chunks = s.chunks;  // views of one head (head())
  s.k_a.rows = s.vt_a.rows = p.seqlen_k;
  return s;
}

// Two staging buffers: steps alternate between them (fwd_impl.hpp).
inline size_t fwd_shared_bytes(const AttnParams& p) {
  ScratchArena arena;
  carve_staged_kv_heads(arena, p);
  carve_staged_kv_heads(arena, p);
  return arena.used();
}

// The two backward schemes (bwd_impl.hpp). The choice depends on the shape
// and on FLASHATTN_CPU_BWD (=split or =groups, for tests), never on the
// thread count; defined in dispatch.cpp.
enum class BwdScheme { kSplitPasses, kOwnedGroups };
BwdScheme bwd_scheme(const AttnParams& p);

// The owned-groups scheme (bwd_group.hpp): one thread's region holds its
// (batch, kv head) group's K, V rows and dK, dV sums, O(S * D), and the
// tiles of one Q tile. Scores are key-major, like the forward.
struct BwdGroupScratch {
  void* isa;
  float* k;       // (seqlen_k, D) the group's K rows
  float* v;       // (seqlen_k, Dv)
  float* dk;      // (seqlen_k, D) dK sums over the group's query heads
  float* dv;      // (seqlen_k, Dv)
  // K and V packed once per group (AMX kernel sets) as the A operands of
  // S^T = K Q^T and dP^T = V dO^T, and K^T as the A operand of
  // dQ^T += K^T dS^T, chunks of kBlockN rows: each tile's K and V feed every
  // Q tile of every query head of the group.
  SharedOperand k_a, v_a, kt_a;
  float* q;       // (kBlockM, D)  B operand of dK += dS^T Q
  float* q_t;     // (D, kBlockM)  B operand of S^T = K Q^T
  float* dout;    // (kBlockM, Dv) B operand of dV += P^T dO
  float* dout_t;  // (Dv, kBlockM) B operand of dP^T = V dO^T
  float* s_t;     // (kBlockN, kBlockM) scores, then P^T (dropped)
  float* dp_t;    // (kBlockN, kBlockM) dP^T, then dS^T
  float* tanh;    // (kBlockN, kBlockM) only with softcap
  float* drop;    // (kBlockN, kBlockM) only with dropout
  float* dq_t;    // (D, kBlockM) dQ^T, transposed like S^T
  float* lse2;    // (kBlockM)
  float* delta;   // (kBlockM)
  float* row_tmp;   // (kTransposeRows, max(D, Dv))
  float* row_tmp2;  // (max(D, Dv))
};

inline BwdGroupScratch carve_bwd_group(ScratchArena& arena, const AttnParams& p) {
  const int64_t tile = kBlockM * kBlockN;
  BwdGroupScratch s;
  s.isa = arena.take_bytes(isa_scratch_bytes(p));
  s.k = arena.take_floats(p.seqlen_k * p.head_dim);
  s.v = arena.take_floats(p.seqlen_k * p.head_dim_v);
  s.dk = arena.take_floats(p.seqlen_k * p.head_dim);
  s.dv = arena.take_floats(p.seqlen_k * p.head_dim_v);
  s.k_a = carve_shared_operand(arena, p, OperandRole::kRowsA, s.k, p.seqlen_k, kBlockN, p.head_dim);
  s.v_a = carve_shared_operand(arena, p, OperandRole::kRowsA, s.v, p.seqlen_k, kBlockN, p.head_dim_v);
  s.kt_a = carve_shared_operand(arena, p, OperandRole::kTransposedA, s.k, p.seqlen_k, kBlockN, p.head_dim);
  s.q = arena.take_floats(kBlockM * p.head_dim);
  s.q_t = arena.take_floats(p.head_dim * kBlockM);
  s.dout = arena.take_floats(kBlockM * p.head_dim_v);
  s.dout_t = arena.take_floats(p.head_dim_v * kBlockM);
  s.s_t = arena.take_floats(tile);
  s.dp_t = arena.take_floats(tile);
  s.tanh = p.softcap > 0.0f ? arena.take_floats(tile) : nullptr;
  s.drop = p.dropout.enabled ? arena.take_floats(tile) : nullptr;
  s.dq_t = arena.take_floats(p.head_dim * kBlockM);
  s.lse2 = arena.take_floats(kBlockM);
  s.delta = arena.take_floats(kBlockM);
  s.row_tmp = arena.take_floats(kTransposeRows * std::max(p.head_dim, p.head_dim_v));
  s.row_tmp2 = arena.take_floats(std::max(p.head_dim, p.head_dim_v));
  return s;
}

// Split passes: they run one after the other, so each thread's region
// serves both.
inline size_t bwd_thread_bytes(const AttnParams& p) {
  ScratchArena kv, q;
  if (bwd_scheme(p) == BwdScheme::kOwnedGroups) {
    carve_bwd_group(kv, p);
    return kv.used();
  }
  carve_bwd_kv(kv, p);
  carve_bwd_q(q, p);
  return std::max(kv.used(), q.used());
}

// Split passes: both passes' staged rows at once, twice, as steps alternate
// (bwd_impl.hpp). Owned groups share nothing.
inline size_t bwd_shared_bytes(const AttnParams& p) {
  ScratchArena arena;
  if (bwd_scheme(p) == BwdScheme::kOwnedGroups) return 0;
  for (int x = 0; x < 2; ++x) {
    carve_staged_q(arena, p);
    carve_staged_kv(arena, p);
  }
  return arena.used();
}

}  // namespace cpu
}  // namespace flashattn
