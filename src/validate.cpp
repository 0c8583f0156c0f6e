// Argument checks of the C API. Each failure names the argument, what was
// expected and what came; nothing is written before all checks have passed.
#include "validate.hpp"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/error.hpp"

namespace flashattn {
namespace validation {

std::string dtype_name(int32_t dtype) {
  switch (dtype) {
    case FA_DTYPE_FP32: return "fp32";
    case FA_DTYPE_FP16: return "fp16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_INT32: return "int32";
    default: return "unknown dtype code " + std::to_string(dtype);
  }
}

std::string shape_string(const fa_tensor& t) {
  std::string text = "(";
  const int rank = t.rank < 0 ? 0 : (t.rank > FA_MAX_RANK ? FA_MAX_RANK : t.rank);
  for (int d = 0; d < rank; ++d) {
    if (d) text += ", ";
    text += std::to_string(t.shape[d]);
  }
  return text + ")";
}

std::string dims_string(std::initializer_list<int64_t> dims) {
  std::string text = "(";
  bool first = true;
  for (int64_t d : dims) {
    if (!first) text += ", ";
    text += std::to_string(d);
    first = false;
  }
  return text + ")";
}

// Rank, no negative size, last stride 1, non-null data, dtype and device.
fa_status check_view(const char* name, const fa_tensor& t, int rank) {
  if (t.data == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected a non-null data pointer, got NULL", name);
  if (t.rank != rank)
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected rank %d, got rank %d", name, rank, static_cast<int>(t.rank));
  for (int d = 0; d < rank; ++d) {
    if (t.shape[d] < 0)
      return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected non-negative sizes, got shape %s", name,
                  shape_string(t).c_str());
  }
  if (t.strides[rank - 1] != 1)
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected a contiguous last dimension (stride 1), got stride %" PRId64,
                name, t.strides[rank - 1]);
  if (raw(t.device) != FA_DEVICE_CPU && raw(t.device) != FA_DEVICE_CUDA)
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected device cpu or cuda, got device code %d", name,
                static_cast<int>(raw(t.device)));
  return FA_OK;
}

fa_status check_dtype(const char* name, const fa_tensor& t, fa_dtype expected) {
  if (raw(t.dtype) != expected)
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected dtype %s, got %s", name, dtype_name(expected).c_str(),
                dtype_name(raw(t.dtype)).c_str());
  return FA_OK;
}

fa_status check_same_device(const char* name, const fa_tensor& t, const fa_tensor& q) {
  if (t.device != q.device || (t.device == FA_DEVICE_CUDA && t.device_index != q.device_index))
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected the device of q (%s:%d), got %s:%d", name,
                q.device == FA_DEVICE_CUDA ? "cuda" : "cpu", q.device_index,
                t.device == FA_DEVICE_CUDA ? "cuda" : "cpu", t.device_index);
  return FA_OK;
}

fa_status check_shape(const char* name, const fa_tensor& t, std::initializer_list<int64_t> dims) {
  int d = 0;
  for (int64_t size : dims) {
    if (t.shape[d] != size)
      return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected shape %s, got %s", name, dims_string(dims).c_str(),
                  shape_string(t).c_str());
    ++d;
  }
  return FA_OK;
}

fa_status check_head_dim(const char* name, int64_t dim) {
  if (dim <= 0 || dim > FA_MAX_HEAD_DIM || dim % 8 != 0)
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "%s: expected a head dimension that is a multiple of 8 in [8, %d], got %" PRId64, name,
                FA_MAX_HEAD_DIM, dim);
  return FA_OK;
}

TensorLayout layout_of(const fa_tensor& t, bool varlen) {
  TensorLayout layout;
  if (varlen) {
    layout.batch = 0;
    layout.row = t.strides[0];
    layout.head = t.strides[1];
  } else {
    layout.batch = t.strides[0];
    layout.row = t.strides[1];
    layout.head = t.strides[2];
  }
  return layout;
}

fa_status check_alibi(const fa_tensor& alibi, const fa_tensor& q, int64_t batch, int64_t heads,
                      const float*& slopes, int64_t& batch_stride) {
  if (alibi.data == nullptr) return FA_OK;
  if (alibi.rank != 1 && alibi.rank != 2)
    return fail(FA_ERROR_INVALID_ARGUMENT, "alibi_slopes: expected shape (H) or (B, H), got rank %d",
                static_cast<int>(alibi.rank));
  FA_TRY(check_view("alibi_slopes", alibi, alibi.rank));
  FA_TRY(check_dtype("alibi_slopes", alibi, FA_DTYPE_FP32));
  FA_TRY(check_same_device("alibi_slopes", alibi, q));
  if (alibi.rank == 1) {
    FA_TRY(check_shape("alibi_slopes", alibi, {heads}));
    batch_stride = 0;
  } else {
    FA_TRY(check_shape("alibi_slopes", alibi, {batch, heads}));
    batch_stride = alibi.strides[0];
  }
  slopes = static_cast<const float*>(alibi.data);
  return FA_OK;
}

fa_status check_option_values(const fa_options& opts) {
  const float scale = opts.softmax_scale;
  if (std::isnan(scale) || std::isinf(scale) || scale < 0.0f)
    return fail(FA_ERROR_INVALID_ARGUMENT, "softmax_scale: expected a finite value >= 0 (0 = 1/sqrt(D)), got %g",
                static_cast<double>(scale));
  if (std::isnan(opts.softcap) || std::isinf(opts.softcap) || opts.softcap < 0.0f)
    return fail(FA_ERROR_INVALID_ARGUMENT, "softcap: expected a finite value >= 0 (0 = off), got %g",
                static_cast<double>(opts.softcap));
  if (opts.window_left < -1)
    return fail(FA_ERROR_INVALID_ARGUMENT, "window_left: expected -1 (unbounded) or a value >= 0, got %d",
                opts.window_left);
  if (opts.window_right < -1)
    return fail(FA_ERROR_INVALID_ARGUMENT, "window_right: expected -1 (unbounded) or a value >= 0, got %d",
                opts.window_right);
  if (raw(opts.alignment) != FA_ALIGN_BOTTOM_RIGHT && raw(opts.alignment) != FA_ALIGN_TOP_LEFT)
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "alignment: expected FA_ALIGN_BOTTOM_RIGHT (0) or FA_ALIGN_TOP_LEFT (1), got %d",
                static_cast<int>(raw(opts.alignment)));
  if (opts.num_threads < 0)
    return fail(FA_ERROR_INVALID_ARGUMENT, "num_threads: expected 0 (default) or a positive count, got %d",
                opts.num_threads);
  return FA_OK;
}

fa_status check_cu_seqlens(const char* name, const fa_tensor& cu, const fa_tensor& q, int64_t batch,
                           int64_t total, int32_t max_seqlen, const char* max_name) {
  FA_TRY(check_view(name, cu, 1));
  FA_TRY(check_dtype(name, cu, FA_DTYPE_INT32));
  FA_TRY(check_same_device(name, cu, q));
  if (cu.shape[0] != batch + 1)
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected length %" PRId64 " (batch + 1), got %" PRId64, name,
                batch + 1, cu.shape[0]);
  if (max_seqlen < 0)
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected a non-negative value, got %d", max_name, max_seqlen);
  if (cu.device != FA_DEVICE_CPU) return FA_OK;  // device memory: read by the kernels, not here
  const int32_t* offsets = static_cast<const int32_t*>(cu.data);
  if (offsets[0] != 0) return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected %s[0] = 0, got %d", name, name, offsets[0]);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = static_cast<int64_t>(offsets[b + 1]) - offsets[b];
    if (length < 0)
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "%s: expected non-decreasing offsets, got %s[%" PRId64 "] = %d > %s[%" PRId64 "] = %d", name, name,
                  b, offsets[b], name, b + 1, offsets[b + 1]);
    if (length > max_seqlen)
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "%s: expected sequence lengths <= %s = %d, got length %" PRId64 " for sequence %" PRId64, name,
                  max_name, max_seqlen, length, b);
  }
  if (offsets[batch] > total)
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected %s[%" PRId64 "] <= total rows %" PRId64 ", got %d", name,
                name, batch, total, offsets[batch]);
  return FA_OK;
}

// Shared by forward and backward: q, k, v, out, lse, cu_seqlens, alibi, options.
fa_status check_common(const fa_tensor& q, const fa_tensor& k, const fa_tensor& v, const fa_tensor& out,
                       const fa_tensor& lse, bool lse_required, const fa_tensor& cu_q, const fa_tensor& cu_k,
                       int32_t max_seqlen_q, int32_t max_seqlen_k, const fa_tensor& alibi, const fa_options& opts,
                       AttnParams& p) {
  const bool varlen = cu_q.data != nullptr || cu_k.data != nullptr;
  if (varlen && (cu_q.data == nullptr || cu_k.data == nullptr))
    return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected both cu_seqlens_q and cu_seqlens_k for varlen, got NULL",
                cu_q.data == nullptr ? "cu_seqlens_q" : "cu_seqlens_k");
  const int rank = varlen ? 3 : 4;
  FA_TRY(check_view("q", q, rank));
  const int32_t q_dtype = raw(q.dtype);
  if (q_dtype != FA_DTYPE_FP32 && q_dtype != FA_DTYPE_FP16 && q_dtype != FA_DTYPE_BF16)
    return fail(FA_ERROR_INVALID_ARGUMENT, "q: expected dtype fp32, fp16 or bf16, got %s",
                dtype_name(q_dtype).c_str());
  FA_TRY(check_view("k", k, rank));
  FA_TRY(check_view("v", v, rank));
  FA_TRY(check_view("out", out, rank));
  FA_TRY(check_dtype("k", k, q.dtype));
  FA_TRY(check_dtype("v", v, q.dtype));
  FA_TRY(check_dtype("out", out, q.dtype));
  FA_TRY(check_same_device("k", k, q));
  FA_TRY(check_same_device("v", v, q));
  FA_TRY(check_same_device("out", out, q));

  const int h_dim = varlen ? 1 : 2;
  const int d_dim = varlen ? 2 : 3;
  p.is_varlen = varlen;
  p.dtype = q.dtype;
  p.device_index = q.device_index;
  p.heads = q.shape[h_dim];
  p.heads_kv = k.shape[h_dim];
  p.head_dim = q.shape[d_dim];
  p.head_dim_v = v.shape[d_dim];
  FA_TRY(check_head_dim("q", p.head_dim));
  FA_TRY(check_head_dim("v", p.head_dim_v));
  if (p.heads <= 0) return fail(FA_ERROR_INVALID_ARGUMENT, "q: expected at least one head, got %" PRId64, p.heads);
  if (p.heads_kv <= 0 || p.heads % p.heads_kv != 0)
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "k: expected a number of heads that divides the %" PRId64 " heads of q, got %" PRId64, p.heads,
                p.heads_kv);

  if (varlen) {
    p.batch = cu_q.shape[0] - 1;
    if (cu_q.rank != 1 || p.batch < 0)
      return fail(FA_ERROR_INVALID_ARGUMENT, "cu_seqlens_q: expected a rank-1 tensor of length batch + 1 >= 1, got %s",
                  shape_string(cu_q).c_str());
    p.total_q = q.shape[0];
    p.total_k = k.shape[0];
    p.seqlen_q = max_seqlen_q;
    p.seqlen_k = max_seqlen_k;
    FA_TRY(check_shape("k", k, {p.total_k, p.heads_kv, p.head_dim}));
    FA_TRY(check_shape("v", v, {p.total_k, p.heads_kv, p.head_dim_v}));
    FA_TRY(check_shape("out", out, {p.total_q, p.heads, p.head_dim_v}));
    FA_TRY(check_cu_seqlens("cu_seqlens_q", cu_q, q, p.batch, p.total_q, max_seqlen_q, "max_seqlen_q"));
    FA_TRY(check_cu_seqlens("cu_seqlens_k", cu_k, q, p.batch, p.total_k, max_seqlen_k, "max_seqlen_k"));
    p.cu_seqlens_q = static_cast<const int32_t*>(cu_q.data);
    p.cu_seqlens_k = static_cast<const int32_t*>(cu_k.data);
  } else {
    p.batch = q.shape[0];
    p.seqlen_q = q.shape[1];
    p.seqlen_k = k.shape[1];
    p.total_q = p.batch * p.seqlen_q;
    p.total_k = p.batch * p.seqlen_k;
    FA_TRY(check_shape("k", k, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim}));
    FA_TRY(check_shape("v", v, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v}));
    FA_TRY(check_shape("out", out, {p.batch, p.seqlen_q, p.heads, p.head_dim_v}));
  }

  if (lse.data != nullptr || lse_required) {
    FA_TRY(check_view("lse", lse, varlen ? 2 : 3));
    FA_TRY(check_dtype("lse", lse, FA_DTYPE_FP32));
    FA_TRY(check_same_device("lse", lse, q));
    if (varlen) {
      FA_TRY(check_shape("lse", lse, {p.heads, p.total_q}));
      p.lse_layout = TensorLayout{0, lse.strides[1], lse.strides[0]};
    } else {
      FA_TRY(check_shape("lse", lse, {p.batch, p.heads, p.seqlen_q}));
      p.lse_layout = TensorLayout{lse.strides[0], lse.strides[2], lse.strides[1]};
    }
    p.lse = static_cast<float*>(lse.data);
  }

  FA_TRY(check_alibi(alibi, q, p.batch, p.heads, p.alibi_slopes, p.alibi_batch_stride));
  FA_TRY(check_option_values(opts));
  if (!(opts.dropout_p >= 0.0f && opts.dropout_p < 1.0f))
    return fail(FA_ERROR_INVALID_ARGUMENT, "dropout_p: expected a probability in [0, 1), got %g",
                static_cast<double>(opts.dropout_p));
  if (reinterpret_cast<uintptr_t>(opts.dropout_rng_state) % alignof(uint64_t) != 0)
    return fail(FA_ERROR_INVALID_ARGUMENT, "dropout_rng_state: expected an 8-byte aligned pointer, got %p",
                static_cast<const void*>(opts.dropout_rng_state));

  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = out.data;
  p.q_layout = layout_of(q, varlen);
  p.k_layout = layout_of(k, varlen);
  p.v_layout = layout_of(v, varlen);
  p.o_layout = layout_of(out, varlen);
  p.softmax_scale =
      opts.softmax_scale > 0.0f ? opts.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  p.softcap = opts.softcap;
  p.causal = opts.causal != 0;
  p.align_bottom_right = opts.alignment == FA_ALIGN_BOTTOM_RIGHT;
  p.window_left = opts.window_left;
  p.window_right = p.causal ? 0 : opts.window_right;
  p.dropout_p = opts.dropout_p;
  p.dropout = make_dropout_config(opts.dropout_p, opts.dropout_seed, opts.dropout_offset);
  if (p.dropout.enabled && opts.dropout_rng_state != nullptr) {
    // The CPU backend runs inside this call, so host memory is read now; GPU kernels read theirs when they run.
    if (q.device == FA_DEVICE_CPU)
      set_dropout_keys(p.dropout, opts.dropout_rng_state[0], opts.dropout_rng_state[1]);
    else
      p.dropout.rng_state = opts.dropout_rng_state;
  }
  p.stream = opts.stream;
  return FA_OK;
}

}  // namespace validation

using namespace validation;

fa_status validate_fwd(const fa_fwd_args* args, FwdParams& params) {
  if (args == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "args: expected a non-null fa_fwd_args, got NULL");
  params = FwdParams{};
  return check_common(args->q, args->k, args->v, args->out, args->lse, false, args->cu_seqlens_q,
                      args->cu_seqlens_k, args->max_seqlen_q, args->max_seqlen_k, args->alibi_slopes, args->opts,
                      params);
}

fa_status validate_bwd(const fa_bwd_args* args, BwdParams& params) {
  if (args == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "args: expected a non-null fa_bwd_args, got NULL");
  params = BwdParams{};
  FA_TRY(check_common(args->q, args->k, args->v, args->out, args->lse, true, args->cu_seqlens_q, args->cu_seqlens_k,
                      args->max_seqlen_q, args->max_seqlen_k, args->alibi_slopes, args->opts, params));
  const bool varlen = params.is_varlen;
  const int rank = varlen ? 3 : 4;
  struct Like {
    const char* name;
    const fa_tensor* tensor;
    const fa_tensor* like;
  };
  const Like likes[] = {{"dout", &args->dout, &args->out},
                        {"dq", &args->dq, &args->q},
                        {"dk", &args->dk, &args->k},
                        {"dv", &args->dv, &args->v}};
  for (const Like& item : likes) {
    FA_TRY(check_view(item.name, *item.tensor, rank));
    FA_TRY(check_dtype(item.name, *item.tensor, args->q.dtype));
    FA_TRY(check_same_device(item.name, *item.tensor, args->q));
    for (int d = 0; d < rank; ++d) {
      if (item.tensor->shape[d] != item.like->shape[d])
        return fail(FA_ERROR_INVALID_ARGUMENT, "%s: expected shape %s, got %s", item.name,
                    shape_string(*item.like).c_str(), shape_string(*item.tensor).c_str());
    }
  }
  params.dout = args->dout.data;
  params.dq = args->dq.data;
  params.dk = args->dk.data;
  params.dv = args->dv.data;
  params.dout_layout = layout_of(args->dout, varlen);
  params.dq_layout = layout_of(args->dq, varlen);
  params.dk_layout = layout_of(args->dk, varlen);
  params.dv_layout = layout_of(args->dv, varlen);
  params.deterministic = args->opts.deterministic != 0;
  return FA_OK;
}

}  // namespace flashattn
