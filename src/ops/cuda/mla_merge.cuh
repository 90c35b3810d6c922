// The merge of a token's attention splits (mla.h's partials layout), as device functions shared
// by mla_merge_splits' kernel and mla_merge_unabsorb's, so that both give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mla.h"

namespace glms::ops::cuda {

// The threads that hold the splits' statistics: thread j < kMergeStatThreads holds splits j +
// kMergeStatThreads m. A fixed count, so that blocks of any size sum them in the same order.
constexpr int kMergeStatThreads = 128;
static_assert(kMlaMaxSplits % kMergeStatThreads == 0, "whole rounds of splits a thread");

// Split s's weight e^(m_s - M) (zero where it saw no selected row) of token i's head `head` into
// weight[s] (shared, kMlaMaxSplits floats); returns 1 / sum_s weight[s] l_s (0 where no split saw
// a row). stats: the partials' [launch_tokens][splits][H][2] (running max, sum of exponentials).
// Every thread of the block calls it (blockDim.x a multiple of 32, at least kMergeStatThreads):
// it synchronises the block, after which weight[] is complete. Each thread's statistics load at
// once: a thread walking 32 splits' statistics one after another was most of a batch-1 merge.
__device__ __forceinline__ float merge_split_weights(const float* stats, int splits, int H, int i, int head,
                                                     float* weight, float* scratch) {
  auto stat = [&](int s) { return stats + ((static_cast<int64_t>(i) * splits + s) * H + head) * 2; };
  constexpr int kPerThread = kMlaMaxSplits / kMergeStatThreads;
  float top_of[kPerThread], sum_of[kPerThread];
  float top = -INFINITY;
#pragma unroll
  for (int m = 0; m < kPerThread; ++m) {
    const int s = static_cast<int>(threadIdx.x) + kMergeStatThreads * m;
    const bool held = threadIdx.x < kMergeStatThreads && s < splits;
    const float2 v = held ? make_float2(stat(s)[0], stat(s)[1]) : make_float2(-INFINITY, 0.0f);
    top_of[m] = v.y > 0.0f ? v.x : -INFINITY;
    sum_of[m] = v.y;
    top = fmaxf(top, top_of[m]);
  }
  top = warp_max(top);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = top;
  __syncthreads();
  top = warp_max(threadIdx.x % 32 < blockDim.x / 32 ? scratch[threadIdx.x % 32] : -INFINITY);
  float part = 0.0f;
#pragma unroll
  for (int m = 0; m < kPerThread; ++m) {
    const int s = static_cast<int>(threadIdx.x) + kMergeStatThreads * m;
    const float w = top_of[m] == -INFINITY ? 0.0f : __expf(top_of[m] - top);
    if (threadIdx.x < kMergeStatThreads && s < splits) weight[s] = w;
    part += w * sum_of[m];
  }
  // Threads past kMergeStatThreads add zeros, which leave the tree's sums as they are.
  const float total = block_sum(part, scratch);  // synchronises: weight[] is complete
  return total > 0.0f ? 1.0f / total : 0.0f;
}

// Columns k .. k + 3 of the merged sums, bf16: column0 is the head's row of split 0 in the
// partials ([splits][H][L] apart by split_stride), weight[] and inv_total from
// merge_split_weights.
__device__ __forceinline__ uint2 merged_columns(const float* column0, int64_t split_stride, int splits,
                                                const float* weight, float inv_total, int k) {
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
  for (int s = 0; s < splits; ++s) {
    const float4 v = *reinterpret_cast<const float4*>(column0 + s * split_stride + k);
    const float w = weight[s];
    sum.x += w * v.x, sum.y += w * v.y, sum.z += w * v.z, sum.w += w * v.w;
  }
  return make_uint2(pack_bf16_pair(sum.x * inv_total, sum.y * inv_total),
                    pack_bf16_pair(sum.z * inv_total, sum.w * inv_total));
}

}  // namespace glms::ops::cuda
