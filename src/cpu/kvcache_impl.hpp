// Attention against a KV cache on the CPU (fa_fwd_kvcache): append, then
// split-KV attention with the query heads of one KV head packed together.
// Compiled four times: for the baseline ISA (kvcache.cpp), for AVX2
// (kvcache_avx2.cpp), for AVX-512 (kvcache_avx512.cpp) and for AVX512-BF16
// (kvcache_avx512bf16.cpp), chosen at run time. The loops are written so that
// the compiler vectorizes them (contiguous innermost, no calls, no branches);
// the AVX-512 builds take the chunk's two products from
// kvcache_chunk_avx512.hpp, and for bf16 caches the AVX512-BF16 build from
// kvcache_chunk_bf16.hpp (K and V read as bf16 where they lie).
//
// Phase 1 writes k_new (rotated) and v_new into the cache at cache_seqlens.
// Phase 2 runs work items (batch row, group of kv heads, row block, split):
// the rows of a kv head are (query i, head g of its group) pairs, r = i * G +
// g, so every K/V row gathered from the (possibly paged) cache serves G query
// heads and Sq queries at once: decode reads each cache byte once per call.
// Per chunk of kKeyChunk keys and kv head the item converts K and V ((keys,
// D), (keys, Dv)) to fp32 (but on VDPBF16PS), prefetches a share of the next
// chunk, forms the scores of the head's rows, and updates
// the online softmax in log2 units (a call-free exp2 that vectorizes). With
// one split the item writes out and lse directly, with several it writes O / l
// and its LSE and phase 3 merges the splits exactly:
//   lse = log sum_s exp(lse_s),  O = sum_s exp(lse_s - lse) O_s.
// Splits fill the team when the items without splits are fewer than the
// threads (decode of one sequence); num_splits > 0 forces a count (tests
// compare counts).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/half.hpp"
#include "common/kvcache_params.hpp"
#include "cpu/config.hpp"
#include "cpu/exp2_poly.hpp"
#if defined(FLASHATTN_KVCACHE_AVX512)
#include "cpu/kvcache_chunk_avx512.hpp"  // chunk_scores, chunk_accumulate
#endif
#if defined(FLASHATTN_KVCACHE_BF16_DOT)
#include "cpu/kvcache_chunk_bf16.hpp"  // the same for bf16 caches, on VDPBF16PS
#endif
#if defined(FLASHATTN_KVCACHE_AVX2)
#include "cpu/kvcache_chunk_avx2.hpp"  // chunk_scores, chunk_accumulate at 8 lanes
#endif

namespace flashattn {
namespace cpu {
namespace {

constexpr int kKeyChunk = 32;              // keys per step: K (32, D) and V (32, Dv) in fp32 stay in L1
constexpr int kRowBlock = 64;              // packed query rows per work item
constexpr int64_t kMinKeysPerSplit = 256;  // below this a split costs more than it saves
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x for x <= 0 (and -inf -> 0) without a call, so loops over it vectorize:
// 2^n * p(f), n = round(x), f in [-1/2, 1/2], p the degree-6 polynomial of
// exp2_poly.hpp (relative error ~1.2e-7, the CPU backend's exp2). Below 2^-126 the
// result flushes to 0, far under any probability that matters next to 1.
inline float exp2_nonpositive(float x) {
  x = x < -127.0f ? -127.0f : x;
  const float n = (x + 12582912.0f) - 12582912.0f;  // round to nearest: 1.5 * 2^23
  const float f = x - n;
  constexpr const auto& kCoefficients = Exp2Poly<6>::kCoefficients;
  float p = kCoefficients[0];
  for (int i = 1; i <= 6; ++i) p = p * f + kCoefficients[i];
  const uint32_t scale_bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;  // 0 for n = -127
  return p * __builtin_bit_cast(float, scale_bits);
}

// fp16 bits -> fp32 without branches (vectorizes): the exponent and mantissa
// moved into fp32 position and rescaled by 2^112 is exact for normal and
// subnormal halves; Inf / NaN keep an all-ones exponent. Bit-identical to
// fp16_to_float in common/half.hpp.
inline float fp16_bits_to_float(uint16_t bits) {
  const uint32_t magnitude = static_cast<uint32_t>(bits & 0x7FFFu) << 13;
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const float finite = __builtin_bit_cast(float, magnitude) * 0x1p112f;
  const uint32_t finite_bits = __builtin_bit_cast(uint32_t, finite);
  const uint32_t value = magnitude >= (0x7C00u << 13) ? (magnitude | 0x7F800000u) : finite_bits;
  return __builtin_bit_cast(float, value | sign);
}

inline float bf16_bits_to_float(uint16_t bits) { return __builtin_bit_cast(float, static_cast<uint32_t>(bits) << 16); }

// n elements of a row of the dtype into fp32, written with `stride` apart.
inline void load_floats(fa_dtype dtype, const void* src, int64_t n, float* dst, int64_t stride) {
  if (dtype == FA_DTYPE_FP32) {
    const float* s = static_cast<const float*>(src);
    for (int64_t d = 0; d < n; ++d) dst[d * stride] = s[d];
  } else if (dtype == FA_DTYPE_BF16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t d = 0; d < n; ++d) dst[d * stride] = bf16_bits_to_float(s[d]);
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t d = 0; d < n; ++d) dst[d * stride] = fp16_bits_to_float(s[d]);
  }
}

float load_element(fa_dtype dtype, const void* base, int64_t offset) {
  switch (dtype) {
    case FA_DTYPE_FP16: return fp16_to_float(static_cast<const uint16_t*>(base)[offset]);
    case FA_DTYPE_BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[offset]);
    default: return static_cast<const float*>(base)[offset];
  }
}

void store_element(fa_dtype dtype, void* base, int64_t offset, float value) {
  switch (dtype) {
    case FA_DTYPE_FP16: static_cast<uint16_t*>(base)[offset] = float_to_fp16(value); break;
    case FA_DTYPE_BF16: static_cast<uint16_t*>(base)[offset] = float_to_bf16(value); break;
    default: static_cast<float*>(base)[offset] = value; break;
  }
}

float round_to_dtype(fa_dtype dtype, float value) {
  switch (dtype) {
    case FA_DTYPE_FP16: return fp16_to_float(float_to_fp16(value));
    case FA_DTYPE_BF16: return bf16_to_float(float_to_bf16(value));
    default: return value;
  }
}

// Dims [0, D) of one row, rotated at `position` when rotary is on, each value
// rounded to the dtype (what flash-attn keeps in shared memory / the cache).
void load_rotated_row(const KvCacheParams& p, const void* base, int64_t row_offset, int64_t position, float* out) {
  for (int64_t d = 0; d < p.head_dim; ++d) out[d] = load_element(p.dtype, base, row_offset + d);
  if (p.rotary_cos == nullptr) return;
  float rotated[FA_MAX_HEAD_DIM];
  for (int64_t d = 0; d < p.rotary_dim; ++d) {
    const RotaryPair pair = rotary_pair(p.rotary_dim, p.rotary_interleaved, d);
    const float c = load_element(p.dtype, p.rotary_cos, position * p.rotary_cos_stride + pair.column);
    const float s = load_element(p.dtype, p.rotary_sin, position * p.rotary_sin_stride + pair.column);
    const bool is_first = d == pair.first;
    if (p.dtype == FA_DTYPE_FP32) {
      rotated[d] = static_cast<float>(rotate<double>(out[pair.first], out[pair.second], c, s, is_first));
    } else {
      rotated[d] = round_to_dtype(p.dtype, rotate<float>(out[pair.first], out[pair.second], c, s, is_first));
    }
  }
  std::copy(rotated, rotated + p.rotary_dim, out);
}

// Phase 1: the new keys and values into the cache.
void append_new_rows(const KvCacheParams& p) {
  const int64_t items = p.batch * p.seqlen_new * p.heads_kv;
#pragma omp parallel for schedule(static) num_threads(p.num_threads) if (p.num_threads > 1 && items > 64)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t h = item % p.heads_kv;
    const int64_t t = (item / p.heads_kv) % p.seqlen_new;
    const int64_t b = item / (p.heads_kv * p.seqlen_new);
    const CacheRow row = CacheRow::of(p, b);
    const int64_t position = row.filled + t;
    float k_row[FA_MAX_HEAD_DIM];
    const int64_t k_src = b * p.k_new_layout.batch + t * p.k_new_layout.row + h * p.k_new_layout.head;
    load_rotated_row(p, p.k_new, k_src, position, k_row);
    const int64_t k_dst = cache_offset(p, p.k_cache_layout, row, b, position, h);
    for (int64_t d = 0; d < p.head_dim; ++d) store_element(p.dtype, p.k_cache, k_dst + d, k_row[d]);
    const int64_t elem = element_size(p.dtype);
    const int64_t v_src = b * p.v_new_layout.batch + t * p.v_new_layout.row + h * p.v_new_layout.head;
    const int64_t v_dst = cache_offset(p, p.v_cache_layout, row, b, position, h);
    std::memcpy(static_cast<char*>(p.v_cache) + v_dst * elem, static_cast<const char*>(p.v_new) + v_src * elem,
                static_cast<size_t>(p.head_dim_v * elem));
  }
}

// Work items: (batch row, group of kv heads, row block, split). A group is
// heads_per_item kv heads walked together, key chunk by key chunk. At one
// cache position their rows lie side by side (Hkv * D elements, in (B, S,
// Hkv, D) storage), so the group reads a chunk's positions as a whole where
// one head alone reads 256 bytes in each 2 KiB (Hkv = 8, D = 128): this
// machine reads the first pattern at about 30 GB/s and the second at 13-14
// (2 threads, 537 MB, dev/cpu_read_bandwidth.cpp). Groups of several heads
// are taken where all their packed rows fit one block (decode: G * Sq rows a
// head), up to kGroupChunkBytes of cache a chunk.
constexpr int64_t kGroupChunkBytes = int64_t{256} << 10;

struct Plan {
  int64_t rows = 0;            // R = Sq * G packed rows per (b, kv head)
  int64_t heads_per_item = 1;  // kv heads of a group
  int64_t block_rows = 0;      // rows of each head in a row block
  int64_t row_blocks = 0;      // ceil(R / block_rows)
  int64_t head_groups = 0;     // Hkv / heads_per_item
  int64_t splits = 1;
  int64_t batch_groups = 0;    // B * head_groups
  int64_t items() const { return batch_groups * row_blocks * splits; }
};

Plan make_plan(const KvCacheParams& p) {
  Plan plan;
  plan.rows = p.seqlen_q * p.group();
  const int64_t chunk_bytes = int64_t{kKeyChunk} * (p.head_dim + p.head_dim_v) * element_size(p.dtype);
  for (int64_t heads = 2; heads <= p.heads_kv && heads * plan.rows <= kRowBlock; ++heads)
    if (p.heads_kv % heads == 0 && heads * chunk_bytes <= kGroupChunkBytes) plan.heads_per_item = heads;
  plan.block_rows = plan.heads_per_item > 1 ? plan.rows : kRowBlock;
  plan.row_blocks = (plan.rows + plan.block_rows - 1) / plan.block_rows;
  plan.head_groups = p.heads_kv / plan.heads_per_item;
  plan.batch_groups = p.batch * plan.head_groups;
  const int64_t max_splits = std::max<int64_t>(1, (p.capacity + kKeyChunk - 1) / kKeyChunk);
  if (p.num_splits > 0) {
    plan.splits = std::min<int64_t>(p.num_splits, max_splits);
  } else {
    const int64_t parallel = std::max<int64_t>(1, plan.batch_groups * plan.row_blocks);
    const int64_t wanted = (2 * static_cast<int64_t>(p.num_threads) + parallel - 1) / parallel;
    plan.splits = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, p.capacity / kMinKeysPerSplit));
    if (parallel >= p.num_threads) plan.splits = 1;
  }
  return plan;
}

// An item's rows: head t of its group (kv head hkv0 + t), rows r0 .. r0 + nr - 1
// of that head, packed as row t * nr + r (at most kRowBlock).
struct ItemRows {
  int64_t b = 0, hkv0 = 0, r0 = 0;
  int nr = 0, heads = 0;
  int packed() const { return heads * nr; }
  // Query i and query head h of packed row `row`.
  int64_t query(const KvCacheParams& p, int row) const { return (r0 + row % nr) / p.group(); }
  int64_t head(const KvCacheParams& p, int row) const {
    return (hkv0 + row / nr) * p.group() + (r0 + row % nr) % p.group();
  }
};

// The rows of the item or combine unit `unit` (an item without its split).
ItemRows item_rows(const Plan& plan, int64_t unit) {
  ItemRows rows;
  const int64_t rb = unit % plan.row_blocks;
  const int64_t g = (unit / plan.row_blocks) % plan.head_groups;
  rows.b = unit / (plan.row_blocks * plan.head_groups);
  rows.hkv0 = g * plan.heads_per_item;
  rows.r0 = rb * plan.block_rows;
  rows.nr = static_cast<int>(std::min<int64_t>(plan.block_rows, plan.rows - rows.r0));
  rows.heads = static_cast<int>(plan.heads_per_item);
  return rows;
}

struct ThreadScratch {
  float *q, *o, *m, *l, *s, *k, *v;
};

ThreadScratch carve_thread(const KvCacheParams& p, ScratchArena& arena) {
  ThreadScratch w;
  w.q = arena.take_floats(int64_t(kRowBlock) * p.head_dim);    // (rows, D), log2(e) * scale folded in
  w.o = arena.take_floats(int64_t(kRowBlock) * p.head_dim_v);  // (rows, Dv)
  w.m = arena.take_floats(kRowBlock);                          // running max, log2 units
  w.l = arena.take_floats(kRowBlock);
  w.s = arena.take_floats(int64_t(kRowBlock) * kKeyChunk);              // (rows, keys)
  w.k = arena.take_floats(int64_t(kKeyChunk) * p.head_dim);             // (keys, D) of one head
  w.v = arena.take_floats(int64_t(kKeyChunk) * p.head_dim_v);           // (keys, Dv)
  return w;
}

struct SplitScratch {
  float* o = nullptr;    // (items, kRowBlock, Dv): O / l of each split
  float* lse = nullptr;  // (items, kRowBlock): its LSE, -inf when it saw no key
};

SplitScratch carve_splits(const KvCacheParams& p, const Plan& plan, ScratchArena& arena) {
  SplitScratch w;
  if (plan.splits == 1) return w;
  w.o = arena.take_floats(plan.items() * kRowBlock * p.head_dim_v);
  w.lse = arena.take_floats(plan.items() * kRowBlock);
  return w;
}

// Per packed row: the keys it sees, [lo, hi), its diagonal (ALiBi distance |diagonal - j|), its slope.
struct RowMask {
  int64_t lo = 0, hi = 0, diagonal = 0;
  float slope = 0.0f;
};

// Scores of one row over keys k0 .. k0 + nk - 1 of a chunk, in log2 units:
// raw = q . k with scale * log2(e) already in q; softcap and ALiBi applied in
// natural units; -inf outside the row's keys.
void shape_scores(const KvCacheParams& p, const RowMask& mask, int64_t k0, int nk, float* s) {
  if (p.softcap > 0.0f) {
    const float cap = p.softcap;
    for (int j = 0; j < nk; ++j) s[j] = cap * std::tanh(s[j] / kLog2e / cap) * kLog2e;
  }
  if (mask.slope != 0.0f) {
    const float slope2 = mask.slope * kLog2e;
    for (int j = 0; j < nk; ++j) {
      const int64_t distance = mask.diagonal - (k0 + j);
      s[j] -= slope2 * static_cast<float>(distance < 0 ? -distance : distance);
    }
  }
  // -inf outside the row's keys [lo, hi): only the chunk's two ends can be.
  const int visible_from = static_cast<int>(std::clamp<int64_t>(mask.lo - k0, 0, nk));
  const int visible_to = std::max(visible_from, static_cast<int>(std::clamp<int64_t>(mask.hi - k0, 0, nk)));
  std::fill(s, s + visible_from, -kInf);
  std::fill(s + visible_to, s + nk, -kInf);
}

#if !defined(FLASHATTN_KVCACHE_AVX512) && !defined(FLASHATTN_KVCACHE_AVX2)
// S (nr, nk), row r at s + r * ld_s, = Q K^T: one vectorized dot product per
// (row, key); each K row (in L1 after its first use) serves every row.
inline void chunk_scores(const float* q, int nr, int64_t d, const float* k, int nk, float* s, int64_t ld_s) {
  for (int j = 0; j < nk; ++j) {
    const float* k_row = k + j * d;
    for (int r = 0; r < nr; ++r) {
      const float* q_row = q + r * d;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < d; ++c) dot += q_row[c] * k_row[c];
      s[r * ld_s + j] = dot;
    }
  }
}

// O (nr, dv) += P V, P row r at p + r * ld_p: each V row loaded once for all rows.
inline void chunk_accumulate(const float* p, int64_t ld_p, int nr, int nk, const float* v, int64_t dv, float* o) {
  for (int j = 0; j < nk; ++j) {
    const float* v_row = v + j * dv;
    for (int r = 0; r < nr; ++r) {
      const float prob = p[r * ld_p + j];
      float* o_row = o + r * dv;
      for (int64_t c = 0; c < dv; ++c) o_row[c] += prob * v_row[c];
    }
  }
}
#endif

// Phase 2 for one item: the rows of item_rows(item / splits), keys of split
// item % splits.
void attend_item(const KvCacheParams& p, const Plan& plan, const ThreadScratch& w, const SplitScratch& splits,
                 int64_t item) {
  const int64_t split = item % plan.splits;
  const ItemRows rows = item_rows(plan, item / plan.splits);
  const int64_t b = rows.b, group = p.group();
  const int64_t d_count = p.head_dim, dv_count = p.head_dim_v;
  const int nr = rows.nr, packed = rows.packed();
  const CacheRow row = CacheRow::of(p, b);
  const MaskPolicy mask = row.mask(p);

  // Scale and log2(e) folded into q: the scores come out in log2 units. A bf16 cache on
  // VDPBF16PS keeps q as bf16 (the values load_rotated_row rounded to it) in w.q's memory,
  // and the factor scales the dot products instead.
#if defined(FLASHATTN_KVCACHE_BF16_DOT)
  const bool bf16_dot = p.dtype == FA_DTYPE_BF16;
#else
  constexpr bool bf16_dot = false;
#endif
  uint16_t* q_bf16 = reinterpret_cast<uint16_t*>(w.q);  // (rows, D) when bf16_dot
  const float q_factor = p.softmax_scale * kLog2e;
  RowMask masks[kRowBlock];
  for (int r = 0; r < packed; ++r) {
    const int64_t i = rows.query(p, r), h = rows.head(p, r);
    const int64_t q_offset = b * p.q_layout.batch + i * p.q_layout.row + h * p.q_layout.head;
    float q_row[FA_MAX_HEAD_DIM];
    load_rotated_row(p, p.q, q_offset, query_rotary_position(p, row, i), q_row);
    for (int64_t d = 0; d < d_count; ++d) {
      if (bf16_dot) {
        q_bf16[r * d_count + d] = float_to_bf16(q_row[d]);
      } else {
        w.q[r * d_count + d] = q_row[d] * q_factor;
      }
    }
    masks[r].lo = mask.key_begin(i);
    masks[r].hi = mask.key_end(i + 1);
    masks[r].diagonal = i + mask.shift;
    masks[r].slope = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.0f;
  }
  std::fill(w.o, w.o + int64_t(packed) * dv_count, 0.0f);
  std::fill(w.m, w.m + packed, -kInf);
  std::fill(w.l, w.l + packed, 0.0f);

  // Keys some row of the block sees (the same for every head), then this
  // split's share on the chunk grid.
  const int64_t i_first = rows.r0 / group, i_last = (rows.r0 + nr - 1) / group;
  int64_t key_lo = mask.key_begin(i_first), key_hi = mask.key_end(i_last + 1);
  const int64_t span = key_hi > key_lo ? key_hi - key_lo : 0;
  const int64_t per_split = ((span + plan.splits - 1) / plan.splits + kKeyChunk - 1) / kKeyChunk * kKeyChunk;
  key_lo += split * per_split;
  key_hi = std::min(key_hi, key_lo + per_split);

  const int64_t elem = element_size(p.dtype);
  const char* k_cache = static_cast<const char*>(p.k_cache);
  const char* v_cache = static_cast<const char*>(p.v_cache);
  // Offset of a position's row of kv head hkv0 (head hkv0 + u is u head strides on).
  auto k_row_of = [&](int64_t key) { return cache_offset(p, p.k_cache_layout, row, b, row.leftpad + key, rows.hkv0); };
  auto v_row_of = [&](int64_t key) { return cache_offset(p, p.v_cache_layout, row, b, row.leftpad + key, rows.hkv0); };
  // The next chunk into L2 (prefetcht1) while this one is worked on: each head's step takes a 1 / heads
  // share of its keys, as units of one key's K or V rows of every head of the group (where the cache
  // holds a position's heads side by side, a sequential read), spread evenly over kPrefetchPoints
  // points of the step. Issued in one burst a step, many were lost (the same burst issued twice gained
  // 1.24-1.41x); spread, each line once, it measured 1.68-2.04x over the single burst (bf16 decode on a
  // Zen 4, dev/cpu_tuning.md, session 27). Always inlined: GCC finds a function of prefetches alone
  // free of effects and deletes the calls to it.
  constexpr int kPrefetchPoints = 6;  // before the scores, between their quarters, before softmax and P V
  auto prefetch_units = [&](int64_t first_key, int64_t from, int64_t to) __attribute__((always_inline)) {
    for (int64_t unit = from; unit < to; ++unit) {
      const bool is_v = unit % 2 == 1;
      const int64_t key = first_key + unit / 2;
      const TensorLayout& layout = is_v ? p.v_cache_layout : p.k_cache_layout;
      const char* first_row = (is_v ? v_cache + v_row_of(key) * elem : k_cache + k_row_of(key) * elem);
      const int64_t row_bytes = (is_v ? dv_count : d_count) * elem;
      for (int u = 0; u < rows.heads; ++u)
        for (int64_t c = 0; c < row_bytes; c += 64) __builtin_prefetch(first_row + u * layout.head * elem + c, 0, 2);
    }
  };
  for (int64_t k0 = key_lo; k0 < key_hi; k0 += kKeyChunk) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyChunk, key_hi - k0));
    const int64_t next_keys = std::clamp<int64_t>(key_hi - k0 - kKeyChunk, 0, kKeyChunk);  // of the next chunk
    int64_t k_rows0[kKeyChunk], v_rows0[kKeyChunk];
    for (int j = 0; j < nk; ++j) {
      k_rows0[j] = k_row_of(k0 + j);
      v_rows0[j] = v_row_of(k0 + j);
    }
    // Head by head: its K and V rows staged (fp32, in L1) or, bf16 on VDPBF16PS, read in place;
    // its rows' scores, softmax and P V.
    for (int t = 0; t < rows.heads; ++t) {
      const int first = t * nr;  // the head's packed rows [first, first + nr)
      const int64_t k_head = t * p.k_cache_layout.head;
      const int64_t v_head = t * p.v_cache_layout.head;
      const int64_t share_from = k0 + kKeyChunk + next_keys * t / rows.heads;
      const int64_t share_units = 2 * (k0 + kKeyChunk + next_keys * (t + 1) / rows.heads - share_from);
      auto prefetch_part = [&](int part) __attribute__((always_inline)) {
        prefetch_units(share_from, share_units * part / kPrefetchPoints, share_units * (part + 1) / kPrefetchPoints);
      };
      // The scores a quarter of the chunk at a time (8 keys), with a part of the prefetch before each.
      constexpr int kQuarter = kKeyChunk / 4;
#if defined(FLASHATTN_KVCACHE_BF16_DOT)
      const uint16_t* k_rows[kKeyChunk];  // the head's K and V rows of the chunk, read in place
      const uint16_t* v_rows[kKeyChunk];
      if (bf16_dot) {
        for (int j = 0; j < nk; ++j) {
          k_rows[j] = reinterpret_cast<const uint16_t*>(k_cache) + k_rows0[j] + k_head;
          v_rows[j] = reinterpret_cast<const uint16_t*>(v_cache) + v_rows0[j] + v_head;
        }
        for (int j0 = 0; j0 < kKeyChunk; j0 += kQuarter) {
          prefetch_part(j0 / kQuarter);
          if (j0 < nk)
            chunk_scores_bf16(q_bf16 + first * d_count, nr, d_count, k_rows + j0, std::min(kQuarter, nk - j0), q_factor,
                              w.s + first * kKeyChunk + j0, kKeyChunk);
        }
      }
#endif
      if (!bf16_dot) {
        for (int j = 0; j < nk; ++j) {
          load_floats(p.dtype, k_cache + (k_rows0[j] + k_head) * elem, d_count, w.k + j * d_count, 1);
          load_floats(p.dtype, v_cache + (v_rows0[j] + v_head) * elem, dv_count, w.v + j * dv_count, 1);
        }
        for (int j0 = 0; j0 < kKeyChunk; j0 += kQuarter) {
          prefetch_part(j0 / kQuarter);
          if (j0 < nk)
            chunk_scores(w.q + first * d_count, nr, d_count, w.k + j0 * d_count, std::min(kQuarter, nk - j0),
                         w.s + first * kKeyChunk + j0, kKeyChunk);
        }
      }
      prefetch_part(4);
      float alpha[kRowBlock];  // each row's rescale of O (1 for a row that has seen no key)
      // Invariant per row: O = sum_j 2^(s_j - m) v_j and l = sum_j 2^(s_j - m) over the keys
      // seen; a new maximum rescales both by 2^(m_old - m_new). A row that has seen no
      // visible key keeps m = -inf and is skipped.
      for (int r = first; r < first + nr; ++r) {
        float* s_row = w.s + r * kKeyChunk;
        shape_scores(p, masks[r], k0, nk, s_row);
        float chunk_max = -kInf;
#pragma omp simd reduction(max : chunk_max)
        for (int j = 0; j < nk; ++j) chunk_max = std::max(chunk_max, s_row[j]);
        const float m_new = std::max(w.m[r], chunk_max);
        alpha[r] = 1.0f;
        if (m_new == -kInf) {
          std::fill(s_row, s_row + nk, 0.0f);
          continue;
        }
        alpha[r] = exp2_nonpositive(w.m[r] - m_new);
        float sum = 0.0f;
        // A vector reduction: summed in order, the 32 adds were one dependent chain (8 % of the
        // bf16 build's time with the cache in L2, perf).
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < nk; ++j) {
          s_row[j] = exp2_nonpositive(s_row[j] - m_new);
          sum += s_row[j];
        }
        float* o_row = w.o + r * dv_count;
        if (!bf16_dot)  // the bf16 product rescales O as it loads it
          for (int64_t d = 0; d < dv_count; ++d) o_row[d] *= alpha[r];
        w.l[r] = w.l[r] * alpha[r] + sum;
        w.m[r] = m_new;
      }
      prefetch_part(5);
#if defined(FLASHATTN_KVCACHE_BF16_DOT)
      if (bf16_dot) {
        uint32_t pairs[kRowBlock * kKeyChunk / 2];  // P of the head's rows as bf16 key pairs
        pair_probabilities(w.s + first * kKeyChunk, kKeyChunk, nr, nk, pairs, kKeyChunk / 2);
        chunk_accumulate_bf16(pairs, kKeyChunk / 2, alpha + first, nr, nk, v_rows, dv_count, w.o + first * dv_count);
      }
#endif
      if (!bf16_dot)
        chunk_accumulate(w.s + first * kKeyChunk, kKeyChunk, nr, nk, w.v, dv_count, w.o + first * dv_count);
    }
  }

  for (int r = 0; r < packed; ++r) {
    const bool empty = !(w.l[r] > 0.0f);
    const float inv = empty ? 0.0f : 1.0f / w.l[r];
    const float lse = empty ? kInf : w.m[r] * kLn2 + std::log(w.l[r]);
    const float* o_row = w.o + r * dv_count;
    if (plan.splits > 1) {
      float* dst = splits.o + (item * kRowBlock + r) * dv_count;
      for (int64_t d = 0; d < dv_count; ++d) dst[d] = o_row[d] * inv;
      splits.lse[item * kRowBlock + r] = empty ? -kInf : lse;
      continue;
    }
    const int64_t i = rows.query(p, r), h = rows.head(p, r);
    const int64_t o_offset = b * p.o_layout.batch + i * p.o_layout.row + h * p.o_layout.head;
    for (int64_t d = 0; d < dv_count; ++d) store_element(p.dtype, p.o, o_offset + d, o_row[d] * inv);
    if (p.lse != nullptr) p.lse[b * p.lse_layout.batch + i * p.lse_layout.row + h * p.lse_layout.head] = lse;
  }
}

// Phase 3: the splits of one unit (item_rows) merged into out and lse.
void combine_item(const KvCacheParams& p, const Plan& plan, const SplitScratch& splits, int64_t unit,
                  float* accumulator) {
  const ItemRows rows = item_rows(plan, unit);
  const int64_t b = rows.b, dv_count = p.head_dim_v;
  const int64_t first_item = unit * plan.splits;
  for (int r = 0; r < rows.packed(); ++r) {
    float lse_max = -kInf;
    for (int64_t s = 0; s < plan.splits; ++s) lse_max = std::max(lse_max, splits.lse[(first_item + s) * kRowBlock + r]);
    std::fill(accumulator, accumulator + dv_count, 0.0f);
    float lse = kInf;
    if (lse_max != -kInf) {
      float total = 0.0f;
      for (int64_t s = 0; s < plan.splits; ++s) total += std::exp(splits.lse[(first_item + s) * kRowBlock + r] - lse_max);
      lse = lse_max + std::log(total);
      for (int64_t s = 0; s < plan.splits; ++s) {
        const float weight = std::exp(splits.lse[(first_item + s) * kRowBlock + r] - lse);
        if (weight == 0.0f) continue;
        const float* src = splits.o + ((first_item + s) * kRowBlock + r) * dv_count;
        for (int64_t d = 0; d < dv_count; ++d) accumulator[d] += weight * src[d];
      }
    }
    const int64_t i = rows.query(p, r), h = rows.head(p, r);
    const int64_t o_offset = b * p.o_layout.batch + i * p.o_layout.row + h * p.o_layout.head;
    for (int64_t d = 0; d < dv_count; ++d) store_element(p.dtype, p.o, o_offset + d, accumulator[d]);
    if (p.lse != nullptr) p.lse[b * p.lse_layout.batch + i * p.lse_layout.row + h * p.lse_layout.head] = lse;
  }
}

size_t kvcache_thread_bytes(const KvCacheParams& p) {
  ScratchArena arena;
  carve_thread(p, arena);
  return arena.used();
}

size_t kvcache_split_bytes(const KvCacheParams& p) {
  ScratchArena arena;
  carve_splits(p, make_plan(p), arena);
  return arena.used();
}

// Layout: [alignment slack][split partials][per-thread regions].
[[maybe_unused]] size_t kvcache_workspace_bytes(const KvCacheParams& p) {
  return kWorkspaceSlack + kvcache_split_bytes(p) + static_cast<size_t>(p.num_threads) * kvcache_thread_bytes(p);
}

fa_status run_kvcache(const KvCacheParams& p, void* workspace) {
  if (p.seqlen_new > 0) append_new_rows(p);
  if (p.batch == 0 || p.seqlen_q == 0) return FA_OK;
  const Plan plan = make_plan(p);
  char* base = align_workspace(workspace);
  ScratchArena split_arena(base);
  const SplitScratch splits = carve_splits(p, plan, split_arena);
  char* thread_base = base + split_arena.used();
  const size_t per_thread = kvcache_thread_bytes(p);
  const int64_t items = plan.items();
  const int team = static_cast<int>(std::min<int64_t>(p.num_threads, items));
#pragma omp parallel num_threads(team) if (team > 1)
  {
    ScratchArena arena(thread_base + static_cast<size_t>(omp_get_thread_num()) * per_thread);
    const ThreadScratch w = carve_thread(p, arena);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) attend_item(p, plan, w, splits, item);
    if (plan.splits > 1) {
#pragma omp for schedule(static)
      for (int64_t unit = 0; unit < plan.batch_groups * plan.row_blocks; ++unit)
        combine_item(p, plan, splits, unit, w.o);
    }
  }
  return FA_OK;
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
