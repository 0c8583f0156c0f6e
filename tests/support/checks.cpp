#include "support/checks.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace fatest {

void expect_forward_matches_reference(const Problem& p) {
  const std::vector<double> q = p.q.to_vector(), k = p.k.to_vector(), v = p.v.to_vector();
  const FwdOut ref = reference_forward(p.g, p.sem, q, k, v);
  const FwdOut naive = attention_forward(p.g, p.sem, q, k, v, p.c.dtype, false);
  const std::vector<double> o = p.out.to_vector(), lse = p.lse_rows();
  EXPECT_TRUE(within_tolerance("O", o, ref.o, naive.o));
  EXPECT_TRUE(within_tolerance("LSE", lse, ref.lse, naive.lse));

  const std::vector<bool> empty = p.empty_rows();
  int64_t bad_rows = 0;
  for (size_t r = 0; r < empty.size(); ++r) {
    if (!empty[r]) continue;
    bool ok = lse[r] == std::numeric_limits<double>::infinity();
    for (int64_t d = 0; d < p.g.Dv; ++d) ok = ok && o[r * p.g.Dv + d] == 0.0;
    bad_rows += ok ? 0 : 1;
  }
  EXPECT_EQ(bad_rows, 0) << "rows that see no key must give O = 0 and LSE = +inf";
}

BackwardReference backward_reference(const Problem& p) {
  const std::vector<double> q = p.q.to_vector(), k = p.k.to_vector(), v = p.v.to_vector();
  const std::vector<double> dout = p.dout.to_vector();
  BackwardReference r{reference_backward(p.g, p.sem, q, k, v, dout),
                      attention_backward(p.g, p.sem, q, k, v, dout, p.c.dtype, false), 0.0, 0.0};
  r.scale = std::max({max_abs(r.ref.dq), max_abs(r.ref.dk), max_abs(r.ref.dv)});
  const double cancelled = std::fabs(p.sem.scale) * std::max(max_abs(q), max_abs(k)) * r.ref.ds_terms_max;
  r.ds_scale = std::max(r.scale, cancelled);
  return r;
}

void expect_gradients_match_reference(const Problem& p, const BackwardReference& r) {
  const std::vector<double> dq = p.dq.to_vector(), dk = p.dk.to_vector(), dv = p.dv.to_vector();
  EXPECT_TRUE(within_tolerance("dQ", dq, r.ref.dq, r.naive.dq, r.ds_scale));
  EXPECT_TRUE(within_tolerance("dK", dk, r.ref.dk, r.naive.dk, r.ds_scale));
  EXPECT_TRUE(within_tolerance("dV", dv, r.ref.dv, r.naive.dv, r.scale));

  const std::vector<bool> empty = p.empty_rows(), unseen = p.unseen_keys();
  int64_t bad = 0;
  for (size_t row = 0; row < empty.size(); ++row)
    for (int64_t d = 0; empty[row] && d < p.g.D; ++d) bad += dq[row * p.g.D + d] == 0.0 ? 0 : 1;
  EXPECT_EQ(bad, 0) << "dQ of rows that see no key must be 0";
  bad = 0;
  for (size_t key = 0; key < unseen.size(); ++key) {
    for (int64_t d = 0; unseen[key] && d < p.g.D; ++d) bad += dk[key * p.g.D + d] == 0.0 ? 0 : 1;
    for (int64_t d = 0; unseen[key] && d < p.g.Dv; ++d) bad += dv[key * p.g.Dv + d] == 0.0 ? 0 : 1;
  }
  EXPECT_EQ(bad, 0) << "dK, dV of keys no query sees must be 0";
}

}  // namespace fatest
