// Attention against a KV cache on the CPU backend: every cache case against
// the fp64 reference on the gathered cache (2x rule), the appended cache
// byte for byte, outputs poisoned before the call, the exact workspace, split
// counts that agree with no split, and bad input that leaves outputs and the
// cache untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "flashattn/flashattn.hpp"
#include "support/kvcache_problem.hpp"
#include "support/problem.hpp"

namespace fatest {
namespace {

std::string param_name(const ::testing::TestParamInfo<KvCase>& info) { return info.param.name; }

void run_kvcache(const KvProblem& p) {
  const fa_kvcache_args args = p.args();
  size_t queried = 0;
  ASSERT_EQ(fa_fwd_kvcache_workspace_size(&args, &queried), FA_OK) << fa_last_error();
  CountingAllocator counter;
  ASSERT_EQ(fa_fwd_kvcache(&args, nullptr, 0), FA_OK) << fa_last_error();
  EXPECT_EQ(counter.total_bytes, queried) << "allocator was asked for a different size than the query reported";
  EXPECT_EQ(counter.live, 0u) << "workspace not freed";
}

class KvCache : public ::testing::TestWithParam<KvCase> {};

TEST_P(KvCache, MatchesReference) {
  KvProblem p = make_kv_problem(GetParam());
  p.poison_outputs();
  run_kvcache(p);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(fully_written("out", p.out));
  if (p.c.with_lse) {
    ASSERT_TRUE(fully_written("lse", p.lse));
  } else {
    EXPECT_EQ(p.lse.count_poisoned(), p.lse.numel()) << "lse was not requested but written";
  }
  expect_kvcache_matches(p);
}

INSTANTIATE_TEST_SUITE_P(Cases, KvCache, ::testing::ValuesIn(kvcache_fast_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(SlowCases, KvCache, ::testing::ValuesIn(kvcache_slow_cases()), param_name);

// Every split count gives the reference's answer, and the counts agree with
// one another far inside the tolerance (the combine is exact up to rounding).
// Without an append the cache is the same for every call, so one problem and
// one reference serve every count.
TEST(KvCacheSplits, CountsAgreeWithNoSplit) {
  for (const char* name : {"paged16_bf16_long_decode_gqa4", "contig_fp16_gqa16_chunk7_causal"})
    expect_split_counts_agree(name, {1, 2, 3, 7, 16, 64}, run_kvcache);
}

// Bad input: a clear error naming the argument; out, lse and both caches untouched.
class KvCacheBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    const KvCase c = kvcache_case("paged16_fp16_leftpad_rotary_interleaved");
    ASSERT_FALSE(c.name.empty());
    p_ = make_kv_problem(c);
    p_.poison_outputs();
    k_before_ = p_.k_cache.bytes();
    v_before_ = p_.v_cache.bytes();
  }

  void expect_rejected(const fa_kvcache_args& args, fa_status status, const char* mention) {
    size_t bytes = 0;
    EXPECT_EQ(fa_fwd_kvcache_workspace_size(&args, &bytes), status) << fa_last_error();
    EXPECT_EQ(fa_fwd_kvcache(&args, nullptr, 0), status);
    const std::string message = fa_last_error();
    EXPECT_NE(message.find(mention), std::string::npos) << "message: " << message;
    EXPECT_NE(message.find("expected"), std::string::npos) << "message: " << message;
    EXPECT_EQ(p_.out.count_poisoned(), p_.out.numel()) << "out written on failure";
    EXPECT_EQ(p_.lse.count_poisoned(), p_.lse.numel()) << "lse written on failure";
    EXPECT_TRUE(p_.k_cache.bytes() == k_before_) << "k_cache written on failure";
    EXPECT_TRUE(p_.v_cache.bytes() == v_before_) << "v_cache written on failure";
  }

  KvProblem p_;
  std::vector<unsigned char> k_before_, v_before_;
};

TEST_F(KvCacheBadInput, NullArgs) {
  size_t bytes = 0;
  EXPECT_EQ(fa_fwd_kvcache_workspace_size(nullptr, &bytes), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fa_fwd_kvcache(nullptr, nullptr, 0), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("args"), std::string::npos);
}

TEST_F(KvCacheBadInput, ShapesAndDtypes) {
  fa_kvcache_args a = p_.args();
  a.v_cache.dtype = FA_DTYPE_BF16;
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "v_cache");
  a = p_.args();
  a.k_new.shape[2] += 1;
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "k_new");
  a = p_.args();
  a.lse.shape[2] += 1;
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "lse");
  a = p_.args();
  a.q.shape[2] = 3;  // 3 heads over 2 kv heads
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "k_cache");
  a = p_.args();
  a.block_table.dtype = FA_DTYPE_FP32;
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "block_table");
}

TEST_F(KvCacheBadInput, IndexValuesOutsideTheCache) {
  HostTensor& seqlens = p_.cache_seqlens;
  const double saved = seqlens.get(1);
  seqlens.set(1, static_cast<double>(p_.capacity));  // + 1 new key overflows
  expect_rejected(p_.args(), FA_ERROR_INVALID_ARGUMENT, "cache_seqlens");
  seqlens.set(1, saved);

  const double page = p_.block_table.get(0);
  p_.block_table.set(0, static_cast<double>(p_.k_cache.shape()[0]));
  expect_rejected(p_.args(), FA_ERROR_INVALID_ARGUMENT, "block_table");
  p_.block_table.set(0, -1);
  expect_rejected(p_.args(), FA_ERROR_INVALID_ARGUMENT, "block_table");
  p_.block_table.set(0, page);

  const double pad = p_.cache_leftpad.get(0);
  p_.cache_leftpad.set(0, 1000);
  expect_rejected(p_.args(), FA_ERROR_INVALID_ARGUMENT, "cache_seqlens");
  p_.cache_leftpad.set(0, pad);
}

TEST_F(KvCacheBadInput, Combinations) {
  fa_kvcache_args a = p_.args();
  a.cache_batch_idx = p_.cache_seqlens.view();  // any int32 (B) tensor
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "cache_batch_idx");
  a = p_.args();
  a.cache_seqlens = fa_tensor{};
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "cache_seqlens");
  a = p_.args();
  a.v_new = fa_tensor{};
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "v_new");
  a = p_.args();
  a.k_new = a.v_new = fa_tensor{};
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "k_new");  // rotary rotates the new keys
  a = p_.args();
  a.rotary_sin = fa_tensor{};
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "rotary_sin");
  a = p_.args();
  a.rotary_cos.shape[1] = 40;  // rotary_dim 80 > D 64
  a.rotary_sin.shape[1] = 40;
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "rotary_cos");
}

TEST_F(KvCacheBadInput, Options) {
  fa_kvcache_args a = p_.args();
  a.opts.dropout_p = 0.1f;
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "dropout_p");
  a = p_.args();
  a.num_splits = -1;
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "num_splits");
  a = p_.args();
  a.opts.softcap = NAN;
  expect_rejected(a, FA_ERROR_INVALID_ARGUMENT, "softcap");
}

TEST_F(KvCacheBadInput, WorkspaceTooSmall) {
  const fa_kvcache_args a = p_.args();
  size_t bytes = 0;
  ASSERT_EQ(fa_fwd_kvcache_workspace_size(&a, &bytes), FA_OK);
  ASSERT_GT(bytes, 0u);
  std::vector<unsigned char> workspace(bytes);
  EXPECT_EQ(fa_fwd_kvcache(&a, workspace.data(), bytes - 1), FA_ERROR_WORKSPACE_TOO_SMALL);
  EXPECT_TRUE(p_.k_cache.bytes() == k_before_);
  EXPECT_EQ(p_.out.count_poisoned(), p_.out.numel());
}

// The C++ wrapper throws with the status and the message.
TEST(KvCacheWrapper, Throws) {
  flashattn::KvCacheArgs args;
  try {
    flashattn::fwd_kvcache(args);
    FAIL() << "expected an exception";
  } catch (const flashattn::Error& error) {
    EXPECT_EQ(error.status(), FA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(error.what()).find("q"), std::string::npos);
  }
}

}  // namespace
}  // namespace fatest
