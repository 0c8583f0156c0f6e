// Bitwise reproducibility: O, LSE and (with opts.deterministic) dQ, dK, dV are
// identical across repeated calls and across thread counts 1, 2 and 7.
#include <gtest/gtest.h>

#include <vector>

#include "support/cases.hpp"
#include "support/checks.hpp"
#include "support/problem.hpp"

namespace fatest {
namespace {

struct Outputs {
  std::vector<unsigned char> out, lse, dq, dk, dv;
};

Outputs run(Problem& p, int32_t threads) {
  Outputs r;
  p.poison_outputs();
  fa_fwd_args fa = p.fwd_args();
  fa.opts.num_threads = threads;
  EXPECT_EQ(fa_fwd(&fa, nullptr, 0), FA_OK) << fa_last_error();
  fa_bwd_args ba = p.bwd_args();
  ba.opts.num_threads = threads;
  ba.opts.deterministic = 1;
  EXPECT_EQ(fa_bwd(&ba, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_TRUE(fully_written("dq", p.dq));
  r.out = p.out.bytes();
  r.lse = p.lse.bytes();
  r.dq = p.dq.bytes();
  r.dk = p.dk.bytes();
  r.dv = p.dv.bytes();
  return r;
}

class Determinism : public ::testing::TestWithParam<Case> {};

TEST_P(Determinism, BitwiseAcrossRunsAndThreadCounts) {
  Problem p = make_problem(GetParam());
  const Outputs base = run(p, 1);
  ASSERT_FALSE(HasFailure());
  for (int32_t threads : {1, 2, 7, 2}) {
    const Outputs again = run(p, threads);
    EXPECT_TRUE(again.out == base.out) << "O differs with " << threads << " threads";
    EXPECT_TRUE(again.lse == base.lse) << "LSE differs with " << threads << " threads";
    EXPECT_TRUE(again.dq == base.dq) << "dQ differs with " << threads << " threads";
    EXPECT_TRUE(again.dk == base.dk) << "dK differs with " << threads << " threads";
    EXPECT_TRUE(again.dv == base.dv) << "dV differs with " << threads << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Determinism, ::testing::ValuesIn(determinism_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// 16 (batch, kv head) groups: the CPU backward takes its owned-groups scheme
// by shape (src/cpu/bwd_impl.hpp), which no case of the shared list reaches;
// its choice and its bits must not move with the thread count either.
TEST(ManyGroups, BitwiseAcrossThreadCountsAndMatchesReference) {
  Case c;
  c.name = "fp32_b2h16kv8_q300k300_d32_causalBR";
  c.B = 2;
  c.H = 16;
  c.Hkv = 8;
  c.Sq = c.Sk = 300;
  c.D = c.Dv = 32;
  c.causal = true;
  Problem p = make_problem(c);
  const Outputs base = run(p, 1);
  ASSERT_FALSE(HasFailure());
  expect_gradients_match_reference(p, backward_reference(p));
  for (int32_t threads : {2, 7}) {
    const Outputs again = run(p, threads);
    EXPECT_TRUE(again.dq == base.dq) << "dQ differs with " << threads << " threads";
    EXPECT_TRUE(again.dk == base.dk) << "dK differs with " << threads << " threads";
    EXPECT_TRUE(again.dv == base.dv) << "dV differs with " << threads << " threads";
  }
}

// A few queries against 4,096 keys at D = 128: one kv head's rows fill the
// forward's staging budget, so one thread stages a head per step while 7 and
// 16 threads stage 3 and 4 to have Q tiles for every thread
// (fwd_heads_per_step, src/cpu/scratch.hpp). The steps change, the bits may not.
TEST(WideForwardSteps, BitwiseAcrossThreadCountsAndMatchesReference) {
  Case c;
  c.name = "bf16_b1h8kv4_q40k4096_d128_causalBR";
  c.dtype = FA_DTYPE_BF16;
  c.B = 1;
  c.H = 8;
  c.Hkv = 4;
  c.Sq = 40;
  c.Sk = 4096;
  c.D = c.Dv = 128;
  c.causal = true;
  Problem p = make_problem(c);
  const Outputs base = run(p, 1);
  ASSERT_FALSE(HasFailure());
  expect_forward_matches_reference(p);
  for (int32_t threads : {7, 16}) {
    const Outputs again = run(p, threads);
    EXPECT_TRUE(again.out == base.out) << "O differs with " << threads << " threads";
    EXPECT_TRUE(again.lse == base.lse) << "LSE differs with " << threads << " threads";
  }
}

// The library default thread count (num_threads = 0) follows fa_set_default_num_threads and gives the same bits.
TEST(DefaultThreads, DefaultCountGivesSameBits) {
  Problem p = make_problem(determinism_cases()[0]);
  const Outputs one = run(p, 1);
  fa_set_default_num_threads(3);
  const Outputs dflt = run(p, 0);
  fa_set_default_num_threads(test_threads());
  EXPECT_TRUE(dflt.out == one.out);
  EXPECT_TRUE(dflt.dq == one.dq);
  EXPECT_TRUE(dflt.dk == one.dk);
  EXPECT_TRUE(dflt.dv == one.dv);
}

}  // namespace
}  // namespace fatest
