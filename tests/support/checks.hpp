// The result checks that every backend's forward and backward tests share:
// the 2x rule against the fp64 reference and the exact zeros of rows that see
// no key. They read the host copies of p's outputs (a GPU test downloads first).
#pragma once

#include <vector>

#include "support/problem.hpp"
#include "support/reference.hpp"

namespace fatest {

// O and LSE within the rule; rows that see no key give O = 0 and LSE = +inf.
void expect_forward_matches_reference(const Problem& p);

struct BackwardReference {
  BwdOut ref;     // fp64
  BwdOut naive;   // same precision as the case
  double scale;   // dV's floor scale: max of |dQ|, |dK|, |dV| of ref
  // dQ's and dK's: also softmax scale * max(|Q|, |K|) * ref.ds_terms_max, the size those gradients
  // take from the terms that dS cancels (FA2's D = dO . O rounds differently from dP = dO . V).
  double ds_scale;
};
BackwardReference backward_reference(const Problem& p);

// dQ, dK, dV within the rule; dQ of rows that see no key and dK, dV of keys no
// row sees exactly 0.
void expect_gradients_match_reference(const Problem& p, const BackwardReference& r);

}  // namespace fatest
