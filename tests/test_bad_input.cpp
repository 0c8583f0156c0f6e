// Forward argument checks: each bad input gets its status and a message that
// names the argument, the expected and the received value; no output byte is
// written. Backward variants are in test_bad_input_bwd.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "bad_input.hpp"

namespace fatest {
namespace {

constexpr fa_status INVALID = FA_ERROR_INVALID_ARGUMENT;
using P = Problem;
using F = fa_fwd_args;
using Bw = fa_bwd_args;

std::vector<BadCase> dense_cases() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::string hd = "expected a head dimension that is a multiple of 8 in [8, 256], got ";
  return {
      {"q_rank", [](P&, F& a, Bw&) { a.q.rank = 3; }, INVALID, {"q: expected rank 4, got rank 3"}},
      {"k_rank", [](P&, F& a, Bw&) { a.k.rank = 3; }, INVALID, {"k: expected rank 4, got rank 3"}},
      {"v_rank", [](P&, F& a, Bw&) { a.v.rank = 2; }, INVALID, {"v: expected rank 4, got rank 2"}},
      {"out_rank", [](P&, F& a, Bw&) { a.out.rank = 3; }, INVALID, {"out: expected rank 4, got rank 3"}},
      {"k_head_dim", [](P&, F& a, Bw&) { a.k.shape[3] = 24; }, INVALID,
       {"k: expected shape (2, 7, 2, 16), got (2, 7, 2, 24)"}},
      {"k_batch", [](P&, F& a, Bw&) { a.k.shape[0] = 1; }, INVALID, {"k: expected shape (2, 7, 2, 16), got (1, 7, 2, 16)"}},
      {"v_seqlen", [](P&, F& a, Bw&) { a.v.shape[1] = 6; }, INVALID, {"v: expected shape (2, 7, 2, 8), got (2, 6, 2, 8)"}},
      {"v_heads", [](P&, F& a, Bw&) { a.v.shape[2] = 1; }, INVALID, {"v: expected shape (2, 7, 2, 8), got (2, 7, 1, 8)"}},
      {"out_dv", [](P&, F& a, Bw&) { a.out.shape[3] = 16; }, INVALID,
       {"out: expected shape (2, 5, 4, 8), got (2, 5, 4, 16)"}},
      {"out_seqlen", [](P&, F& a, Bw&) { a.out.shape[1] = 7; }, INVALID,
       {"out: expected shape (2, 5, 4, 8), got (2, 7, 4, 8)"}},
      {"heads_not_multiple",
       [](P&, F& a, Bw&) {
         a.k.shape[2] = 3;
         a.v.shape[2] = 3;
       },
       INVALID, {"k: expected a number of heads that divides the 4 heads of q, got 3"}},
      {"head_dim_0",
       [](P&, F& a, Bw&) {
         a.q.shape[3] = 0;
         a.k.shape[3] = 0;
       },
       INVALID, {"q: " + hd + "0"}},
      {"head_dim_264",
       [](P&, F& a, Bw&) {
         a.q.shape[3] = 264;
         a.k.shape[3] = 264;
       },
       INVALID, {"q: " + hd + "264"}},
      {"head_dim_12",
       [](P&, F& a, Bw&) {
         a.q.shape[3] = 12;
         a.k.shape[3] = 12;
       },
       INVALID, {"q: " + hd + "12"}},
      {"head_dim_v_12",
       [](P&, F& a, Bw&) {
         a.v.shape[3] = 12;
         a.out.shape[3] = 12;
       },
       INVALID, {"v: " + hd + "12"}},
      {"q_int32", [](P&, F& a, Bw&) { a.q.dtype = FA_DTYPE_INT32; }, INVALID,
       {"q: expected dtype fp32, fp16 or bf16, got int32"}},
      {"k_fp16", [](P&, F& a, Bw&) { a.k.dtype = FA_DTYPE_FP16; }, INVALID, {"k: expected dtype fp32, got fp16"}},
      {"v_bf16", [](P&, F& a, Bw&) { a.v.dtype = FA_DTYPE_BF16; }, INVALID, {"v: expected dtype fp32, got bf16"}},
      {"out_bf16", [](P&, F& a, Bw&) { a.out.dtype = FA_DTYPE_BF16; }, INVALID, {"out: expected dtype fp32, got bf16"}},
      {"lse_fp16", [](P&, F& a, Bw&) { a.lse.dtype = FA_DTYPE_FP16; }, INVALID, {"lse: expected dtype fp32, got fp16"}},
      {"q_stride", [](P&, F& a, Bw&) { a.q.strides[3] = 2; }, INVALID,
       {"q: expected a contiguous last dimension (stride 1), got stride 2"}},
      {"out_stride", [](P&, F& a, Bw&) { a.out.strides[3] = 0; }, INVALID,
       {"out: expected a contiguous last dimension (stride 1), got stride 0"}},
      {"k_null", [](P&, F& a, Bw&) { a.k.data = nullptr; }, INVALID, {"k: expected a non-null data pointer, got NULL"}},
      {"q_null", [](P&, F& a, Bw&) { a.q.data = nullptr; }, INVALID, {"q: expected a non-null data pointer, got NULL"}},
      {"out_null", [](P&, F& a, Bw&) { a.out.data = nullptr; }, INVALID,
       {"out: expected a non-null data pointer, got NULL"}},
      {"q_negative", [](P&, F& a, Bw&) { a.q.shape[1] = -1; }, INVALID,
       {"q: expected non-negative sizes, got shape (2, -1, 4, 16)"}},
      {"k_negative", [](P&, F& a, Bw&) { a.k.shape[1] = -7; }, INVALID,
       {"k: expected non-negative sizes, got shape (2, -7, 2, 16)"}},
      {"window_left", [](P&, F& a, Bw&) { a.opts.window_left = -2; }, INVALID,
       {"window_left: expected -1 (unbounded) or a value >= 0, got -2"}},
      {"window_right", [](P&, F& a, Bw&) { a.opts.window_right = -5; }, INVALID,
       {"window_right: expected -1 (unbounded) or a value >= 0, got -5"}},
      {"dropout_1", [](P&, F& a, Bw&) { a.opts.dropout_p = 1.0f; }, INVALID,
       {"dropout_p: expected a probability in [0, 1), got 1"}},
      {"dropout_negative", [](P&, F& a, Bw&) { a.opts.dropout_p = -0.25f; }, INVALID,
       {"dropout_p: expected a probability in [0, 1), got -0.25"}},
      {"dropout_nan", [nan](P&, F& a, Bw&) { a.opts.dropout_p = nan; }, INVALID,
       {"dropout_p: expected a probability in [0, 1), got nan"}},
      {"softcap_negative", [](P&, F& a, Bw&) { a.opts.softcap = -1.0f; }, INVALID,
       {"softcap: expected a finite value >= 0 (0 = off), got -1"}},
      {"softcap_inf", [inf](P&, F& a, Bw&) { a.opts.softcap = inf; }, INVALID,
       {"softcap: expected a finite value >= 0 (0 = off), got inf"}},
      {"scale_nan", [nan](P&, F& a, Bw&) { a.opts.softmax_scale = nan; }, INVALID,
       {"softmax_scale: expected a finite value >= 0 (0 = 1/sqrt(D)), got nan"}},
      {"scale_negative", [](P&, F& a, Bw&) { a.opts.softmax_scale = -0.5f; }, INVALID,
       {"softmax_scale: expected a finite value >= 0 (0 = 1/sqrt(D)), got -0.5"}},
      {"scale_inf", [inf](P&, F& a, Bw&) { a.opts.softmax_scale = -inf; }, INVALID,
       {"softmax_scale: expected a finite value >= 0 (0 = 1/sqrt(D)), got -inf"}},
      {"num_threads", [](P&, F& a, Bw&) { a.opts.num_threads = -1; }, INVALID,
       {"num_threads: expected 0 (default) or a positive count, got -1"}},
      {"lse_shape", [](P&, F& a, Bw&) { a.lse.shape[2] = 6; }, INVALID, {"lse: expected shape (2, 4, 5), got (2, 4, 6)"}},
      {"lse_rank", [](P&, F& a, Bw&) { a.lse.rank = 2; }, INVALID, {"lse: expected rank 3, got rank 2"}},
      {"alibi_shape",
       [](P& p, F& a, Bw&) {
         p.alibi = HostTensor(FA_DTYPE_FP32, {5});
         a.alibi_slopes = p.alibi.view();
       },
       INVALID, {"alibi_slopes: expected shape (4), got (5)"}},
      {"alibi_batch_shape",
       [](P& p, F& a, Bw&) {
         p.alibi = HostTensor(FA_DTYPE_FP32, {3, 4});
         a.alibi_slopes = p.alibi.view();
       },
       INVALID, {"alibi_slopes: expected shape (2, 4), got (3, 4)"}},
      {"alibi_rank",
       [](P& p, F& a, Bw&) {
         p.alibi = HostTensor(FA_DTYPE_FP32, {2, 4, 1});
         a.alibi_slopes = p.alibi.view();
       },
       INVALID, {"alibi_slopes: expected shape (H) or (B, H), got rank 3"}},
      {"alibi_dtype",
       [](P& p, F& a, Bw&) {
         p.alibi = HostTensor(FA_DTYPE_FP16, {4});
         a.alibi_slopes = p.alibi.view();
       },
       INVALID, {"alibi_slopes: expected dtype fp32, got fp16"}},
      {"k_other_device", [](P&, F& a, Bw&) { a.k.device = FA_DEVICE_CUDA; }, INVALID,
       {"k: expected the device of q (cpu:0), got cuda:0"}},
  };
}

std::vector<BadCase> varlen_cases() {
  auto set_cu = [](HostTensor& t, std::vector<int32_t> values) {
    for (size_t e = 0; e < values.size(); ++e) t.set(static_cast<int64_t>(e), values[e]);
  };
  return {
      {"cu_q_start", [set_cu](P& p, F&, Bw&) { set_cu(p.cu_q, {1, 2, 2, 5}); }, INVALID,
       {"cu_seqlens_q: expected cu_seqlens_q[0] = 0, got 1"}},
      {"cu_q_not_monotonic", [set_cu](P& p, F&, Bw&) { set_cu(p.cu_q, {0, 3, 2, 5}); }, INVALID,
       {"cu_seqlens_q: expected non-decreasing offsets, got cu_seqlens_q[1] = 3 > cu_seqlens_q[2] = 2"}},
      {"cu_k_exceeds_total", [set_cu](P& p, F&, Bw&) { set_cu(p.cu_k, {0, 4, 5, 8}); }, INVALID,
       {"cu_seqlens_k: expected cu_seqlens_k[3] <= total rows 7, got 8"}},
      {"cu_q_exceeds_total", [set_cu](P& p, F&, Bw&) { set_cu(p.cu_q, {0, 2, 3, 6}); }, INVALID,
       {"cu_seqlens_q: expected cu_seqlens_q[3] <= total rows 5, got 6"}},
      {"cu_k_length", [](P&, F& a, Bw&) { a.cu_seqlens_k.shape[0] = 3; }, INVALID,
       {"cu_seqlens_k: expected length 4 (batch + 1), got 3"}},
      {"cu_q_empty", [](P&, F& a, Bw&) { a.cu_seqlens_q.shape[0] = 0; }, INVALID,
       {"cu_seqlens_q: expected a rank-1 tensor of length batch + 1 >= 1, got (0)"}},
      {"cu_k_missing", [](P&, F& a, Bw&) { a.cu_seqlens_k = fa_tensor{}; }, INVALID,
       {"cu_seqlens_k: expected both cu_seqlens_q and cu_seqlens_k for varlen, got NULL"}},
      {"cu_q_dtype", [](P&, F& a, Bw&) { a.cu_seqlens_q.dtype = FA_DTYPE_FP32; }, INVALID,
       {"cu_seqlens_q: expected dtype int32, got fp32"}},
      {"max_seqlen_q_small", [](P&, F& a, Bw&) { a.max_seqlen_q = 2; }, INVALID,
       {"cu_seqlens_q: expected sequence lengths <= max_seqlen_q = 2, got length 3 for sequence 2"}},
      {"max_seqlen_k_negative", [](P&, F& a, Bw&) { a.max_seqlen_k = -1; }, INVALID,
       {"max_seqlen_k: expected a non-negative value, got -1"}},
      {"varlen_q_rank4", [](P&, F& a, Bw&) { a.q.rank = 4; }, INVALID, {"q: expected rank 3, got rank 4"}},
      {"varlen_k_rows", [](P&, F& a, Bw&) { a.v.shape[0] = 6; }, INVALID, {"v: expected shape (7, 2, 8), got (6, 2, 8)"}},
      {"varlen_lse_shape", [](P&, F& a, Bw&) { a.lse.shape[1] = 6; }, INVALID, {"lse: expected shape (4, 5), got (4, 6)"}},
      {"varlen_alibi_batch",
       [](P& p, F& a, Bw&) {
         p.alibi = HostTensor(FA_DTYPE_FP32, {2, 4});
         a.alibi_slopes = p.alibi.view();
       },
       INVALID, {"alibi_slopes: expected shape (3, 4), got (2, 4)"}},
  };
}

TEST(BadInputForward, DenseArgumentsRejected) {
  for (const BadCase& c : dense_cases()) {
    Problem p = make_problem(dense_base());
    check_rejected(p, c, false);
  }
}

// Enum fields holding values outside the enum, as a C caller can pass. Apart
// from the rest: reading such a value through the C++ enum type is undefined
// behaviour that UBSan (-fsanitize=enum) aborts on, which must not hide the
// other checks.
TEST(BadInputForward, OutOfRangeEnumValuesRejected) {
  const std::vector<BadCase> cases = {
      {"alignment", [](P&, F& a, Bw&) { a.opts.alignment = static_cast<fa_alignment>(7); }, INVALID,
       {"alignment: expected FA_ALIGN_BOTTOM_RIGHT (0) or FA_ALIGN_TOP_LEFT (1), got 7"}},
      {"q_device_code", [](P&, F& a, Bw&) { a.q.device = static_cast<fa_device_type>(5); }, INVALID,
       {"q: expected device cpu or cuda, got device code 5"}},
      {"k_dtype_code", [](P&, F& a, Bw&) { a.k.dtype = static_cast<fa_dtype>(9); }, INVALID,
       {"k: expected dtype fp32, got unknown"}},
  };
  for (const BadCase& c : cases) {
    Problem p = make_problem(dense_base());
    check_rejected(p, c, false);
  }
}

TEST(BadInputForward, VarlenArgumentsRejected) {
  for (const BadCase& c : varlen_cases()) {
    Problem p = make_problem(varlen_base());
    check_rejected(p, c, false);
  }
}

TEST(BadInputForward, CudaTensorOnCpuOnlyBuild) {
  if (fa_has_cuda() != 0) GTEST_SKIP() << "this build has the CUDA backend; a CUDA tensor is valid here";
  Problem p = make_problem(dense_base());
  const BadCase c{"all_cuda",
                  [](P&, F& a, Bw&) {
                    for (fa_tensor* t : {&a.q, &a.k, &a.v, &a.out, &a.lse}) t->device = FA_DEVICE_CUDA;
                  },
                  FA_ERROR_UNSUPPORTED,
                  {"q: expected a CPU tensor", "got a CUDA tensor"}};
  check_rejected(p, c, false);
}

TEST(BadInputForward, WorkspaceTooSmall) {
  Problem p = make_problem(dense_base());
  const fa_fwd_args a = p.fwd_args();
  size_t need = 0;
  ASSERT_EQ(fa_fwd_workspace_size(&a, &need), FA_OK) << fa_last_error();
  if (need == 0) GTEST_SKIP() << "the backend needs no forward workspace for this shape";
  fill_sentinel(p.out);
  fill_sentinel(p.lse);
  std::vector<unsigned char> ws(need);
  EXPECT_EQ(fa_fwd(&a, ws.data(), need - 1), FA_ERROR_WORKSPACE_TOO_SMALL);
  EXPECT_TRUE(message_has(fa_last_error(), {"workspace_bytes: expected at least " + std::to_string(need) +
                                            " bytes, got " + std::to_string(need - 1)}));
  EXPECT_TRUE(untouched("out", p.out));
  EXPECT_TRUE(untouched("lse", p.lse));
  try {
    flashattn::fwd(a, ws.data(), 1);
    ADD_FAILURE() << "the C++ wrapper must throw";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(e.status(), FA_ERROR_WORKSPACE_TOO_SMALL);
    EXPECT_TRUE(message_has(e.what(), {"workspace_bytes: expected at least"}));
  }
  EXPECT_EQ(fa_fwd(&a, ws.data(), need), FA_OK) << "exactly the queried size must suffice: " << fa_last_error();
}

TEST(BadInputForward, NullPointers) {
  EXPECT_EQ(fa_fwd(nullptr, nullptr, 0), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has(fa_last_error(), {"args: expected a non-null fa_fwd_args, got NULL"}));
  Problem p = make_problem(dense_base());
  const fa_fwd_args a = p.fwd_args();
  EXPECT_EQ(fa_fwd_workspace_size(&a, nullptr), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has(fa_last_error(), {"bytes: expected a non-null pointer, got NULL"}));
  size_t bytes = 5;
  EXPECT_EQ(fa_fwd_workspace_size(nullptr, &bytes), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(bytes, 5u);
}

TEST(BadInputForward, CppMakeTensorRejectsRank5AndStrideCount) {
  float x = 0.0f;
  EXPECT_THROW(flashattn::make_tensor(&x, FA_DTYPE_FP32, {1, 1, 1, 1, 1}), flashattn::Error);
  try {
    flashattn::make_tensor(&x, FA_DTYPE_FP32, {1, 2}, {1});
    ADD_FAILURE() << "must throw";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(e.status(), FA_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(message_has(e.what(), {"strides"}));
  }
}

// After the failures above a valid call still succeeds: no state is left behind.
TEST(BadInputForward, ValidCallAfterRejectionsSucceeds) {
  Problem p = make_problem(dense_base());
  fa_fwd_args a = p.fwd_args();
  a.opts.dropout_p = 2.0f;
  EXPECT_EQ(fa_fwd(&a, nullptr, 0), FA_ERROR_INVALID_ARGUMENT);
  a.opts.dropout_p = 0.0f;
  p.poison_outputs();
  EXPECT_EQ(fa_fwd(&a, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_TRUE(fully_written("out", p.out));
}

}  // namespace
}  // namespace fatest
