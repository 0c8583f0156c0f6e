// The entry points of each ISA build of the backend and the dispatcher's
// choice between them. Every ISA translation unit instantiates the same
// algorithm (fwd_impl.hpp, bwd_impl.hpp) over its own kernel set:
//   gemm            C (m, n) (+)= A (m, k) B (k, n); A element (i, l) at
//                   a[i * a_row + l * a_col] so A can be read transposed;
//                   B and C row-major
//   gemm_exact_a    C += A B where A holds values the gemm's multiply type
//                   cannot represent (P): a kernel set that rounds operands
//                   (AMX, bf16) adds the product of A's rounding residual,
//                   overwriting A with it; the others are gemm
//   gemm_exact_b    the same for a B that holds P
//   exp2_sub_vec    x[i] = exp2(x[i] * mul - sub[i])
//   exp2_sub_vec_unmasked
//                   the same for arguments that are never -inf: an argument
//                   below -125 may give 2^-125 p(f) instead of 0 (AVX-512:
//                   exp2_unmasked_ps); exp2_sub_vec elsewhere
//   column_max      out[i] = max over r < rows of x[r * ld + i], i < n, a
//                   NaN element ignored as by std::max(out, x)
//   exp2_tile_sum   x[r * ld + i] = exp2(x[r * ld + i] * mul - sub[i]) for
//                   r < rows, i < n, and sum[i] += the new column sums;
//                   with `finite` no x is -inf and the kernel set may take
//                   its exp2 for finite arguments (exp2_sub_vec_unmasked);
//                   with pin_slot >= 0 the caller reads x afterwards only as
//                   the B operand (k = rows, n, ldb = ld) of gemms until
//                   unpin_b(pin_slot): a kernel set that packs B (AMX) packs
//                   it in that slot straight away and leaves x unwritten
//   exp2_sub_scalar x[i] = exp2(x[i] * mul - sub)
//   transpose       out (cols, rows) = in (rows, cols) transposed, each with
//                   its leading dimension (transpose_reference below)
//   load_row        n elements of dtype -> fp32
//   store_row       n fp32 -> dtype, round to nearest even
//   pin_b(slot, b, k, n, ldb) / unpin_b(slot)
//                   promise that B operand b keeps its contents until unpinned,
//                   so a kernel set that repacks B (AMX) packs it once; a gemm
//                   on a column window b + 16 * t of it reuses the packing
//   softmax_grad(p, dp, ld, rows, n, delta, a_slot_p, a_slot_ds, b_slot) /
//   unpin_a(slot)   dS^T = P^T o (dP^T - delta) (rows, n) with P^T and dS^T
//                   pinned as A operands (rows, lda = ld) and dS^T as a B
//                   operand, packed in the same pass; p and dp are then read
//                   only through those pins. False, doing nothing, where the
//                   kernel set does not (all but AMX for bf16)
//   fwd_plain_tile(tile)
//                   one whole key tile of the forward (PlainTile in
//                   fwd_impl.hpp) with the loop's state update; false,
//                   doing nothing, where the kernel set has no such path
//                   (all but AMX) or the operands are not packed
//   pack_chunk(op, chunk, rows) / share(slot, op) / unshare(slot)
//                   pack one chunk of staged rows in the kernel set's layout
//                   (scratch.hpp, SharedOperand), and let gemms whose A or B
//                   lies in op read that packing; no-ops where operands are
//                   read as fp32 (generic, AVX2, AVX-512, whose operand hooks
//                   are staged_operands.hpp's)
//   pack_chunk_from_rows(op, chunk, rows, src, first_row) /
//   pin_b_from_rows(slot, src, first_row, rows, cols, b, ldb)
//                   the same packings made straight from the tensor's rows
//                   (src, a RowsView) where the kernel set can (AMX: bf16
//                   rows, and fp32 rows for the shared operands): the fp32
//                   staging is then skipped and the fp32 operand never
//                   written; false, doing nothing, elsewhere
#pragma once

#include <cstdint>

#include "common/params.hpp"

namespace flashattn {
namespace cpu {

// The kernel sets' transpose in plain loops (generic, AVX2).
inline void transpose_reference(const float* in, int64_t ld_in, int rows, int cols, float* out, int64_t ld_out) {
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) out[j * ld_out + i] = in[i * ld_in + j];
}

struct IsaBackend {
  const char* name;
  fa_status (*fwd)(const FwdParams&, void*);
  fa_status (*bwd)(const BwdParams&, void*);
};

// Plain C++ the compiler vectorizes for the baseline target; runs anywhere.
IsaBackend generic_backend();
// AVX2 + FMA + F16C, every dtype computed in fp32; only called when the CPU
// reports those features. The bf16 build uses a shorter exp2 polynomial.
IsaBackend avx2_backend();
IsaBackend avx2_bf16_backend();
bool avx2_supported();
// AVX-512F/BW/VL/DQ + FMA; only called when the CPU reports those features.
IsaBackend avx512_backend();
bool avx512_supported();
// AVX-512 plus AVX512-BF16 (VDPBF16PS); the KV-cache attention of bf16 caches
// has a build for it (kvcache_avx512bf16.cpp), the forward and backward run
// the AVX-512 set. Defined with avx512_supported() (isa_avx512.cpp).
bool avx512_bf16_supported();
// AVX-512 plus AMX-BF16 tiles, for bf16 tensors; only called when
// amx_supported() (which also asks Linux for the tile state) says yes.
IsaBackend amx_backend();
bool amx_supported();
// The same for fp32 and fp16 tensors: every gemm operand split into three
// bf16 pieces (isa_amx.cpp), fp32 accuracy at AMX speed.
IsaBackend amx_split_backend();

// The richest kernel sets this CPU runs, in order, capped by
// FLASHATTN_CPU_ISA=generic, =avx2, =avx512 or =avx512bf16 (to test the lesser
// builds on a machine that has more); decided once per process (dispatch.cpp).
enum class IsaLevel { kGeneric, kAvx2, kAvx512, kAvx512Bf16, kAmx };
IsaLevel isa_level();

}  // namespace cpu
}  // namespace flashattn
