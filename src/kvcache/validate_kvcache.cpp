// Argument checks of fa_fwd_kvcache. Each failure names the argument, what was
// expected and what came; nothing (output or cache) is written before every
// check has passed. Index tensors that live on the host are checked against
// the cache bounds here; device ones are bounded by the kernels.
#include <cinttypes>
#include <cmath>

#include "common/error.hpp"
#include "validate.hpp"

namespace flashattn {
namespace {

using namespace validation;

fa_status check_index_vector(const char* name, const fa_tensor& t, const fa_tensor& q, int64_t batch) {
  FA_TRY(check_view(name, t, 1));
  FA_TRY(check_dtype(name, t, FA_DTYPE_INT32));
  FA_TRY(check_same_device(name, t, q));
  if (t.shape[0] != batch)
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected shape (%" PRId64 ") (the batch of q), got %s", name, batch,
                shape_string(t).c_str());
  return FA_OK;
}

// Only host memory can be read here.
fa_status check_index_values(const KvCacheParams& p) {
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.cache_batch_idx != nullptr && (p.cache_batch_idx[b] < 0 || p.cache_batch_idx[b] >= p.cache_batch))
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "cache_batch_idx: expected values in [0, %" PRId64 ") (rows of k_cache), got %d at index %" PRId64,
                  p.cache_batch, p.cache_batch_idx[b], b);
    const CacheRow row = CacheRow::of(p, b);
    if (row.leftpad < 0)
      return fail(FA_ERROR_INVALID_ARGUMENT, "cache_leftpad: expected values >= 0, got %" PRId64 " at index %" PRId64,
                  row.leftpad, b);
    if (row.filled < row.leftpad || row.filled + p.seqlen_new > p.capacity)
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "cache_seqlens: expected cache_leftpad[b] <= cache_seqlens[b] and cache_seqlens[b] + %" PRId64
                  " (new keys) <= %" PRId64 " (cache capacity), got cache_seqlens[%" PRId64 "] = %" PRId64
                  " with leftpad %" PRId64,
                  p.seqlen_new, p.capacity, b, row.filled, row.leftpad);
    if (!p.paged) continue;
    const int64_t used_blocks = (row.filled + p.seqlen_new + p.page_rows - 1) / p.page_rows;
    for (int64_t blk = row.leftpad / p.page_rows; blk < used_blocks; ++blk) {
      const int32_t block = p.block_table[b * p.block_table_stride + blk];
      if (block < 0 || block >= p.cache_batch)
        return fail(FA_ERROR_INVALID_ARGUMENT,
                    "block_table: expected page indices in [0, %" PRId64 ") (pages of k_cache), got %d at [%" PRId64
                    ", %" PRId64 "]",
                    p.cache_batch, block, b, blk);
    }
  }
  return FA_OK;
}

fa_status check_rotary(const fa_kvcache_args& a, KvCacheParams& p) {
  const bool has_cos = a.rotary_cos.data != nullptr, has_sin = a.rotary_sin.data != nullptr;
  if (!has_cos && !has_sin) return FA_OK;
  if (has_cos != has_sin)
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected rotary_cos and rotary_sin together, got NULL",
                has_cos ? "rotary_sin" : "rotary_cos");
  if (a.k_new.data == nullptr)
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "rotary_cos: expected k_new and v_new with a rotary embedding (it rotates the appended keys), got "
                "k_new NULL");
  for (const auto& [name, t] : {std::pair<const char*, const fa_tensor*>{"rotary_cos", &a.rotary_cos},
                                std::pair<const char*, const fa_tensor*>{"rotary_sin", &a.rotary_sin}}) {
    FA_TRY(check_view(name, *t, 2));
    FA_TRY(check_dtype(name, *t, a.q.dtype));
    FA_TRY(check_same_device(name, *t, a.q));
  }
  const int64_t rotary_dim = 2 * a.rotary_cos.shape[1];
  if (rotary_dim <= 0 || rotary_dim > p.head_dim)
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "rotary_cos: expected shape (S_ro, rotary_dim / 2) with 0 < rotary_dim <= %" PRId64 " (D), got %s",
                p.head_dim, shape_string(a.rotary_cos).c_str());
  if (a.rotary_cos.shape[0] < p.capacity)
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "rotary_cos: expected at least %" PRId64 " positions (the cache capacity), got shape %s", p.capacity,
                shape_string(a.rotary_cos).c_str());
  FA_TRY(check_shape("rotary_sin", a.rotary_sin, {a.rotary_cos.shape[0], a.rotary_cos.shape[1]}));
  const bool ordered = a.opts.causal != 0 || a.opts.window_left >= 0 || a.opts.window_right >= 0;
  if (ordered && p.seqlen_q > p.seqlen_new)
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "q: expected at most %" PRId64 " queries (the new keys) with rotary and a causal or local mask (query i "
                "is rotated at cache_seqlens + i), got %" PRId64,
                p.seqlen_new, p.seqlen_q);
  p.rotary_cos = a.rotary_cos.data;
  p.rotary_sin = a.rotary_sin.data;
  p.rotary_dim = rotary_dim;
  p.rotary_cos_stride = a.rotary_cos.strides[0];
  p.rotary_sin_stride = a.rotary_sin.strides[0];
  p.rotary_interleaved = a.rotary_interleaved != 0;
  return FA_OK;
}

fa_status check_options(const fa_kvcache_args& a, KvCacheParams& p) {
  const fa_options& opts = a.opts;
  FA_TRY(check_option_values(opts));
  if (opts.dropout_p != 0.0f)
    return fail(FA_ERROR_INVALID_ARGUMENT, "dropout_p: expected 0 (attention against a KV cache has no dropout), got %g",
                static_cast<double>(opts.dropout_p));
  if (a.num_splits < 0)
    return fail(FA_ERROR_INVALID_ARGUMENT, "num_splits: expected 0 (heuristic) or a positive count, got %d",
                a.num_splits);
  FA_TRY(check_alibi(a.alibi_slopes, a.q, p.batch, p.heads, p.alibi_slopes, p.alibi_batch_stride));
  p.softmax_scale =
      opts.softmax_scale > 0.0f ? opts.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  p.softcap = opts.softcap;
  p.causal = opts.causal != 0;
  p.align_bottom_right = opts.alignment == FA_ALIGN_BOTTOM_RIGHT;
  p.window_left = opts.window_left;
  p.window_right = p.causal ? 0 : opts.window_right;
  p.num_splits = a.num_splits;
  p.stream = opts.stream;
  return FA_OK;
}

}  // namespace

fa_status validate_kvcache(const fa_kvcache_args* args, KvCacheParams& p) {
  if (args == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "args: expected a non-null fa_kvcache_args, got NULL");
  const fa_kvcache_args& a = *args;
  p = KvCacheParams{};
  FA_TRY(check_view("q", a.q, 4));
  const int32_t q_dtype = raw(a.q.dtype);
  if (q_dtype != FA_DTYPE_FP32 && q_dtype != FA_DTYPE_FP16 && q_dtype != FA_DTYPE_BF16)
    return fail(FA_ERROR_INVALID_ARGUMENT, "q: expected dtype fp32, fp16 or bf16, got %s", dtype_name(q_dtype).c_str());
  FA_TRY(check_view("k_cache", a.k_cache, 4));
  FA_TRY(check_view("v_cache", a.v_cache, 4));
  FA_TRY(check_view("out", a.out, 4));
  for (const auto& [name, t] : {std::pair<const char*, const fa_tensor*>{"k_cache", &a.k_cache},
                                {"v_cache", &a.v_cache}, {"out", &a.out}}) {
    FA_TRY(check_dtype(name, *t, a.q.dtype));
    FA_TRY(check_same_device(name, *t, a.q));
  }
  p.dtype = a.q.dtype;
  p.device_index = a.q.device_index;
  p.batch = a.q.shape[0];
  p.seqlen_q = a.q.shape[1];
  p.heads = a.q.shape[2];
  p.head_dim = a.q.shape[3];
  p.heads_kv = a.k_cache.shape[2];
  p.head_dim_v = a.v_cache.shape[3];
  FA_TRY(check_head_dim("q", p.head_dim));
  FA_TRY(check_head_dim("v_cache", p.head_dim_v));
  if (p.heads <= 0) return fail(FA_ERROR_INVALID_ARGUMENT, "q: expected at least one head, got %" PRId64, p.heads);
  if (p.heads_kv <= 0 || p.heads % p.heads_kv != 0)
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "k_cache: expected a number of heads that divides the %" PRId64 " heads of q, got %" PRId64, p.heads,
                p.heads_kv);
  p.cache_batch = a.k_cache.shape[0];
  p.page_rows = a.k_cache.shape[1];
  FA_TRY(check_shape("k_cache", a.k_cache, {p.cache_batch, p.page_rows, p.heads_kv, p.head_dim}));
  FA_TRY(check_shape("v_cache", a.v_cache, {p.cache_batch, p.page_rows, p.heads_kv, p.head_dim_v}));
  FA_TRY(check_shape("out", a.out, {p.batch, p.seqlen_q, p.heads, p.head_dim_v}));

  p.paged = a.block_table.data != nullptr;
  if (p.paged) {
    FA_TRY(check_view("block_table", a.block_table, 2));
    FA_TRY(check_dtype("block_table", a.block_table, FA_DTYPE_INT32));
    FA_TRY(check_same_device("block_table", a.block_table, a.q));
    if (a.block_table.shape[0] != p.batch)
      return fail(FA_ERROR_INVALID_ARGUMENT, "block_table: expected shape (%" PRId64 ", max_blocks), got %s", p.batch,
                  shape_string(a.block_table).c_str());
    if (a.cache_batch_idx.data != nullptr)
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "cache_batch_idx: expected NULL with a block_table (the table maps each batch row), got a tensor");
    if (p.page_rows < 1)
      return fail(FA_ERROR_INVALID_ARGUMENT, "k_cache: expected a page size >= 1 (dimension 1), got %" PRId64,
                  p.page_rows);
    p.max_blocks = a.block_table.shape[1];
    p.block_table = static_cast<const int32_t*>(a.block_table.data);
    p.block_table_stride = a.block_table.strides[0];
    p.capacity = p.max_blocks * p.page_rows;
  } else {
    p.capacity = p.page_rows;
  }

  if ((a.k_new.data == nullptr) != (a.v_new.data == nullptr))
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected k_new and v_new together, got NULL",
                a.k_new.data == nullptr ? "k_new" : "v_new");
  if (a.k_new.data != nullptr) {
    FA_TRY(check_view("k_new", a.k_new, 4));
    FA_TRY(check_view("v_new", a.v_new, 4));
    FA_TRY(check_dtype("k_new", a.k_new, a.q.dtype));
    FA_TRY(check_dtype("v_new", a.v_new, a.q.dtype));
    FA_TRY(check_same_device("k_new", a.k_new, a.q));
    FA_TRY(check_same_device("v_new", a.v_new, a.q));
    p.seqlen_new = a.k_new.shape[1];
    FA_TRY(check_shape("k_new", a.k_new, {p.batch, p.seqlen_new, p.heads_kv, p.head_dim}));
    FA_TRY(check_shape("v_new", a.v_new, {p.batch, p.seqlen_new, p.heads_kv, p.head_dim_v}));
    if (a.cache_seqlens.data == nullptr)
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "cache_seqlens: expected a tensor with k_new (it says where the new keys go), got NULL");
    p.k_new = a.k_new.data;
    p.v_new = a.v_new.data;
    p.k_new_layout = layout_of(a.k_new, false);
    p.v_new_layout = layout_of(a.v_new, false);
  }
  if (a.cache_seqlens.data != nullptr) {
    FA_TRY(check_index_vector("cache_seqlens", a.cache_seqlens, a.q, p.batch));
    p.cache_seqlens = static_cast<const int32_t*>(a.cache_seqlens.data);
  }
  if (a.cache_batch_idx.data != nullptr) {
    FA_TRY(check_index_vector("cache_batch_idx", a.cache_batch_idx, a.q, p.batch));
    p.cache_batch_idx = static_cast<const int32_t*>(a.cache_batch_idx.data);
  } else if (!p.paged && p.cache_batch < p.batch) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "k_cache: expected at least %" PRId64 " cache rows (the batch of q) without cache_batch_idx, got %" PRId64,
                p.batch, p.cache_batch);
  }
  if (a.cache_leftpad.data != nullptr) {
    FA_TRY(check_index_vector("cache_leftpad", a.cache_leftpad, a.q, p.batch));
    p.cache_leftpad = static_cast<const int32_t*>(a.cache_leftpad.data);
  }

  if (a.lse.data != nullptr) {
    FA_TRY(check_view("lse", a.lse, 3));
    FA_TRY(check_dtype("lse", a.lse, FA_DTYPE_FP32));
    FA_TRY(check_same_device("lse", a.lse, a.q));
    FA_TRY(check_shape("lse", a.lse, {p.batch, p.heads, p.seqlen_q}));
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_layout = TensorLayout{a.lse.strides[0], a.lse.strides[2], a.lse.strides[1]};
  }
  FA_TRY(check_rotary(a, p));
  FA_TRY(check_options(a, p));

  p.q = a.q.data;
  p.k_cache = a.k_cache.data;
  p.v_cache = a.v_cache.data;
  p.o = a.out.data;
  p.q_layout = layout_of(a.q, false);
  p.k_cache_layout = layout_of(a.k_cache, false);
  p.v_cache_layout = layout_of(a.v_cache, false);
  p.o_layout = layout_of(a.out, false);
  if (a.q.device == FA_DEVICE_CPU) FA_TRY(check_index_values(p));
  return FA_OK;
}

}  // namespace flashattn
