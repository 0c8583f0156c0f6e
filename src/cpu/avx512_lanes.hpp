// The lane mask of AVX-512 tails, shared by the AVX-512 kernel set
// (avx512_kernels.hpp) and the KV-cache chunk products
// (kvcache_chunk_avx512.hpp). Included only under an AVX-512 target pragma;
// the anonymous namespace keeps each copy private to its unit.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace flashattn {
namespace cpu {
namespace {

// Lanes [0, count) of 16 (none for count <= 0, all for count >= 16).
inline __mmask16 lanes_mask(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (count > 0 ? count : 0)) - 1u);
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
