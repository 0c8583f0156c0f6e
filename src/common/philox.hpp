// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3")
// and the dropout keep-mask mapping documented in flashattn.h. The CPU backend
// and every GPU kernel call these same functions, so the masks agree bit for bit.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace flashattn {

struct Philox4 {
  uint32_t x, y, z, w;
};

FA_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

FA_HOST_DEVICE Philox4 philox4x32_10(Philox4 ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, ctr.x, hi0, lo0);
    philox_mulhilo(kMul1, ctr.z, hi1, lo1);
    ctr = Philox4{hi1 ^ ctr.y ^ key0, lo1, hi0 ^ ctr.w ^ key1, lo0};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return ctr;
}

// Everything about one call's dropout that does not depend on the element.
struct DropoutConfig {
  uint32_t key0 = 0, key1 = 0, offset_word = 0;
  uint32_t keep_threshold = 0;  // keep iff r < keep_threshold
  float keep_scale = 1.0f;      // 1 / (1 - p)
  bool enabled = false;
  // {seed, offset} in GPU-readable memory, read by the kernel when it runs
  // (key0, key1 and offset_word are then unset): a captured graph's replays
  // each take the seed written there.
  const uint64_t* rng_state = nullptr;
};

FA_HOST_DEVICE void set_dropout_keys(DropoutConfig& config, uint64_t seed, uint64_t offset) {
  config.key0 = static_cast<uint32_t>(seed);
  config.key1 = static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(offset >> 32);
  config.offset_word = static_cast<uint32_t>(offset);
}

inline DropoutConfig make_dropout_config(float p, uint64_t seed, uint64_t offset) {
  DropoutConfig config;
  config.enabled = p > 0.0f;
  set_dropout_keys(config, seed, offset);
  const double threshold = static_cast<double>(1.0f - p) * 4294967296.0;
  config.keep_threshold = threshold >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(threshold);
  config.keep_scale = 1.0f / (1.0f - p);
  return config;
}

// The config with its keys in place: read from rng_state when the call gave one.
FA_HOST_DEVICE DropoutConfig resolve_dropout_keys(DropoutConfig config) {
  if (config.rng_state == nullptr) return config;
  set_dropout_keys(config, config.rng_state[0], config.rng_state[1]);
  config.rng_state = nullptr;
  return config;
}

// Random words of the four key columns j0 .. j0+3 (j0 a multiple of 4) of row i.
FA_HOST_DEVICE Philox4 dropout_words(const DropoutConfig& config, uint32_t batch_head, uint32_t i,
                                     uint32_t j0) {
  return philox4x32_10(Philox4{j0 >> 2, i, batch_head, config.offset_word}, config.key0, config.key1);
}

FA_HOST_DEVICE uint32_t philox_word(const Philox4& words, uint32_t lane) {
  return lane == 0 ? words.x : lane == 1 ? words.y : lane == 2 ? words.z : words.w;
}

// batch_head = b * H + h with h the query head; i, j within the sequence.
FA_HOST_DEVICE bool dropout_keep(const DropoutConfig& config, uint32_t batch_head, uint32_t i, uint32_t j) {
  const Philox4 words = dropout_words(config, batch_head, i, j & ~3u);
  return philox_word(words, j & 3u) < config.keep_threshold;
}

}  // namespace flashattn
