#include "ops/cuda/tensor_map.h"

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace glms::ops::cuda {

CUtensorMap swizzled_rows_tensor_map(const void* base, CUtensorMapDataType type, int64_t rows, int64_t row_elements,
                                     int box_rows, int64_t row_stride) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found),
          "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    GLMS_CHECK(found == cudaDriverEntryPointSuccess && function != nullptr,
               "the CUDA driver has no cuTensorMapEncodeTiled (12.0 or later needed)");
    return reinterpret_cast<Encode>(function);
  }();
  GLMS_CHECK(type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 || type == CU_TENSOR_MAP_DATA_TYPE_UINT8,
             "swizzled_rows_tensor_map: bf16 or 1-byte elements");
  const int64_t element_bytes = type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 ? 2 : 1;
  if (row_stride == 0) row_stride = row_elements;
  GLMS_CHECK(row_elements * element_bytes % 16 == 0 && row_stride * element_bytes % 16 == 0 &&
                 row_stride >= row_elements && box_rows >= 1 && box_rows <= 256,
             "swizzled_rows_tensor_map: rows of whole 16 bytes, boxes of 1 to 256 rows");
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_elements), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride * element_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / element_bytes), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = encode(&map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  GLMS_CHECK(result == CUDA_SUCCESS,
             "cuTensorMapEncodeTiled failed (error " + std::to_string(static_cast<int>(result)) + ")");
  return map;
}

}  // namespace glms::ops::cuda
