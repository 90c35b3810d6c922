// bf16 GEMV for decode-sized batches: y[n, rows] = x[n, cols] . W[rows, cols]^T, n <= 4.
//
// Why: at one to four tokens a linear layer is a pass over its weights, and cuBLAS's GEMM
// kernels leave bandwidth unused on narrow outputs (kv_a 576 rows, indexer wk 128, weights_proj
// 32) and add a split-K workspace pass. Here a block owns four rows and its eight warps split
// the row length between them, so even a 32-row matrix spreads over eight blocks of 16-byte
// loads, and a block-level sum finishes each output.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"

namespace glms::ops::cuda {

namespace {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvRows = 4;  // rows per block

__device__ __forceinline__ void widen8(const uint4& v, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

template <int kTokens>
__global__ void __launch_bounds__(kGemvThreads) gemv_bf16_kernel(const uint16_t* x, int n, int64_t ld_x,
                                                                 const uint16_t* w, int64_t rows, int64_t cols, float* y,
                                                                 int64_t ld_y) {
  __shared__ float partial[kGemvWarps][kGemvRows][kTokens];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kGemvRows;
  const uint4* w_rows[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r)
    w_rows[r] = reinterpret_cast<const uint4*>(w + min(row0 + r, rows - 1) * cols);
  // This warp's share of the row: 16-byte chunks [begin, end), lane-strided.
  const int64_t chunks = cols / 8;
  const int64_t begin = chunks * warp / kGemvWarps, end = chunks * (warp + 1) / kGemvWarps;
  float acc[kGemvRows][kTokens];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokens; ++j) acc[r][j] = 0.0f;
  for (int64_t c = begin + lane; c < end; c += 32) {
    float wv[kGemvRows][8];
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) widen8(__ldg(w_rows[r] + c), wv[r]);
#pragma unroll
    for (int j = 0; j < kTokens; ++j) {
      if (j >= n) break;
      float xv[8];
      widen8(__ldg(reinterpret_cast<const uint4*>(x + j * ld_x) + c), xv);
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][j] += wv[r][i] * xv[i];
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokens; ++j) {
      const float sum = warp_sum(acc[r][j]);
      if (lane == 0) partial[warp][r][j] = sum;
    }
  __syncthreads();
  const int t = threadIdx.x;
  if (t < kGemvRows * kTokens) {
    const int r = t / kTokens, j = t % kTokens;
    if (j < n && row0 + r < rows) {
      float sum = 0.0f;
#pragma unroll
      for (int v = 0; v < kGemvWarps; ++v) sum += partial[v][r][j];
      y[j * ld_y + row0 + r] = sum;
    }
  }
}

}  // namespace

bool gemv_bf16_fits(const uint16_t* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t cols) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return n >= 1 && n <= kGemvMaxTokens && cols % 8 == 0 && ld_x % 8 == 0 && aligned(x) && aligned(w);
}

void gemv_bf16(const uint16_t* x, int64_t n, int64_t ld_x, const uint16_t* w, int64_t rows, int64_t cols, float* y,
               int64_t ld_y, cudaStream_t stream) {
  if (n == 0 || rows == 0) return;
  GLMS_CHECK(gemv_bf16_fits(x, n, ld_x, w, cols), "gemv_bf16: at most 4 tokens, 16-byte aligned rows");
  const unsigned blocks = blocks_for(rows, kGemvRows);
  const int tokens = static_cast<int>(n);
  if (n == 1) gemv_bf16_kernel<1><<<blocks, kGemvThreads, 0, stream>>>(x, tokens, ld_x, w, rows, cols, y, ld_y);
  else if (n == 2) gemv_bf16_kernel<2><<<blocks, kGemvThreads, 0, stream>>>(x, tokens, ld_x, w, rows, cols, y, ld_y);
  else gemv_bf16_kernel<4><<<blocks, kGemvThreads, 0, stream>>>(x, tokens, ld_x, w, rows, cols, y, ld_y);
  check(cudaGetLastError(), "gemv_bf16 launch");
}

}  // namespace glms::ops::cuda
