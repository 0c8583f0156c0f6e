// Finite values far from 1 are computed like any others: scaling V by 2^110
// scales O by 2^110 and leaves LSE as it was; scaling dO by 2^110 scales dQ,
// dK and dV. In bf16 every rounding scales with the values, so the results
// are the clean ones times 2^110 bit for bit. In fp32 on AMX the scaled
// operands are split into their bf16 pieces by three roundings instead of the
// Veltkamp split (isa_amx.cpp, split_pieces: lanes at or above 2^100), which
// could drop different small piece products: the results agree to a few fp32
// ulps of the largest value, and this checks that the two splits do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "support/problem.hpp"

namespace fatest {
namespace {

constexpr double kScale = 0x1p110;

struct LargeCase {
  fa_dtype dtype;
  bool causal;
};

Case make_case(const LargeCase& lc) {
  Case c;
  c.name = std::string("large_") + dtype_name(lc.dtype) + (lc.causal ? "_causal" : "");
  c.dtype = lc.dtype;
  c.B = 2;
  c.H = 4;
  c.Hkv = 2;
  c.Sq = 150;
  c.Sk = 200;
  c.D = 64;
  c.Dv = 64;
  c.causal = lc.causal;
  return c;
}

void scale_tensor(HostTensor& t, double factor) {
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, t.get(i) * factor);
}

// max |scaled / kScale - clean| against max |clean|: 0 for bf16; for fp32
// 1e-6, about eight ulps of the largest value, room for ties that the two
// splits round apart (measured: 0 on an AMX machine, where dropping the
// smallest piece of the rounding split shows as 4-6e-6).
void expect_scaled(const std::vector<double>& clean, const std::vector<double>& scaled, fa_dtype dtype,
                   const char* what) {
  ASSERT_EQ(clean.size(), scaled.size());
  double largest = 0.0, worst = 0.0;
  for (size_t i = 0; i < clean.size(); ++i) {
    ASSERT_TRUE(std::isfinite(scaled[i])) << what << "[" << i << "] = " << scaled[i];
    largest = std::max(largest, std::abs(clean[i]));
    worst = std::max(worst, std::abs(scaled[i] / kScale - clean[i]));
  }
  ASSERT_GT(largest, 0.0) << what << " is all zeros";
  const double allowed = dtype == FA_DTYPE_BF16 ? 0.0 : 1e-6 * largest;
  EXPECT_LE(worst, allowed) << what << ": max |scaled / 2^110 - clean| = " << worst << ", max |clean| = " << largest;
}

class LargeValues : public ::testing::TestWithParam<LargeCase> {};

TEST_P(LargeValues, ScalingVScalesOutput) {
  Problem p = make_problem(make_case(GetParam()));
  p.poison_outputs();
  fa_fwd_args args = p.fwd_args();
  ASSERT_EQ(fa_fwd(&args, nullptr, 0), FA_OK) << fa_last_error();
  const std::vector<double> o = p.out.to_vector(), lse = p.lse_rows();

  scale_tensor(p.v, kScale);
  p.poison_outputs();
  args = p.fwd_args();
  ASSERT_EQ(fa_fwd(&args, nullptr, 0), FA_OK) << fa_last_error();
  expect_scaled(o, p.out.to_vector(), p.c.dtype, "O");
  EXPECT_EQ(lse, p.lse_rows()) << "LSE does not depend on V";
}

TEST_P(LargeValues, ScalingGradientScalesGradients) {
  Problem p = make_problem(make_case(GetParam()));
  p.poison_outputs();
  const fa_fwd_args fwd = p.fwd_args();
  ASSERT_EQ(fa_fwd(&fwd, nullptr, 0), FA_OK) << fa_last_error();
  fa_bwd_args args = p.bwd_args();
  ASSERT_EQ(fa_bwd(&args, nullptr, 0), FA_OK) << fa_last_error();
  const std::vector<double> dq = p.dq.to_vector(), dk = p.dk.to_vector(), dv = p.dv.to_vector();

  scale_tensor(p.dout, kScale);
  p.dq.poison();
  p.dk.poison();
  p.dv.poison();
  args = p.bwd_args();
  ASSERT_EQ(fa_bwd(&args, nullptr, 0), FA_OK) << fa_last_error();
  expect_scaled(dq, p.dq.to_vector(), p.c.dtype, "dQ");
  expect_scaled(dk, p.dk.to_vector(), p.c.dtype, "dK");
  expect_scaled(dv, p.dv.to_vector(), p.c.dtype, "dV");
}

INSTANTIATE_TEST_SUITE_P(Cases, LargeValues,
                         ::testing::Values(LargeCase{FA_DTYPE_FP32, false}, LargeCase{FA_DTYPE_FP32, true},
                                           LargeCase{FA_DTYPE_BF16, false}, LargeCase{FA_DTYPE_BF16, true}),
                         [](const ::testing::TestParamInfo<LargeCase>& info) { return make_case(info.param).name; });

}  // namespace
}  // namespace fatest
