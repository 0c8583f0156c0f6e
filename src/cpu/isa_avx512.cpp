// The AVX-512 kernel set. Only this file is compiled for AVX-512 (through the
// target pragma below, never -march), and only after the dispatcher has seen
// the features at run time. Standard and shared headers are included before
// the pragma, so their inline functions stay baseline code; the algorithm
// headers after it are instantiated with AVX-512 and have internal linkage.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/half.hpp"
#include "common/mask.hpp"
#include "common/params.hpp"
#include "common/philox.hpp"
#include "cpu/config.hpp"
#include "cpu/kernels.hpp"
#include "cpu/scratch.hpp"

namespace flashattn {
namespace cpu {

bool avx512_supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
}

bool avx512_bf16_supported() { return avx512_supported() && __builtin_cpu_supports("avx512bf16"); }

}  // namespace cpu
}  // namespace flashattn

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
// GCC 12's own intrinsic headers seed results with `__m512i __Y = __Y;` and
// then warn about it; the warnings say nothing about this file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "cpu/avx512_kernels.hpp"
#include "cpu/bwd_impl.hpp"
#include "cpu/fwd_impl.hpp"

namespace flashattn {
namespace cpu {

IsaBackend avx512_backend() { return IsaBackend{"avx512", &run_fwd<Avx512Kernels>, &run_bwd<Avx512Kernels>}; }

}  // namespace cpu
}  // namespace flashattn

#pragma GCC diagnostic pop
#pragma GCC pop_options
