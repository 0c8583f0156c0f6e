// An independent Philox4x32-10 and dropout mapping, written from the paper
// (Salmon et al. 2011) and the header's comment, to check the library's
// fa_dropout_keep and its kernels. Test code only: do not share with src/.
#pragma once

#include <array>
#include <cstdint>

namespace fatest {

inline std::array<uint32_t, 4> philox4x32_10_ref(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  const uint64_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = m0 * c[0], p1 = m1 * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  return c;
}

// The header's mapping, literally: key, counter, word j % 4, threshold floor((1 - p) * 2^32)
// (1 - p evaluated in float, p being a float) clamped to 2^32 - 1; p = 0 keeps everything.
inline bool dropout_keep_ref(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t H, int64_t i, int64_t j,
                             float p) {
  if (!(p > 0.0f)) return true;
  const std::array<uint32_t, 2> key = {static_cast<uint32_t>(seed),
                                       static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(offset >> 32)};
  const std::array<uint32_t, 4> counter = {static_cast<uint32_t>(j / 4), static_cast<uint32_t>(i),
                                           static_cast<uint32_t>(b * H + h), static_cast<uint32_t>(offset)};
  const uint32_t r = philox4x32_10_ref(counter, key)[static_cast<size_t>(j % 4)];
  const float keep = 1.0f - p;
  const double scaled = static_cast<double>(keep) * 4294967296.0;
  const uint64_t threshold = scaled >= 4294967295.0 ? 4294967295ull : static_cast<uint64_t>(scaled);
  return r < threshold;
}

}  // namespace fatest
