// The CUDA backend against the fp64 reference on the shared case list
// (forward and backward, the 2x rule of tests/support), with outputs poisoned
// on the device before every call and the exact workspace the query reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "device_problem.hpp"
#include "support/cases.hpp"
#include "support/checks.hpp"
#include "support/problem.hpp"
#include "support/reference.hpp"

namespace fatest::gpu {
namespace {

std::string param_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

// Runs fa_fwd on the device with a workspace of exactly the queried size.
void run_forward(DeviceMirror& mirror, Problem& p) {
  const fa_fwd_args args = mirror.fwd_args();
  size_t bytes = 0;
  ASSERT_EQ(fa_fwd_workspace_size(&args, &bytes), FA_OK) << fa_last_error();
  DeviceBuffer workspace(bytes);
  ASSERT_EQ(fa_fwd(&args, bytes ? workspace.data : nullptr, bytes), FA_OK) << fa_last_error();
  FA_CUDA_ASSERT(cudaDeviceSynchronize());
  mirror.download(p.out);
  mirror.download(p.lse);
}

void run_backward(DeviceMirror& mirror, Problem& p, bool deterministic) {
  fa_bwd_args args = mirror.bwd_args();
  args.opts.deterministic = deterministic ? 1 : 0;
  size_t bytes = 0;
  ASSERT_EQ(fa_bwd_workspace_size(&args, &bytes), FA_OK) << fa_last_error();
  DeviceBuffer workspace(bytes);
  if (bytes > 0) {
    EXPECT_EQ(fa_bwd(&args, workspace.data, bytes - 1), FA_ERROR_WORKSPACE_TOO_SMALL);
    FA_CUDA_ASSERT(cudaMemset(workspace.data, 0xFF, bytes));  // the backend must not rely on a clean workspace
  }
  ASSERT_EQ(fa_bwd(&args, bytes ? workspace.data : nullptr, bytes), FA_OK) << fa_last_error();
  FA_CUDA_ASSERT(cudaDeviceSynchronize());
  mirror.download(p.dq);
  mirror.download(p.dk);
  mirror.download(p.dv);
}

class GpuForward : public ::testing::TestWithParam<Case> {};
class GpuBackward : public ::testing::TestWithParam<Case> {};

// The forward of one case against the reference, and bit-identical O without LSE.
void check_forward(const Case& c) {
  Problem p = make_problem(c);
  p.poison_outputs();
  DeviceMirror mirror(p);
  run_forward(mirror, p);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(fully_written("out", p.out));
  ASSERT_TRUE(fully_written("lse", p.lse));

  expect_forward_matches_reference(p);

  // Without LSE the output is bit-identical.
  const std::vector<unsigned char> first_out = p.out.bytes();
  p.out.poison();
  mirror.upload(p.out);
  fa_fwd_args args = mirror.fwd_args();
  args.lse = fa_tensor{};
  ASSERT_EQ(fa_fwd(&args, nullptr, 0), FA_OK) << fa_last_error();
  FA_CUDA_ASSERT(cudaDeviceSynchronize());
  mirror.download(p.out);
  EXPECT_TRUE(p.out.bytes() == first_out) << "O changed when LSE was not requested";
}

TEST_P(GpuForward, MatchesReference) {
  FA_GPU_TEST_OR_SKIP();
  check_forward(GetParam());
}

// The same cases with the persistent sm90 forward asked for (FLASHATTN_SM90_PERSISTENT=1):
// on Hopper every case without softcap / ALiBi / dropout runs it (GpuKernelPath
// checks which path that is); elsewhere this repeats GpuForward.
class GpuForwardPersistent : public ::testing::TestWithParam<Case> {};

TEST_P(GpuForwardPersistent, MatchesReference) {
  FA_GPU_TEST_OR_SKIP();
  const ScopedEnv persistent("FLASHATTN_SM90_PERSISTENT", "1");
  check_forward(GetParam());
}

// The cases of head-dim class 64 with one, two and three consumer warpgroups in
// the sm90 forward (FLASHATTN_SM90_FWD_CONSUMERS: 64-, 128- and 192-row tiles;
// the defaults are 1 under a diagonal mask, 3 without), one tile per CTA, and
// two and three also persistent; softcap / ALiBi cases stay on two consumers.
// Elsewhere these repeat GpuForward.
class GpuForwardConsumers : public ::testing::TestWithParam<Case> {
 protected:
  void check_with(const char* consumers, bool also_persistent) {
    const ScopedEnv count("FLASHATTN_SM90_FWD_CONSUMERS", consumers);
    check_forward(GetParam());
    if (HasFatalFailure() || !also_persistent) return;
    const ScopedEnv persistent("FLASHATTN_SM90_PERSISTENT", "1");
    check_forward(GetParam());
  }
};

TEST_P(GpuForwardConsumers, OneMatchesReference) {
  FA_GPU_TEST_OR_SKIP();
  check_with("1", false);  // no persistent kernel with one consumer
}

TEST_P(GpuForwardConsumers, TwoMatchReference) {
  FA_GPU_TEST_OR_SKIP();
  check_with("2", true);
}

TEST_P(GpuForwardConsumers, ThreeMatchReference) {
  FA_GPU_TEST_OR_SKIP();
  check_with("3", true);
}

// The cases of head-dim class 128 with one consumer warpgroup in the sm90
// forward (64-row, 64-key tiles, two CTAs per SM; the default under a
// diagonal mask up to 1k queries, elsewhere two).
class GpuForwardOneConsumer128 : public GpuForwardConsumers {};

TEST_P(GpuForwardOneConsumer128, MatchesReference) {
  FA_GPU_TEST_OR_SKIP();
  check_with("1", false);
}

// Scores that rise key tile after key tile in the order the kernels walk them
// (from the last key tile to the first): K's rows scaled by 1 at the last key
// up to 24 at the first, so the row maxima climb by several log2 units per
// tile and the softmax's reference maximum (kRescaleSlack, sm90/fwd_kernel.cuh)
// is kept over some tiles and moved at others. Every head-dim class, fp16 and
// bf16, with and without a causal mask, one tile per CTA and persistent;
// elsewhere than Hopper the same call twice.
class GpuRescaleSlack : public ::testing::TestWithParam<Case> {};

TEST_P(GpuRescaleSlack, RisingScoresMatchReference) {
  FA_GPU_TEST_OR_SKIP();
  Problem p = make_problem(GetParam());
  const int64_t keys = p.c.Sk, row_elements = p.k.numel() / (p.c.B * keys);
  ASSERT_EQ(p.k.rank(), 4);
  ASSERT_EQ(p.k.shape()[1], keys);
  for (int64_t i = 0; i < p.k.numel(); ++i) {
    const int64_t key = (i / row_elements) % keys;
    p.k.set(i, p.k.get(i) * (1.0 + 23.0 * double(keys - 1 - key) / double(keys - 1)));
  }
  for (const char* persistent : {"0", "1"}) {
    SCOPED_TRACE(std::string("FLASHATTN_SM90_PERSISTENT=") + persistent);
    const ScopedEnv kernel("FLASHATTN_SM90_PERSISTENT", persistent);
    p.poison_outputs();
    DeviceMirror mirror(p);
    run_forward(mirror, p);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(fully_written("out", p.out));
    ASSERT_TRUE(fully_written("lse", p.lse));
    expect_forward_matches_reference(p);
  }
}

std::vector<Case> rising_score_cases() {
  std::vector<Case> cases;
  for (const fa_dtype dtype : {FA_DTYPE_FP16, FA_DTYPE_BF16})
    for (const int64_t d : {64, 128, 256})
      for (const bool causal : {false, true}) {
        Case c;
        c.name = std::string(dtype == FA_DTYPE_FP16 ? "fp16" : "bf16") + "_rising_d" + std::to_string(d) +
                 (causal ? "_causal" : "");
        c.dtype = dtype;
        c.B = 2, c.H = 4, c.Hkv = 2, c.Sq = 300, c.Sk = 3000, c.D = d, c.Dv = d;
        c.causal = causal;
        cases.push_back(c);
      }
  return cases;
}

std::vector<Case> head_dim_cases(std::vector<Case> cases, int64_t above, int64_t up_to) {
  std::vector<Case> kept;
  for (const Case& c : cases)
    if (std::max(c.D, c.Dv) > above && std::max(c.D, c.Dv) <= up_to) kept.push_back(c);
  return kept;
}

std::vector<Case> head_dim_64_cases(std::vector<Case> cases) { return head_dim_cases(std::move(cases), 0, 64); }

TEST_P(GpuBackward, MatchesReference) {
  FA_GPU_TEST_OR_SKIP();
  Problem p = make_problem(GetParam());
  p.poison_outputs();
  DeviceMirror mirror(p);
  run_forward(mirror, p);
  if (HasFatalFailure()) return;
  run_backward(mirror, p, false);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(fully_written("dq", p.dq));
  ASSERT_TRUE(fully_written("dk", p.dk));
  ASSERT_TRUE(fully_written("dv", p.dv));

  const BackwardReference r = backward_reference(p);
  expect_gradients_match_reference(p, r);

  // Deterministic mode: same tolerance.
  p.dq.poison();
  p.dk.poison();
  p.dv.poison();
  for (HostTensor* t : {&p.dq, &p.dk, &p.dv}) mirror.upload(*t);
  run_backward(mirror, p, true);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(within_tolerance("dQ (deterministic)", p.dq.to_vector(), r.ref.dq, r.naive.dq, r.ds_scale));
  EXPECT_TRUE(within_tolerance("dK (deterministic)", p.dk.to_vector(), r.ref.dk, r.naive.dk, r.ds_scale));
  EXPECT_TRUE(within_tolerance("dV (deterministic)", p.dv.to_vector(), r.ref.dv, r.naive.dv, r.scale));
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuForward, ::testing::ValuesIn(gpu_cases(fast_cases())), param_name);
INSTANTIATE_TEST_SUITE_P(Cases, GpuBackward, ::testing::ValuesIn(gpu_cases(fast_cases())), param_name);
INSTANTIATE_TEST_SUITE_P(Cases, GpuForwardPersistent, ::testing::ValuesIn(gpu_cases(fast_cases())), param_name);
INSTANTIATE_TEST_SUITE_P(ManyTiles, GpuForwardPersistent, ::testing::ValuesIn(many_tile_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Cases, GpuForwardConsumers,
                         ::testing::ValuesIn(head_dim_64_cases(gpu_cases(fast_cases()))), param_name);
INSTANTIATE_TEST_SUITE_P(ManyTiles, GpuForwardConsumers, ::testing::ValuesIn(head_dim_64_cases(many_tile_cases())),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Cases, GpuForwardOneConsumer128,
                         ::testing::ValuesIn(head_dim_cases(gpu_cases(fast_cases()), 64, 128)), param_name);
INSTANTIATE_TEST_SUITE_P(ManyTiles, GpuForwardOneConsumer128,
                         ::testing::ValuesIn(head_dim_cases(many_tile_cases(), 64, 128)), param_name);
INSTANTIATE_TEST_SUITE_P(Cases, GpuRescaleSlack, ::testing::ValuesIn(rising_score_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(SlowCases, GpuForward, ::testing::ValuesIn(gpu_cases(slow_cases())), param_name);
INSTANTIATE_TEST_SUITE_P(SlowCases, GpuBackward, ::testing::ValuesIn(gpu_cases(slow_cases())), param_name);

// Deterministic mode: within the 2x rule, and bitwise identical dQ, dK, dV over 20 runs.
class GpuDeterminism : public ::testing::TestWithParam<Case> {};
TEST_P(GpuDeterminism, BitwiseStableOver20Runs) {
  FA_GPU_TEST_OR_SKIP();
  Problem p = make_problem(GetParam());
  DeviceMirror mirror(p);
  run_forward(mirror, p);
  if (HasFatalFailure()) return;
  run_backward(mirror, p, true);
  if (HasFatalFailure()) return;
  expect_gradients_match_reference(p, backward_reference(p));
  const std::vector<unsigned char> dq = p.dq.bytes(), dk = p.dk.bytes(), dv = p.dv.bytes();
  for (int run = 1; run < 20; ++run) {
    for (HostTensor* t : {&p.dq, &p.dk, &p.dv}) {
      t->poison();
      mirror.upload(*t);
    }
    run_backward(mirror, p, true);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(p.dq.bytes() == dq) << "dQ differs in run " << run;
    ASSERT_TRUE(p.dk.bytes() == dk) << "dK differs in run " << run;
    ASSERT_TRUE(p.dv.bytes() == dv) << "dV differs in run " << run;
  }
}

std::vector<Case> determinism_gpu_cases() {
  std::vector<Case> cases = gpu_cases(determinism_cases());
  // A long one: many key tiles add into every query tile, in a fixed order.
  Case c;
  c.name = "bf16_long_gqa_causal_det";
  c.dtype = FA_DTYPE_BF16;
  c.B = 2, c.H = 4, c.Hkv = 2, c.Sq = 1000, c.Sk = 1500, c.D = 128, c.Dv = 128;
  c.causal = true;
  cases.push_back(c);
  // Without a mask the sm90 kernels start each key tile at its own query tile
  // and add into two dQ copies: more query tiles than key tiles, and fewer
  // (several key tiles then start at the same query tile).
  c.name = "bf16_long_gqa_dense_det";
  c.causal = false;
  cases.push_back(c);
  c.name = "fp16_short_q_long_k_dense_det";
  c.dtype = FA_DTYPE_FP16;
  c.B = 1, c.H = 2, c.Hkv = 1, c.Sq = 130, c.Sk = 3000, c.D = 64, c.Dv = 64;
  cases.push_back(c);
  // Under a causal mask the sm90 kernels split the key tiles into two
  // groups, each adding into a dQ copy of its own: varlen with an empty
  // sequence and top-left alignment at class 64, and class 256 (64-key tiles).
  c = Case{};
  c.name = "fp16_long_varlen_topleft_causal_det";
  c.dtype = FA_DTYPE_FP16;
  c.H = 4, c.Hkv = 1, c.D = 64, c.Dv = 64;
  c.seqlens_q = {700, 0, 1500}, c.seqlens_k = {900, 0, 1300};
  c.B = 3, c.Sq = 1500, c.Sk = 1300;
  c.causal = true;
  c.align = FA_ALIGN_TOP_LEFT;
  cases.push_back(c);
  c = Case{};
  c.name = "bf16_long_causal_det_d256";
  c.dtype = FA_DTYPE_BF16;
  c.B = 1, c.H = 2, c.Hkv = 2, c.Sq = 1100, c.Sk = 1100, c.D = 256, c.Dv = 256;
  c.causal = true;
  cases.push_back(c);
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Cases, GpuDeterminism, ::testing::ValuesIn(determinism_gpu_cases()), param_name);

}  // namespace
}  // namespace fatest::gpu
