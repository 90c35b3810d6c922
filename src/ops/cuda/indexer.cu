// DSA indexer scoring and top-k selection.
//
// Scoring: a block holds one token's queries in shared memory and walks its context in tiles of
// 128 keys, a key a thread: the thread keeps every head's dot product in registers while its key
// streams through in chunks, so each query value read from shared memory (a broadcast, as float4)
// feeds 4 FMAs and each key value 32 (a shared-memory read for every FMA would make it bound by
// shared memory). With threads_per_key 4, four lanes share a key, 8 heads each.
//
// Top-k of decode steps (prefill chunks take top_k_prefill.cu's kernel): one block per token runs
// a radix select over the scores mapped to order-preserving unsigned keys (four passes of 8-bit
// histograms find the k-th largest key and how many of its equals to keep; lanes that share a
// digit count once, a block scan picks the digit), then writes the chosen positions in increasing
// order with two block scans, so the result is deterministic and equal ties go to the lower
// position, as on the CPU. With blocks_per_token > 1 a thread block cluster shares a token: each
// block takes a slice of the positions, and the histograms and the scans' totals are combined
// through distributed shared memory.
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cluster.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/indexer.h"
#include "ops/cuda/launch.cuh"

namespace glms::ops::cuda {

namespace {

constexpr int kTileKeys = 128;  // keys a block scores at once
constexpr int kDimChunk = 8;    // key values a thread holds at a time

// The FP8 key's codes [k0, k0 + kDimChunk) as fp32 values (its scale not applied), zero past
// `dim`; vector: dim % 8 == 0 and 8-byte aligned rows, a chunk one 8-byte load.
__device__ __forceinline__ void load_key_chunk(const uint8_t* key, int k0, int dim, bool vector,
                                               float (&out)[kDimChunk]) {
  if (vector) {
    const uint2 v = k0 < dim ? *reinterpret_cast<const uint2*>(key + k0) : make_uint2(0, 0);
    const uint32_t words[2] = {v.x, v.y};
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const float2 lo = e4m3x2_to_float2(words[w]), hi = e4m3x2_to_float2(words[w] >> 16);
      out[4 * w] = lo.x, out[4 * w + 1] = lo.y, out[4 * w + 2] = hi.x, out[4 * w + 3] = hi.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kDimChunk; ++j) out[j] = k0 + j < dim ? e4m3_to_float(key[k0 + j]) : 0.0f;
  }
}

// The bf16 key's values [k0, k0 + kDimChunk) as fp32, zero past `dim`; vector: dim % 8 == 0 and
// 16-byte aligned rows, a chunk one 16-byte load.
__device__ __forceinline__ void load_key_chunk(const uint16_t* key, int k0, int dim, bool vector,
                                               float (&out)[kDimChunk]) {
  static_assert(kDimChunk == 8, "a chunk is one 16-byte load of bf16");
  if (vector) {
    const uint4 v = k0 < dim ? *reinterpret_cast<const uint4*>(key + k0) : make_uint4(0, 0, 0, 0);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) out[2 * w] = __uint_as_float(words[w] << 16), out[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
  } else {
#pragma unroll
    for (int j = 0; j < kDimChunk; ++j) out[j] = k0 + j < dim ? __uint_as_float(uint32_t{key[k0 + j]} << 16) : 0.0f;
  }
}

// dot[h] += q[h, k0 .. k0 + kDimChunk) . values for kHeads heads; q: rows of `stride` floats in
// shared memory, read as float4 (the same address in every lane: a broadcast). Sums in k order.
template <int kHeads>
__device__ __forceinline__ void add_chunk_dots(float (&dot)[kHeads], const float* q, int stride, const float* values) {
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const float4* qh = reinterpret_cast<const float4*>(q + h * stride);
#pragma unroll
    for (int v = 0; v < kDimChunk / 4; ++v) {
      const float4 qv = qh[v];
      dot[h] = fmaf(qv.x, values[4 * v], dot[h]);
      dot[h] = fmaf(qv.y, values[4 * v + 1], dot[h]);
      dot[h] = fmaf(qv.z, values[4 * v + 2], dot[h]);
      dot[h] = fmaf(qv.w, values[4 * v + 3], dot[h]);
    }
  }
}

// Block (token, every gridDim.y-th tile of kTileKeys positions); kSplit threads a key (adjacent
// lanes), each holding the dot products of kHeads of its heads in registers against the token's
// queries in shared memory, its key streamed from global memory in chunks of kDimChunk (the next
// chunk loading while this one is used; the kSplit lanes of a key read the same bytes, one
// transaction). Splitting a key's heads over lanes gives a one-token launch enough warps to
// cover the loads' latency. Heads past a.heads are zero queries with zero weight. Each thread
// sums over k, then over its heads in order; the key's lanes add their sums by shuffles. FP8
// keys (kKey uint8_t) are summed as their codes' values, each head's dot product then times the
// key's scale.
template <int kHeads, int kSplit, typename kKey>
__global__ void __launch_bounds__(kTileKeys * kSplit) indexer_score_kernel(IndexerScoreArgs a, int padded_heads,
                                                                           int padded_dim, bool vector) {
  chained_grid_prologue();
  constexpr int kThreads = kTileKeys * kSplit;
  extern __shared__ float4 shared_vectors[];  // float4: 16-byte aligned for the query reads
  const int D = a.dim, H = a.heads;
  float* q = reinterpret_cast<float*>(shared_vectors);  // [padded_heads, padded_dim], zero past (H, D)
  float* w = q + padded_heads * padded_dim;              // [padded_heads], zero past H
  const int t = a.first_token + blockIdx.x;
  const int context = a.positions[t] + 1;
  if (context <= a.top_k) return;
  for (int i = threadIdx.x; i < padded_heads * padded_dim; i += kThreads) {
    const int h = i / padded_dim, k = i % padded_dim;
    q[i] = h < H && k < D ? a.queries[(static_cast<int64_t>(t) * H + h) * D + k] : 0.0f;
  }
  for (int h = threadIdx.x; h < padded_heads; h += kThreads)
    w[h] = h < H ? a.head_weights[static_cast<int64_t>(t) * H + h] * a.head_scale : 0.0f;
  __syncthreads();
  const int32_t* blocks = a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks;
  const int key_in_tile = static_cast<int>(threadIdx.x) / kSplit, part = static_cast<int>(threadIdx.x) % kSplit;
  const int lane = threadIdx.x % 32;
  const unsigned key_lanes = kSplit == 1 ? 1u << lane : ((1u << kSplit) - 1u) << (lane / kSplit * kSplit);

  for (int tile_start = blockIdx.y * kTileKeys; tile_start < context; tile_start += gridDim.y * kTileKeys) {
    const int position = tile_start + key_in_tile;
    if (position >= context) break;  // a key's lanes leave together
    const int64_t slot = static_cast<int64_t>(blocks[position / a.block_size]) * a.block_size + position % a.block_size;
    const kKey* key = static_cast<const kKey*>(a.key_cache) + slot * D;
    const float key_scale = sizeof(kKey) == 1 ? a.key_scales[slot] * a.softmax_scale : a.softmax_scale;
    float score = 0.0f;
    for (int h0 = part * kHeads; h0 < padded_heads; h0 += kSplit * kHeads) {
      float dot[kHeads];
#pragma unroll
      for (int h = 0; h < kHeads; ++h) dot[h] = 0.0f;
      float next[kDimChunk];
      load_key_chunk(key, 0, D, vector, next);
      for (int k0 = 0; k0 < D; k0 += kDimChunk) {
        float values[kDimChunk];
#pragma unroll
        for (int j = 0; j < kDimChunk; ++j) values[j] = next[j];
        if (k0 + kDimChunk < D) load_key_chunk(key, k0 + kDimChunk, D, vector, next);
        add_chunk_dots(dot, q + h0 * padded_dim + k0, padded_dim, values);
      }
#pragma unroll
      for (int h = 0; h < kHeads; ++h) score += fmaxf(dot[h] * key_scale, 0.0f) * w[h0 + h];
    }
#pragma unroll
    for (int offset = 1; offset < kSplit; offset *= 2) score += __shfl_xor_sync(key_lanes, score, offset);
    if (part == 0) a.scores[static_cast<int64_t>(t) * a.score_stride + position] = score;
  }
}

constexpr int kTopKThreads = 1024;
constexpr int kTopKLoads = 8;
using TopKScan = cub::BlockScan<int, kTopKThreads>;
// Steps of at least this many tokens (prefill chunks; decode batches are fewer) select with a
// 256-thread block a token (select_top_k_prefill): there are blocks enough to fill the GPU, and a
// 1024-thread block (or a cluster of them) spent most of its time in the barriers and scans of
// each pass over a few thousand scores.
constexpr int kManyTopKTokens = 512;
// Steps of more than this many tokens take one 1024-thread block a token whatever
// blocks_per_token asks: a cluster a token pays where one token's passes are the step's whole
// top-k (16k context: a cluster of 4 is 0.5-1.4% faster on the EP8 rank's 5-layer step at
// batch 2-16), and costs where many clusters wait for co-scheduled SMs (H100, batch 32 / 64:
// 3.80 -> 3.78 / 4.38 -> 4.30 ms at 16k, 3.55 -> 3.49 / 3.92 -> 3.79 ms at 2k).
constexpr int kClusterTopKMaxTokens = 16;

// The last step of select_token_top_k: every key of this block's slice [slice_lo, slice_hi) above
// `threshold` is kept, and of the keys equal to it the first `remaining` over the whole token (in
// block order, then position order); each kept position goes to out in position order.
template <int kBlocks>
__device__ __forceinline__ void write_kept_positions(const float* row, int slice_lo, int slice_hi, uint32_t threshold,
                                                     int remaining, TopKScan::TempStorage& scan_storage,
                                                     int& total_slot, int32_t* out) {
  using Blocks = ClusterBlocks<kBlocks>;
  const int per_thread = (slice_hi - slice_lo + kTopKThreads - 1) / kTopKThreads;
  const int first = min(slice_hi, slice_lo + static_cast<int>(threadIdx.x) * per_thread),
            last = min(slice_hi, first + per_thread);
  int greater = 0, equal = 0;
#pragma unroll 8
  for (int j = first; j < last; ++j) {
    const uint32_t u = order_key(__ldg(row + j));
    greater += u > threshold;
    equal += u == threshold;
  }
  int equal_before = 0, block_equal = 0;
  TopKScan(scan_storage).ExclusiveSum(equal, equal_before, block_equal);
  __syncthreads();
  int all = 0;
  equal_before += Blocks::sum_of_earlier_blocks(block_equal, &total_slot, &all);
  const int kept = greater + max(0, min(equal, remaining - equal_before));
  int out_index = 0, block_kept = 0;
  TopKScan(scan_storage).ExclusiveSum(kept, out_index, block_kept);
  __syncthreads();
  out_index += Blocks::sum_of_earlier_blocks(block_kept, &total_slot, &all);
  int equal_rank = equal_before;
#pragma unroll 8
  for (int j = first; j < last; ++j) {
    const uint32_t u = order_key(__ldg(row + j));
    if (u > threshold || (u == threshold && equal_rank++ < remaining)) out[out_index++] = j;
  }
}

// The top_k of one token's scores row[0, context) (context > top_k) over kBlocks blocks of
// kTopKThreads, this block the rank-th (a thread block cluster when kBlocks > 1: block r takes the
// r-th slice of the positions, the histograms of each pass summed over the blocks through
// distributed shared memory in rank order, so every block picks the same digits), into out in
// position order; rank 0 writes *num_selected.
template <int kBlocks>
__device__ __forceinline__ void select_token_top_k(const float* row, int context, int rank, int top_k, int32_t* out,
                                                   int32_t* num_selected) {
  constexpr int kThreads = kTopKThreads;
  static_assert(kThreads >= 256, "a thread a digit of the 256");
  __shared__ TopKScan::TempStorage scan_storage;
  __shared__ unsigned histogram[256];
  __shared__ unsigned cluster_histogram[kBlocks == 1 ? 1 : 256];
  __shared__ uint32_t threshold_shared;
  __shared__ int remaining_shared, total_slot;
  using Blocks = ClusterBlocks<kBlocks>;
  // This block's positions [slice_lo, slice_hi).
  const int slice = (context + kBlocks - 1) / kBlocks;
  const int slice_lo = min(context, rank * slice), slice_hi = min(context, slice_lo + slice);

  // kTopKLoads reads in flight a thread: one at a time, each pass waited out a memory latency
  // per kThreads scores. A slice of at most kThreads * kTopKLoads scores (a decode token's up to
  // 8k positions a block) is read once and kept in registers through the four passes.
  auto load_keys = [&](int base, uint32_t(&keys)[kTopKLoads]) {
#pragma unroll
    for (int l = 0; l < kTopKLoads; ++l) {
      const int j = base + l * kThreads + static_cast<int>(threadIdx.x);
      keys[l] = j < slice_hi ? order_key(row[j]) : 0u;
    }
  };
  const bool resident = slice_hi - slice_lo <= kThreads * kTopKLoads;
  uint32_t resident_keys[kTopKLoads];
  if (resident) load_keys(slice_lo, resident_keys);
  // A warp's first lane: a warp whose 32 positions of a load start at or past slice_hi has no
  // key there and skips that load's match (a decode token of 2049 positions in a cluster of four
  // has keys in one load of the eight, and only in half the warps).
  const int warp_first = static_cast<int>(threadIdx.x) / 32 * 32;

  uint32_t prefix = 0, mask = 0;
  int remaining = top_k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) histogram[i] = 0;
    __syncthreads();
    // Lanes with the same digit add once: scores bunch into a few digits (in the first pass
    // nearly all share one), where an atomic per key would serialise the pass.
    for (int base = slice_lo; base < slice_hi; base += kThreads * kTopKLoads) {
      uint32_t keys[kTopKLoads];
      if (resident) {
#pragma unroll
        for (int l = 0; l < kTopKLoads; ++l) keys[l] = resident_keys[l];
      } else {
        load_keys(base, keys);
      }
#pragma unroll
      for (int l = 0; l < kTopKLoads; ++l) {
        if (base + l * kThreads + warp_first >= slice_hi) break;  // warp-uniform: no key past here
        const int j = base + l * kThreads + static_cast<int>(threadIdx.x);
        const uint32_t digit = j < slice_hi && (keys[l] & mask) == prefix ? (keys[l] >> shift) & 0xffu : 256u;  // 256: none
        const unsigned peers = __match_any_sync(0xffffffffu, digit);
        if (digit < 256 && static_cast<int>(threadIdx.x % 32) == __ffs(peers) - 1) atomicAdd(&histogram[digit], __popc(peers));
      }
    }
    __syncthreads();
    const unsigned* counts = Blocks::sum_arrays(histogram, cluster_histogram, 256);
    // The digit holding the remaining-th largest key: thread i < 256 takes digit 255 - i, and a
    // scan counts the keys at or above each digit.
    const int count = threadIdx.x < 256 ? static_cast<int>(counts[255 - threadIdx.x]) : 0;
    int at_or_above = 0;
    TopKScan(scan_storage).InclusiveSum(count, at_or_above);
    if (count > 0 && at_or_above >= remaining && at_or_above - count < remaining) {
      threshold_shared = prefix | (static_cast<uint32_t>(255 - threadIdx.x) << shift);
      remaining_shared = remaining - (at_or_above - count);
    }
    __syncthreads();
    prefix = threshold_shared;
    remaining = remaining_shared;
    mask |= 0xffu << shift;
  }
  write_kept_positions<kBlocks>(row, slice_lo, slice_hi, prefix, remaining, scan_storage, total_slot, out);
  if (threadIdx.x == 0 && rank == 0) *num_selected = top_k;
}

// A token per kBlocks blocks of kTopKThreads (select_token_top_k), or per the cluster's first block
// alone where the token's scores fit its registers (there the cluster's syncs cost more than its
// slices save: the H100's 5-layer EP8 rank at 2k context, batch 1 to 8, about 1% a step faster
// in one block; at 16k the cluster of four stays 1-1.5% ahead).
template <int kBlocks>
__global__ void __launch_bounds__(kTopKThreads) top_k_kernel(const float* scores, int64_t score_stride,
                                                             const int32_t* positions, int top_k, int32_t* selected,
                                                             int max_selected, int32_t* num_selected) {
  chained_grid_prologue();
  constexpr int kThreads = kTopKThreads;
  const int t = static_cast<int>(blockIdx.x) / kBlocks;
  const int rank = ClusterBlocks<kBlocks>::rank();
  const int context = positions[t] + 1;
  int32_t* out = selected + static_cast<int64_t>(t) * max_selected;
  const bool one_block = kBlocks == 1 || context <= kThreads * kTopKLoads;  // the same in every block of the token
  if (context <= top_k || one_block) {
    if (rank != 0) return;
    if (context > top_k) {
      select_token_top_k<1>(scores + static_cast<int64_t>(t) * score_stride, context, 0, top_k, out,
                            num_selected + t);
      return;
    }
    for (int j = threadIdx.x; j < context; j += kThreads) out[j] = j;
    if (threadIdx.x == 0) num_selected[t] = context;
    return;
  }
  if constexpr (kBlocks > 1)
    select_token_top_k<kBlocks>(scores + static_cast<int64_t>(t) * score_stride, context, rank, top_k, out,
                                num_selected + t);
}

// out[j, :] = the key of position j as fp32: bf16 widened, or codes times the key's scale.
__global__ void gather_keys_kernel(const void* key_cache, const float* key_scales, const int32_t* block_table,
                                   int block_size, int dim, float* out) {
  chained_grid_prologue();
  const int j = blockIdx.x;
  const int64_t slot = static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size;
  float* dst = out + static_cast<int64_t>(j) * dim;
  if (key_scales) {
    const uint8_t* src = static_cast<const uint8_t*>(key_cache) + slot * dim;
    const float scale = key_scales[slot];
    for (int k = threadIdx.x; k < dim; k += blockDim.x) dst[k] = e4m3_to_float(src[k]) * scale;
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(key_cache) + slot * dim;
    for (int k = threadIdx.x; k < dim; k += blockDim.x) dst[k] = bf16_to_float(src[k]);
  }
}

// Block (chunk token i, 256 positions): scores[t, j] = sum_h relu(S[i, h, j] * softmax_scale) *
// w[t, h] * head_scale over the causal positions of tokens past top-k.
__global__ void reduce_head_scores_kernel(IndexerScoreArgs a, int first, int context, const float* head_scores) {
  chained_grid_prologue();
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
  launch_chained("gather_keys launch", gather_keys_kernel, context, 128, 0, stream, a.key_cache, a.key_scales,
                 block_table, a.block_size, a.dim, w.keys);
  const int64_t per_token = int64_t{a.heads} * context;
  const int chunk = static_cast<int>(std::min<int64_t>(launch_tokens, w.head_score_elements / per_token));
  GLMS_CHECK(chunk >= 1, "indexer_scores_gemm: the workspace holds no token");
  for (int done = 0; done < launch_tokens; done += chunk) {
    const int n = std::min(chunk, launch_tokens - done), first = a.first_token + done;
    // head_scores[(i, h), j] = q[first + i, h] . key[j]   [n * heads, context]
    gemm.linear_f32(a.queries + int64_t{first} * a.heads * a.dim, int64_t{n} * a.heads, w.keys, context, a.dim,
                    w.head_scores, stream, /*tf32=*/true);
    launch_chained("reduce_head_scores launch", reduce_head_scores_kernel, dim3(n, (context + 255) / 256), 256, 0,
                   stream, a, first, context, w.head_scores);
  }
}

void indexer_scores(const IndexerScoreArgs& a, cudaStream_t stream) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0 || a.max_context <= a.top_k) return;
  const bool fp8 = a.key_scales != nullptr;
  const bool vector = a.dim % 8 == 0 && reinterpret_cast<uintptr_t>(a.key_cache) % 16 == 0;
  // One thread a key: 32 heads' sums in registers (GLM-5's indexer has 32), or groups of 8 for
  // fewer heads; a.threads_per_key 4 (32 heads or more): 8 heads' sums a thread.
  GLMS_CHECK(a.threads_per_key == 1 || a.threads_per_key == 4, "indexer_scores: 1 or 4 threads a key");
  const bool split = a.threads_per_key == 4 && a.heads >= 32;
  const int heads_per_pass = a.heads >= 32 ? 32 : 8;
  const int padded_heads = (a.heads + heads_per_pass - 1) / heads_per_pass * heads_per_pass;
  const int padded_dim = (a.dim + kDimChunk - 1) / kDimChunk * kDimChunk;
  const size_t shared = sizeof(float) * (static_cast<size_t>(padded_heads) * padded_dim + padded_heads);
  auto pick = [&](auto key) {
    using Key = decltype(key);
    return split ? indexer_score_kernel<8, 4, Key>
                 : (a.heads >= 32 ? indexer_score_kernel<32, 1, Key> : indexer_score_kernel<8, 1, Key>);
  };
  auto kernel = fp8 ? pick(uint8_t{}) : pick(uint16_t{});
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)),
        "indexer_scores shared memory");
  // Enough key tiles per token to fill the GPU, each block looping over every gridDim.y-th tile.
  const int tiles = (a.max_context + kTileKeys - 1) / kTileKeys;
  const int per_token = std::clamp(512 / launch_tokens, 1, tiles);
  const dim3 grid(launch_tokens, per_token);
  launch_chained("indexer_scores launch", kernel, grid, kTileKeys * (split ? 4 : 1), shared, stream, a, padded_heads,
                 padded_dim, vector);
}

void select_top_k(const float* scores, int64_t score_stride, const int32_t* positions, int64_t n, int top_k,
                  int32_t* selected, int max_selected, int32_t* num_selected, cudaStream_t stream, int blocks_per_token) {
  if (n == 0) return;
  GLMS_CHECK(top_k <= max_selected, "select_top_k: top_k over the selection row size");
  GLMS_CHECK(blocks_per_token == 1 || blocks_per_token == 2 || blocks_per_token == 4 || blocks_per_token == 8,
             "select_top_k: 1, 2, 4 or 8 blocks a token");
  auto launch = [&](auto kernel) {
    launch_chained_clusters("select_top_k launch (cluster)", kernel, static_cast<unsigned>(blocks_per_token),
                            dim3(static_cast<unsigned>(n * blocks_per_token)), dim3(kTopKThreads), 0, stream, scores,
                            score_stride, positions, top_k, selected, max_selected, num_selected);
  };
  if (n >= kManyTopKTokens) {
    select_top_k_prefill(scores, score_stride, positions, n, top_k, selected, max_selected, num_selected, stream);
    return;
  }
  switch (n > kClusterTopKMaxTokens ? 1 : blocks_per_token) {
    case 1:
      launch_chained("top_k launch", top_k_kernel<1>, static_cast<unsigned>(n), kTopKThreads, 0, stream, scores,
                     score_stride, positions, top_k, selected, max_selected, num_selected);
      break;
    case 2: launch(top_k_kernel<2>); break;
    case 4: launch(top_k_kernel<4>); break;
    default: launch(top_k_kernel<8>); break;
  }
}

}  // namespace glms::ops::cuda
