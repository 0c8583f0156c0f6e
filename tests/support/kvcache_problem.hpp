// Cases of attention against a KV cache (fa_fwd_kvcache), made concrete the
// way problem.hpp does for the plain forward: random inputs, the host tensors
// the library reads and writes (the cache included, written in place), the
// argument block, and the expectation computed independently of src/: the
// cache after the append (to be matched byte for byte) and, gathered from it,
// a varlen problem for the fp64 reference and the same-precision naive version.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "support/reference.hpp"
#include "support/tensor.hpp"

namespace fatest {

enum class Rotary { kNone, kInterleaved, kNeox };

struct KvCase {
  std::string name;
  fa_dtype dtype = FA_DTYPE_FP32;
  int64_t B = 1, H = 1, Hkv = 1, Sq = 1, D = 64, Dv = 64;
  std::vector<int32_t> seqlens;  // cache_seqlens before the append (one per batch row); empty: full cache
  int64_t S_new = 0;             // appended keys (0: no k_new / v_new)
  int64_t page_size = 0;         // 0: contiguous cache
  int64_t slack = 3;             // capacity beyond the longest row
  Rotary rotary = Rotary::kNone;
  int64_t rotary_dim = 0;        // 0: D
  bool batch_idx = false;        // cache_batch_idx (a permutation into a larger cache)
  std::vector<int32_t> leftpad;  // cache_leftpad, empty: none
  bool causal = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool alibi = false;
  bool with_lse = true;
  int32_t num_splits = 0;
  bool slow = false;
};

void PrintTo(const KvCase& c, std::ostream* os);
const std::vector<KvCase>& kvcache_cases();
// The shared case called `name`; a case with an empty name when there is none.
KvCase kvcache_case(const std::string& name);
std::vector<KvCase> kvcache_fast_cases();
std::vector<KvCase> kvcache_slow_cases();

struct KvProblem {
  KvCase c;
  int64_t capacity = 0;
  HostTensor q, k_cache, v_cache, k_new, v_new, out, lse;
  HostTensor cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin, alibi;
  HostTensor expected_k_cache, expected_v_cache;  // the caches after the append
  Geometry g;      // varlen: Sq queries and N_b keys per row
  Semantics sem;
  std::vector<double> q_rows, k_rows, v_rows;  // reference inputs gathered from the expected cache

  fa_kvcache_args args() const;
  std::vector<HostTensor*> inputs() {
    return {&q, &k_cache, &v_cache, &k_new, &v_new, &cache_seqlens, &cache_batch_idx, &cache_leftpad,
            &block_table, &rotary_cos, &rotary_sin, &alibi};
  }
  void poison_outputs();
};

KvProblem make_kv_problem(const KvCase& c);

// The fp64 reference and the same-precision naive result on the gathered cache.
struct KvReference {
  FwdOut ref, naive;
};
KvReference kv_reference(const KvProblem& p);

// O and LSE within the 2x rule of the reference on the gathered cache, empty
// rows exact, both caches equal to the expected ones byte for byte.
void expect_kvcache_matches(const KvProblem& p, const KvReference& r);
inline void expect_kvcache_matches(const KvProblem& p) { expect_kvcache_matches(p, kv_reference(p)); }

// Case `name` without an append or rotary (one problem and one reference then serve every
// call), run by `run` (which fills p.out) at each split count: every result meets the
// reference, and each stays within 0.02 of the unsplit one (the combine is exact up to rounding).
void expect_split_counts_agree(const std::string& name, std::initializer_list<int32_t> counts,
                               const std::function<void(KvProblem&)>& run);

}  // namespace fatest
