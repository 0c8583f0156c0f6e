// Turns C API arguments into normalized backend params, or fails with a
// message naming the argument. Writes nothing but `params`.
#pragma once

#include "common/params.hpp"

namespace flashattn {

fa_status validate_fwd(const fa_fwd_args* args, FwdParams& params);
fa_status validate_bwd(const fa_bwd_args* args, BwdParams& params);

}  // namespace flashattn
