// Central differences of the fp64 reference forward check the fp64 reference
// backward (softcap derivative, ALiBi, dropout mask, GQA sums, masks, varlen),
// and the library's gradients against the same finite differences. Tiny
// shapes, fp32 inputs, fp64 math: the differences are accurate to ~1e-9.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "support/problem.hpp"
#include "support/reference.hpp"

namespace fatest {
namespace {

Case tiny(const char* name) {
  Case c;
  c.name = name;
  c.dtype = FA_DTYPE_FP32;
  c.B = 1;
  c.H = 2;
  c.Hkv = 1;
  c.Sq = 5;
  c.Sk = 7;
  c.D = 8;
  c.Dv = 8;
  return c;
}

std::vector<Case> fd_cases() {
  std::vector<Case> cases;
  Case a = tiny("causal_softcap_alibi_dropout_gqa");
  a.causal = true;
  a.softcap = 2.0f;
  a.scale = 0.7f;
  a.alibi = Alibi::kPerHead;
  a.dropout = 0.3f;
  cases.push_back(a);
  Case b = tiny("varlen_window_topleft");
  b.seqlens_q = {3, 0, 4, 2};
  b.seqlens_k = {5, 2, 6, 0};
  b.B = 4;
  b.Sq = 4;
  b.Sk = 6;
  b.Dv = 16;
  b.window_left = 2;
  b.window_right = 1;
  b.align = FA_ALIGN_TOP_LEFT;
  b.alibi = Alibi::kPerBatchHead;
  cases.push_back(b);
  Case c = tiny("sq_gt_sk_causal_empty_rows");
  c.B = 2;
  c.H = 4;
  c.Hkv = 2;
  c.Sq = 7;
  c.Sk = 4;
  c.causal = true;
  c.softcap = 0.5f;
  c.layout = Layout::kHeadMajor;
  cases.push_back(c);
  return cases;
}

// d/dx of sum(O * dout) for every element of x, by central differences.
std::vector<double> central_differences(const Problem& p, std::vector<double> q, std::vector<double> k,
                                        std::vector<double> v, const std::vector<double>& dout, int which) {
  std::vector<double>& x = which == 0 ? q : which == 1 ? k : v;
  std::vector<double> grad(x.size());
  const double h = 1e-5;
  for (size_t e = 0; e < x.size(); ++e) {
    const double saved = x[e];
    x[e] = saved + h;
    const double plus = weighted_output(p.g, p.sem, q, k, v, dout);
    x[e] = saved - h;
    const double minus = weighted_output(p.g, p.sem, q, k, v, dout);
    x[e] = saved;
    grad[e] = (plus - minus) / (2 * h);
  }
  return grad;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t e = 0; e < a.size(); ++e) m = std::max(m, std::fabs(a[e] - b[e]));
  return m;
}

class FiniteDifference : public ::testing::TestWithParam<Case> {};

TEST_P(FiniteDifference, ReferenceAndLibraryGradients) {
  Problem p = make_problem(GetParam());
  const std::vector<double> q = p.q.to_vector(), k = p.k.to_vector(), v = p.v.to_vector(), dout = p.dout.to_vector();
  const BwdOut ref = reference_backward(p.g, p.sem, q, k, v, dout);
  const BwdOut naive = attention_backward(p.g, p.sem, q, k, v, dout, FA_DTYPE_FP32, false);
  const std::vector<double>* refs[] = {&ref.dq, &ref.dk, &ref.dv};
  const std::vector<double>* naives[] = {&naive.dq, &naive.dk, &naive.dv};
  const char* names[] = {"dQ", "dK", "dV"};
  const double scale = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
  ASSERT_GT(scale, 0.1) << "degenerate case: gradients vanish";

  p.poison_outputs();
  const fa_fwd_args fa = p.fwd_args();
  ASSERT_EQ(fa_fwd(&fa, nullptr, 0), FA_OK) << fa_last_error();
  const fa_bwd_args ba = p.bwd_args();
  ASSERT_EQ(fa_bwd(&ba, nullptr, 0), FA_OK) << fa_last_error();
  const std::vector<double> ours[] = {p.dq.to_vector(), p.dk.to_vector(), p.dv.to_vector()};

  for (int which = 0; which < 3; ++which) {
    const std::vector<double> fd = central_differences(p, q, k, v, dout, which);
    // Truncation h^2 |f'''| and cancellation eps |L| / h are both below 1e-9 here.
    const double ref_vs_fd = max_diff(*refs[which], fd);
    EXPECT_LE(ref_vs_fd, 1e-7 * scale) << names[which] << ": fp64 reference backward vs finite differences";
    const ErrorReport r = compare(ours[which], *refs[which], *naives[which], scale);
    const double ours_vs_fd = max_diff(ours[which], fd);
    EXPECT_LE(ours_vs_fd, r.bound + ref_vs_fd) << names[which] << ": library vs finite differences; "
                                               << r.describe(names[which]);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, FiniteDifference, ::testing::ValuesIn(fd_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The finite-difference check is sensitive: dropping the softcap derivative is detected.
TEST(FiniteDifferenceSensitivity, MissingSoftcapDerivativeIsDetected) {
  Problem p = make_problem(fd_cases()[0]);
  const std::vector<double> q = p.q.to_vector(), k = p.k.to_vector(), v = p.v.to_vector(), dout = p.dout.to_vector();
  const std::vector<double> fd = central_differences(p, q, k, v, dout, 0);
  Semantics no_cap = p.sem;
  no_cap.softcap = 0.0;  // the backward of an uncapped score
  const BwdOut wrong = attention_backward(p.g, no_cap, q, k, v, dout, FA_DTYPE_FP32, true);
  EXPECT_GT(max_diff(wrong.dq, fd), 1e-3);
}

}  // namespace
}  // namespace fatest
