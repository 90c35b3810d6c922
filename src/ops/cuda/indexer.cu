// DSA indexer scoring and top-k selection.
//
// Scoring: a block holds one token's queries in shared memory and walks its context in tiles of
// 64 keys (staged with an odd row stride so that lanes reading different keys hit different
// banks); thread (key, quarter) sums a quarter of the heads, and the quarters add up in shared.
//
// Top-k: one block per token runs a radix select over the scores mapped to order-preserving
// unsigned keys (four passes of 8-bit histograms find the k-th largest key and how many of its
// equals to keep), then writes the chosen positions in increasing order with two block scans,
// so the result is deterministic and equal ties go to the lower position, as on the CPU.
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/indexer.h"

namespace glms::ops::cuda {

namespace {

constexpr int kKeyTile = 64;
constexpr int kScoreThreads = 256;
constexpr int kHeadQuarters = kScoreThreads / kKeyTile;

__global__ void __launch_bounds__(kScoreThreads) indexer_score_kernel(IndexerScoreArgs a, int key_stride) {
  extern __shared__ float shared[];
  const int D = a.dim, H = a.heads;
  float* q = shared;                          // [H, D]
  float* w = q + H * D;                       // [H]
  float* keys = w + H;                        // [kKeyTile, key_stride]
  float* partial = keys + kKeyTile * key_stride;  // [kHeadQuarters, kKeyTile]

  const int t = a.first_token + blockIdx.x;
  const int context = a.positions[t] + 1;
  if (context <= a.top_k) return;
  for (int i = threadIdx.x; i < H * D; i += kScoreThreads) q[i] = a.queries[static_cast<int64_t>(t) * H * D + i];
  for (int i = threadIdx.x; i < H; i += kScoreThreads) w[i] = a.head_weights[static_cast<int64_t>(t) * H + i] * a.head_scale;
  const int32_t* blocks = a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks;
  const int key = threadIdx.x % kKeyTile, quarter = threadIdx.x / kKeyTile;

  for (int tile_start = blockIdx.y * kKeyTile; tile_start < context; tile_start += gridDim.y * kKeyTile) {
    const int rows = min(kKeyTile, context - tile_start);
    __syncthreads();
    for (int i = threadIdx.x; i < rows * D; i += kScoreThreads) {
      const int r = i / D, k = i % D, position = tile_start + r;
      const int64_t slot = static_cast<int64_t>(blocks[position / a.block_size]) * a.block_size + position % a.block_size;
      keys[r * key_stride + k] = a.key_cache[slot * D + k];
    }
    __syncthreads();
    float sum = 0.0f;
    if (key < rows) {
      const float* kr = keys + key * key_stride;
      for (int h = quarter; h < H; h += kHeadQuarters) {
        const float* qh = q + h * D;
        float dot = 0.0f;
        for (int k = 0; k < D; ++k) dot += qh[k] * kr[k];
        sum += fmaxf(dot * a.softmax_scale, 0.0f) * w[h];
      }
    }
    partial[quarter * kKeyTile + key] = sum;
    __syncthreads();
    if (quarter == 0 && key < rows) {
      float total = 0.0f;
      for (int qi = 0; qi < kHeadQuarters; ++qi) total += partial[qi * kKeyTile + key];
      a.scores[static_cast<int64_t>(t) * a.score_stride + tile_start + key] = total;
    }
  }
}

constexpr int kTopKThreads = 1024;

// Order-preserving map of floats to unsigned keys (larger float, larger key); -0 counts as +0.
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopKThreads) top_k_kernel(const float* scores, int64_t score_stride,
                                                             const int32_t* positions, int top_k, int32_t* selected,
                                                             int max_selected, int32_t* num_selected) {
  using BlockScan = cub::BlockScan<int, kTopKThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ unsigned histogram[256];
  __shared__ uint32_t threshold_shared;
  __shared__ int remaining_shared;

  const int t = blockIdx.x;
  const int context = positions[t] + 1;
  int32_t* out = selected + static_cast<int64_t>(t) * max_selected;
  if (context <= top_k) {
    for (int j = threadIdx.x; j < context; j += kTopKThreads) out[j] = j;
    if (threadIdx.x == 0) num_selected[t] = context;
    return;
  }
  const float* row = scores + static_cast<int64_t>(t) * score_stride;

  uint32_t prefix = 0, mask = 0;
  int remaining = top_k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kTopKThreads) histogram[i] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < context; j += kTopKThreads) {
      const uint32_t u = order_key(row[j]);
      if ((u & mask) == prefix) atomicAdd(&histogram[(u >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int want = remaining;
      for (int digit = 255; digit >= 0; --digit) {
        const int c = static_cast<int>(histogram[digit]);
        if (want <= c) {
          threshold_shared = prefix | (static_cast<uint32_t>(digit) << shift);
          break;
        }
        want -= c;
      }
      remaining_shared = want;
    }
    __syncthreads();
    prefix = threshold_shared;
    remaining = remaining_shared;
    mask |= 0xffu << shift;
  }
  // Keys above the threshold are all kept; of the keys equal to it, the first `remaining`.
  const uint32_t threshold = prefix;
  const int per_thread = (context + kTopKThreads - 1) / kTopKThreads;
  const int first = min(context, static_cast<int>(threadIdx.x) * per_thread), last = min(context, first + per_thread);
  int greater = 0, equal = 0;
  for (int j = first; j < last; ++j) {
    const uint32_t u = order_key(row[j]);
    greater += u > threshold;
    equal += u == threshold;
  }
  int equal_before = 0;
  BlockScan(scan_storage).ExclusiveSum(equal, equal_before);
  __syncthreads();
  const int kept = greater + max(0, min(equal, remaining - equal_before));
  int out_index = 0;
  BlockScan(scan_storage).ExclusiveSum(kept, out_index);
  int equal_rank = equal_before;
  for (int j = first; j < last; ++j) {
    const uint32_t u = order_key(row[j]);
    if (u > threshold || (u == threshold && equal_rank++ < remaining)) out[out_index++] = j;
  }
  if (threadIdx.x == 0) num_selected[t] = top_k;
}

__global__ void gather_keys_kernel(const float* key_cache, const int32_t* block_table, int block_size, int dim,
                                   float* out) {
  const int j = blockIdx.x;
  const float* src = key_cache + (static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size) * dim;
  for (int k = threadIdx.x; k < dim; k += blockDim.x) out[static_cast<int64_t>(j) * dim + k] = src[k];
}

// Block (chunk token i, 256 positions): scores[t, j] = sum_h relu(S[i, h, j] * softmax_scale) *
// w[t, h] * head_scale over the causal positions of tokens past top-k.
__global__ void reduce_head_scores_kernel(IndexerScoreArgs a, int first, int context, const float* head_scores) {
  const int i = blockIdx.x, t = first + i;
  const int j = blockIdx.y * blockDim.x + threadIdx.x;
  const int causal = a.positions[t] + 1;
  if (causal <= a.top_k || j >= causal || j >= context) return;
  const float* s = head_scores + static_cast<int64_t>(i) * a.heads * context + j;
  const float* w = a.head_weights + static_cast<int64_t>(t) * a.heads;
  float score = 0.0f;
  for (int h = 0; h < a.heads; ++h) score += fmaxf(s[static_cast<int64_t>(h) * context] * a.softmax_scale, 0.0f) * (w[h] * a.head_scale);
  a.scores[static_cast<int64_t>(t) * a.score_stride + j] = score;
}

}  // namespace

void indexer_scores_gemm(const IndexerScoreArgs& a, const int32_t* block_table, int context,
                         const IndexerGemmWorkspace& w, Gemm& gemm, cudaStream_t stream) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0 || context <= a.top_k) return;
  gather_keys_kernel<<<context, 128, 0, stream>>>(a.key_cache, block_table, a.block_size, a.dim, w.keys);
  check(cudaGetLastError(), "gather_keys launch");
  const int64_t per_token = int64_t{a.heads} * context;
  const int chunk = static_cast<int>(std::min<int64_t>(launch_tokens, w.head_score_elements / per_token));
  GLMS_CHECK(chunk >= 1, "indexer_scores_gemm: the workspace holds no token");
  for (int done = 0; done < launch_tokens; done += chunk) {
    const int n = std::min(chunk, launch_tokens - done), first = a.first_token + done;
    // head_scores[(i, h), j] = q[first + i, h] . key[j]   [n * heads, context]
    gemm.linear_f32(a.queries + int64_t{first} * a.heads * a.dim, int64_t{n} * a.heads, w.keys, context, a.dim,
                    w.head_scores, stream, /*tf32=*/true);
    reduce_head_scores_kernel<<<dim3(n, (context + 255) / 256), 256, 0, stream>>>(a, first, context, w.head_scores);
    check(cudaGetLastError(), "reduce_head_scores launch");
  }
}

void indexer_scores(const IndexerScoreArgs& a, cudaStream_t stream) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0 || a.max_context <= a.top_k) return;
  const int key_stride = a.dim % 2 == 1 ? a.dim : a.dim + 1;
  const size_t shared = sizeof(float) * (static_cast<size_t>(a.heads) * a.dim + a.heads +
                                         static_cast<size_t>(kKeyTile) * key_stride + kHeadQuarters * kKeyTile);
  check(cudaFuncSetAttribute(indexer_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)),
        "indexer_scores shared memory");
  // Enough key tiles per token to fill the GPU, each block looping over every gridDim.y-th tile.
  const int tiles = (a.max_context + kKeyTile - 1) / kKeyTile;
  const int per_token = std::clamp(512 / launch_tokens, 1, tiles);
  const dim3 grid(launch_tokens, per_token);
  indexer_score_kernel<<<grid, kScoreThreads, shared, stream>>>(a, key_stride);
  check(cudaGetLastError(), "indexer_scores launch");
}

void select_top_k(const float* scores, int64_t score_stride, const int32_t* positions, int64_t n, int top_k,
                  int32_t* selected, int max_selected, int32_t* num_selected, cudaStream_t stream) {
  if (n == 0) return;
  GLMS_CHECK(top_k <= max_selected, "select_top_k: top_k over the selection row size");
  top_k_kernel<<<static_cast<unsigned>(n), kTopKThreads, 0, stream>>>(scores, score_stride, positions, top_k, selected,
                                                                       max_selected, num_selected);
  check(cudaGetLastError(), "select_top_k launch");
}

}  // namespace glms::ops::cuda
