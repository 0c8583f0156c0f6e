// GPU-only properties: the dropout keep-mask equals the CPU mapping element
// for element, bad input on GPU tensors fails with the CPU path's messages,
// graph capture works with a caller workspace (a dropout seed read from device
// memory changes per replay), and a small subset for
// compute-sanitizer (GpuSanitizer.*).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/half.hpp"
#include "device_problem.hpp"
#include "support/cases.hpp"
#include "support/problem.hpp"

namespace fatest::gpu {
namespace {

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> out(n);
  for (auto& x : out) x = flashattn::float_to_bf16(normal(rng));
  return out;
}

template <typename V>
void* to_device(const V& host) {
  void* device = nullptr;
  if (cudaMalloc(&device, host.size() * sizeof(host[0]) + 16) != cudaSuccess) return nullptr;
  cudaMemcpy(device, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice);
  return device;
}

fa_tensor device_tensor(void* data, fa_dtype dtype, std::vector<int64_t> shape) {
  fa_tensor t = fa_tensor_contiguous(data, dtype, FA_DEVICE_CUDA, static_cast<int32_t>(shape.size()), shape.data());
  return t;
}

// V = identity (Sk = Dv): O[i, j] = P[i, j] * keep(i, j) / (1 - p), so O == 0
// exactly where the kernel dropped (b, h, i, j), and the mask can be read off.
void check_dropout_mask(const std::vector<int32_t>& seqlens_q, const std::vector<int32_t>& seqlens_k, bool varlen) {
  const int64_t H = 3, Hkv = 1, D = 64, Dv = 128, B = static_cast<int64_t>(seqlens_q.size());
  const float p = 0.3f;
  const uint64_t seed = 0x0123456789ABCDEFull, offset = (uint64_t(7) << 32) + 12345;
  int64_t Sq = 0, Sk = 0, Tq = 0, Tk = 0;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (size_t b = 0; b < seqlens_q.size(); ++b) {
    Sq = std::max<int64_t>(Sq, seqlens_q[b]);
    Sk = std::max<int64_t>(Sk, seqlens_k[b]);
    Tq += seqlens_q[b];
    Tk += seqlens_k[b];
    cu_q.push_back(static_cast<int32_t>(Tq));
    cu_k.push_back(static_cast<int32_t>(Tk));
  }
  ASSERT_LE(Sk, Dv);
  std::mt19937_64 rng(42);
  const std::vector<uint16_t> q = random_bf16(Tq * H * D, rng), k = random_bf16(Tk * Hkv * D, rng);
  std::vector<uint16_t> v(Tk * Hkv * Dv, 0);
  for (size_t b = 0; b < seqlens_k.size(); ++b)
    for (int64_t j = 0; j < seqlens_k[b]; ++j) v[(cu_k[b] + j) * Dv + j] = flashattn::float_to_bf16(1.0f);
  std::vector<uint16_t> o(Tq * H * Dv, 0xFFFF);
  void *dq = to_device(q), *dk = to_device(k), *dv = to_device(v), *dO = to_device(o);
  void *dcu_q = to_device(cu_q), *dcu_k = to_device(cu_k);

  fa_fwd_args args;
  fa_fwd_args_init(&args);
  if (varlen) {
    args.q = device_tensor(dq, FA_DTYPE_BF16, {Tq, H, D});
    args.k = device_tensor(dk, FA_DTYPE_BF16, {Tk, Hkv, D});
    args.v = device_tensor(dv, FA_DTYPE_BF16, {Tk, Hkv, Dv});
    args.out = device_tensor(dO, FA_DTYPE_BF16, {Tq, H, Dv});
    args.cu_seqlens_q = device_tensor(dcu_q, FA_DTYPE_INT32, {B + 1});
    args.cu_seqlens_k = device_tensor(dcu_k, FA_DTYPE_INT32, {B + 1});
    args.max_seqlen_q = static_cast<int32_t>(Sq);
    args.max_seqlen_k = static_cast<int32_t>(Sk);
  } else {
    args.q = device_tensor(dq, FA_DTYPE_BF16, {B, Sq, H, D});
    args.k = device_tensor(dk, FA_DTYPE_BF16, {B, Sk, Hkv, D});
    args.v = device_tensor(dv, FA_DTYPE_BF16, {B, Sk, Hkv, Dv});
    args.out = device_tensor(dO, FA_DTYPE_BF16, {B, Sq, H, Dv});
  }
  args.opts.softmax_scale = 0.05f;  // flat scores: no kept probability underflows to 0
  args.opts.dropout_p = p;
  args.opts.dropout_seed = seed;
  args.opts.dropout_offset = offset;
  ASSERT_EQ(fa_fwd(&args, nullptr, 0), FA_OK) << fa_last_error();
  ASSERT_EQ(cudaMemcpy(o.data(), dO, o.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t mismatches = 0, kept = 0, total = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < seqlens_q[b]; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < seqlens_k[b]; ++j) {
          const int64_t row = cu_q[b] + i;
          const float value = flashattn::bf16_to_float(o[(row * H + h) * Dv + j]);
          const bool gpu_keep = value != 0.0f;
          const bool cpu_keep = fa_dropout_keep(seed, offset, b, h, H, i, j, p) != 0;
          mismatches += gpu_keep != cpu_keep;
          kept += cpu_keep;
          ++total;
        }
  EXPECT_EQ(mismatches, 0) << "of " << total << " elements";
  EXPECT_NEAR(double(kept) / double(total), 1.0 - p, 0.02);
  for (void* ptr : {dq, dk, dv, dO, dcu_q, dcu_k}) cudaFree(ptr);
}

TEST(GpuDropout, MaskEqualsCpuMappingDense) {
  FA_GPU_TEST_OR_SKIP();
  check_dropout_mask({77, 77}, {128, 128}, false);
}

TEST(GpuDropout, MaskEqualsCpuMappingVarlen) {
  FA_GPU_TEST_OR_SKIP();
  check_dropout_mask({33, 0, 130, 5}, {100, 7, 128, 0}, true);
}

// Same status and message for the same bad argument on CPU and GPU tensors.
TEST(GpuBadInput, SameErrorsAsCpu) {
  FA_GPU_TEST_OR_SKIP();
  Case c = all_cases()[2];  // bf16
  c.dtype = FA_DTYPE_BF16;
  Problem p = make_problem(c);
  DeviceMirror mirror(p);
  struct Mutation {
    const char* what;
    void (*apply)(fa_fwd_args&);
  };
  const Mutation mutations[] = {
      {"head dim 12", [](fa_fwd_args& a) { a.q.shape[3] = 12; }},
      {"k shape", [](fa_fwd_args& a) { a.k.shape[1] += 1; }},
      {"window", [](fa_fwd_args& a) { a.opts.window_left = -5; }},
      {"dropout", [](fa_fwd_args& a) { a.opts.dropout_p = 1.0f; }},
      {"stride", [](fa_fwd_args& a) { a.v.strides[3] = 2; }},
      {"null out", [](fa_fwd_args& a) { a.out.data = nullptr; }},
      {"out dtype", [](fa_fwd_args& a) { a.out.dtype = FA_DTYPE_FP16; }},
  };
  for (const Mutation& m : mutations) {
    fa_fwd_args cpu = p.fwd_args(), gpu = mirror.fwd_args();
    m.apply(cpu);
    m.apply(gpu);
    const fa_status cpu_status = fa_fwd(&cpu, nullptr, 0);
    const std::string cpu_message = fa_last_error();
    const fa_status gpu_status = fa_fwd(&gpu, nullptr, 0);
    const std::string gpu_message = fa_last_error();
    EXPECT_EQ(cpu_status, gpu_status) << m.what;
    EXPECT_NE(cpu_status, FA_OK) << m.what;
    EXPECT_EQ(cpu_message, gpu_message) << m.what;
  }
  // A CPU tensor next to GPU ones.
  fa_fwd_args mixed = mirror.fwd_args();
  mixed.k = p.fwd_args().k;
  EXPECT_EQ(fa_fwd(&mixed, nullptr, 0), FA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa_last_error()).find("expected the device of q"), std::string::npos) << fa_last_error();
  // Misaligned rows: a clear CUDA-specific refusal.
  fa_fwd_args misaligned = mirror.fwd_args();
  misaligned.q.data = static_cast<char*>(misaligned.q.data) + 2;
  EXPECT_EQ(fa_fwd(&misaligned, nullptr, 0), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fa_last_error()).find("16-byte aligned"), std::string::npos) << fa_last_error();
}

TEST(GpuBadInput, Fp32IsNotSupportedOnCuda) {
  FA_GPU_TEST_OR_SKIP();
  Case c = all_cases()[0];
  ASSERT_EQ(c.dtype, FA_DTYPE_FP32);
  Problem p = make_problem(c);
  DeviceMirror mirror(p);
  const fa_fwd_args args = mirror.fwd_args();
  EXPECT_EQ(fa_fwd(&args, nullptr, 0), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fa_last_error()).find("not supported on CUDA"), std::string::npos) << fa_last_error();
  size_t bytes = 0;
  EXPECT_EQ(fa_fwd_workspace_size(&args, &bytes), FA_ERROR_UNSUPPORTED);
  const fa_bwd_args bargs = mirror.bwd_args();
  EXPECT_EQ(fa_bwd(&bargs, nullptr, 0), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fa_last_error()).find("not supported on CUDA"), std::string::npos) << fa_last_error();
}

// fwd then bwd, with the caller's workspaces, captured on stream into an
// executable graph. An eager call must come first: it sets the kernels'
// shared-memory attributes, and capture records launches only.
::testing::AssertionResult capture_fwd_bwd(cudaStream_t stream, const fa_fwd_args& fwd, const DeviceBuffer& fwd_ws,
                                           const fa_bwd_args& bwd, const DeviceBuffer& bwd_ws, cudaGraphExec_t* exec) {
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess)
    return ::testing::AssertionFailure() << "cudaStreamBeginCapture failed";
  const fa_status fwd_status = fa_fwd(&fwd, fwd_ws.data, fwd_ws.bytes);
  const std::string fwd_message = fa_last_error();
  const fa_status bwd_status = fa_bwd(&bwd, bwd_ws.data, bwd_ws.bytes);
  const std::string bwd_message = fa_last_error();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (fwd_status != FA_OK) return ::testing::AssertionFailure() << "fa_fwd under capture: " << fwd_message;
  if (bwd_status != FA_OK) return ::testing::AssertionFailure() << "fa_bwd under capture: " << bwd_message;
  if (end != cudaSuccess) return ::testing::AssertionFailure() << "cudaStreamEndCapture: " << cudaGetErrorString(end);
  const cudaError_t instantiated = cudaGraphInstantiate(exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph does not need it
  if (instantiated != cudaSuccess)
    return ::testing::AssertionFailure() << "cudaGraphInstantiate: " << cudaGetErrorString(instantiated);
  return ::testing::AssertionSuccess();
}

// A graph test's setup: the problem on the GPU, a non-blocking stream in both
// calls' options, the backward deterministic if asked (before its workspace is
// sized), and the caller's workspaces.
struct StreamedProblem {
  Problem p;
  DeviceMirror mirror;
  fa_fwd_args fwd;
  fa_bwd_args bwd;
  DeviceBuffer fwd_ws, bwd_ws;
  cudaStream_t stream = nullptr;

  StreamedProblem(const Case& c, bool deterministic_bwd)
      : p(make_problem(c)), mirror(p), fwd(mirror.fwd_args()), bwd(bwd_args(mirror, deterministic_bwd)),
        fwd_ws(workspace_bytes(fwd)), bwd_ws(workspace_bytes(bwd)) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    fwd.opts.stream = bwd.opts.stream = stream;
  }
  ~StreamedProblem() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  StreamedProblem(const StreamedProblem&) = delete;
  StreamedProblem& operator=(const StreamedProblem&) = delete;

  static fa_bwd_args bwd_args(const DeviceMirror& mirror, bool deterministic) {
    fa_bwd_args args = mirror.bwd_args();
    args.opts.deterministic = deterministic ? 1 : 0;
    return args;
  }
  // A failed query leaves 0 bytes: the call then fails and says so.
  static size_t workspace_bytes(const fa_fwd_args& args) {
    size_t bytes = 0;
    return fa_fwd_workspace_size(&args, &bytes) == FA_OK ? bytes : 0;
  }
  static size_t workspace_bytes(const fa_bwd_args& args) {
    size_t bytes = 0;
    return fa_bwd_workspace_size(&args, &bytes) == FA_OK ? bytes : 0;
  }
};

// With a caller workspace the forward and backward capture into a CUDA graph
// (no allocation, no synchronization inside) and the replay gives the eager bits.
TEST(GpuGraph, CaptureAndReplayMatchEager) {
  FA_GPU_TEST_OR_SKIP();
  Case c;
  c.name = "graph_bf16";
  c.dtype = FA_DTYPE_BF16;
  c.B = 2, c.H = 4, c.Hkv = 2, c.Sq = 300, c.Sk = 300, c.D = 64, c.Dv = 64;
  c.causal = true;
  c.dropout = 0.1f;
  StreamedProblem setup(c, false);
  Problem& p = setup.p;
  DeviceMirror& mirror = setup.mirror;
  ASSERT_EQ(fa_fwd(&setup.fwd, setup.fwd_ws.data, setup.fwd_ws.bytes), FA_OK) << fa_last_error();
  ASSERT_EQ(fa_bwd(&setup.bwd, setup.bwd_ws.data, setup.bwd_ws.bytes), FA_OK) << fa_last_error();
  FA_CUDA_ASSERT(cudaStreamSynchronize(setup.stream));
  mirror.download(p.out);
  mirror.download(p.dq);
  mirror.download(p.dk);
  const std::vector<unsigned char> out = p.out.bytes(), dq = p.dq.bytes(), dk = p.dk.bytes();

  p.poison_outputs();
  for (HostTensor* t : {&p.out, &p.dq, &p.dk}) mirror.upload(*t);
  cudaGraphExec_t exec = nullptr;
  ASSERT_TRUE(capture_fwd_bwd(setup.stream, setup.fwd, setup.fwd_ws, setup.bwd, setup.bwd_ws, &exec));
  FA_CUDA_ASSERT(cudaGraphLaunch(exec, setup.stream));
  FA_CUDA_ASSERT(cudaStreamSynchronize(setup.stream));
  mirror.download(p.out);
  mirror.download(p.dq);
  mirror.download(p.dk);
  EXPECT_TRUE(p.out.bytes() == out);
  EXPECT_TRUE(p.dq.bytes() == dq);
  EXPECT_TRUE(p.dk.bytes() == dk);
  cudaGraphExecDestroy(exec);
}

// dropout_rng_state in device memory: the kernels read {seed, offset} when they
// run, so one captured forward + backward replays with whatever seed was written
// there last, bit for bit the eager call given that seed by value.
TEST(GpuGraph, DropoutSeedInDeviceMemoryChangesPerReplay) {
  FA_GPU_TEST_OR_SKIP();
  Case c;
  c.name = "graph_dropout_bf16";
  c.dtype = FA_DTYPE_BF16;
  c.B = 2, c.H = 4, c.Hkv = 2, c.Sq = 200, c.Sk = 260, c.D = 64, c.Dv = 64;
  c.causal = true;
  c.dropout = 0.2f;
  StreamedProblem setup(c, true);  // deterministic: replays compared byte for byte
  Problem& p = setup.p;
  DeviceMirror& mirror = setup.mirror;
  fa_fwd_args& fwd = setup.fwd;
  fa_bwd_args& bwd = setup.bwd;
  DeviceBuffer rng_state(2 * sizeof(uint64_t));
  std::vector<HostTensor*> outputs = {&p.out, &p.lse, &p.dq, &p.dk, &p.dv};
  auto run_and_read = [&](auto&& launch) {
    p.poison_outputs();
    for (HostTensor* t : outputs) mirror.upload(*t);
    launch();
    std::vector<std::vector<unsigned char>> bytes;
    if (cudaStreamSynchronize(setup.stream) != cudaSuccess) return bytes;
    for (HostTensor* t : outputs) {
      mirror.download(*t);
      bytes.push_back(t->bytes());
    }
    return bytes;
  };

  const uint64_t seeds[2][2] = {{0x0123456789ABCDEFull, 17}, {0xFEDCBA9876543210ull, (uint64_t(3) << 32) + 5}};
  std::vector<std::vector<unsigned char>> eager[2];
  for (int s = 0; s < 2; ++s) {
    fa_fwd_args f = fwd;
    fa_bwd_args b = bwd;
    f.opts.dropout_seed = b.opts.dropout_seed = seeds[s][0];
    f.opts.dropout_offset = b.opts.dropout_offset = seeds[s][1];
    eager[s] = run_and_read([&] {
      EXPECT_EQ(fa_fwd(&f, setup.fwd_ws.data, setup.fwd_ws.bytes), FA_OK) << fa_last_error();
      EXPECT_EQ(fa_bwd(&b, setup.bwd_ws.data, setup.bwd_ws.bytes), FA_OK) << fa_last_error();
    });
    ASSERT_EQ(eager[s].size(), outputs.size());
  }
  EXPECT_FALSE(eager[0][0] == eager[1][0]) << "two seeds, one mask";

  fwd.opts.dropout_seed = bwd.opts.dropout_seed = 0;  // ignored: the pointer wins
  fwd.opts.dropout_offset = bwd.opts.dropout_offset = 0;
  fwd.opts.dropout_rng_state = bwd.opts.dropout_rng_state = static_cast<const uint64_t*>(rng_state.data);
  cudaGraphExec_t exec = nullptr;
  ASSERT_TRUE(capture_fwd_bwd(setup.stream, fwd, setup.fwd_ws, bwd, setup.bwd_ws, &exec));
  for (int s : {1, 0, 1}) {
    const auto replay = run_and_read([&] {
      EXPECT_EQ(cudaMemcpyAsync(rng_state.data, seeds[s], sizeof(seeds[s]), cudaMemcpyHostToDevice, setup.stream),
                cudaSuccess);
      EXPECT_EQ(cudaGraphLaunch(exec, setup.stream), cudaSuccess);
    });
    ASSERT_EQ(replay.size(), outputs.size());
    for (size_t t = 0; t < outputs.size(); ++t)
      EXPECT_TRUE(replay[t] == eager[s][t]) << "seed " << s << ", output " << t << " (out, lse, dq, dk, dv)";
  }
  cudaGraphExecDestroy(exec);
}

// The persistent sm90 forward in a CUDA graph: its tile order is static (no
// counter to reset between launches), so a captured launch replays to the
// same bytes as the eager call, twice. On other GPUs this runs the sm80 forward.
TEST(GpuGraph, PersistentForwardReplaysEager) {
  FA_GPU_TEST_OR_SKIP();
  const ScopedEnv persistent("FLASHATTN_SM90_PERSISTENT", "1");
  Case c;
  c.name = "graph_persistent_bf16";
  c.dtype = FA_DTYPE_BF16;
  c.B = 2, c.H = 80, c.Hkv = 20, c.Sq = 300, c.Sk = 300, c.D = 128, c.Dv = 128;  // 480 tiles
  c.causal = true;
  Problem p = make_problem(c);
  DeviceMirror mirror(p);
  cudaStream_t stream = nullptr;
  FA_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fa_fwd_args fwd = mirror.fwd_args();
  fwd.opts.stream = stream;
  ASSERT_EQ(fa_fwd(&fwd, nullptr, 0), FA_OK) << fa_last_error();
  FA_CUDA_ASSERT(cudaStreamSynchronize(stream));
  mirror.download(p.out);
  mirror.download(p.lse);
  const std::vector<unsigned char> out = p.out.bytes(), lse = p.lse.bytes();

  cudaGraph_t graph = nullptr;
  FA_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const fa_status status = fa_fwd(&fwd, nullptr, 0);
  const std::string message = fa_last_error();
  FA_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(status, FA_OK) << message;
  cudaGraphExec_t exec = nullptr;
  FA_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    p.out.poison();
    p.lse.poison();
    mirror.upload(p.out);
    mirror.upload(p.lse);
    FA_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    FA_CUDA_ASSERT(cudaStreamSynchronize(stream));
    mirror.download(p.out);
    mirror.download(p.lse);
    EXPECT_TRUE(p.out.bytes() == out) << "replay " << replay;
    EXPECT_TRUE(p.lse.bytes() == lse) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Small problems for compute-sanitizer memcheck / racecheck: causal, varlen
// with empty sequences, GQA, head dim 256, dropout, softcap + ALiBi, forward
// and backward (default and deterministic).
TEST(GpuSanitizer, RepresentativeSubset) {
  FA_GPU_TEST_OR_SKIP();
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  Case base;
  base.dtype = FA_DTYPE_BF16;
  base.B = 1, base.H = 2, base.Hkv = 1, base.Sq = 130, base.Sk = 200, base.D = 64, base.Dv = 64;
  Case causal = base;
  causal.name = "san_causal_gqa";
  causal.causal = true;
  add(causal);
  Case varlen = base;
  varlen.name = "san_varlen";
  varlen.dtype = FA_DTYPE_FP16;
  varlen.seqlens_q = {70, 0, 5};
  varlen.seqlens_k = {129, 3, 0};
  varlen.B = 3, varlen.Sq = 70, varlen.Sk = 129, varlen.D = 128, varlen.Dv = 128;
  varlen.causal = true;
  add(varlen);
  Case wide = base;
  wide.name = "san_hdim256_causal";  // the sm90 backward's wide kernel on Hopper
  wide.causal = true;
  wide.Sq = 100, wide.Sk = 150, wide.D = 256, wide.Dv = 192;
  add(wide);
  Case drop = base;
  drop.name = "san_dropout_softcap_alibi";
  drop.dropout = 0.2f;
  drop.softcap = 5.0f;
  drop.alibi = Alibi::kPerHead;
  drop.window_left = 40;
  drop.D = 256, drop.Dv = 256;
  add(drop);
  for (const Case& c : cases) {
    Problem p = make_problem(c);
    p.poison_outputs();
    DeviceMirror mirror(p);
    const fa_fwd_args fwd = mirror.fwd_args();
    ASSERT_EQ(fa_fwd(&fwd, nullptr, 0), FA_OK) << c.name << ": " << fa_last_error();
    for (int deterministic = 0; deterministic < 2; ++deterministic) {
      fa_bwd_args bwd = mirror.bwd_args();
      bwd.opts.deterministic = deterministic;
      ASSERT_EQ(fa_bwd(&bwd, nullptr, 0), FA_OK) << c.name << ": " << fa_last_error();
    }
    FA_CUDA_ASSERT(cudaDeviceSynchronize());
    mirror.download(p.out);
    mirror.download(p.dq);
    EXPECT_TRUE(fully_written("out", p.out)) << c.name;
    EXPECT_TRUE(fully_written("dq", p.dq)) << c.name;
  }
}

// The persistent sm90 forward under the sanitizers: 280 tiles (more than the
// SMs of an H200, so CTAs loop and the Q and K/V buffers are reused across
// tiles), causal with GQA, and varlen with empty sequences. Elsewhere than on
// Hopper the variable is ignored and this runs the sm80 forward.
TEST(GpuSanitizer, PersistentForward) {
  FA_GPU_TEST_OR_SKIP();
  const ScopedEnv persistent("FLASHATTN_SM90_PERSISTENT", "1");
  Case causal;
  causal.name = "san_persistent_causal_gqa";
  causal.dtype = FA_DTYPE_BF16;
  causal.B = 2, causal.H = 70, causal.Hkv = 14, causal.Sq = 130, causal.Sk = 200, causal.D = 64, causal.Dv = 64;
  causal.causal = true;
  Case varlen = causal;
  varlen.name = "san_persistent_varlen";
  varlen.seqlens_q = {130, 0, 5, 129};
  varlen.seqlens_k = {129, 3, 0, 200};
  varlen.B = 4, varlen.H = 40, varlen.Hkv = 40, varlen.Sq = 130, varlen.Sk = 200, varlen.D = 128, varlen.Dv = 128;
  for (const Case& c : {causal, varlen}) {
    Problem p = make_problem(c);
    p.poison_outputs();
    DeviceMirror mirror(p);
    const fa_fwd_args fwd = mirror.fwd_args();
    ASSERT_EQ(fa_fwd(&fwd, nullptr, 0), FA_OK) << c.name << ": " << fa_last_error();
    FA_CUDA_ASSERT(cudaDeviceSynchronize());
    mirror.download(p.out);
    mirror.download(p.lse);
    EXPECT_TRUE(fully_written("out", p.out)) << c.name;
    EXPECT_TRUE(fully_written("lse", p.lse)) << c.name;
  }
}

}  // namespace
}  // namespace fatest::gpu
