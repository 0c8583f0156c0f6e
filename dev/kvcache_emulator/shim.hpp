#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#include "common/half.hpp"
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(x)
struct uint4 { uint32_t x, y, z, w; };
struct uint2 { uint32_t x, y; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct __half { uint16_t bits; };
struct __nv_bfloat16 { uint16_t bits; };
inline float __half2float(__half h) { return flashattn::fp16_to_float(h.bits); }
inline float __bfloat162float(__nv_bfloat16 h) { return flashattn::bf16_to_float(h.bits); }
inline __half __float2half_rn(float f) { return {flashattn::float_to_fp16(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {flashattn::float_to_bf16(f)}; }
struct dim3i { unsigned x = 0, y = 0, z = 0; };
namespace emu {
inline thread_local dim3i tid, bid;
inline dim3i grid, block;
inline unsigned char* block_smem = nullptr;  // set per block (shared by its threads)
inline std::barrier<>* block_barrier = nullptr;
inline std::barrier<>* warp_barriers[8];
inline float warp_slots[8][32];
}
#define threadIdx emu::tid
#define blockIdx emu::bid
#define gridDim emu::grid
#define blockDim emu::block
// Shared-space addresses are offsets into the emulated block's shared memory.
inline size_t __cvta_generic_to_shared(const void* p) {
  return static_cast<size_t>(static_cast<const unsigned char*>(p) - emu::block_smem);
}
inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int offset) {
  const int lane = emu::tid.x % 32, warp = emu::tid.x / 32;
  emu::warp_slots[warp][lane] = v;
  emu::warp_barriers[warp]->arrive_and_wait();
  const float other = emu::warp_slots[warp][lane ^ offset];
  emu::warp_barriers[warp]->arrive_and_wait();
  return other;
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_barriers[emu::tid.x / 32]->arrive_and_wait(); }
inline bool __any_sync(unsigned, bool pred) {
  const int lane = emu::tid.x % 32, warp = emu::tid.x / 32;
  emu::warp_slots[warp][lane] = pred ? 1.0f : 0.0f;
  emu::warp_barriers[warp]->arrive_and_wait();
  bool any = false;
  for (int l = 0; l < 32; ++l) any = any || emu::warp_slots[warp][l] != 0.0f;
  emu::warp_barriers[warp]->arrive_and_wait();
  return any;
}
// Byte k of the result is byte (selector nibble k) of the 8 bytes {y, x} (x the low word).
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t selector) {
  const uint64_t bytes = (uint64_t(y) << 32) | x;
  uint32_t out = 0;
  for (int k = 0; k < 4; ++k) out |= uint32_t((bytes >> (8 * ((selector >> (4 * k)) & 7))) & 0xff) << (8 * k);
  return out;
}
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
using std::min; using std::max; using std::abs; using std::fmaxf; using std::fmaf;
