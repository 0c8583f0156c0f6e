// The one list of attention cases. Each case is described once and drives the
// forward test, the backward test and (through the same support library) any
// other backend's test: nothing here depends on the device.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "support/tensor.hpp"

namespace fatest {

enum class Alibi { kNone, kPerHead, kPerBatchHead };  // slopes of shape (H) or (B, H)

struct Case {
  std::string name;  // unique, [A-Za-z0-9_], built from the fields below
  fa_dtype dtype = FA_DTYPE_FP32;
  int64_t B = 1, H = 1, Hkv = 1;
  int64_t Sq = 1, Sk = 1;  // dense lengths; for varlen the maxima of the lists below
  int64_t D = 64, Dv = 64;
  bool causal = false;
  fa_alignment align = FA_ALIGN_BOTTOM_RIGHT;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  float scale = 0.0f;  // 0: 1/sqrt(D)
  Alibi alibi = Alibi::kNone;
  float dropout = 0.0f;
  std::vector<int32_t> seqlens_q, seqlens_k;  // non-empty: varlen with B = size()
  Layout layout = Layout::kContiguous;
  bool slow = false;  // long runtime: runs under the `slow` ctest label only

  bool varlen() const { return !seqlens_q.empty(); }
};

// gtest prints a case by its name.
void PrintTo(const Case& c, std::ostream* os);

// Every case, in list order; names are unique.
const std::vector<Case>& all_cases();
std::vector<Case> fast_cases();
std::vector<Case> slow_cases();
// A few cases that together use every feature, for the repeated-run tests.
std::vector<Case> determinism_cases();

// Seed of the random inputs of a case: a fixed function of its name, so a
// failure reproduces alone and cases do not share inputs.
uint64_t case_seed(const Case& c);

}  // namespace fatest
