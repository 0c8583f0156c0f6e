// The CUDA backend's attention against a KV cache on the shared cache cases
// (fp32 cases run as bf16): O and LSE within the 2x rule of the fp64
// reference on the gathered cache, the appended cache byte for byte, outputs
// poisoned on the device, the exact workspace, every split count from 1 to
// the maximum agreeing with no split, consecutive calls in a CUDA graph, and a
// call right after a kernel that writes its inputs late.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <string>

#include "device_problem.hpp"
#include "late_writer.hpp"
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
  // The host outputs (e.g. poisoned again) to the device, landed before work on any stream starts
  // (a copy from pageable memory may return before its DMA ends).
  void upload_outputs() {
    for (HostTensor* t : {&p_.out, &p_.lse})
      cudaMemcpy(device_of_.at(t->data()), t->data(), t->bytes().size(), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
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

// The case on the device, its outputs poisoned first: every element written, O and LSE within the
// 2x rule, the appended cache byte for byte.
void expect_case_matches(const KvCase& c) {
  KvProblem p = make_kv_problem(c);
  p.poison_outputs();
  run_on_device(p);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(fully_written("out", p.out));
  if (p.c.with_lse) {
    ASSERT_TRUE(fully_written("lse", p.lse));
  }
  expect_kvcache_matches(p);
}

class GpuKvCache : public ::testing::TestWithParam<KvCase> {};

TEST_P(GpuKvCache, MatchesReference) {
  FA_GPU_TEST_OR_SKIP();
  expect_case_matches(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuKvCache, ::testing::ValuesIn(as_gpu(kvcache_cases())), param_name);

// Split counts 1 .. 128 (the kernel's maximum) against the reference and against no split.
TEST(GpuKvCacheSplits, EveryCountAgreesWithNoSplit) {
  FA_GPU_TEST_OR_SKIP();
  for (const char* name : {"paged16_bf16_long_decode_gqa4", "contig_fp16_gqa16_chunk7_causal"})
    expect_split_counts_agree(name, {1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 64, 100, 128}, run_on_device);
}

// Every shared case, and each with 4 splits, run with the environment variable `name` set to
// `baseline` and again set to `variant`: the same bytes of out, lse and the appended cache.
void expect_cases_agree_bitwise(const char* name, const char* baseline, const char* variant) {
  auto run_with = [&](const KvCase& c, const char* value) {
    KvProblem p = make_kv_problem(c);
    p.poison_outputs();
    const ScopedEnv setting(name, value);
    run_on_device(p);
    return p;
  };
  int compared = 0;
  for (const KvCase& shared : as_gpu(kvcache_cases())) {
    if (shared.slow) continue;
    for (int32_t splits : {shared.num_splits, 4}) {
      SCOPED_TRACE(shared.name + " num_splits " + std::to_string(splits) + ", " + name + "=" + variant);
      KvCase c = shared;
      c.num_splits = splits;
      const KvProblem expected = run_with(c, baseline);
      if (::testing::Test::HasFatalFailure()) return;
      const KvProblem actual = run_with(c, variant);
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_TRUE(actual.out.bytes() == expected.out.bytes());
      EXPECT_TRUE(actual.lse.bytes() == expected.lse.bytes());
      EXPECT_TRUE(actual.k_cache.bytes() == expected.k_cache.bytes());
      ++compared;
    }
  }
  EXPECT_GT(compared, 0) << "no case in the shared list";
}

// The ring's depth (compact: the one for sm_86/sm_89 at hdim 128) changes how many slabs are in
// flight, not the order of the arithmetic.
TEST(GpuKvCacheRing, RingsAgreeBitwise) {
  FA_GPU_TEST_OR_SKIP();
  expect_cases_agree_bitwise("FLASHATTN_DECODE_RING", "standard", "compact");
}

// The L2's 256-byte fetch (the contiguous walk's, on grids of more blocks than SMs where the DRAM is
// below 4 TB/s) changes what the L2 asks of the DRAM, not the bytes a copy brings: every case forced
// wide against every case forced to the sectors.
TEST(GpuKvCacheFetch, WideFetchAgreesBitwise) {
  FA_GPU_TEST_OR_SKIP();
  expect_cases_agree_bitwise("FLASHATTN_DECODE_FETCH", "sector", "wide");
}

// A shared case with 4 splits (the combine runs; the short case gets the 2 its keys allow) on a
// stream of its own, called once eagerly and checked against the reference. The tests below make
// the same call in other ways and expect that call's bytes of out, lse and the appended cache.
class EagerCall {
 public:
  EagerCall() = default;
  EagerCall(const EagerCall&) = delete;
  EagerCall& operator=(const EagerCall&) = delete;
  ~EagerCall() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  void run(const char* name) {
    KvCase c = kvcache_case(name);
    ASSERT_EQ(c.name, name);
    c.num_splits = 4;
    problem_ = std::make_unique<KvProblem>(make_kv_problem(c));
    problem_->poison_outputs();
    mirror_ = std::make_unique<KvMirror>(*problem_);
    ASSERT_TRUE(mirror_->complete()) << "cudaMalloc failed";
    FA_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    args_ = mirror_->args();
    args_.opts.stream = stream_;
    ASSERT_EQ(fa_fwd_kvcache_workspace_size(&args_, &bytes_), FA_OK) << fa_last_error();
    workspace_ = std::make_unique<DeviceBuffer>(bytes_);
    FA_CUDA_ASSERT(cudaDeviceSynchronize());  // the mirror's copies have landed
    ASSERT_EQ(call(), FA_OK) << fa_last_error();
    FA_CUDA_ASSERT(cudaStreamSynchronize(stream_));
    mirror_->download();
    expect_kvcache_matches(*problem_);
    out_ = problem_->out.bytes();
    lse_ = problem_->lse.bytes();
    k_cache_ = problem_->k_cache.bytes();
  }
  fa_status call() { return fa_fwd_kvcache(&args_, workspace_->data, bytes_); }
  // out and lse poisoned again, on the host and the device, before the next call.
  void poison_outputs() {
    problem_->poison_outputs();
    mirror_->upload_outputs();
  }
  void expect_same(const std::string& what) {
    mirror_->download();
    EXPECT_TRUE(problem_->out.bytes() == out_) << what;
    EXPECT_TRUE(problem_->lse.bytes() == lse_) << what;
    EXPECT_TRUE(problem_->k_cache.bytes() == k_cache_) << what;
  }
  KvProblem& problem() { return *problem_; }
  const fa_kvcache_args& args() const { return args_; }
  cudaStream_t stream() const { return stream_; }

 private:
  std::unique_ptr<KvProblem> problem_;
  std::unique_ptr<KvMirror> mirror_;
  cudaStream_t stream_ = nullptr;
  fa_kvcache_args args_{};
  size_t bytes_ = 0;
  std::unique_ptr<DeviceBuffer> workspace_;
  std::vector<unsigned char> out_, lse_, k_cache_;
};

// body(eager) for a paged case with append and a contiguous one without, each called eagerly first.
template <class Body>
void for_each_eager_call(Body body) {
  for (const char* name : {"paged16_bf16_long_decode_gqa4", "contig_bf16_decode_noappend"}) {
    SCOPED_TRACE(name);
    EagerCall eager;
    eager.run(name);
    if (::testing::Test::HasFatalFailure()) return;
    body(eager);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Three consecutive calls captured in a CUDA graph replay to the bytes of one eager call, and so
// does an eager call in plain stream order: on sm_90 the decode kernels are programmatic dependent
// launches (kvcache_launch.cuh), which capture turns into programmatic edges, and
// FLASHATTN_DECODE_PDL=0 turns them off. The append writes the same rows on every call
// (cache_seqlens are inputs), so every call sees the same cache.
TEST(GpuKvCacheGraph, ConsecutiveCallsReplayEager) {
  FA_GPU_TEST_OR_SKIP();
  for_each_eager_call([](EagerCall& eager) {
    {
      const ScopedEnv plain("FLASHATTN_DECODE_PDL", "0");
      eager.poison_outputs();
      ASSERT_EQ(eager.call(), FA_OK) << fa_last_error();
      FA_CUDA_ASSERT(cudaStreamSynchronize(eager.stream()));
      eager.expect_same("plain stream order");
    }
    cudaGraph_t graph = nullptr;
    FA_CUDA_ASSERT(cudaStreamBeginCapture(eager.stream(), cudaStreamCaptureModeGlobal));
    fa_status status = FA_OK;
    for (int call = 0; call < 3 && status == FA_OK; ++call) status = eager.call();
    const std::string message = fa_last_error();
    FA_CUDA_ASSERT(cudaStreamEndCapture(eager.stream(), &graph));
    ASSERT_EQ(status, FA_OK) << message;
    cudaGraphExec_t exec = nullptr;
    FA_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      eager.poison_outputs();
      FA_CUDA_ASSERT(cudaGraphLaunch(exec, eager.stream()));
      FA_CUDA_ASSERT(cudaStreamSynchronize(eager.stream()));
      eager.expect_same("replay " + std::to_string(replay));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  });
}

// On sm_90 every decode kernel is a programmatic dependent launch, the call's first one too
// (kvcache_launch.cuh): it may start while the stream's previous kernel runs, and must wait for it
// before its first global read. Here that previous kernel lets it start at once and then, 200 us
// later, writes the call's inputs: before, the device holds NaN queries and new rows and zero cache
// lengths. The call must give the bytes of an eager call on the real inputs (out, lse and the
// appended cache). Below sm_90 the launches are in plain stream order and this holds trivially.
TEST(GpuKvCacheEarlyLaunch, WaitsForThePreviousKernelsWrites) {
  FA_GPU_TEST_OR_SKIP();
  for_each_eager_call([](EagerCall& eager) {
    struct Input {
      const HostTensor& host;
      void* device;
      int poison_byte;
    };
    KvProblem& p = eager.problem();
    const fa_kvcache_args& args = eager.args();
    const Input inputs[] = {{p.q, args.q.data, 0xFF},
                            {p.cache_seqlens, args.cache_seqlens.data, 0},
                            {p.k_new, args.k_new.data, 0xFF},
                            {p.v_new, args.v_new.data, 0xFF}};
    static_assert(std::size(inputs) <= kMaxLateCopies, "one region per input");
    std::vector<std::unique_ptr<DeviceBuffer>> real_inputs;
    LateCopy copies[kMaxLateCopies];
    int regions = 0;
    for (const Input& input : inputs) {
      const size_t size = input.host.bytes().size();
      if (input.device == nullptr || size == 0) continue;
      real_inputs.push_back(std::make_unique<DeviceBuffer>(size));
      FA_CUDA_ASSERT(cudaMemcpy(real_inputs.back()->data, input.device, size, cudaMemcpyDeviceToDevice));
      FA_CUDA_ASSERT(cudaMemset(input.device, input.poison_byte, size));
      copies[regions++] = {input.device, real_inputs.back()->data, size};
    }
    ASSERT_GE(regions, 2) << "q and cache_seqlens at least";
    eager.poison_outputs();  // synchronizes the device: the poison has landed
    FA_CUDA_ASSERT(launch_late_copies(copies, 200'000, eager.stream()));
    ASSERT_EQ(eager.call(), FA_OK) << fa_last_error();
    FA_CUDA_ASSERT(cudaStreamSynchronize(eager.stream()));
    eager.expect_same("after a kernel that writes the inputs late");
  });
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
