// Shared checks of the bad-input tests: a rejected call returns the expected
// status, a message naming the argument with the expected and received
// values, writes no output byte (sentinel pattern kept) and changes no input;
// the workspace query and the C++ wrapper report the same.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "support/problem.hpp"

namespace fatest {

constexpr unsigned char kSentinel = 0x5A;

inline void fill_sentinel(HostTensor& t) { std::memset(t.data(), kSentinel, t.bytes().size()); }

inline ::testing::AssertionResult untouched(const char* what, const HostTensor& t) {
  for (size_t e = 0; e < t.bytes().size(); ++e)
    if (t.bytes()[e] != kSentinel)
      return ::testing::AssertionFailure() << what << ": byte " << e << " was written by a rejected call";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult message_has(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts)
    if (message.find(part) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << part << "\"";
  return ::testing::AssertionSuccess();
}

struct BadCase {
  std::string name;
  std::function<void(Problem&, fa_fwd_args&, fa_bwd_args&)> mutate;
  fa_status status;
  std::vector<std::string> parts;
};

// Runs the forward (bwd = false) or backward of `p` mutated by `c` and checks the rejection.
inline void check_rejected(Problem& p, const BadCase& c, bool bwd) {
  SCOPED_TRACE(c.name);
  fa_fwd_args fa = p.fwd_args();
  fa_bwd_args ba = p.bwd_args();
  c.mutate(p, fa, ba);
  std::vector<HostTensor*> outputs, inputs;
  if (bwd) {
    outputs = {&p.dq, &p.dk, &p.dv};
    inputs = {&p.q, &p.k, &p.v, &p.out, &p.lse, &p.dout};
  } else {
    outputs = {&p.out, &p.lse};
    inputs = {&p.q, &p.k, &p.v};
  }
  for (HostTensor* t : {&p.cu_q, &p.cu_k, &p.alibi})
    if (!t->bytes().empty()) inputs.push_back(t);
  std::vector<std::vector<unsigned char>> before;
  for (HostTensor* t : inputs) before.push_back(t->bytes());
  for (HostTensor* t : outputs) fill_sentinel(*t);

  std::vector<unsigned char> big(1 << 20);
  for (int attempt = 0; attempt < 2; ++attempt) {
    // attempt 0: library-allocated workspace; 1: a large caller workspace (the check is not the allocation).
    if (attempt == 1 && c.status == FA_ERROR_WORKSPACE_TOO_SMALL) break;
    void* ws = attempt == 0 ? nullptr : big.data();
    const size_t ws_bytes = attempt == 0 ? 0 : big.size();
    const fa_status got = bwd ? fa_bwd(&ba, ws, ws_bytes) : fa_fwd(&fa, ws, ws_bytes);
    EXPECT_EQ(got, c.status) << fa_last_error();
    EXPECT_TRUE(message_has(fa_last_error(), c.parts));
  }
  for (size_t t = 0; t < outputs.size(); ++t) EXPECT_TRUE(untouched("output", *outputs[t])) << "output " << t;
  for (size_t t = 0; t < inputs.size(); ++t) EXPECT_TRUE(inputs[t]->bytes() == before[t]) << "input " << t << " changed";

  if (c.status != FA_ERROR_WORKSPACE_TOO_SMALL) {
    size_t bytes = 777;
    const fa_status q = bwd ? fa_bwd_workspace_size(&ba, &bytes) : fa_fwd_workspace_size(&fa, &bytes);
    EXPECT_EQ(q, c.status) << "workspace query";
    EXPECT_EQ(bytes, 777u) << "a failed query must not write the size";
    EXPECT_TRUE(message_has(fa_last_error(), c.parts));
  }
  bool threw = false;
  try {
    if (bwd)
      flashattn::bwd(ba, c.status == FA_ERROR_WORKSPACE_TOO_SMALL ? big.data() : nullptr, 1);
    else
      flashattn::fwd(fa, c.status == FA_ERROR_WORKSPACE_TOO_SMALL ? big.data() : nullptr, 1);
  } catch (const flashattn::Error& e) {
    threw = true;
    EXPECT_EQ(e.status(), c.status);
    EXPECT_TRUE(message_has(e.what(), c.parts));
  }
  EXPECT_TRUE(threw) << "the C++ wrapper must throw flashattn::Error";
}

// The small valid problems every bad case starts from.
inline Case dense_base() {
  Case c;
  c.name = "bad_dense";
  c.dtype = FA_DTYPE_FP32;
  c.B = 2;
  c.H = 4;
  c.Hkv = 2;
  c.Sq = 5;
  c.Sk = 7;
  c.D = 16;
  c.Dv = 8;
  return c;
}

inline Case varlen_base() {
  Case c = dense_base();
  c.name = "bad_varlen";
  c.seqlens_q = {2, 0, 3};  // cu_seqlens_q = {0, 2, 2, 5}
  c.seqlens_k = {4, 1, 2};  // cu_seqlens_k = {0, 4, 5, 7}
  c.B = 3;
  c.Sq = 3;
  c.Sk = 4;
  return c;
}

}  // namespace fatest
