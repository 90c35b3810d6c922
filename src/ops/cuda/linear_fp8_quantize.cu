// quantize_fp8_rows (fp32 or bf16 rows): a warp per (token, 128-column block), four values a
// lane (one 16- or 8-byte load, one 4-byte store of codes); the block's largest magnitude, by
// shuffles, sets the scale. Pad tokens read as zeros.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/linear_fp8.h"

namespace glms::ops::cuda {

namespace {

constexpr int kQuantizeThreads = 256;
constexpr int kWarps = kQuantizeThreads / 32;
static_assert(kFp8ScaleBlock == 4 * 32, "a warp's four values a lane cover one scale block");

__device__ __forceinline__ float4 four_values(const float* x) { return *reinterpret_cast<const float4*>(x); }
__device__ __forceinline__ float4 four_values(const uint16_t* x) {
  const uint2 v = *reinterpret_cast<const uint2*>(x);
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                     __uint_as_float(v.y & 0xffff0000u));
}

template <typename T>
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_fp8_rows_kernel(const T* x, int64_t n, int64_t padded, int64_t cols, uint8_t* codes, float* scales) {
  chained_grid_prologue();
  const int64_t blocks = cols / kFp8ScaleBlock;
  const int64_t item = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  if (item >= padded * blocks) return;
  const int64_t token = item / blocks, block = item % blocks, lane = threadIdx.x % 32;
  const int64_t i = token * cols + block * kFp8ScaleBlock + 4 * lane;
  const float4 v = token < n ? four_values(x + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  const float scale = activation_scale_over_lanes<32>(amax);
  *reinterpret_cast<uint32_t*>(codes + i) = static_cast<uint32_t>(e4m3_of(v.x, scale)) |
                                           static_cast<uint32_t>(e4m3_of(v.y, scale)) << 8 |
                                           static_cast<uint32_t>(e4m3_of(v.z, scale)) << 16 |
                                           static_cast<uint32_t>(e4m3_of(v.w, scale)) << 24;
  if (lane == 0) scales[block * padded + token] = scale;
}

template <typename T>
void launch_quantize(const T* x, int64_t n, int64_t cols, uint8_t* codes, float* scales, cudaStream_t stream) {
  if (n == 0) return;
  GLMS_CHECK(cols % kFp8ScaleBlock == 0, "quantize_fp8_rows: cols a multiple of 128");
  const int64_t padded = fp8_padded_tokens(n);
  const int64_t grid = (padded * (cols / kFp8ScaleBlock) + kWarps - 1) / kWarps;
  GLMS_CHECK(grid <= 0x7fffffff, "quantize_fp8_rows: too many rows or columns");
  launch_chained("quantize_fp8_rows launch", quantize_fp8_rows_kernel<T>, static_cast<unsigned>(grid), kQuantizeThreads,
                 0, stream, x, n, padded, cols, codes, scales);
}

}  // namespace

void quantize_fp8_rows(const float* x, int64_t n, int64_t cols, uint8_t* codes, float* scales, cudaStream_t stream) {
  launch_quantize(x, n, cols, codes, scales, stream);
}

void quantize_fp8_rows(const uint16_t* x, int64_t n, int64_t cols, uint8_t* codes, float* scales,
                       cudaStream_t stream) {
  launch_quantize(x, n, cols, codes, scales, stream);
}

}  // namespace glms::ops::cuda
