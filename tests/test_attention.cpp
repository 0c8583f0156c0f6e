// Forward and backward of every case in the shared list against the fp64
// reference, with the tolerance set by the same-precision naive version.
// Each call also proves: every output element written (NaN poison gone), no
// padding byte touched, no NaN/Inf, fully masked rows exact (O = 0,
// LSE = +inf, zero gradients), and the workspace the library asked the
// allocator for equals the size fa_*_workspace_size reported.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "flashattn/flashattn.hpp"
#include "support/cases.hpp"
#include "support/checks.hpp"
#include "support/problem.hpp"
#include "support/reference.hpp"

namespace fatest {
namespace {

std::string param_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

// Runs the forward with workspace = NULL through the counting allocator and checks the exact query.
void run_forward(Problem& p) {
  const fa_fwd_args args = p.fwd_args();
  size_t queried = 0;
  ASSERT_EQ(fa_fwd_workspace_size(&args, &queried), FA_OK) << fa_last_error();
  CountingAllocator counter;
  ASSERT_EQ(fa_fwd(&args, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_EQ(counter.total_bytes, queried) << "allocator was asked for a different size than the query reported";
  EXPECT_EQ(counter.calls, queried > 0 ? 1 : 0);
  EXPECT_EQ(counter.live, 0u) << "workspace not freed";
}

void run_backward(Problem& p) {
  const fa_bwd_args args = p.bwd_args();
  size_t queried = 0;
  ASSERT_EQ(fa_bwd_workspace_size(&args, &queried), FA_OK) << fa_last_error();
  CountingAllocator counter;
  ASSERT_EQ(fa_bwd(&args, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_EQ(counter.total_bytes, queried) << "allocator was asked for a different size than the query reported";
  EXPECT_EQ(counter.calls, queried > 0 ? 1 : 0);
  EXPECT_EQ(counter.live, 0u) << "workspace not freed";
}

class Forward : public ::testing::TestWithParam<Case> {};
class Backward : public ::testing::TestWithParam<Case> {};

TEST_P(Forward, MatchesReference) {
  Problem p = make_problem(GetParam());
  p.poison_outputs();
  run_forward(p);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(fully_written("out", p.out));
  ASSERT_TRUE(fully_written("lse", p.lse));

  expect_forward_matches_reference(p);

  // The caller-provided workspace of exactly the queried size gives the same bits.
  const fa_fwd_args args = p.fwd_args();
  size_t bytes = 0;
  ASSERT_EQ(fa_fwd_workspace_size(&args, &bytes), FA_OK);
  std::unique_ptr<unsigned char[]> workspace(new unsigned char[bytes == 0 ? 1 : bytes]);
  const std::vector<unsigned char> first_out = p.out.bytes(), first_lse = p.lse.bytes();
  p.poison_outputs();
  ASSERT_EQ(fa_fwd(&args, bytes == 0 ? nullptr : workspace.get(), bytes), FA_OK) << fa_last_error();
  EXPECT_TRUE(p.out.bytes() == first_out) << "explicit workspace changed O";
  EXPECT_TRUE(p.lse.bytes() == first_lse) << "explicit workspace changed LSE";
}

TEST_P(Backward, MatchesReference) {
  Problem p = make_problem(GetParam());
  p.poison_outputs();
  run_forward(p);
  if (HasFatalFailure()) return;
  run_backward(p);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(fully_written("dq", p.dq));
  ASSERT_TRUE(fully_written("dk", p.dk));
  ASSERT_TRUE(fully_written("dv", p.dv));

  expect_gradients_match_reference(p, backward_reference(p));
}

INSTANTIATE_TEST_SUITE_P(Cases, Forward, ::testing::ValuesIn(fast_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Cases, Backward, ::testing::ValuesIn(fast_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(SlowCases, Forward, ::testing::ValuesIn(slow_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(SlowCases, Backward, ::testing::ValuesIn(slow_cases()), param_name);

// The case list itself: every value the issue names appears somewhere.
TEST(CaseList, CoversEveryRequiredValue) {
  const std::vector<Case>& cases = all_cases();
  auto any = [&](auto predicate) {
    for (const Case& c : cases)
      if (predicate(c)) return true;
    return false;
  };
  for (int64_t d : {8, 32, 40, 64, 80, 96, 128, 160, 192, 256})
    EXPECT_TRUE(any([&](const Case& c) { return c.D == d; })) << "head dim " << d;
  EXPECT_TRUE(any([](const Case& c) { return c.Dv > c.D; }));
  EXPECT_TRUE(any([](const Case& c) { return c.Dv < c.D; }));
  EXPECT_TRUE(any([](const Case& c) { return !c.varlen() && c.Sq < c.Sk; }));
  EXPECT_TRUE(any([](const Case& c) { return !c.varlen() && c.Sq > c.Sk; }));
  for (int64_t s : {1, 3, 17, 128, 1000, 4096})
    EXPECT_TRUE(any([&](const Case& c) { return c.Sq == s || c.Sk == s; })) << "seqlen " << s;
  for (fa_alignment a : {FA_ALIGN_BOTTOM_RIGHT, FA_ALIGN_TOP_LEFT})
    EXPECT_TRUE(any([&](const Case& c) { return c.causal && c.align == a; }));
  EXPECT_TRUE(any([](const Case& c) { return c.window_left == 0 && c.window_right == 0; }));
  EXPECT_TRUE(any([](const Case& c) { return c.window_left == 16 && c.window_right == 0; }));
  EXPECT_TRUE(any([](const Case& c) { return c.window_left == -1 && c.window_right == 8; }));
  EXPECT_TRUE(any([](const Case& c) { return c.softcap > 0.0f; }));
  EXPECT_TRUE(any([](const Case& c) { return c.alibi == Alibi::kPerHead; }));
  EXPECT_TRUE(any([](const Case& c) { return c.alibi == Alibi::kPerBatchHead; }));
  for (int64_t ratio : {1, 2, 8}) EXPECT_TRUE(any([&](const Case& c) { return c.H / c.Hkv == ratio && c.Hkv > 1; }));
  EXPECT_TRUE(any([](const Case& c) { return c.Hkv == 1 && c.H > 1; }));
  EXPECT_TRUE(any([](const Case& c) {
    for (size_t b = 0; b < c.seqlens_q.size(); ++b)
      if (c.seqlens_q[b] == 0 || c.seqlens_k[b] == 0) return true;
    return false;
  }));
  EXPECT_TRUE(any([](const Case& c) {
    for (size_t b = 0; b < c.seqlens_q.size(); ++b)
      if (c.causal && c.seqlens_k[b] < c.seqlens_q[b]) return true;
    return false;
  }));
  EXPECT_TRUE(any([](const Case& c) { return c.layout == Layout::kHeadMajor; }));
  EXPECT_TRUE(any([](const Case& c) { return c.dropout > 0.0f; }));
  for (fa_dtype t : {FA_DTYPE_FP32, FA_DTYPE_FP16, FA_DTYPE_BF16})
    EXPECT_TRUE(any([&](const Case& c) { return c.dtype == t; }));
  EXPECT_GE(cases.size(), 60u);
  EXPECT_LE(cases.size(), 140u);  // the suite's time: about 110 fixed cases and 24 random combinations
}

template <typename Pred>
Case first_case(Pred pred) {
  for (const Case& c : fast_cases())
    if (pred(c)) return c;
  ADD_FAILURE() << "no case matches";
  return fast_cases().front();
}

// LSE is optional in the forward; without it O is bit-identical.
TEST(ForwardOptions, LseOptionalGivesSameOutput) {
  Problem p = make_problem(first_case([](const Case& c) { return c.dtype == FA_DTYPE_FP32 && c.causal && c.D == 64; }));
  p.poison_outputs();
  fa_fwd_args args = p.fwd_args();
  ASSERT_EQ(fa_fwd(&args, nullptr, 0), FA_OK) << fa_last_error();
  const std::vector<unsigned char> with_lse = p.out.bytes();
  p.out.poison();
  args.lse = fa_tensor{};
  ASSERT_EQ(fa_fwd(&args, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_TRUE(p.out.bytes() == with_lse);
}

// The C++ wrapper on a valid call: same results as the C API.
TEST(CppWrapper, RunsForwardAndBackward) {
  Problem p = make_problem(first_case([](const Case& c) { return c.H > c.Hkv && c.Sq > 64 && !c.causal; }));
  p.poison_outputs();
  const fa_fwd_args fargs = p.fwd_args();
  const fa_bwd_args bargs = p.bwd_args();
  flashattn::fwd(fargs);
  EXPECT_TRUE(fully_written("out", p.out));
  EXPECT_EQ(flashattn::fwd_workspace_size(fargs), [&] {
    size_t b = 0;
    fa_fwd_workspace_size(&fargs, &b);
    return b;
  }());
  const size_t bytes = flashattn::bwd_workspace_size(bargs);
  std::vector<unsigned char> workspace(bytes + 1);
  flashattn::bwd(bargs, workspace.data(), bytes);
  EXPECT_TRUE(fully_written("dq", p.dq));
  EXPECT_TRUE(fully_written("dk", p.dk));
  EXPECT_TRUE(fully_written("dv", p.dv));
}

}  // namespace
}  // namespace fatest
