// One case made concrete: random inputs (seeded from the case), the host
// tensors the library reads and writes, the C API argument blocks that point
// at them, and the reference semantics. A GPU test copies the tensors to the
// device, repoints the views and reads the outputs back into the same
// HostTensors; everything else here is reused as is.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "support/cases.hpp"
#include "support/reference.hpp"
#include "support/tensor.hpp"

namespace fatest {

struct Problem {
  Case c;
  Geometry g;
  Semantics sem;
  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  HostTensor cu_q, cu_k, alibi;  // empty when unused

  // Argument blocks over these tensors (valid while the Problem lives and is not moved).
  fa_fwd_args fwd_args() const;
  fa_bwd_args bwd_args() const;  // out and lse must hold a forward's results

  // For a device test: what to upload before a call and what to read back after it.
  std::vector<HostTensor*> inputs() { return {&q, &k, &v, &dout, &cu_q, &cu_k, &alibi}; }
  std::vector<HostTensor*> outputs() { return {&out, &lse, &dq, &dk, &dv}; }

  // Every output back to the poison pattern.
  void poison_outputs();
  // Our LSE in the reference's (Tq, H) order.
  std::vector<double> lse_rows() const;
  // Rows (Tq*H entries) that see no key, and keys (Tk*Hkv entries) that no query row sees.
  std::vector<bool> empty_rows() const;
  std::vector<bool> unseen_keys() const;
};

// Builds the case's problem with inputs drawn from `seed` (default: case_seed).
Problem make_problem(const Case& c);
Problem make_problem(const Case& c, uint64_t seed);

// Pass rule (flash-attn's): max|ours - ref| <= 2 * max|naive - ref| + floor,
// floor = 1e-6 * max|ref|: about 8 fp32 ulps of the largest value, far below
// any fp16/bf16 rounding step, so it only matters when the naive error is ~0.
// +inf entries (LSE of empty rows) must match exactly; any other non-finite
// value in `ours` fails. `scale` (when larger than max|ref|) sets the floor
// instead: the backward passes the largest reference gradient of dQ, dK, dV,
// and for dQ, dK at least softmax scale * max(|Q|, |K|) * max|P dP|, because
// FA2's D_i = dO_i . O_i rounds differently from dP = dO . V, which leaves
// errors of eps * |dP| in dS even where dS, dQ, dK are exactly 0 (rows that see
// one key), where the naive error is 0 too.
struct ErrorReport {
  double ours = 0, naive = 0, floor = 0, bound = 0, ref_max = 0;
  int64_t worst = -1;        // index of the largest error of ours
  int64_t nonfinite = 0;     // non-finite entries of ours where ref is finite
  int64_t inf_mismatch = 0;  // ref +inf but ours not (or the other way)
  bool pass() const { return nonfinite == 0 && inf_mismatch == 0 && ours <= bound; }
  std::string describe(const char* what) const;
};
ErrorReport compare(const std::vector<double>& ours, const std::vector<double>& ref,
                    const std::vector<double>& naive, double scale = 0.0);

::testing::AssertionResult within_tolerance(const char* what, const std::vector<double>& ours,
                                            const std::vector<double>& ref, const std::vector<double>& naive,
                                            double scale = 0.0);

// max |x| over the finite entries.
double max_abs(const std::vector<double>& x);

// Every logical element written (no poison left) and no padding byte touched.
::testing::AssertionResult fully_written(const char* what, const HostTensor& t);

// Counts the library's allocations (fa_set_allocator); installed for its lifetime.
class CountingAllocator {
 public:
  CountingAllocator();
  ~CountingAllocator();
  CountingAllocator(const CountingAllocator&) = delete;
  CountingAllocator& operator=(const CountingAllocator&) = delete;

  int64_t calls = 0, frees = 0;
  size_t total_bytes = 0, last_bytes = 0, live = 0;
  void reset() { calls = frees = 0, total_bytes = last_bytes = live = 0; }
};

// Thread count the tests use when a test does not choose one (env FLASHATTN_TEST_THREADS, default 2).
int test_threads();

}  // namespace fatest
