// Attention against a KV cache on the CPU (fa_fwd_kvcache): append, then
// split-KV attention with the query heads of one KV head packed together.
//
// Phase 1 writes k_new (rotated) and v_new into the cache at cache_seqlens.
// Phase 2 runs work items (batch row, kv head, row block, split): the rows of
// a block are (query i, head g of the group) pairs, r = i * G + g, so every
// K/V row gathered from the (possibly paged) cache serves G query heads and
// Sq queries at once: decode reads each cache byte once per call. Per key
// chunk the rows keep the online-softmax state (m, l, O); with one split the
// item writes out and lse directly, with several it writes O / l and its LSE
// and phase 3 merges the splits exactly:
//   lse = log sum_s exp(lse_s),  O = sum_s exp(lse_s - lse) O_s.
// Splits fill the team when B * Hkv is below the thread count (decode of one
// sequence); num_splits > 0 forces a count (tests compare counts).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend.hpp"
#include "common/half.hpp"
#include "common/kvcache_params.hpp"
#include "cpu/config.hpp"

namespace flashattn {
namespace cpu {
namespace {

constexpr int kKeyChunk = 64;    // keys gathered to fp32 per step: (64, D) + (64, Dv) stay in L1/L2
constexpr int kRowBlock = 64;    // packed query rows per work item
constexpr int64_t kMinKeysPerSplit = 256;  // below this a split costs more than it saves
constexpr float kInf = std::numeric_limits<float>::infinity();

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
  const int64_t d_count = p.head_dim;
  for (int64_t d = 0; d < d_count; ++d) out[d] = load_element(p.dtype, base, row_offset + d);
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

struct Plan {
  int64_t rows = 0;        // R = Sq * G packed rows per (b, kv head)
  int64_t row_blocks = 0;  // ceil(R / kRowBlock)
  int64_t splits = 1;
  int64_t items() const { return batch_heads * row_blocks * splits; }
  int64_t batch_heads = 0;  // B * Hkv
};

Plan make_plan(const KvCacheParams& p) {
  Plan plan;
  plan.rows = p.seqlen_q * p.group();
  plan.row_blocks = (plan.rows + kRowBlock - 1) / kRowBlock;
  plan.batch_heads = p.batch * p.heads_kv;
  const int64_t max_splits = std::max<int64_t>(1, (p.capacity + kKeyChunk - 1) / kKeyChunk);
  if (p.num_splits > 0) {
    plan.splits = std::min<int64_t>(p.num_splits, max_splits);
  } else {
    const int64_t parallel = std::max<int64_t>(1, plan.batch_heads * plan.row_blocks);
    const int64_t wanted = (2 * static_cast<int64_t>(p.num_threads) + parallel - 1) / parallel;
    plan.splits = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, p.capacity / kMinKeysPerSplit));
    if (parallel >= p.num_threads) plan.splits = 1;
  }
  return plan;
}

struct ThreadScratch {
  float *q, *o, *m, *l, *s, *k, *v;
};

ThreadScratch carve_thread(const KvCacheParams& p, ScratchArena& arena) {
  ThreadScratch w;
  w.q = arena.take_floats(int64_t(kRowBlock) * p.head_dim);    // (rows, D)
  w.o = arena.take_floats(int64_t(kRowBlock) * p.head_dim_v);  // (rows, Dv)
  w.m = arena.take_floats(kRowBlock);
  w.l = arena.take_floats(kRowBlock);
  w.s = arena.take_floats(int64_t(kRowBlock) * kKeyChunk);     // (rows, keys)
  w.k = arena.take_floats(int64_t(kKeyChunk) * p.head_dim);    // (keys, D)
  w.v = arena.take_floats(int64_t(kKeyChunk) * p.head_dim_v);  // (keys, Dv)
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

float score_of(const KvCacheParams& p, const MaskPolicy& mask, float dot, float slope, int64_t i, int64_t j) {
  if (!mask.visible(i, j)) return -kInf;
  float s = dot * p.softmax_scale;
  if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
  if (slope != 0.0f) s -= slope * mask.alibi_distance(i, j);
  return s;
}

// Phase 2 for one item. Rows r0 .. r0 + nr - 1 of (b, kv head), keys of split `split`.
void attend_item(const KvCacheParams& p, const Plan& plan, const ThreadScratch& w, const SplitScratch& splits,
                 int64_t item) {
  const int64_t split = item % plan.splits;
  const int64_t rb = (item / plan.splits) % plan.row_blocks;
  const int64_t hkv = (item / (plan.splits * plan.row_blocks)) % p.heads_kv;
  const int64_t b = item / (plan.splits * plan.row_blocks * p.heads_kv);
  const int64_t group = p.group();
  const int64_t d_count = p.head_dim, dv_count = p.head_dim_v;
  const int64_t r0 = rb * kRowBlock;
  const int nr = static_cast<int>(std::min<int64_t>(kRowBlock, plan.rows - r0));
  const CacheRow row = CacheRow::of(p, b);
  const MaskPolicy mask = row.mask(p);

  float slopes[kRowBlock];
  for (int r = 0; r < nr; ++r) {
    const int64_t i = (r0 + r) / group, h = hkv * group + (r0 + r) % group;
    const int64_t q_offset = b * p.q_layout.batch + i * p.q_layout.row + h * p.q_layout.head;
    load_rotated_row(p, p.q, q_offset, query_rotary_position(p, row, i), w.q + r * d_count);
    slopes[r] = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.0f;
  }
  std::fill(w.o, w.o + int64_t(nr) * dv_count, 0.0f);
  std::fill(w.m, w.m + nr, -kInf);
  std::fill(w.l, w.l + nr, 0.0f);

  // Keys some row of the block sees, then this split's share on the chunk grid.
  const int64_t i_first = r0 / group, i_last = (r0 + nr - 1) / group;
  int64_t key_lo = mask.key_begin(i_first), key_hi = mask.key_end(i_last + 1);
  const int64_t span = key_hi > key_lo ? key_hi - key_lo : 0;
  const int64_t per_split = ((span + plan.splits - 1) / plan.splits + kKeyChunk - 1) / kKeyChunk * kKeyChunk;
  key_lo += split * per_split;
  key_hi = std::min(key_hi, key_lo + per_split);

  const int64_t elem = element_size(p.dtype);
  for (int64_t k0 = key_lo; k0 < key_hi; k0 += kKeyChunk) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyChunk, key_hi - k0));
    for (int j = 0; j < nk; ++j) {
      const int64_t position = row.leftpad + k0 + j;
      const int64_t k_off = cache_offset(p, p.k_cache_layout, row, b, position, hkv);
      const int64_t v_off = cache_offset(p, p.v_cache_layout, row, b, position, hkv);
      if (p.dtype == FA_DTYPE_FP32) {
        std::memcpy(w.k + j * d_count, static_cast<const float*>(p.k_cache) + k_off, size_t(d_count) * 4);
        std::memcpy(w.v + j * dv_count, static_cast<const float*>(p.v_cache) + v_off, size_t(dv_count) * 4);
      } else {
        const uint16_t* k_src = reinterpret_cast<const uint16_t*>(static_cast<const char*>(p.k_cache) + k_off * elem);
        const uint16_t* v_src = reinterpret_cast<const uint16_t*>(static_cast<const char*>(p.v_cache) + v_off * elem);
        float* k_dst = w.k + j * d_count;
        float* v_dst = w.v + j * dv_count;
        if (p.dtype == FA_DTYPE_BF16) {
          // bf16 -> fp32 is a shift: vectorizes.
#pragma omp simd
          for (int64_t d = 0; d < d_count; ++d) k_dst[d] = bf16_to_float(k_src[d]);
#pragma omp simd
          for (int64_t d = 0; d < dv_count; ++d) v_dst[d] = bf16_to_float(v_src[d]);
        } else {
          for (int64_t d = 0; d < d_count; ++d) k_dst[d] = fp16_to_float(k_src[d]);
          for (int64_t d = 0; d < dv_count; ++d) v_dst[d] = fp16_to_float(v_src[d]);
        }
      }
    }
    for (int r = 0; r < nr; ++r) {
      const int64_t i = (r0 + r) / group;
      const float* q_row = w.q + r * d_count;
      float* s_row = w.s + r * kKeyChunk;
      float chunk_max = -kInf;
      for (int j = 0; j < nk; ++j) {
        const float* k_row = w.k + j * d_count;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < d_count; ++d) dot += q_row[d] * k_row[d];
        s_row[j] = score_of(p, mask, dot, slopes[r], i, k0 + j);
        chunk_max = std::max(chunk_max, s_row[j]);
      }
      // Invariant: O_r = sum_j exp(s_j - m_r) v_j and l_r = sum_j exp(s_j - m_r)
      // over the keys seen; a new maximum rescales both by exp(m_old - m_new).
      // A row that has seen no visible key keeps m = -inf and is skipped.
      const float m_new = std::max(w.m[r], chunk_max);
      if (m_new == -kInf) continue;
      const float alpha = std::exp(w.m[r] - m_new);
      float* o_row = w.o + r * dv_count;
      if (alpha != 1.0f) {
#pragma omp simd
        for (int64_t d = 0; d < dv_count; ++d) o_row[d] *= alpha;
      }
      float sum = 0.0f;
      for (int j = 0; j < nk; ++j) {
        const float prob = std::exp(s_row[j] - m_new);
        if (prob == 0.0f) continue;
        sum += prob;
        const float* v_row = w.v + j * dv_count;
#pragma omp simd
        for (int64_t d = 0; d < dv_count; ++d) o_row[d] += prob * v_row[d];
      }
      w.l[r] = w.l[r] * alpha + sum;
      w.m[r] = m_new;
    }
  }

  for (int r = 0; r < nr; ++r) {
    const bool empty = !(w.l[r] > 0.0f);
    const float inv = empty ? 0.0f : 1.0f / w.l[r];
    const float lse = empty ? kInf : w.m[r] + std::log(w.l[r]);
    const float* o_row = w.o + r * dv_count;
    if (plan.splits > 1) {
      float* dst = splits.o + (item * kRowBlock + r) * dv_count;
      for (int64_t d = 0; d < dv_count; ++d) dst[d] = o_row[d] * inv;
      splits.lse[item * kRowBlock + r] = empty ? -kInf : lse;
      continue;
    }
    const int64_t i = (r0 + r) / group, h = hkv * group + (r0 + r) % group;
    const int64_t o_offset = b * p.o_layout.batch + i * p.o_layout.row + h * p.o_layout.head;
    for (int64_t d = 0; d < dv_count; ++d) store_element(p.dtype, p.o, o_offset + d, o_row[d] * inv);
    if (p.lse != nullptr) p.lse[b * p.lse_layout.batch + i * p.lse_layout.row + h * p.lse_layout.head] = lse;
  }
}

// Phase 3: the splits of one (b, kv head, row block) merged into out and lse.
void combine_item(const KvCacheParams& p, const Plan& plan, const SplitScratch& splits, int64_t group_item,
                  float* accumulator) {
  const int64_t rb = group_item % plan.row_blocks;
  const int64_t hkv = (group_item / plan.row_blocks) % p.heads_kv;
  const int64_t b = group_item / (plan.row_blocks * p.heads_kv);
  const int64_t group = p.group();
  const int64_t dv_count = p.head_dim_v;
  const int64_t r0 = rb * kRowBlock;
  const int nr = static_cast<int>(std::min<int64_t>(kRowBlock, plan.rows - r0));
  const int64_t first_item = group_item * plan.splits;
  for (int r = 0; r < nr; ++r) {
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
#pragma omp simd
        for (int64_t d = 0; d < dv_count; ++d) accumulator[d] += weight * src[d];
      }
    }
    const int64_t i = (r0 + r) / group, h = hkv * group + (r0 + r) % group;
    const int64_t o_offset = b * p.o_layout.batch + i * p.o_layout.row + h * p.o_layout.head;
    for (int64_t d = 0; d < dv_count; ++d) store_element(p.dtype, p.o, o_offset + d, accumulator[d]);
    if (p.lse != nullptr) p.lse[b * p.lse_layout.batch + i * p.lse_layout.row + h * p.lse_layout.head] = lse;
  }
}

size_t thread_bytes(const KvCacheParams& p) {
  ScratchArena arena;
  carve_thread(p, arena);
  return arena.used();
}

size_t split_bytes(const KvCacheParams& p) {
  ScratchArena arena;
  carve_splits(p, make_plan(p), arena);
  return arena.used();
}

}  // namespace

// Layout: [alignment slack][split partials][per-thread regions].
size_t fwd_kvcache_workspace_bytes(const KvCacheParams& p) {
  return kWorkspaceSlack + split_bytes(p) + static_cast<size_t>(p.num_threads) * thread_bytes(p);
}

fa_status fwd_kvcache(const KvCacheParams& p, void* workspace) {
  if (p.seqlen_new > 0) append_new_rows(p);
  if (p.batch == 0 || p.seqlen_q == 0) return FA_OK;
  const Plan plan = make_plan(p);
  char* base = align_workspace(workspace);
  ScratchArena split_arena(base);
  const SplitScratch splits = carve_splits(p, plan, split_arena);
  char* thread_base = base + split_arena.used();
  const size_t per_thread = thread_bytes(p);
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
      for (int64_t g = 0; g < plan.batch_heads * plan.row_blocks; ++g) combine_item(p, plan, splits, g, w.o);
    }
  }
  return FA_OK;
}

}  // namespace cpu
}  // namespace flashattn
