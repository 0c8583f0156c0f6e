// Backward argument checks: dq/dk/dv/dout/lse problems and the options shared
// with the forward. The problems start from a valid forward, so out and lse
// hold real values; a rejected backward writes none of dq, dk, dv.
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

Problem forwarded(const Case& c) {
  Problem p = make_problem(c);
  const fa_fwd_args a = p.fwd_args();
  EXPECT_EQ(fa_fwd(&a, nullptr, 0), FA_OK) << fa_last_error();
  return p;
}

std::vector<BadCase> bwd_cases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return {
      {"dq_shape", [](P&, F&, Bw& a) { a.dq.shape[3] = 24; }, INVALID,
       {"dq: expected shape (2, 5, 4, 16), got (2, 5, 4, 24)"}},
      {"dk_shape", [](P&, F&, Bw& a) { a.dk.shape[1] = 6; }, INVALID,
       {"dk: expected shape (2, 7, 2, 16), got (2, 6, 2, 16)"}},
      {"dv_heads", [](P&, F&, Bw& a) { a.dv.shape[2] = 4; }, INVALID, {"dv: expected shape (2, 7, 2, 8), got (2, 7, 4, 8)"}},
      {"dout_shape", [](P&, F&, Bw& a) { a.dout.shape[3] = 16; }, INVALID,
       {"dout: expected shape (2, 5, 4, 8), got (2, 5, 4, 16)"}},
      {"dout_rank", [](P&, F&, Bw& a) { a.dout.rank = 3; }, INVALID, {"dout: expected rank 4, got rank 3"}},
      {"dq_rank", [](P&, F&, Bw& a) { a.dq.rank = 2; }, INVALID, {"dq: expected rank 4, got rank 2"}},
      {"dv_fp16", [](P&, F&, Bw& a) { a.dv.dtype = FA_DTYPE_FP16; }, INVALID, {"dv: expected dtype fp32, got fp16"}},
      {"dout_bf16", [](P&, F&, Bw& a) { a.dout.dtype = FA_DTYPE_BF16; }, INVALID, {"dout: expected dtype fp32, got bf16"}},
      {"dk_null", [](P&, F&, Bw& a) { a.dk.data = nullptr; }, INVALID, {"dk: expected a non-null data pointer, got NULL"}},
      {"dout_null", [](P&, F&, Bw& a) { a.dout.data = nullptr; }, INVALID,
       {"dout: expected a non-null data pointer, got NULL"}},
      {"dq_stride", [](P&, F&, Bw& a) { a.dq.strides[3] = 3; }, INVALID,
       {"dq: expected a contiguous last dimension (stride 1), got stride 3"}},
      {"dq_negative", [](P&, F&, Bw& a) { a.dq.shape[0] = -2; }, INVALID,
       {"dq: expected non-negative sizes, got shape (-2, 5, 4, 16)"}},
      {"dk_device", [](P&, F&, Bw& a) { a.dk.device = FA_DEVICE_CUDA; }, INVALID,
       {"dk: expected the device of q (cpu:0), got cuda:0"}},
      {"lse_missing", [](P&, F&, Bw& a) { a.lse = fa_tensor{}; }, INVALID, {"lse: expected a non-null data pointer, got NULL"}},
      {"lse_shape", [](P&, F&, Bw& a) { a.lse.shape[1] = 3; }, INVALID, {"lse: expected shape (2, 4, 5), got (2, 3, 5)"}},
      {"out_shape", [](P&, F&, Bw& a) { a.out.shape[2] = 2; }, INVALID, {"out: expected shape (2, 5, 4, 8), got (2, 5, 2, 8)"}},
      {"q_int32", [](P&, F&, Bw& a) { a.q.dtype = FA_DTYPE_INT32; }, INVALID,
       {"q: expected dtype fp32, fp16 or bf16, got int32"}},
      {"k_fp16", [](P&, F&, Bw& a) { a.k.dtype = FA_DTYPE_FP16; }, INVALID, {"k: expected dtype fp32, got fp16"}},
      {"heads_not_multiple",
       [](P&, F&, Bw& a) {
         a.k.shape[2] = 3;
         a.v.shape[2] = 3;
       },
       INVALID, {"k: expected a number of heads that divides the 4 heads of q, got 3"}},
      {"head_dim_264",
       [](P&, F&, Bw& a) {
         a.q.shape[3] = 264;
         a.k.shape[3] = 264;
       },
       INVALID, {"q: expected a head dimension that is a multiple of 8 in [8, 256], got 264"}},
      {"scale_nan", [nan](P&, F&, Bw& a) { a.opts.softmax_scale = nan; }, INVALID,
       {"softmax_scale: expected a finite value >= 0 (0 = 1/sqrt(D)), got nan"}},
      {"dropout_1", [](P&, F&, Bw& a) { a.opts.dropout_p = 1.0f; }, INVALID,
       {"dropout_p: expected a probability in [0, 1), got 1"}},
      {"softcap_negative", [](P&, F&, Bw& a) { a.opts.softcap = -3.0f; }, INVALID,
       {"softcap: expected a finite value >= 0 (0 = off), got -3"}},
      {"window_left", [](P&, F&, Bw& a) { a.opts.window_left = -9; }, INVALID,
       {"window_left: expected -1 (unbounded) or a value >= 0, got -9"}},
  };
}

TEST(BadInputBackward, DenseArgumentsRejected) {
  for (const BadCase& c : bwd_cases()) {
    Problem p = forwarded(dense_base());
    check_rejected(p, c, true);
  }
}

TEST(BadInputBackward, VarlenArgumentsRejected) {
  auto set_cu = [](HostTensor& t, std::vector<int32_t> values) {
    for (size_t e = 0; e < values.size(); ++e) t.set(static_cast<int64_t>(e), values[e]);
  };
  const std::vector<BadCase> cases = {
      {"cu_k_not_monotonic", [set_cu](P& p, F&, Bw&) { set_cu(p.cu_k, {0, 4, 3, 7}); }, INVALID,
       {"cu_seqlens_k: expected non-decreasing offsets, got cu_seqlens_k[1] = 4 > cu_seqlens_k[2] = 3"}},
      {"cu_q_start", [set_cu](P& p, F&, Bw&) { set_cu(p.cu_q, {2, 2, 2, 5}); }, INVALID,
       {"cu_seqlens_q: expected cu_seqlens_q[0] = 0, got 2"}},
      {"dq_rows", [](P&, F&, Bw& a) { a.dq.shape[0] = 4; }, INVALID, {"dq: expected shape (5, 4, 16), got (4, 4, 16)"}},
      {"lse_varlen_shape", [](P&, F&, Bw& a) { a.lse.shape[0] = 2; }, INVALID, {"lse: expected shape (4, 5), got (2, 5)"}},
  };
  for (const BadCase& c : cases) {
    Problem p = forwarded(varlen_base());
    check_rejected(p, c, true);
  }
}

TEST(BadInputBackward, CudaTensorOnCpuOnlyBuild) {
  if (fa_has_cuda() != 0) GTEST_SKIP() << "this build has the CUDA backend; a CUDA tensor is valid here";
  Problem p = forwarded(dense_base());
  const BadCase c{"all_cuda",
                  [](P&, F&, Bw& a) {
                    for (fa_tensor* t : {&a.dout, &a.q, &a.k, &a.v, &a.out, &a.lse, &a.dq, &a.dk, &a.dv})
                      t->device = FA_DEVICE_CUDA;
                  },
                  FA_ERROR_UNSUPPORTED,
                  {"q: expected a CPU tensor", "got a CUDA tensor"}};
  check_rejected(p, c, true);
}

TEST(BadInputBackward, WorkspaceTooSmall) {
  Problem p = forwarded(dense_base());
  const fa_bwd_args a = p.bwd_args();
  size_t need = 0;
  ASSERT_EQ(fa_bwd_workspace_size(&a, &need), FA_OK) << fa_last_error();
  if (need == 0) GTEST_SKIP() << "the backend needs no backward workspace for this shape";
  for (HostTensor* t : {&p.dq, &p.dk, &p.dv}) fill_sentinel(*t);
  std::vector<unsigned char> ws(need);
  EXPECT_EQ(fa_bwd(&a, ws.data(), need - 1), FA_ERROR_WORKSPACE_TOO_SMALL);
  EXPECT_TRUE(message_has(fa_last_error(), {"workspace_bytes: expected at least " + std::to_string(need) +
                                            " bytes, got " + std::to_string(need - 1)}));
  EXPECT_TRUE(untouched("dq", p.dq));
  EXPECT_TRUE(untouched("dk", p.dk));
  EXPECT_TRUE(untouched("dv", p.dv));
  for (HostTensor* t : {&p.dq, &p.dk, &p.dv}) t->poison();
  EXPECT_EQ(fa_bwd(&a, ws.data(), need), FA_OK) << "exactly the queried size must suffice: " << fa_last_error();
  EXPECT_TRUE(fully_written("dq", p.dq));
  EXPECT_TRUE(fully_written("dk", p.dk));
  EXPECT_TRUE(fully_written("dv", p.dv));
}

TEST(BadInputBackward, NullArgs) {
  EXPECT_EQ(fa_bwd(nullptr, nullptr, 0), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has(fa_last_error(), {"args: expected a non-null fa_bwd_args, got NULL"}));
  size_t bytes = 9;
  EXPECT_EQ(fa_bwd_workspace_size(nullptr, &bytes), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(bytes, 9u);
}

}  // namespace
}  // namespace fatest
