// TMA tensor maps of the sm90 kernels, encoded on the host with the driver's
// cuTensorMapEncodeTiled reached through the runtime (no libcuda link).
#pragma once

#include <cuda.h>

#include "common/error.hpp"
#include "common/params.hpp"

namespace flashattn::cuda {

// True when TMA can describe the operand: 16-byte aligned base, strides of the
// dimensions longer than 1 multiples of 16 bytes, nonzero and below 2^40.
bool tma_describable(const void* base, const TensorLayout& layout, int64_t heads, int64_t batch);

// A 4-D map (col, row, head, batch) of a 16-bit tensor with `cols` columns,
// `rows` rows per sequence (varlen: all rows, batch 1), boxes of 64 columns x
// box_rows rows, 128-byte swizzle, zero fill outside the tensor.
fa_status encode_tensor_map(CUtensorMap* map, fa_dtype dtype, const void* base, int64_t cols, int64_t rows,
                            int64_t heads, int64_t batch, const TensorLayout& layout, int box_rows);

}  // namespace flashattn::cuda
