// Host side of the TMA: the driver entry point is resolved once through the
// runtime, so the library keeps linking only the static runtime.
#include "cuda/sm90/tensor_map.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cinttypes>
#include <mutex>

namespace flashattn::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 resolve_encode() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &query) ==
            cudaSuccess &&
        query == cudaDriverEntryPointSuccess)
      encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  });
  return encode;
}

bool stride_ok(int64_t extent, int64_t stride_elements) {
  if (extent <= 1) return true;  // never stepped: replaced by a valid dummy
  const int64_t bytes = stride_elements * 2;
  return bytes > 0 && bytes % 16 == 0 && bytes < (int64_t(1) << 40);
}

cuuint64_t stride_bytes(int64_t extent, int64_t stride_elements) {
  return extent <= 1 ? 16 : static_cast<cuuint64_t>(stride_elements * 2);
}

}  // namespace

bool tma_describable(const void* base, const TensorLayout& layout, int64_t heads, int64_t batch) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride_ok(2, layout.row) && stride_ok(heads, layout.head) &&
         stride_ok(batch, layout.batch) && resolve_encode() != nullptr;
}

fa_status encode_tensor_map(CUtensorMap* map, fa_dtype dtype, const void* base, int64_t cols, int64_t rows,
                            int64_t heads, int64_t batch, const TensorLayout& layout, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = resolve_encode();
  if (encode == nullptr)
    return fail(FA_ERROR_BACKEND, "CUDA: cuTensorMapEncodeTiled is not available from this driver");
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {stride_bytes(rows, layout.row), stride_bytes(heads, layout.head),
                                 stride_bytes(batch, layout.batch)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result =
      encode(map, dtype == FA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
             const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    return fail(FA_ERROR_BACKEND,
                "CUDA: cuTensorMapEncodeTiled failed (%d) for dims (%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                ") and strides (%" PRId64 ", %" PRId64 ", %" PRId64 ") elements",
                static_cast<int>(result), cols, rows, heads, batch, layout.row, layout.head, layout.batch);
  return FA_OK;
}

}  // namespace flashattn::cuda
