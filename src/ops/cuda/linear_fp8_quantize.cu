// quantize_fp8_rows (fp32 or bf16 rows): a block of 128 threads per (token, 128-column block), a
// value a thread; the block's largest magnitude sets the scale, then each thread writes its
// code. Pad tokens read as zeros.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/linear_fp8.h"

namespace glms::ops::cuda {

namespace {

constexpr int kQuantizeThreads = static_cast<int>(kFp8ScaleBlock);

__device__ __forceinline__ float value_of(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float value_of(const uint16_t* x, int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

template <typename T>
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_fp8_rows_kernel(const T* x, int64_t n, int64_t padded, int64_t cols, uint8_t* codes, float* scales) {
  __shared__ float warp_max[kQuantizeThreads / 32];
  const int64_t token = blockIdx.x, block = blockIdx.y;
  const int64_t i = token * cols + block * kFp8ScaleBlock + threadIdx.x;
  const float v = token < n ? value_of(x, i) : 0.0f;
  float amax = fabsf(v);
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
  for (int w = 1; w < kQuantizeThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float scale = amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 1.0f;
  codes[i] = e4m3_of(v, scale);
  if (threadIdx.x == 0) scales[block * padded + token] = scale;
}

template <typename T>
void launch_quantize(const T* x, int64_t n, int64_t cols, uint8_t* codes, float* scales, cudaStream_t stream) {
  if (n == 0) return;
  GLMS_CHECK(cols % kFp8ScaleBlock == 0, "quantize_fp8_rows: cols a multiple of 128");
  GLMS_CHECK(n <= 0x7fffffff && cols / kFp8ScaleBlock <= 65535, "quantize_fp8_rows: too many rows or columns");
  const int64_t padded = fp8_padded_tokens(n);
  const dim3 grid(static_cast<unsigned>(padded), static_cast<unsigned>(cols / kFp8ScaleBlock));
  quantize_fp8_rows_kernel<T><<<grid, kQuantizeThreads, 0, stream>>>(x, n, padded, cols, codes, scales);
  check(cudaGetLastError(), "quantize_fp8_rows launch");
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
