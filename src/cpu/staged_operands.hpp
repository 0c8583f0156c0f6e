// The operand hooks of the kernel sets that read every gemm operand as
// staged fp32 (generic, AVX2, AVX-512; kernels.hpp has the contract): no
// packed layouts, so pins and shared operands are no-ops, and the packings
// straight from tensor rows or fused with dS are declined. The AMX kernel
// sets (isa_amx.cpp) define their own.
#pragma once

#include <cstdint>

#include "cpu/scratch.hpp"

namespace flashattn {
namespace cpu {
namespace {

struct StagedOperands {
  void pin_b(int /*slot*/, const float* /*b*/, int /*k*/, int /*n*/, int64_t /*ldb*/) {}
  void unpin_b(int /*slot*/) {}
  void unpin_a(int /*slot*/) {}
  static void pack_chunk(const SharedOperand& /*op*/, int64_t /*chunk*/, int /*rows*/) {}
  void share(int /*slot*/, const SharedOperand& /*op*/) {}
  void unshare(int /*slot*/) {}
  template <class Rows>
  static bool pack_chunk_from_rows(const SharedOperand& /*op*/, int64_t /*chunk*/, int /*rows*/, const Rows& /*src*/,
                                   int64_t /*first_row*/) {
    return false;
  }
  template <class Rows>
  static bool pin_b_from_rows(int /*slot*/, const Rows& /*src*/, int64_t /*first_row*/, int /*rows*/, int /*cols*/,
                              const float* /*b*/, int64_t /*ldb*/) {
    return false;
  }
  template <class Tile>
  static bool fwd_plain_tile(const Tile& /*tile*/) {
    return false;
  }
  static bool softmax_grad(const float* /*p*/, float* /*dp*/, int64_t /*ld*/, int /*rows*/, int /*n*/,
                           const float* /*delta*/, int /*a_slot_p*/, int /*a_slot_ds*/, int /*b_slot*/) {
    return false;
  }
};

}  // namespace
}  // namespace cpu
}  // namespace flashattn
