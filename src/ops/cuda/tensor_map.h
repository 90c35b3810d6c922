// TMA tensor maps (CUtensorMap) for the warp-specialised kernels' bulk copies: a row-major 2D
// array of `rows` rows, `row_elements` elements each, cut into boxes of box_rows rows x 128
// bytes that land in shared memory with the 128-byte swizzle wgmma.cuh describes (swizzled()).
// Reads past the last row fill zeros. The driver's encoder comes through the runtime's entry
// point, so that nothing links libcuda.
#pragma once

#include <cuda.h>  // CUtensorMap and its encoder's types

#include <cstdint>

namespace glms::ops::cuda {

// type: CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 (2-byte elements) or CU_TENSOR_MAP_DATA_TYPE_UINT8 (E4M3
// codes). Rows of a multiple of 16 bytes; box_rows 1..256. row_stride: elements from one row's
// start to the next's (a multiple of 16 bytes; 0: row_elements, dense rows).
CUtensorMap swizzled_rows_tensor_map(const void* base, CUtensorMapDataType type, int64_t rows, int64_t row_elements,
                                     int box_rows, int64_t row_stride = 0);

}  // namespace glms::ops::cuda
