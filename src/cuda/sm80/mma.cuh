// Warp-level tensor-core building blocks for sm80 and newer: cp.async copies,
// ldmatrix loads from swizzled shared memory, mma.sync m16n8k16 with fp32
// accumulation, and two small warp GEMMs (both operands in shared memory, or A
// in registers) that every kernel of this folder is written with.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16x16) a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   B (16x8)  b0 = (k 2t..2t+1, n g)  b1 = (k 2t+8.., n g)
//   C (16x8)  c0,c1 = (g, 2t..2t+1)  c2,c3 = (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashattn::sm80 {

// A shared-memory tile of 16-bit elements, (kRows, kCols), kCols a multiple of
// 64. Rows are 16-byte chunks XOR-swizzled by row % 8, so the 8 row addresses
// of one ldmatrix phase and the 8 chunks a cp.async row writes fall in 8
// different bank groups: no bank conflicts in either direction.
template <int kRows_, int kCols_>
struct SmemTile {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static constexpr int kElements = kRows * kCols;
  static constexpr int kBytes = kElements * 2;
  static_assert(kCols % 64 == 0, "swizzle needs rows of at least 8 chunks of 16 bytes");
  static_assert(kRows % 16 == 0, "ldmatrix tiles are 16 rows high");

  __device__ __forceinline__ static int offset(int row, int col) {
    const int chunk = col >> 3;
    const int swizzled = (chunk & ~7) | ((chunk ^ row) & 7);
    return row * kCols + (swizzled << 3) + (col & 7);
  }
};

template <typename T>
struct Pack2;
template <>
struct Pack2<__half> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 value = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&value);
  }
};
template <>
struct Pack2<__nv_bfloat16> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 value = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&value);
  }
};

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16-byte global -> shared copy; src_bytes 0 fills the chunk with zeros (and reads nothing).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
               "r"(src_bytes));
}
// One fp32 word; an invalid source writes zero.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix row addresses. A lane reads row (row0 + row_lane) and 16-byte chunk
// (chunk0 + chunk_lane) of a tile, with row0 a multiple of 16 and chunk0 even:
// then row % 8 == row_lane % 8 and chunk0 + chunk_lane == chunk0 ^ chunk_lane,
// so the swizzled chunk is chunk0 ^ lane_xor with one per-lane constant. The
// address becomes a per-lane base plus compile-time offsets XOR a per-lane
// constant, which keeps the address registers of an unrolled GEMM at a few.
template <class Tile>
struct LaneAddress {
  uint32_t row_base;  // shared address of (row_lane, chunk 0)
  uint32_t xor16;     // lane_xor * 16
  __device__ __forceinline__ LaneAddress(const void* tile, int row_lane, int chunk_lane)
      : row_base(smem_address(tile) + row_lane * Tile::kCols * 2),
        xor16(static_cast<uint32_t>((chunk_lane ^ (row_lane & 7)) * 16)) {}
  __device__ __forceinline__ uint32_t at(int row0, int chunk0) const {
    // Only chunk0 % 8 meets the XOR: 4 distinct per-lane values for all chunk0.
    return row_base + row0 * Tile::kCols * 2 + (chunk0 & ~7) * 16 + ((static_cast<uint32_t>(chunk0 & 7) * 16) ^ xor16);
  }
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// A fragments (16 x 16) at logical (m0, k0) of A. kTrans: the tile stores A^T,
// i.e. (k, m); otherwise (m, k).
template <bool kTrans, class Tile>
__device__ __forceinline__ LaneAddress<Tile> lane_address_a(const void* tile, int lane) {
  return kTrans ? LaneAddress<Tile>(tile, (lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1)
                : LaneAddress<Tile>(tile, lane & 15, lane >> 4);
}
template <bool kTrans, class Tile>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const LaneAddress<Tile>& address, int m0, int k0) {
  if constexpr (!kTrans) ldmatrix_x4(a, address.at(m0, k0 / 8));
  else ldmatrix_x4_trans(a, address.at(k0, m0 / 8));
}

// B fragments of two n8 tiles (n0 and n0 + 8) for the k16 step at k0:
// b = {b0(n0), b1(n0), b0(n0+8), b1(n0+8)}. kTrans: the tile stores (k, n);
// otherwise (n, k) (the "col" operand of mma.row.col, e.g. K for Q K^T).
template <bool kTrans, class Tile>
__device__ __forceinline__ LaneAddress<Tile> lane_address_b(const void* tile, int lane) {
  return kTrans ? LaneAddress<Tile>(tile, lane & 15, lane >> 4)
                : LaneAddress<Tile>(tile, (lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
}
template <bool kTrans, class Tile>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const LaneAddress<Tile>& address, int n0, int k0) {
  if constexpr (!kTrans) ldmatrix_x4(b, address.at(n0, k0 / 8));
  else ldmatrix_x4_trans(b, address.at(k0, n0 / 8));
}

// acc (kMTiles*16, kNTiles*8) += A[m0.., 0..kSteps*16) * B[0.., n0..]: both from shared memory.
template <int kMTiles, int kNTiles, int kSteps, bool kATrans, bool kBTrans, class TileA, class TileB, typename T>
__device__ __forceinline__ void gemm_ss(float (&acc)[kMTiles][kNTiles][4], const T* tile_a, int m0, const T* tile_b,
                                        int n0, int lane) {
  static_assert(kNTiles % 2 == 0, "B fragments load in pairs of n8 tiles");
  const LaneAddress<TileA> address_a = lane_address_a<kATrans, TileA>(tile_a, lane);
  const LaneAddress<TileB> address_b = lane_address_b<kBTrans, TileB>(tile_b, lane);
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) load_a<kATrans>(a[mi], address_a, m0 + mi * 16, ks * 16);
#pragma unroll
    for (int nj = 0; nj < kNTiles / 2; ++nj) {
      uint32_t b[4];
      load_b<kBTrans>(b, address_b, n0 + nj * 16, ks * 16);
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        mma_16816<T>(acc[mi][2 * nj], a[mi], b[0], b[1]);
        mma_16816<T>(acc[mi][2 * nj + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

// acc += A * B with A in registers as fragments a[mi][ks] (kSteps k16 steps).
template <int kMTiles, int kNTiles, int kSteps, bool kBTrans, class TileB, typename T>
__device__ __forceinline__ void gemm_rs(float (&acc)[kMTiles][kNTiles][4], const uint32_t (&a)[kMTiles][kSteps][4],
                                        const T* tile_b, int n0, int lane) {
  const LaneAddress<TileB> address_b = lane_address_b<kBTrans, TileB>(tile_b, lane);
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
#pragma unroll
    for (int nj = 0; nj < kNTiles / 2; ++nj) {
      uint32_t b[4];
      load_b<kBTrans>(b, address_b, n0 + nj * 16, ks * 16);
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        mma_16816<T>(acc[mi][2 * nj], a[mi][ks], b[0], b[1]);
        mma_16816<T>(acc[mi][2 * nj + 1], a[mi][ks], b[2], b[3]);
      }
    }
  }
}

// Accumulator tiles (kMTiles, 2*kSteps n8 tiles) of fp32 -> A fragments of T:
// the C layout of two adjacent n8 tiles is exactly the A layout of one k16 step.
template <typename T, int kMTiles, int kNTiles>
__device__ __forceinline__ void accumulator_to_a(uint32_t (&a)[kMTiles][kNTiles / 2][4],
                                                 const float (&acc)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int ks = 0; ks < kNTiles / 2; ++ks) {
      a[mi][ks][0] = Pack2<T>::pack(acc[mi][2 * ks][0], acc[mi][2 * ks][1]);
      a[mi][ks][1] = Pack2<T>::pack(acc[mi][2 * ks][2], acc[mi][2 * ks][3]);
      a[mi][ks][2] = Pack2<T>::pack(acc[mi][2 * ks + 1][0], acc[mi][2 * ks + 1][1]);
      a[mi][ks][3] = Pack2<T>::pack(acc[mi][2 * ks + 1][2], acc[mi][2 * ks + 1][3]);
    }
  }
}

template <int kMTiles, int kNTiles>
__device__ __forceinline__ void clear(float (&acc)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
}

// Writes accumulator tiles (rows m0.., cols n0..) to a shared tile as T pairs.
template <typename T, class Tile, int kMTiles, int kNTiles>
__device__ __forceinline__ void store_accumulator(T* tile, const float (&acc)[kMTiles][kNTiles][4], int m0, int n0,
                                                  int lane, float scale = 1.0f) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni) {
      const int row = m0 + mi * 16 + g, col = n0 + ni * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(tile + Tile::offset(row, col)) =
          Pack2<T>::pack(acc[mi][ni][0] * scale, acc[mi][ni][1] * scale);
      *reinterpret_cast<uint32_t*>(tile + Tile::offset(row + 8, col)) =
          Pack2<T>::pack(acc[mi][ni][2] * scale, acc[mi][ni][3] * scale);
    }
  }
}

}  // namespace flashattn::sm80
