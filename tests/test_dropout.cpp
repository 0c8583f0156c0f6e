// Dropout: an independent Philox4x32-10 (known-answer vectors), the header's
// mapping against fa_dropout_keep, keep rates within 5 binomial sigmas, and the
// masks the forward and the backward actually applied, read back through
// identity-like V (forward) and one-hot dO (backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "support/philox_ref.hpp"
#include "support/problem.hpp"
#include "support/reference.hpp"

namespace fatest {
namespace {

TEST(Philox, KnownAnswerVectors) {
  // Random123 kat_vectors, philox4x32 with 10 rounds.
  struct Kat {
    std::array<uint32_t, 4> ctr;
    std::array<uint32_t, 2> key;
    std::array<uint32_t, 4> out;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& kat : kats) {
    const std::array<uint32_t, 4> got = philox4x32_10_ref(kat.ctr, kat.key);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(got[w], kat.out[w]) << "word " << w << " of ctr " << kat.ctr[0];
  }
}

TEST(DropoutMapping, FaDropoutKeepMatchesHeaderMapping) {
  std::mt19937_64 rng(20240601);
  const float ps[] = {1e-6f, 0.1f, 0.17f, 0.5f, 0.75f, 0.9f, 0.999f};
  int64_t mismatches = 0, checked = 0;
  for (int n = 0; n < 200000; ++n) {
    const uint64_t seed = rng(), offset = n % 3 == 0 ? rng() : rng() & 0xFFFFFFFFull;
    const int64_t H = 1 + static_cast<int64_t>(rng() % 64);
    const int64_t b = static_cast<int64_t>(rng() % 64), h = static_cast<int64_t>(rng() % H);
    const int64_t i = static_cast<int64_t>(rng() % (n % 2 ? 70000 : 300));
    const int64_t j = static_cast<int64_t>(rng() % (n % 2 ? 70000 : 300));
    const float p = ps[n % 7];
    const bool ours = fa_dropout_keep(seed, offset, b, h, H, i, j, p) != 0;
    mismatches += ours == dropout_keep_ref(seed, offset, b, h, H, i, j, p) ? 0 : 1;
    ++checked;
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  for (int64_t j = 0; j < 64; ++j) EXPECT_EQ(fa_dropout_keep(1, 2, 0, 0, 1, 3, j, 0.0f), 1) << "p = 0 keeps all";
}

// |kept - n(1-p)| <= 5 sqrt(n p (1-p)): a false failure has probability < 1e-6.
::testing::AssertionResult keep_rate_ok(int64_t kept, int64_t n, double p) {
  const double expected = static_cast<double>(n) * (1.0 - p);
  const double sigma = std::sqrt(static_cast<double>(n) * p * (1.0 - p));
  if (std::fabs(static_cast<double>(kept) - expected) <= 5.0 * sigma) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "kept " << kept << " of " << n << ", expected " << expected << " +- 5 x "
                                       << sigma;
}

TEST(DropoutMapping, KeepRateWithinFiveSigma) {
  for (float p : {0.05f, 0.3f, 0.5f, 0.9f}) {
    int64_t kept = 0, n = 0, same_as_other_seed = 0, same_as_other_offset = 0;
    for (int64_t i = 0; i < 512; ++i)
      for (int64_t j = 0; j < 1024; ++j, ++n) {
        const bool keep = fa_dropout_keep(77, 5, 1, 2, 4, i, j, p) != 0;
        kept += keep ? 1 : 0;
        same_as_other_seed += keep == (fa_dropout_keep(78, 5, 1, 2, 4, i, j, p) != 0) ? 1 : 0;
        same_as_other_offset += keep == (fa_dropout_keep(77, 5 + (uint64_t{1} << 32), 1, 2, 4, i, j, p) != 0) ? 1 : 0;
      }
    EXPECT_TRUE(keep_rate_ok(kept, n, p)) << "p = " << p;
    // Independent masks agree with probability p^2 + (1-p)^2.
    const double agree = static_cast<double>(p) * p + (1.0 - p) * (1.0 - p);
    EXPECT_TRUE(keep_rate_ok(same_as_other_seed, n, 1.0 - agree)) << "seed must change the mask, p = " << p;
    EXPECT_TRUE(keep_rate_ok(same_as_other_offset, n, 1.0 - agree)) << "offset >> 32 must change the mask";
  }
}

// fp32, Sk <= Dv = 256 keys, V[j] = e_j: O[i][j] = P_ij * keep_ij / (1 - p), and P_ij > 0.
Case mask_case(bool varlen, int64_t H, int64_t Hkv, bool causal) {
  Case c;
  c.dtype = FA_DTYPE_FP32;
  c.B = 2;
  c.H = H;
  c.Hkv = Hkv;
  c.Sq = 70;
  c.Sk = 256;
  c.D = 32;
  c.Dv = 256;
  c.causal = causal;
  c.dropout = 0.3f;
  if (varlen) {
    c.seqlens_q = {40, 0, 70};
    c.seqlens_k = {256, 5, 130};
    c.B = 3;
    c.Sq = 70;
  }
  c.name = std::string("mask_") + (varlen ? "varlen" : "dense") + std::to_string(H) + "_" + std::to_string(Hkv) +
           (causal ? "_causal" : "");
  return c;
}

void set_identity_v(Problem& p) {
  const Geometry& g = p.g;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t j = 0; j < g.seqlen_k[b]; ++j)
      for (int64_t hk = 0; hk < g.Hkv; ++hk)
        for (int64_t d = 0; d < g.Dv; ++d) p.v.set(((g.start_k[b] + j) * g.Hkv + hk) * g.Dv + d, d == j ? 1.0 : 0.0);
}

class DropoutMask : public ::testing::TestWithParam<Case> {};

TEST_P(DropoutMask, ForwardAndBackwardApplyTheDocumentedMask) {
  Problem p = make_problem(GetParam());
  set_identity_v(p);
  const Geometry& g = p.g;
  // dO[i] = e_i (Sq <= Dv): dV[j][i] = P_ij * keep_ij / (1 - p) for H = Hkv.
  for (int64_t r = 0; r < g.total_q; ++r)
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t d = 0; d < g.Dv; ++d) {
        const int64_t b = static_cast<int64_t>(std::upper_bound(g.start_q.begin(), g.start_q.end(), r) -
                                               g.start_q.begin()) - 1;
        p.dout.set((r * g.H + h) * g.Dv + d, d == r - g.start_q[b] ? 1.0 : 0.0);
      }
  p.poison_outputs();
  const fa_fwd_args fa = p.fwd_args();
  ASSERT_EQ(fa_fwd(&fa, nullptr, 0), FA_OK) << fa_last_error();
  const fa_bwd_args ba = p.bwd_args();
  ASSERT_EQ(fa_bwd(&ba, nullptr, 0), FA_OK) << fa_last_error();
  const std::vector<double> o = p.out.to_vector(), dv = p.dv.to_vector();

  int64_t fwd_mismatch = 0, bwd_mismatch = 0, visible_count = 0, kept = 0;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t i = 0; i < g.seqlen_q[b]; ++i)
        for (int64_t j = 0; j < g.seqlen_k[b]; ++j) {
          const bool seen = visible(g, p.sem, b, i, j);
          const bool keep = seen && dropout_keep_ref(p.sem.seed, p.sem.offset, b, h, g.H, i, j, p.c.dropout);
          const double oij = o[((g.start_q[b] + i) * g.H + h) * g.Dv + j];
          fwd_mismatch += (oij != 0.0) == keep ? 0 : 1;
          if (g.H == g.Hkv) {
            const double dvji = dv[((g.start_k[b] + j) * g.Hkv + h) * g.Dv + i];
            bwd_mismatch += (dvji != 0.0) == keep ? 0 : 1;
          }
          visible_count += seen ? 1 : 0;
          kept += keep ? 1 : 0;
        }
  EXPECT_EQ(fwd_mismatch, 0) << "forward mask differs from the documented mapping";
  EXPECT_EQ(bwd_mismatch, 0) << "backward mask differs from the documented mapping";
  EXPECT_TRUE(keep_rate_ok(kept, visible_count, p.c.dropout));

  // The values too: O and all gradients against the reference run with the same mask.
  const std::vector<double> q = p.q.to_vector(), k = p.k.to_vector(), v = p.v.to_vector(), dout = p.dout.to_vector();
  const FwdOut ref = reference_forward(g, p.sem, q, k, v);
  const FwdOut naive = attention_forward(g, p.sem, q, k, v, p.c.dtype, false);
  EXPECT_TRUE(within_tolerance("O", o, ref.o, naive.o));
  const BwdOut gref = reference_backward(g, p.sem, q, k, v, dout);
  const BwdOut gnaive = attention_backward(g, p.sem, q, k, v, dout, p.c.dtype, false);
  const double scale = std::max({max_abs(gref.dq), max_abs(gref.dk), max_abs(gref.dv)});
  EXPECT_TRUE(within_tolerance("dQ", p.dq.to_vector(), gref.dq, gnaive.dq, scale));
  EXPECT_TRUE(within_tolerance("dK", p.dk.to_vector(), gref.dk, gnaive.dk, scale));
  EXPECT_TRUE(within_tolerance("dV", dv, gref.dv, gnaive.dv, scale));

  // The comparison is sensitive to the mask: another seed's reference does not pass.
  Semantics other = p.sem;
  other.seed ^= 1;
  const FwdOut wrong = reference_forward(g, other, q, k, v);
  const FwdOut wrong_naive = attention_forward(g, other, q, k, v, p.c.dtype, false);
  EXPECT_FALSE(compare(o, wrong.o, wrong_naive.o).pass()) << "a different mask must be detected";
}

INSTANTIATE_TEST_SUITE_P(Shapes, DropoutMask,
                         ::testing::Values(mask_case(false, 3, 3, false), mask_case(false, 4, 2, true),
                                           mask_case(true, 2, 2, false), mask_case(true, 2, 2, true)),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Two calls with the same seed and offset give the same mask; a new offset gives another.
TEST(DropoutCalls, SameSeedSameOutputNewOffsetNewOutput) {
  Problem p = make_problem(mask_case(false, 3, 3, false));
  fa_fwd_args a = p.fwd_args();
  ASSERT_EQ(fa_fwd(&a, nullptr, 0), FA_OK) << fa_last_error();
  const std::vector<unsigned char> first = p.out.bytes();
  p.out.poison();
  ASSERT_EQ(fa_fwd(&a, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_TRUE(p.out.bytes() == first);
  a.opts.dropout_offset += 1;
  ASSERT_EQ(fa_fwd(&a, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_FALSE(p.out.bytes() == first);
}

// dropout_rng_state: {seed, offset} read from memory when the call runs, the same
// mask as the two values; writing new values there changes the mask of the next call.
TEST(DropoutCalls, RngStateInMemoryMatchesValues) {
  Problem p = make_problem(mask_case(true, 2, 2, true));
  fa_fwd_args by_value = p.fwd_args();
  ASSERT_EQ(fa_fwd(&by_value, nullptr, 0), FA_OK) << fa_last_error();
  const std::vector<unsigned char> expected = p.out.bytes();

  uint64_t rng_state[2] = {~by_value.opts.dropout_seed, by_value.opts.dropout_offset + 5};
  fa_fwd_args from_memory = by_value;
  from_memory.opts.dropout_seed = 0;  // ignored while dropout_rng_state is set
  from_memory.opts.dropout_offset = 0;
  from_memory.opts.dropout_rng_state = rng_state;
  p.out.poison();
  ASSERT_EQ(fa_fwd(&from_memory, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_FALSE(p.out.bytes() == expected);

  rng_state[0] = by_value.opts.dropout_seed;
  rng_state[1] = by_value.opts.dropout_offset;
  p.out.poison();
  ASSERT_EQ(fa_fwd(&from_memory, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_TRUE(p.out.bytes() == expected);

  fa_bwd_args bwd_value = p.bwd_args();
  ASSERT_EQ(fa_bwd(&bwd_value, nullptr, 0), FA_OK) << fa_last_error();
  const std::vector<unsigned char> dq = p.dq.bytes(), dk = p.dk.bytes(), dv = p.dv.bytes();
  fa_bwd_args bwd_memory = bwd_value;
  bwd_memory.opts.dropout_seed = 0;
  bwd_memory.opts.dropout_offset = 0;
  bwd_memory.opts.dropout_rng_state = rng_state;
  p.dq.poison();
  p.dk.poison();
  p.dv.poison();
  ASSERT_EQ(fa_bwd(&bwd_memory, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_TRUE(p.dq.bytes() == dq && p.dk.bytes() == dk && p.dv.bytes() == dv);
}

TEST(DropoutCalls, MisalignedRngStateIsRejected) {
  Problem p = make_problem(mask_case(false, 3, 3, false));
  alignas(8) unsigned char bytes[24] = {};
  fa_fwd_args a = p.fwd_args();
  a.opts.dropout_rng_state = reinterpret_cast<const uint64_t*>(bytes + 4);
  p.out.poison();
  const std::vector<unsigned char> poisoned = p.out.bytes();
  EXPECT_EQ(fa_fwd(&a, nullptr, 0), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("dropout_rng_state: expected an 8-byte aligned pointer"),
            std::string::npos)
      << fa_last_error();
  EXPECT_TRUE(p.out.bytes() == poisoned) << "outputs must be left untouched";
}

}  // namespace
}  // namespace fatest
