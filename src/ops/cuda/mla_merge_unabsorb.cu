// The merge of a short decode step's attention splits and the un-absorption of its heads in one
// launch (mla_merge_unabsorb).
//
// Why this kernel: at batch 1 a token's selection goes in 32 splits, whose sums mla_merge_splits
// merged (a launch of 64 blocks, about 4 us a layer in the replayed step) before the un-absorbing
// GEMV read them back. Here each block of the un-absorption merges its head's splits itself (the
// same functions as mla_merge_splits, mla_merge.cuh, so the same bits), and loads its value rows
// into registers before its chained wait: the attention kernel before it holds 32 SMs whole,
// so these blocks start on the others and have their weights in hand when the sums land.
//
// Block (row tile, head, token): kWarps warps of kRowsPerWarp value rows each; lane l holds
// 16-byte chunks l and l + 32 of each of its rows (512 latent columns: 64 chunks), the order in
// which gemv_bf16_batched's row kernel sums them, so that the heads are the bits the two launches
// gave.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla.h"
#include "ops/cuda/mla_merge.cuh"

namespace glms::ops::cuda {

namespace {

constexpr int kLatent = 512, kChunks = kLatent / 8;  // a value row's 16-byte chunks
constexpr int kLaneChunks = kChunks / 32;
constexpr int kWarps = 8, kThreads = 32 * kWarps, kRowsPerWarp = 8, kBlockRows = kWarps * kRowsPerWarp;
static_assert(kThreads >= kMergeStatThreads && kThreads % 32 == 0, "merge_split_weights' threads");
static_assert(kLatent == 4 * kMergeStatThreads, "the merge's first threads take four columns each");

// partials: [T][splits][H][512] sums, then [T][splits][H][2] statistics (mla.h). w_uv: head h's
// value rows [v_dim][512] bf16 from w_uv + h * head_rows * 512. heads: [T, H * v_dim] bf16.
__global__ void __launch_bounds__(kThreads)
    merge_unabsorb_kernel(const float* partials, int T, int splits, int H, const uint16_t* w_uv, int64_t head_rows,
                          int v_dim, uint16_t* heads) {
  const int tile = blockIdx.x, head = blockIdx.y, t = blockIdx.z;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int row0 = tile * kBlockRows + warp * kRowsPerWarp;
  // The weights (no kernel writes them) load before the wait for the attention.
  uint4 w[kRowsPerWarp][kLaneChunks];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const uint4* row = reinterpret_cast<const uint4*>(w_uv + (head * head_rows + row0 + r) * kLatent);
#pragma unroll
    for (int c = 0; c < kLaneChunks; ++c)
      w[r][c] = row0 + r < v_dim ? __ldg(row + lane + 32 * c) : make_uint4(0, 0, 0, 0);
  }
  chained_grid_prologue();

  __shared__ float weight[kMlaMaxSplits];
  __shared__ float scratch[32];
  __shared__ __align__(16) uint16_t merged[kLatent];  // the head's sums, bf16 as mla_merge_splits writes them
  const float* stats = partials + static_cast<int64_t>(T) * splits * H * kLatent;
  const float inv_total = merge_split_weights(stats, splits, H, t, head, weight, scratch);
  if (threadIdx.x < kMergeStatThreads) {
    const int k = 4 * static_cast<int>(threadIdx.x);
    const float* column0 = partials + (static_cast<int64_t>(t) * splits * H + head) * kLatent;
    *reinterpret_cast<uint2*>(merged + k) =
        merged_columns(column0, static_cast<int64_t>(H) * kLatent, splits, weight, inv_total, k);
  }
  __syncthreads();

  float x[kLaneChunks][8];
#pragma unroll
  for (int c = 0; c < kLaneChunks; ++c) {
    const uint4 v = reinterpret_cast<const uint4*>(merged)[lane + 32 * c];
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[c][2 * i] = __uint_as_float(words[i] << 16);
      x[c][2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
  uint16_t* out = heads + (static_cast<int64_t>(t) * H + head) * v_dim;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < kLaneChunks; ++c) {
      const uint32_t words[4] = {w[r][c].x, w[r][c].y, w[r][c].z, w[r][c].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc += __uint_as_float(words[i] << 16) * x[c][2 * i];
        acc += __uint_as_float(words[i] & 0xffff0000u) * x[c][2 * i + 1];
      }
    }
    const float sum = warp_sum(acc);
    if (lane == 0 && row0 + r < v_dim) out[row0 + r] = float_to_bf16(sum);
  }
}

}  // namespace

bool mla_merge_unabsorb_supported(int64_t T, int64_t latent, int64_t v_dim) {
  return T >= 1 && T <= kMlaMergeUnabsorbMaxTokens && latent == kLatent && v_dim >= 1;
}

void mla_merge_unabsorb(const float* partials, int T, int splits, int heads, const uint16_t* w_uv, int64_t head_rows,
                        int v_dim, uint16_t* out, cudaStream_t stream) {
  GLMS_CHECK(mla_merge_unabsorb_supported(T, kLatent, v_dim) && splits >= 1 && splits <= kMlaMaxSplits,
             "mla_merge_unabsorb: at most kMlaMergeUnabsorbMaxTokens tokens, latent 512, 1 to 512 splits");
  GLMS_CHECK(reinterpret_cast<uintptr_t>(w_uv) % 16 == 0, "mla_merge_unabsorb: 16-byte aligned value rows");
  const dim3 grid((v_dim + kBlockRows - 1) / kBlockRows, heads, T);
  launch_chained("mla_merge_unabsorb launch", merge_unabsorb_kernel, grid, kThreads, 0, stream, partials, T, splits,
                 heads, w_uv, head_rows, v_dim, out);
}

}  // namespace glms::ops::cuda
