// The AVX2 kernel set, for CPUs without AVX-512. Only this file is compiled
// for AVX2 + FMA + F16C (through the target pragma below, never -march), and
// only after the dispatcher has seen the features at run time. Standard and
// shared headers are included before the pragma, so their inline functions
// stay baseline code; the algorithm headers after it are instantiated with
// AVX2 and have internal linkage.
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

bool avx2_supported() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

}  // namespace cpu
}  // namespace flashattn

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "cpu/avx2_kernels.hpp"
#include "cpu/bwd_impl.hpp"
#include "cpu/fwd_impl.hpp"

namespace flashattn {
namespace cpu {

IsaBackend avx2_backend() { return IsaBackend{"avx2", &run_fwd<Avx2Kernels>, &run_bwd<Avx2Kernels>}; }
IsaBackend avx2_bf16_backend() {
  return IsaBackend{"avx2-bf16", &run_fwd<Avx2Bf16Kernels>, &run_bwd<Avx2Bf16Kernels>};
}

}  // namespace cpu
}  // namespace flashattn

#pragma GCC pop_options
