// The building blocks of the sm90 forward, each alone against a host
// reference, so a failing forward test can be traced to one of them:
//   1. a TMA load (128-byte swizzle, zero fill past the tensor) lands exactly
//      where swizzled_offset() says;
//   2. S = Q K^T with wgmma from shared memory (K-major descriptors, k-steps
//      inside and across 64-column blocks) gives the accumulator layout of
//      wgmma.cuh;
//   3. O = P V with P converted from that accumulator to A fragments and V
//      as an MN-major operand over two 64-column blocks (the leading offset);
//   4. the backward's dQ = dS K with both operands MN-major from shared
//      memory: dS stored key-major (as dS^T), K as loaded, one 64-column
//      block of K per instruction.
// Only compute capability 9.0 runs them; elsewhere they skip with the reason.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/sm90/fwd_kernel.cuh"
#include "cuda/sm90/tensor_map.hpp"

namespace {

using flashattn::TensorLayout;
using flashattn::sm90::swizzled_offset;
using T = __nv_bfloat16;

#define SM90_SKIP_UNLESS_HOPPER()                                                         \
  do {                                                                                    \
    int count = 0, major = 0, minor = 0;                                                  \
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device"; \
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);                 \
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);                 \
    if (major * 10 + minor != 90) GTEST_SKIP() << "sm_90a code needs compute capability 9.0"; \
  } while (0)

#define SM90_CUDA_ASSERT(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

uint16_t to_bf16_bits(float x) {  // round to nearest even, as __float2bfloat16_rn
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16_bits(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = to_bf16_bits(dist(gen));
  return v;
}

// --- 1. TMA round trip -----------------------------------------------------

__global__ void tma_roundtrip_kernel(const __grid_constant__ CUtensorMap map, int col, int row, int head, int batch,
                                     int box_bytes, uint8_t* out) {
  extern __shared__ unsigned char smem_raw[];
  uint8_t* tile = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  __shared__ uint64_t barrier;
  if (threadIdx.x == 0) {
    ::cuda::ptx::mbarrier_init(&barrier, 1);
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta, ::cuda::ptx::space_shared,
                                           &barrier, box_bytes);
    flashattn::sm90::tma_load(tile, &map, col, row, head, batch, &barrier);
  }
  flashattn::sm90::wait_barrier(&barrier, 0);
  for (int i = threadIdx.x; i < box_bytes; i += blockDim.x) out[i] = tile[i];
}

TEST(GpuSm90Primitives, TmaLoadSwizzlesAndZeroFills) {
  SM90_SKIP_UNLESS_HOPPER();
  // (B, S, H, D) = (2, 100, 3, 72) bf16, contiguous; box 64 columns x 64 rows
  // at column 64 (8 valid), row 80 (20 valid), head 2, batch 1.
  const int B = 2, S = 100, H = 3, D = 72, box_rows = 64;
  const std::vector<uint16_t> host = random_bf16(size_t(B) * S * H * D, 1);
  void* dev = nullptr;
  uint8_t* out = nullptr;
  const int box_bytes = box_rows * 128;
  SM90_CUDA_ASSERT(cudaMalloc(&dev, host.size() * 2));
  SM90_CUDA_ASSERT(cudaMalloc(&out, box_bytes));
  SM90_CUDA_ASSERT(cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  TensorLayout layout;
  layout.batch = int64_t(S) * H * D, layout.row = int64_t(H) * D, layout.head = D;
  CUtensorMap map;
  ASSERT_EQ(flashattn::cuda::encode_tensor_map(&map, FA_DTYPE_BF16, dev, D, S, H, B, layout, box_rows), FA_OK)
      << fa_last_error();
  const int col0 = 64, row0 = 80, head = 2, batch = 1;
  tma_roundtrip_kernel<<<1, 128, box_bytes + 1024>>>(map, col0, row0, head, batch, box_bytes, out);
  SM90_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint8_t> got(box_bytes);
  SM90_CUDA_ASSERT(cudaMemcpy(got.data(), out, box_bytes, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int r = 0; r < box_rows; ++r)
    for (int c = 0; c < 64; ++c) {
      const int row = row0 + r, col = col0 + c;
      const uint16_t expected =
          row < S && col < D ? host[((size_t(batch) * S + row) * H + head) * D + col] : uint16_t(0);
      uint16_t value;
      std::memcpy(&value, got.data() + swizzled_offset(box_rows, r, c), 2);
      if (value != expected && ++wrong <= 5)
        ADD_FAILURE() << "tile (" << r << ", " << c << "): got " << value << ", expected " << expected;
    }
  EXPECT_EQ(wrong, 0);
  cudaFree(dev);
  cudaFree(out);
}

// --- 2 and 3. wgmma: S = Q K^T, then O = P V --------------------------------

constexpr int kM = 64, kN = 128, kD = 128;  // one warpgroup: Q (64, 128), K and V (128, 128)

__global__ void wgmma_kernel(const T* q, const T* k, const T* v, float* s_out, float* o_out) {
  using namespace flashattn::sm90;
  extern __shared__ unsigned char smem_raw[];
  uint8_t* sQ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sK = sQ + kM * kD * 2;
  uint8_t* sV = sK + kN * kD * 2;
  const int tid = threadIdx.x;
  // Generic stores into the layout TMA would write (test 1 checks the two agree).
  for (int i = tid; i < kM * kD; i += 128)
    *reinterpret_cast<T*>(sQ + swizzled_offset(kM, i / kD, i % kD)) = q[i];
  for (int i = tid; i < kN * kD; i += 128) {
    *reinterpret_cast<T*>(sK + swizzled_offset(kN, i / kD, i % kD)) = k[i];
    *reinterpret_cast<T*>(sV + swizzled_offset(kN, i / kD, i % kD)) = v[i];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes -> wgmma reads
  __syncthreads();
  const uint32_t q_addr = static_cast<uint32_t>(__cvta_generic_to_shared(sQ));
  const uint32_t k_addr = static_cast<uint32_t>(__cvta_generic_to_shared(sK));
  const uint32_t v_addr = static_cast<uint32_t>(__cvta_generic_to_shared(sV));

  float acc_s[kN / 2];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t block = (kk / 4) * 128, step = (kk % 4) * 32;  // 64-column block, 16-column k-step
    WgmmaSS<T, kN>::run(acc_s, desc_k_major(q_addr + block * kM + step), desc_k_major(k_addr + block * kN + step),
                        kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(acc_s);
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  for (int j = 0; j < kN / 8; ++j)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c)
        s_out[(warp * 16 + g + 8 * r) * kN + 8 * j + 2 * t + c] = acc_s[4 * j + 2 * r + c];

  uint32_t a_p[kN / 16][4];
  for (int kk = 0; kk < kN / 16; ++kk)
    for (int i = 0; i < 4; ++i)
      a_p[kk][i] = flashattn::sm80::Pack2<T>::pack(acc_s[8 * kk + 2 * i] * 0.125f, acc_s[8 * kk + 2 * i + 1] * 0.125f);
  float acc_o[kD / 2];
  for (float& x : acc_o) x = 0.0f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
    WgmmaRS<T, kD>::run(acc_o, a_p[kk], desc_mn_major(v_addr + kk * 16 * 128, kN * 128), 1);
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(acc_o);
  for (int j = 0; j < kD / 8; ++j)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c)
        o_out[(warp * 16 + g + 8 * r) * kD + 8 * j + 2 * t + c] = acc_o[4 * j + 2 * r + c];
}

TEST(GpuSm90Primitives, WgmmaQKThenPVMatchHost) {
  SM90_SKIP_UNLESS_HOPPER();
  const std::vector<uint16_t> q = random_bf16(kM * kD, 2), k = random_bf16(kN * kD, 3), v = random_bf16(kN * kD, 4);
  T *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float *ds = nullptr, *dout = nullptr;
  SM90_CUDA_ASSERT(cudaMalloc(&dq, q.size() * 2));
  SM90_CUDA_ASSERT(cudaMalloc(&dk, k.size() * 2));
  SM90_CUDA_ASSERT(cudaMalloc(&dv, v.size() * 2));
  SM90_CUDA_ASSERT(cudaMalloc(&ds, kM * kN * 4));
  SM90_CUDA_ASSERT(cudaMalloc(&dout, kM * kD * 4));
  SM90_CUDA_ASSERT(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  SM90_CUDA_ASSERT(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  SM90_CUDA_ASSERT(cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  const int smem = 1024 + (kM + 2 * kN) * kD * 2;
  SM90_CUDA_ASSERT(cudaFuncSetAttribute(wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgmma_kernel<<<1, 128, smem>>>(dq, dk, dv, ds, dout);
  SM90_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> s(kM * kN), o(kM * kD);
  SM90_CUDA_ASSERT(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
  SM90_CUDA_ASSERT(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));

  // Host: S in double from the same bf16 inputs; P = bf16(S_device / 8) exactly as the kernel rounds it.
  double s_err = 0.0, o_err = 0.0;
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      double ref = 0.0;
      for (int d = 0; d < kD; ++d) ref += double(from_bf16_bits(q[i * kD + d])) * from_bf16_bits(k[j * kD + d]);
      s_err = std::max(s_err, std::abs(ref - s[i * kN + j]));
    }
  for (int i = 0; i < kM; ++i)
    for (int d = 0; d < kD; ++d) {
      double ref = 0.0;
      for (int j = 0; j < kN; ++j)
        ref += double(from_bf16_bits(to_bf16_bits(s[i * kN + j] * 0.125f))) * from_bf16_bits(v[j * kD + d]);
      o_err = std::max(o_err, std::abs(ref - o[i * kD + d]));
    }
  // fp32 accumulation of 128 products of magnitude ~1 (S) and ~2 (O): errors ~1e-5, layout bugs ~1.
  EXPECT_LT(s_err, 1e-3) << "S = Q K^T (SS descriptors, accumulator layout)";
  EXPECT_LT(o_err, 1e-3) << "O = P V (A fragments from the accumulator, MN-major V, leading offset)";
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(ds);
  cudaFree(dout);
}

// --- 4. wgmma with both operands MN-major: dQ = dS K -------------------------

// dS^T (kN keys, kM queries) and K (kN keys, kD): C (kM, kD) = dS K, one N = 64
// instruction chain per 64-column block of K.
__global__ void wgmma_transposed_kernel(const T* ds_t, const T* k, float* c_out) {
  using namespace flashattn::sm90;
  extern __shared__ unsigned char smem_raw[];
  uint8_t* sDs = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sK = sDs + kN * kM * 2;
  const int tid = threadIdx.x;
  for (int i = tid; i < kN * kM; i += 128)
    *reinterpret_cast<T*>(sDs + swizzled_offset(kN, i / kM, i % kM)) = ds_t[i];
  for (int i = tid; i < kN * kD; i += 128)
    *reinterpret_cast<T*>(sK + swizzled_offset(kN, i / kD, i % kD)) = k[i];
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint32_t ds_addr = static_cast<uint32_t>(__cvta_generic_to_shared(sDs));
  const uint32_t k_addr = static_cast<uint32_t>(__cvta_generic_to_shared(sK));
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  for (int block = 0; block < kD / 64; ++block) {
    float acc[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk)
      WgmmaSS<T, 64>::run<1, 1>(acc, desc_mn_major(ds_addr + kk * 16 * 128, kN * 128),
                                desc_mn_major(k_addr + block * kN * 128 + kk * 16 * 128, kN * 128), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(acc);
    for (int j = 0; j < 8; ++j)
      for (int r = 0; r < 2; ++r)
        for (int c = 0; c < 2; ++c)
          c_out[(warp * 16 + g + 8 * r) * kD + block * 64 + 8 * j + 2 * t + c] = acc[4 * j + 2 * r + c];
  }
}

TEST(GpuSm90Primitives, WgmmaBothOperandsMnMajorMatchHost) {
  SM90_SKIP_UNLESS_HOPPER();
  const std::vector<uint16_t> ds_t = random_bf16(kN * kM, 5), k = random_bf16(kN * kD, 6);
  T *d_ds = nullptr, *d_k = nullptr;
  float* d_c = nullptr;
  SM90_CUDA_ASSERT(cudaMalloc(&d_ds, ds_t.size() * 2));
  SM90_CUDA_ASSERT(cudaMalloc(&d_k, k.size() * 2));
  SM90_CUDA_ASSERT(cudaMalloc(&d_c, kM * kD * 4));
  SM90_CUDA_ASSERT(cudaMemcpy(d_ds, ds_t.data(), ds_t.size() * 2, cudaMemcpyHostToDevice));
  SM90_CUDA_ASSERT(cudaMemcpy(d_k, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  const int smem = 1024 + (kN * kM + kN * kD) * 2;
  SM90_CUDA_ASSERT(cudaFuncSetAttribute(wgmma_transposed_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgmma_transposed_kernel<<<1, 128, smem>>>(d_ds, d_k, d_c);
  SM90_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> c(kM * kD);
  SM90_CUDA_ASSERT(cudaMemcpy(c.data(), d_c, c.size() * 4, cudaMemcpyDeviceToHost));
  double err = 0.0;
  for (int i = 0; i < kM; ++i)
    for (int d = 0; d < kD; ++d) {
      double ref = 0.0;
      for (int j = 0; j < kN; ++j) ref += double(from_bf16_bits(ds_t[j * kM + i])) * from_bf16_bits(k[j * kD + d]);
      err = std::max(err, std::abs(ref - c[i * kD + d]));
    }
  EXPECT_LT(err, 1e-3) << "dQ = dS K (A and B MN-major: transpose flags, descriptors of a key-major dS tile)";
  cudaFree(d_ds);
  cudaFree(d_k);
  cudaFree(d_c);
}

}  // namespace
