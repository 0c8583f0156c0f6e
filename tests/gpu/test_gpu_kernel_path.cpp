// Which kernel family the dispatcher picks (fa_fwd_kernel_path, fa_bwd_kernel_path): on
// compute capability 9.0 with the Hopper kernels built, every case of the
// shared list runs the sm90 path except dropout (and problems without keys),
// which fall back to sm80; elsewhere everything runs sm80. The forward tests of
// test_gpu_attention.cpp then check the numbers of whichever path this is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>

#include "device_problem.hpp"
#include "support/cases.hpp"
#include "support/problem.hpp"

#ifndef FA_TEST_SM90_BUILT
#define FA_TEST_SM90_BUILT 0
#endif

namespace fatest::gpu {
namespace {

int64_t total_keys(const Case& c) {
  if (c.varlen()) return std::accumulate(c.seqlens_k.begin(), c.seqlens_k.end(), int64_t(0));
  return c.B * c.Sk;
}
int64_t total_queries(const Case& c) {
  if (c.varlen()) return std::accumulate(c.seqlens_q.begin(), c.seqlens_q.end(), int64_t(0));
  return c.B * c.Sq;
}

TEST(GpuKernelPath, SharedCasesRunSm90OnHopperDropoutFallsBack) {
  FA_GPU_TEST_OR_SKIP();
  const char* forced = std::getenv("FLASHATTN_CUDA_FWD");
  if (forced != nullptr && std::string(forced) == "sm80") GTEST_SKIP() << "FLASHATTN_CUDA_FWD=sm80 forces the sm80 path";
  const bool hopper = compute_capability() == 90 && FA_TEST_SM90_BUILT;
  int sm90 = 0, sm80 = 0, dropout_cases = 0;
  for (const Case& c : gpu_cases(fast_cases())) {
    Problem p = make_problem(c);
    DeviceMirror mirror(p);
    const fa_fwd_args args = mirror.fwd_args();
    const char* path = fa_fwd_kernel_path(&args);
    ASSERT_NE(path, nullptr) << c.name << ": " << fa_last_error();
    const bool expect_sm90 = hopper && c.dropout == 0.0f && total_keys(c) > 0 && total_queries(c) > 0;
    if (expect_sm90) {  // one tile per CTA or persistent (FLASHATTN_SM90_PERSISTENT; see the tests below)
      EXPECT_TRUE(std::string(path) == "cuda-sm90" || std::string(path) == "cuda-sm90-persistent")
          << c.name << ": " << path;
    } else {
      EXPECT_STREQ(path, "cuda-sm80") << c.name;
    }
    (std::string(path) == "cuda-sm80" ? sm80 : sm90) += 1;
    dropout_cases += c.dropout > 0.0f;
  }
  std::printf("forward kernel path over the shared case list: %d cuda-sm90, %d cuda-sm80 (%d dropout cases)\n", sm90,
              sm80, dropout_cases);
  if (hopper) {
    EXPECT_GT(sm90, 0);
    EXPECT_GT(dropout_cases, 0) << "the case list should exercise the dropout fallback";
  }
}

// FLASHATTN_SM90_PERSISTENT=1 selects the persistent sm90 forward for every
// shared case the sm90 path serves, except softcap and ALiBi (their kernels
// run schedule v1, one tile per CTA); =0 selects one tile per CTA.
TEST(GpuKernelPath, PersistentSwitchSelectsThePersistentForward) {
  FA_GPU_TEST_OR_SKIP();
  const char* forced = std::getenv("FLASHATTN_CUDA_FWD");
  if (forced != nullptr && std::string(forced) == "sm80") GTEST_SKIP() << "FLASHATTN_CUDA_FWD=sm80 forces the sm80 path";
  const char* schedule = std::getenv("FLASHATTN_SM90_SCHEDULE");
  const bool schedule_v1 = schedule != nullptr && std::string(schedule) == "v1";
  if (compute_capability() != 90 || !FA_TEST_SM90_BUILT) GTEST_SKIP() << "needs the sm90 forward on compute capability 9.0";
  int persistent = 0;
  for (const Case& c : gpu_cases(fast_cases())) {
    Problem p = make_problem(c);
    DeviceMirror mirror(p);
    const fa_fwd_args args = mirror.fwd_args();
    const bool sm90 = c.dropout == 0.0f && total_keys(c) > 0 && total_queries(c) > 0;
    const bool extras = c.softcap > 0.0f || c.alibi != Alibi::kNone;
    {
      const ScopedEnv on("FLASHATTN_SM90_PERSISTENT", "1");
      const char* path = fa_fwd_kernel_path(&args);
      ASSERT_NE(path, nullptr) << c.name << ": " << fa_last_error();
      const char* expected = !sm90 ? "cuda-sm80" : extras || schedule_v1 ? "cuda-sm90" : "cuda-sm90-persistent";
      EXPECT_STREQ(path, expected) << c.name;
      persistent += std::string(path) == "cuda-sm90-persistent";
    }
    const ScopedEnv off("FLASHATTN_SM90_PERSISTENT", "0");
    const char* path = fa_fwd_kernel_path(&args);
    ASSERT_NE(path, nullptr) << c.name << ": " << fa_last_error();
    EXPECT_STREQ(path, sm90 ? "cuda-sm90" : "cuda-sm80") << c.name;
  }
  std::printf("shared cases on the persistent sm90 forward with FLASHATTN_SM90_PERSISTENT=1: %d\n", persistent);
  if (!schedule_v1) {
    EXPECT_GT(persistent, 0);
  }
}

// Without FLASHATTN_SM90_PERSISTENT the persistent forward runs where it
// measured faster: without a mask at head-dim class 64 at every length, class
// 128 (D up to 128 above 64) up to 8,192, class 256 from 2,049 on; one tile per
// CTA under every diagonal mask, elsewhere, and wherever a consumer count is
// asked for.
TEST(GpuKernelPath, PersistentByDefaultWhereItMeasuredFaster) {
  FA_GPU_TEST_OR_SKIP();
  if (compute_capability() != 90 || !FA_TEST_SM90_BUILT) GTEST_SKIP() << "needs the sm90 forward on compute capability 9.0";
  for (const char* name : {"FLASHATTN_CUDA_FWD", "FLASHATTN_SM90_PERSISTENT", "FLASHATTN_SM90_SCHEDULE",
                           "FLASHATTN_SM90_FWD_CONSUMERS"})
    if (std::getenv(name) != nullptr) GTEST_SKIP() << name << " is set: it overrides the default";
  struct Shape {
    int64_t D, Sq, Sk;
    bool causal;
    int32_t window_left;
    const char* expected;
  };
  const Shape shapes[] = {
      {128, 256, 1024, false, -1, "cuda-sm90-persistent"},  {96, 256, 300, false, -1, "cuda-sm90-persistent"},
      {128, 256, 8193, false, -1, "cuda-sm90"},             {128, 256, 1024, true, -1, "cuda-sm90"},
      {128, 256, 8192, false, -1, "cuda-sm90-persistent"},
      {128, 256, 512, false, 64, "cuda-sm90"},              {64, 256, 4096, false, -1, "cuda-sm90-persistent"},
      {64, 256, 16384, false, -1, "cuda-sm90-persistent"},              {64, 256, 1024, true, -1, "cuda-sm90"},
      {256, 256, 2048, false, -1, "cuda-sm90"},             {256, 256, 2049, false, -1, "cuda-sm90-persistent"},
      {256, 256, 4096, true, -1, "cuda-sm90"},              {128, 1025, 1025, true, -1, "cuda-sm90"},
      {128, 1024, 4096, true, -1, "cuda-sm90"},             {128, 2048, 8192, true, -1, "cuda-sm90"},
      {128, 2048, 8193, true, -1, "cuda-sm90"},             {128, 2048, 4096, true, 512, "cuda-sm90"},
  };
  for (const Shape& shape : shapes) {
    Case c;
    c.name = "path_probe";
    c.dtype = FA_DTYPE_BF16;
    c.B = 2;
    c.H = 4;
    c.Hkv = 2;
    c.Sq = shape.Sq;
    c.Sk = shape.Sk;
    c.D = c.Dv = shape.D;
    c.causal = shape.causal;
    c.window_left = shape.window_left;
    if (shape.window_left >= 0) c.window_right = 0;
    Problem p = make_problem(c);
    DeviceMirror mirror(p);
    const fa_fwd_args args = mirror.fwd_args();
    const char* path = fa_fwd_kernel_path(&args);
    ASSERT_NE(path, nullptr) << fa_last_error();
    EXPECT_STREQ(path, shape.expected) << "D " << shape.D << ", Sq " << shape.Sq << ", Sk " << shape.Sk
                                       << (shape.causal ? ", causal" : "")
                                       << ", window_left " << shape.window_left;
    if (std::string(shape.expected) == "cuda-sm90-persistent") {
      const ScopedEnv one("FLASHATTN_SM90_FWD_CONSUMERS", "2");
      EXPECT_STREQ(fa_fwd_kernel_path(&args), "cuda-sm90") << "a consumer count asked for keeps one tile per CTA";
    }
  }
}

// The persistent forward computes every tile exactly as one tile per CTA does
// (same GEMMs, same order of key tiles, same rounding); only who runs the tile
// and how O reaches memory differ. So O and LSE must be bit-identical, on
// problems of many more tiles than SMs (the CTAs loop). Both with two consumer
// warpgroups: the one-consumer kernel of hdim 128 (the default there for short
// causal rows) takes 64-key tiles, which round differently.
TEST(GpuKernelPath, PersistentForwardBitIdenticalToOneTilePerCta) {
  FA_GPU_TEST_OR_SKIP();
  if (compute_capability() != 90 || !FA_TEST_SM90_BUILT) GTEST_SKIP() << "needs the sm90 forward on compute capability 9.0";
  const char* forced = std::getenv("FLASHATTN_CUDA_FWD");
  if (forced != nullptr && std::string(forced) == "sm80") GTEST_SKIP() << "FLASHATTN_CUDA_FWD=sm80 forces the sm80 path";
  const char* schedule = std::getenv("FLASHATTN_SM90_SCHEDULE");
  if (schedule != nullptr && std::string(schedule) == "v1") GTEST_SKIP() << "schedule v1 has no persistent kernel";
  const ScopedEnv two_consumers("FLASHATTN_SM90_FWD_CONSUMERS", "2");
  for (const Case& c : many_tile_cases()) {
    Problem p = make_problem(c);
    p.poison_outputs();
    DeviceMirror mirror(p);
    const fa_fwd_args args = mirror.fwd_args();
    std::vector<unsigned char> out[2], lse[2];
    for (int persistent = 0; persistent < 2; ++persistent) {
      const ScopedEnv env("FLASHATTN_SM90_PERSISTENT", persistent ? "1" : "0");
      const char* path = fa_fwd_kernel_path(&args);
      ASSERT_NE(path, nullptr) << c.name << ": " << fa_last_error();
      EXPECT_STREQ(path, persistent ? "cuda-sm90-persistent" : "cuda-sm90") << c.name;
      p.out.poison();
      p.lse.poison();
      mirror.upload(p.out);
      mirror.upload(p.lse);
      ASSERT_EQ(fa_fwd(&args, nullptr, 0), FA_OK) << c.name << ": " << fa_last_error();
      FA_CUDA_ASSERT(cudaDeviceSynchronize());
      mirror.download(p.out);
      mirror.download(p.lse);
      out[persistent] = p.out.bytes();
      lse[persistent] = p.lse.bytes();
    }
    EXPECT_TRUE(out[0] == out[1]) << c.name << ": O differs between the persistent and the one-tile-per-CTA forward";
    EXPECT_TRUE(lse[0] == lse[1]) << c.name << ": LSE differs between the persistent and the one-tile-per-CTA forward";
  }
}

// The backward: sm90 for head dims up to 256 without softcap, ALiBi or
// dropout; everything else (and every case off Hopper) on sm80. The backward
// tests of test_gpu_attention.cpp then check whichever path this is.
TEST(GpuKernelPath, BackwardRunsSm90WithoutExtras) {
  FA_GPU_TEST_OR_SKIP();
  const char* forced = std::getenv("FLASHATTN_CUDA_BWD");
  if (forced != nullptr) GTEST_SKIP() << "FLASHATTN_CUDA_BWD=" << forced << " forces a path";
  const bool hopper = compute_capability() == 90 && FA_TEST_SM90_BUILT;
  int sm90 = 0, sm80 = 0;
  for (const Case& c : gpu_cases(fast_cases())) {
    Problem p = make_problem(c);
    DeviceMirror mirror(p);
    const fa_bwd_args args = mirror.bwd_args();
    const char* path = fa_bwd_kernel_path(&args);
    ASSERT_NE(path, nullptr) << c.name << ": " << fa_last_error();
    const bool extras = c.dropout > 0.0f || c.softcap > 0.0f || c.alibi != Alibi::kNone;
    const int64_t head_dim = std::max(c.D, c.Dv);
    const bool expect_sm90 =
        hopper && !extras && head_dim <= 256 && total_keys(c) > 0 && total_queries(c) > 0;
    EXPECT_STREQ(path, expect_sm90 ? "cuda-sm90" : "cuda-sm80") << c.name;
    (std::string(path) == "cuda-sm90" ? sm90 : sm80) += 1;
  }
  std::printf("backward kernel path over the shared case list: %d cuda-sm90, %d cuda-sm80\n", sm90, sm80);
  if (hopper) {
    EXPECT_GT(sm90, 0);
    EXPECT_GT(sm80, 0) << "the case list should exercise the sm80 fallback";
  }
}

TEST(GpuKernelPath, CpuTensorsReportCpuAndBadArgumentsNull) {
  Case c;
  c.name = "path_cpu";
  c.dtype = FA_DTYPE_FP32;
  c.B = 1, c.H = 2, c.Hkv = 1, c.Sq = 5, c.Sk = 7, c.D = 64, c.Dv = 64;
  Problem p = make_problem(c);
  const fa_fwd_args args = p.fwd_args();
  const char* path = fa_fwd_kernel_path(&args);
  ASSERT_NE(path, nullptr) << fa_last_error();
  EXPECT_STREQ(path, "cpu");
  EXPECT_EQ(fa_fwd_kernel_path(nullptr), nullptr);
  EXPECT_EQ(fa_bwd_kernel_path(nullptr), nullptr);
  EXPECT_NE(std::string(fa_last_error()).find("args"), std::string::npos) << fa_last_error();
}

}  // namespace
}  // namespace fatest::gpu
