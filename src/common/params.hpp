// The flat parameter block every backend receives. Built once from the
// validated C arguments (src/api.cpp); backends see raw pointers, int64 strides
// and scalars only.
#pragma once

#include <cstdint>

#include "common/philox.hpp"
#include "flashattn/flashattn.h"

namespace flashattn {

// Where row r of sequence b, head h lives: base + b*batch + (row0_b + r)*row + h*head,
// row0_b = cu_seqlens[b] for varlen (batch stride then 0) and 0 for dense.
struct TensorLayout {
  int64_t batch = 0, row = 0, head = 0;
};

struct AttnParams {
  fa_dtype dtype = FA_DTYPE_FP32;
  int32_t device_index = 0;
  bool is_varlen = false;

  int64_t batch = 0;
  int64_t heads = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;    // D
  int64_t head_dim_v = 0;  // Dv
  int64_t seqlen_q = 0;    // dense Sq, or max_seqlen_q for varlen
  int64_t seqlen_k = 0;
  int64_t total_q = 0;     // rows of Q (B*Sq dense, Tq varlen)
  int64_t total_k = 0;

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // may be null in the forward
  TensorLayout q_layout, k_layout, v_layout, o_layout, lse_layout;

  const int32_t* cu_seqlens_q = nullptr;  // varlen: B+1 offsets, host-readable for CPU tensors
  const int32_t* cu_seqlens_k = nullptr;

  float softmax_scale = 1.0f;
  float softcap = 0.0f;       // 0: off
  bool causal = false;        // window_right was set to 0
  bool align_bottom_right = true;
  int32_t window_left = -1;   // -1: unbounded
  int32_t window_right = -1;

  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;  // 0 for (H) slopes

  float dropout_p = 0.0f;
  DropoutConfig dropout;

  int32_t num_threads = 1;  // CPU: resolved count
  void* stream = nullptr;   // CUDA
};

struct FwdParams : AttnParams {};

struct BwdParams : AttnParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  TensorLayout dout_layout, dq_layout, dk_layout, dv_layout;
  bool deterministic = false;
};

inline int64_t element_size(fa_dtype dtype) { return dtype == FA_DTYPE_FP32 || dtype == FA_DTYPE_INT32 ? 4 : 2; }

}  // namespace flashattn
