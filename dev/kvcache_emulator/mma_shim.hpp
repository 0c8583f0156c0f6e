// mma.sync m16n8k16 (fp32 accumulate) and the 16-bit pair packing of src/cuda/sm80/mma.cuh, for
// the emulator: every lane of the warp deposits its fragments, then computes its own four outputs
// from all of them with the layouts of mma.cuh's header (g = lane / 4, t = lane % 4):
//   A (16x16) a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   B (16x8)  b0 = (k 2t..2t+1, n g)  b1 = (k 2t+8.., n g)
//   C (16x8)  c0,c1 = (g, 2t..2t+1)  c2,c3 = (g+8, 2t..2t+1)
#pragma once
#include "shim.hpp"

namespace flashattn::sm80 {

template <typename T>
struct Pack2 {
  static uint32_t pack(float lo, float hi) {
    return uint32_t(bits_of(lo)) | (uint32_t(bits_of(hi)) << 16);
  }
  static uint16_t bits_of(float x);
  static float value_of(uint16_t bits);
};
template <> inline uint16_t Pack2<__nv_bfloat16>::bits_of(float x) { return flashattn::float_to_bf16(x); }
template <> inline float Pack2<__nv_bfloat16>::value_of(uint16_t b) { return flashattn::bf16_to_float(b); }
template <> inline uint16_t Pack2<__half>::bits_of(float x) { return flashattn::float_to_fp16(x); }
template <> inline float Pack2<__half>::value_of(uint16_t b) { return flashattn::fp16_to_float(b); }

namespace emu_mma {
inline uint32_t a_slots[8][32][4], b_slots[8][32][2], row_addresses[8][32];
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lanes 8m .. 8m + 7 give the shared addresses of
// rows 0-7 of matrix m (16 bytes each); lane i receives, in r[m], elements (row 2 (i % 4), column
// i / 4) and (row 2 (i % 4) + 1, column i / 4) of matrix m, the first in the low half.
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  const int lane = emu::tid.x % 32, warp = emu::tid.x / 32;
  emu_mma::row_addresses[warp][lane] = address;
  emu::warp_barriers[warp]->arrive_and_wait();
  auto element = [&](int matrix, int row, int column) {
    uint16_t bits;
    std::memcpy(&bits, emu::block_smem + emu_mma::row_addresses[warp][8 * matrix + row] + 2 * column, 2);
    return uint32_t(bits);
  };
  for (int m = 0; m < 4; ++m)
    r[m] = element(m, 2 * (lane % 4), lane / 4) | (element(m, 2 * (lane % 4) + 1, lane / 4) << 16);
  emu::warp_barriers[warp]->arrive_and_wait();
}

template <typename T>
inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int lane = emu::tid.x % 32, warp = emu::tid.x / 32;
  for (int r = 0; r < 4; ++r) emu_mma::a_slots[warp][lane][r] = a[r];
  emu_mma::b_slots[warp][lane][0] = b0;
  emu_mma::b_slots[warp][lane][1] = b1;
  emu::warp_barriers[warp]->arrive_and_wait();
  auto half_of = [](uint32_t word, int k) { return Pack2<T>::value_of(uint16_t(k % 2 == 0 ? word : word >> 16)); };
  auto a_at = [&](int row, int k) {  // A (row, k)
    const int owner = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return half_of(emu_mma::a_slots[warp][owner][reg], k);
  };
  auto b_at = [&](int k, int n) {  // B (k, n)
    const int owner = n * 4 + (k % 8) / 2;
    return half_of(emu_mma::b_slots[warp][owner][k >= 8 ? 1 : 0], k);
  };
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + e % 2;
    double sum = c[e];
    for (int k = 0; k < 16; ++k) sum += double(a_at(row, k)) * double(b_at(k, col));
    c[e] = float(sum);
  }
  emu::warp_barriers[warp]->arrive_and_wait();
}

}  // namespace flashattn::sm80
