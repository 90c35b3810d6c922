// gemv_fp8: a block owns kRows weight rows and its eight warps split the row length; a lane
// reads 16 codes (16 bytes) of each of its rows a step, widens them in pairs (the hardware's
// E4M3 -> fp16 conversion, exact) and sums them against the tokens' bf16 values in fp32. A
// 16-code chunk lies inside one 128-column scale block, so the block scale multiplies the
// chunk's partial sum once. The tokens' values are read through the cache (a few KB a step).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/linear_fp8.h"

namespace glms::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 4;

// The 16 values of token t's chunk c as fp32.
__device__ __forceinline__ void load_inputs(const uint16_t* x, int64_t cols, int t, int64_t c, float (&v)[16]) {
  const uint4* p = reinterpret_cast<const uint4*>(x + t * cols + c * 16);
  const uint4 a = __ldg(p), b = __ldg(p + 1);
  const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

template <int N>
__global__ void __launch_bounds__(kThreads)
    gemv_fp8_kernel(const uint16_t* x, const uint8_t* w, const float* scales, int64_t scale_stride, int64_t rows,
                    int64_t cols, float* y, int64_t ld_y) {
  __shared__ float partial[kWarps][kRows][N];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  // The thread's first 16 codes of each row into L2 while the previous kernel finishes (weights
  // are not written by a step's kernels; launch.cuh).
  release_dependent_grids();
  if (threadIdx.x < cols / 16) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      prefetch_l2(reinterpret_cast<const uint4*>(w + min(row0 + r, rows - 1) * cols) + threadIdx.x);
  }
  wait_for_previous_grid();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float acc[kRows][N];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < N; ++t) acc[r][t] = 0.0f;
  const int64_t chunks = cols / 16;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    uint4 codes[kRows];
    float scale[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = min(row0 + r, rows - 1);  // rows past the end repeat the last (not written)
      codes[r] = __ldg(reinterpret_cast<const uint4*>(w + row * cols) + c);
      scale[r] = __ldg(scales + (row / kFp8ScaleBlock) * scale_stride + (c * 16) / kFp8ScaleBlock);
    }
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float v[16];
      load_inputs(x, cols, t, c, v);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint32_t words[4] = {codes[r].x, codes[r].y, codes[r].z, codes[r].w};
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 lo = e4m3x2_to_float2(words[i]), hi = e4m3x2_to_float2(words[i] >> 16);
          sum = fmaf(lo.x, v[4 * i], sum);
          sum = fmaf(lo.y, v[4 * i + 1], sum);
          sum = fmaf(hi.x, v[4 * i + 2], sum);
          sum = fmaf(hi.y, v[4 * i + 3], sum);
        }
        acc[r][t] = fmaf(sum, scale[r], acc[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float v = acc[r][t];
      for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
      if (lane == 0) partial[warp][r][t] = v;
    }
  __syncthreads();
  if (threadIdx.x < kRows * N) {
    const int r = threadIdx.x / N, t = threadIdx.x % N;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) sum += partial[k][r][t];
    if (row0 + r < rows) y[t * ld_y + row0 + r] = sum;
  }
}

}  // namespace

void gemv_fp8(const uint16_t* x, int64_t n, const uint8_t* w_codes, const float* w_scales, int64_t rows, int64_t cols,
              float* y, int64_t ld_y, cudaStream_t stream) {
  if (n == 0 || rows == 0) return;
  GLMS_CHECK(n <= kFp8GemvMaxTokens, "gemv_fp8: at most kFp8GemvMaxTokens tokens");
  GLMS_CHECK(cols % 16 == 0, "gemv_fp8: cols a multiple of 16");
  GLMS_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w_codes) % 16 == 0,
             "gemv_fp8: 16-byte aligned inputs");
  if (ld_y == 0) ld_y = rows;
  const int64_t stride = fp8_scale_row_stride(cols);
  const unsigned blocks = static_cast<unsigned>((rows + kRows - 1) / kRows);
  auto launch = [&](auto tokens) {
    launch_chained("gemv_fp8 launch", gemv_fp8_kernel<decltype(tokens)::value>, blocks, kThreads, 0, stream, x, w_codes,
                   w_scales, stride, rows, cols, y, ld_y);
  };
  switch (n) {
    case 1: launch(std::integral_constant<int, 1>{}); break;
    case 2: launch(std::integral_constant<int, 2>{}); break;
    case 3: launch(std::integral_constant<int, 3>{}); break;
    default: launch(std::integral_constant<int, 4>{}); break;
  }
}

}  // namespace glms::ops::cuda
