// The CUDA backend's attention against a KV cache on the shared cache cases
// (fp32 cases run as bf16): O and LSE within the 2x rule of the fp64
// reference on the gathered cache, the appended cache byte for byte, outputs
// poisoned on the device, the exact workspace, and every split count from 1 to
// the maximum agreeing with no split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "device_problem.hpp"
#include "support/kvcache_problem.hpp"

namespace fatest::gpu {
namespace {

std::string param_name(const ::testing::TestParamInfo<KvCase>& info) { return info.param.name; }

std::vector<KvCase> as_gpu(std::vector<KvCase> cases) {
  for (KvCase& c : cases)
    if (c.dtype == FA_DTYPE_FP32) c.dtype = FA_DTYPE_BF16, c.name += "_as_bf16";
  return cases;
}

// Every tensor of the problem in device memory; outputs and caches come back on download().
class KvMirror {
 public:
  explicit KvMirror(KvProblem& p) : p_(p) {
    for (HostTensor* t : all()) {
      if (t->bytes().empty()) continue;
      void* device = nullptr;
      if (cudaMalloc(&device, t->bytes().size()) != cudaSuccess) continue;
      cudaMemcpy(device, t->data(), t->bytes().size(), cudaMemcpyHostToDevice);
      device_of_[t->data()] = device;
    }
  }
  ~KvMirror() {
    for (auto& entry : device_of_) cudaFree(entry.second);
  }
  KvMirror(const KvMirror&) = delete;
  KvMirror& operator=(const KvMirror&) = delete;

  fa_kvcache_args args() const {
    fa_kvcache_args a = p_.args();
    for (fa_tensor* t : {&a.q, &a.k_cache, &a.v_cache, &a.k_new, &a.v_new, &a.cache_seqlens, &a.cache_batch_idx,
                         &a.cache_leftpad, &a.block_table, &a.rotary_cos, &a.rotary_sin, &a.alibi_slopes, &a.out,
                         &a.lse}) {
      if (t->data == nullptr) continue;
      t->data = device_of_.at(t->data);
      t->device = FA_DEVICE_CUDA;
      t->device_index = 0;
    }
    return a;
  }

  void download() {
    for (HostTensor* t : {&p_.out, &p_.lse, &p_.k_cache, &p_.v_cache})
      cudaMemcpy(t->data(), device_of_.at(t->data()), t->bytes().size(), cudaMemcpyDeviceToHost);
  }

  bool complete() const {
    for (HostTensor* t : const_cast<KvMirror*>(this)->all())
      if (!t->bytes().empty() && device_of_.count(t->data()) == 0) return false;
    return true;
  }

 private:
  std::vector<HostTensor*> all() {
    std::vector<HostTensor*> tensors = p_.inputs();
    tensors.push_back(&p_.out);
    tensors.push_back(&p_.lse);
    return tensors;
  }
  KvProblem& p_;
  std::map<const void*, void*> device_of_;
};

void run_on_device(KvProblem& p) {
  KvMirror mirror(p);
  ASSERT_TRUE(mirror.complete()) << "cudaMalloc failed";
  const fa_kvcache_args args = mirror.args();
  size_t bytes = 0;
  ASSERT_EQ(fa_fwd_kvcache_workspace_size(&args, &bytes), FA_OK) << fa_last_error();
  DeviceBuffer workspace(bytes);
  if (bytes > 0) {
    EXPECT_EQ(fa_fwd_kvcache(&args, workspace.data, bytes - 1), FA_ERROR_WORKSPACE_TOO_SMALL);
    FA_CUDA_ASSERT(cudaMemset(workspace.data, 0xFF, bytes));  // no reliance on a clean workspace
  }
  ASSERT_EQ(fa_fwd_kvcache(&args, bytes ? workspace.data : nullptr, bytes), FA_OK) << fa_last_error();
  FA_CUDA_ASSERT(cudaDeviceSynchronize());
  mirror.download();
}

class GpuKvCache : public ::testing::TestWithParam<KvCase> {};

TEST_P(GpuKvCache, MatchesReference) {
  FA_GPU_TEST_OR_SKIP();
  KvProblem p = make_kv_problem(GetParam());
  p.poison_outputs();
  run_on_device(p);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(fully_written("out", p.out));
  if (p.c.with_lse) {
    ASSERT_TRUE(fully_written("lse", p.lse));
  }
  expect_kvcache_matches(p);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuKvCache, ::testing::ValuesIn(as_gpu(kvcache_cases())), param_name);

// Split counts 1 .. 128 (the kernel's maximum) against the reference and against no split.
TEST(GpuKvCacheSplits, EveryCountAgreesWithNoSplit) {
  FA_GPU_TEST_OR_SKIP();
  for (const char* name : {"paged16_bf16_long_decode_gqa4", "contig_fp16_gqa16_chunk7_causal"})
    expect_split_counts_agree(name, {1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 64, 100, 128}, run_on_device);
}

// The decode kernels copy 16-byte chunks of a head: D or Dv not a multiple of 8 is refused by
// name (the shared validator already does, with the value), before anything runs (out stays
// poisoned, the cache unchanged).
TEST(GpuKvCacheErrors, HeadDimNotMultipleOf8) {
  FA_GPU_TEST_OR_SKIP();
  KvCase c = kvcache_case("contig_bf16_decode_noappend");
  ASSERT_EQ(c.name, "contig_bf16_decode_noappend");
  c.D = c.Dv = 60;
  KvProblem p = make_kv_problem(c);
  p.poison_outputs();
  const std::vector<double> cache_before = p.k_cache.to_vector();
  KvMirror mirror(p);
  ASSERT_TRUE(mirror.complete()) << "cudaMalloc failed";
  const fa_kvcache_args args = mirror.args();
  DeviceBuffer workspace(1 << 20);
  EXPECT_NE(fa_fwd_kvcache(&args, workspace.data, 1 << 20), FA_OK);
  const std::string message = fa_last_error();
  EXPECT_NE(message.find("multiple"), std::string::npos) << message;
  EXPECT_NE(message.find("of 8"), std::string::npos) << message;
  EXPECT_NE(message.find("60"), std::string::npos) << message;
  FA_CUDA_ASSERT(cudaDeviceSynchronize());
  mirror.download();
  EXPECT_EQ(p.out.count_poisoned(), p.out.numel()) << "out was written";
  EXPECT_EQ(p.k_cache.to_vector(), cache_before) << "the cache was written";
}

}  // namespace
}  // namespace fatest::gpu
