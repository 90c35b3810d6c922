// MoE routing, grouping and the small-batch expert kernels.
//
// Routing runs one warp per token. Grouping counts pairs per expert, scans the counts in one
// block, then places each pair (the order inside an expert's group does not change any value:
// every row is computed on its own). The small-batch expert kernels are GEMVs over the active
// experts only: block (slot, row tile) streams a tile of one expert's weight rows with 16-byte
// loads while the expert's tokens (at most kTokens at a time) sit in shared memory, so each
// weight byte is read once per step however many tokens chose the expert.
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/moe.h"

namespace glms::ops::cuda {

namespace {

__global__ void moe_route_kernel(const float* logits, const float* bias, MoeRouting r, int32_t* ids, float* weights) {
  extern __shared__ float shared[];
  float* scores = shared;                   // [E]
  float* choice = shared + r.num_experts;   // [E]
  __shared__ float group_scores[32];
  __shared__ bool keep_group[32];
  const int t = blockIdx.x, lane = threadIdx.x, E = r.num_experts;
  for (int e = lane; e < E; e += 32) {
    const float s = 1.0f / (1.0f + expf(-logits[static_cast<int64_t>(t) * E + e]));
    scores[e] = s;
    choice[e] = s + bias[e];
  }
  __syncwarp();
  if (r.n_group > 1) {
    // A group's score is the sum of its two best choices; only topk_group groups compete.
    const int per_group = E / r.n_group;
    if (lane < r.n_group) {
      float best = -INFINITY, second = -INFINITY;
      for (int i = 0; i < per_group; ++i) {
        const float v = choice[lane * per_group + i];
        if (v > best) {
          second = best;
          best = v;
        } else if (v > second) {
          second = v;
        }
      }
      group_scores[lane] = per_group > 1 ? best + second : best;
      keep_group[lane] = false;
    }
    __syncwarp();
    if (lane == 0) {
      for (int i = 0; i < r.topk_group; ++i) {
        int chosen = -1;
        for (int g = 0; g < r.n_group; ++g)
          if (!keep_group[g] && (chosen < 0 || group_scores[g] > group_scores[chosen])) chosen = g;
        keep_group[chosen] = true;
      }
    }
    __syncwarp();
    for (int e = lane; e < E; e += 32)
      if (!keep_group[e / per_group]) choice[e] = -INFINITY;
    __syncwarp();
  }
  float total = 0.0f;
  for (int k = 0; k < r.top_k; ++k) {
    float best = -INFINITY;
    int best_index = -1;
    for (int e = lane; e < E; e += 32)
      if (best_index < 0 || choice[e] > best) {
        best = choice[e];
        best_index = e;
      }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
      if (other_index >= 0 && (best_index < 0 || other > best || (other == best && other_index < best_index))) {
        best = other;
        best_index = other_index;
      }
    }
    if (lane == 0) {
      ids[static_cast<int64_t>(t) * r.top_k + k] = best_index;
      choice[best_index] = -INFINITY;
      total += scores[best_index];
    }
    __syncwarp();
  }
  if (lane == 0) {
    for (int k = 0; k < r.top_k; ++k) {
      const int64_t i = static_cast<int64_t>(t) * r.top_k + k;
      float w = scores[ids[i]];
      if (r.norm_topk_prob) w /= total + 1e-20f;
      weights[i] = w * r.routed_scaling_factor;
    }
  }
}

__global__ void moe_count_kernel(const int32_t* ids, int64_t num_pairs, int32_t* counts) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p < num_pairs) atomicAdd(&counts[ids[p]], 1);
}

constexpr int kScanThreads = 1024;

__global__ void __launch_bounds__(kScanThreads) moe_scan_kernel(int num_experts, MoePlan plan) {
  using BlockScan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename BlockScan::TempStorage storage;
  const int e = threadIdx.x;
  const int count = e < num_experts ? plan.counts[e] : 0;
  int offset = 0, active_index = 0, total = 0, total_active = 0;
  BlockScan(storage).ExclusiveSum(count, offset, total);
  __syncthreads();
  BlockScan(storage).ExclusiveSum(count > 0 ? 1 : 0, active_index, total_active);
  if (e < num_experts) {
    plan.offsets[e] = offset;
    plan.counts[e] = offset;  // becomes the placement cursor
    if (count > 0) plan.active_experts[active_index] = e;
  }
  if (e == 0) {
    plan.offsets[num_experts] = total;
    *plan.num_active = total_active;
  }
}

__global__ void moe_place_kernel(const int32_t* ids, int64_t num_pairs, MoePlan plan) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= num_pairs) return;
  const int slot = atomicAdd(&plan.counts[ids[p]], 1);
  plan.sorted_pairs[slot] = static_cast<int32_t>(p);
  plan.pair_slot[p] = slot;
}

// 8 bf16 in a 16-byte word, widened.
__device__ __forceinline__ void unpack8(const uint4& v, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// Dot products of `kRows` weight rows (at w_rows[i], `dim` wide) with `count` <= kTokens input
// rows staged in shared memory (xs, [kTokens, dim]); each warp lane-strides over `dim`, then
// the warp reduces. Vector path: dim % 8 == 0 (16-byte aligned rows).
template <int kTokens, int kRows, bool kVector>
__device__ __forceinline__ void warp_dots(const uint16_t* const* w_rows, const uint16_t* xs, int64_t dim, int count,
                                          float (&acc)[kRows][kTokens]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokens; ++j) acc[r][j] = 0.0f;
  if constexpr (kVector) {
    for (int64_t k8 = lane; k8 < dim / 8; k8 += 32) {
      float w[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) unpack8(__ldg(reinterpret_cast<const uint4*>(w_rows[r]) + k8), w[r]);
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        if (j >= count) break;
        float xv[8];
        unpack8(reinterpret_cast<const uint4*>(xs + j * dim)[k8], xv);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][j] += w[r][i] * xv[i];
      }
    }
  } else {
    for (int64_t k = lane; k < dim; k += 32) {
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        if (j >= count) break;
        const float xv = bf16_to_float(xs[j * dim + k]);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r][j] += bf16_to_float(w_rows[r][k]) * xv;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokens; ++j) acc[r][j] = warp_sum(acc[r][j]);
}

constexpr int kExpertThreads = 256;
constexpr int kGateUpRowsPerWarp = 2;
constexpr int kDownRowsPerWarp = 4;

// Stages rows `input_row(chunk + j)` of `src` ([*, dim] bf16) for j < count into xs.
template <bool kVector, typename RowOf>
__device__ __forceinline__ void stage_rows(const uint16_t* src, int64_t dim, int count, RowOf input_row, uint16_t* xs) {
  if constexpr (kVector) {
    const int64_t vectors = dim / 8;
    for (int64_t i = threadIdx.x; i < count * vectors; i += blockDim.x) {
      const int j = static_cast<int>(i / vectors);
      reinterpret_cast<uint4*>(xs + j * dim)[i % vectors] =
          reinterpret_cast<const uint4*>(src + input_row(j) * dim)[i % vectors];
    }
  } else {
    for (int64_t i = threadIdx.x; i < count * dim; i += blockDim.x) {
      const int j = static_cast<int>(i / dim);
      xs[i] = src[input_row(j) * dim + i % dim];
    }
  }
}

template <int kTokens, bool kVector>
__global__ void __launch_bounds__(kExpertThreads) moe_gate_up_kernel(const uint16_t* x, int64_t hidden, int64_t inter,
                                                                     const uint16_t* gate_up, MoePlan plan, int top_k,
                                                                     uint16_t* act) {
  extern __shared__ __align__(16) uint16_t xs[];  // [kTokens, hidden]
  if (static_cast<int>(blockIdx.x) >= *plan.num_active) return;
  const int e = plan.active_experts[blockIdx.x];
  const int begin = plan.offsets[e], end = plan.offsets[e + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.y) * (kExpertThreads / 32) + warp) * kGateUpRowsPerWarp;
  const uint16_t* w = gate_up + static_cast<int64_t>(e) * 2 * inter * hidden;
  for (int chunk = begin; chunk < end; chunk += kTokens) {
    const int count = min(kTokens, end - chunk);
    __syncthreads();
    stage_rows<kVector>(x, hidden, count, [&](int j) { return static_cast<int64_t>(plan.sorted_pairs[chunk + j] / top_k); },
                        xs);
    __syncthreads();
    for (int rr = 0; rr < kGateUpRowsPerWarp; ++rr) {
      const int64_t r = row0 + rr;
      if (r >= inter) break;
      const uint16_t* rows[2] = {w + r * hidden, w + (inter + r) * hidden};
      float acc[2][kTokens];
      warp_dots<kTokens, 2, kVector>(rows, xs, hidden, count, acc);
      if (lane == 0)
        for (int j = 0; j < count; ++j) {
          const float g = acc[0][j], u = acc[1][j];
          act[static_cast<int64_t>(chunk + j) * inter + r] = float_to_bf16(g / (1.0f + expf(-g)) * u);
        }
    }
  }
}

template <int kTokens, bool kVector>
__global__ void __launch_bounds__(kExpertThreads) moe_down_kernel(int64_t hidden, int64_t inter, const uint16_t* down,
                                                                  MoePlan plan, const uint16_t* act, float* expert_out) {
  extern __shared__ __align__(16) uint16_t xs[];  // [kTokens, inter]
  if (static_cast<int>(blockIdx.x) >= *plan.num_active) return;
  const int e = plan.active_experts[blockIdx.x];
  const int begin = plan.offsets[e], end = plan.offsets[e + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.y) * (kExpertThreads / 32) + warp) * kDownRowsPerWarp;
  const uint16_t* w = down + static_cast<int64_t>(e) * hidden * inter;
  for (int chunk = begin; chunk < end; chunk += kTokens) {
    const int count = min(kTokens, end - chunk);
    __syncthreads();
    stage_rows<kVector>(act, inter, count, [&](int j) { return static_cast<int64_t>(chunk + j); }, xs);
    __syncthreads();
    if (row0 >= hidden) continue;
    const uint16_t* rows[kDownRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kDownRowsPerWarp; ++r) rows[r] = w + min(row0 + r, hidden - 1) * inter;
    float acc[kDownRowsPerWarp][kTokens];
    warp_dots<kTokens, kDownRowsPerWarp, kVector>(rows, xs, inter, count, acc);
    if (lane == 0)
      for (int r = 0; r < kDownRowsPerWarp && row0 + r < hidden; ++r)
        for (int j = 0; j < count; ++j) expert_out[static_cast<int64_t>(chunk + j) * hidden + row0 + r] = acc[r][j];
  }
}

template <int kTokens, bool kVector>
void launch_experts(const uint16_t* x, int64_t hidden, int64_t inter, const uint16_t* gate_up, const uint16_t* down,
                    const MoePlan& plan, int top_k, int max_active, uint16_t* act, float* expert_out,
                    cudaStream_t stream) {
  const size_t gate_up_shared = sizeof(uint16_t) * kTokens * hidden, down_shared = sizeof(uint16_t) * kTokens * inter;
  check(cudaFuncSetAttribute(moe_gate_up_kernel<kTokens, kVector>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(gate_up_shared)),
        "moe_gate_up shared memory");
  check(cudaFuncSetAttribute(moe_down_kernel<kTokens, kVector>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(down_shared)),
        "moe_down shared memory");
  const int64_t gate_up_rows_per_block = (kExpertThreads / 32) * kGateUpRowsPerWarp;
  const int64_t down_rows_per_block = (kExpertThreads / 32) * kDownRowsPerWarp;
  const dim3 gate_up_grid(max_active, static_cast<unsigned>((inter + gate_up_rows_per_block - 1) / gate_up_rows_per_block));
  moe_gate_up_kernel<kTokens, kVector>
      <<<gate_up_grid, kExpertThreads, gate_up_shared, stream>>>(x, hidden, inter, gate_up, plan, top_k, act);
  check(cudaGetLastError(), "moe_gate_up launch");
  const dim3 down_grid(max_active, static_cast<unsigned>((hidden + down_rows_per_block - 1) / down_rows_per_block));
  moe_down_kernel<kTokens, kVector>
      <<<down_grid, kExpertThreads, down_shared, stream>>>(hidden, inter, down, plan, act, expert_out);
  check(cudaGetLastError(), "moe_down launch");
}

__global__ void moe_combine_kernel(float* x, const float* shared_out, const float* expert_out, const int32_t* pair_slot,
                                   const int32_t* ids, const float* weights, int top_k, int64_t hidden) {
  __shared__ int order[64];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    // The token's experts in increasing id (the CPU path adds them in that order).
    for (int k = 0; k < top_k; ++k) order[k] = k;
    for (int i = 1; i < top_k; ++i)
      for (int j = i; j > 0 && ids[t * top_k + order[j]] < ids[t * top_k + order[j - 1]]; --j) {
        const int tmp = order[j];
        order[j] = order[j - 1];
        order[j - 1] = tmp;
      }
  }
  __syncthreads();
  const int64_t d = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (d < hidden) {
    float sum = shared_out[t * hidden + d];
    for (int i = 0; i < top_k; ++i) {
      const int64_t pair = t * top_k + order[i];
      sum += weights[pair] * expert_out[static_cast<int64_t>(pair_slot[pair]) * hidden + d];
    }
    x[t * hidden + d] += sum;
  }
}

}  // namespace

void moe_route(const float* logits, const float* correction_bias, int64_t n, const MoeRouting& routing,
               int32_t* expert_ids, float* expert_weights, cudaStream_t stream) {
  if (n == 0) return;
  GLMS_CHECK(routing.num_experts <= 1024 && routing.n_group <= 32 && routing.top_k <= 64 &&
                 routing.top_k <= routing.num_experts,
             "moe_route: at most 1024 experts, 32 groups and top-64");
  moe_route_kernel<<<static_cast<unsigned>(n), 32, 2 * routing.num_experts * sizeof(float), stream>>>(
      logits, correction_bias, routing, expert_ids, expert_weights);
  check(cudaGetLastError(), "moe_route launch");
}

void moe_plan(const int32_t* expert_ids, int64_t num_pairs, int num_experts, const MoePlan& plan, cudaStream_t stream) {
  GLMS_CHECK(num_experts <= kScanThreads, "moe_plan: at most 1024 experts");
  check(cudaMemsetAsync(plan.counts, 0, sizeof(int32_t) * (num_experts + 1), stream), "moe_plan memset");
  if (num_pairs > 0) {
    moe_count_kernel<<<blocks_for(num_pairs, 256), 256, 0, stream>>>(expert_ids, num_pairs, plan.counts);
    check(cudaGetLastError(), "moe_count launch");
  }
  moe_scan_kernel<<<1, kScanThreads, 0, stream>>>(num_experts, plan);
  check(cudaGetLastError(), "moe_scan launch");
  if (num_pairs > 0) {
    moe_place_kernel<<<blocks_for(num_pairs, 256), 256, 0, stream>>>(expert_ids, num_pairs, plan);
    check(cudaGetLastError(), "moe_place launch");
  }
}

void moe_experts_small(const uint16_t* x, int64_t hidden, int64_t inter, const uint16_t* gate_up,
                       const uint16_t* down, const MoePlan& plan, int num_experts, int top_k, int num_tokens, int max_active,
                       uint16_t* act, float* expert_out, cudaStream_t stream) {
  if (max_active <= 0) return;
  const bool vector = hidden % 8 == 0 && inter % 8 == 0;
  // Tokens staged at a time: from the pairs an expert gets on average, not the batch size.
  // Staging shared memory caps the blocks in flight a streaming GEMV needs, while an expert
  // with more pairs than staged re-reads its weights per chunk. Measured at GLM-5.2 width on
  // the H200 (bench-step): 1 below half a pair per expert (batch <= 16), 4 up to 4 pairs
  // (batch 32-128; 8 was slower at 64 and 128), else 8.
  const double pairs_per_expert = static_cast<double>(num_tokens) * top_k / std::max(1, num_experts);
  const int tokens = pairs_per_expert <= 0.5 ? 1 : pairs_per_expert <= 4.0 ? 4 : 8;
  auto run = [&](auto tokens_tag, auto vector_tag) {
    launch_experts<decltype(tokens_tag)::value, decltype(vector_tag)::value>(x, hidden, inter, gate_up, down, plan,
                                                                             top_k, max_active, act, expert_out, stream);
  };
  using One = std::integral_constant<int, 1>;
  using Four = std::integral_constant<int, 4>;
  using Eight = std::integral_constant<int, 8>;
  if (vector) {
    if (tokens <= 1) run(One{}, std::true_type{});
    else if (tokens <= 4) run(Four{}, std::true_type{});
    else run(Eight{}, std::true_type{});
  } else {
    run(Eight{}, std::false_type{});
  }
}

void moe_combine(float* x, const float* shared_out, const float* expert_out, const int32_t* pair_slot,
                 const int32_t* expert_ids, const float* expert_weights, int64_t n, int top_k, int64_t hidden,
                 cudaStream_t stream) {
  if (n == 0) return;
  GLMS_CHECK(top_k <= 64, "moe_combine: at most top-64");
  // A block per (token, 256 dims): a lone decode token still spreads over the GPU.
  const dim3 grid(static_cast<unsigned>(n), blocks_for(hidden, 256));
  moe_combine_kernel<<<grid, 256, 0, stream>>>(x, shared_out, expert_out, pair_slot, expert_ids, expert_weights, top_k,
                                               hidden);
  check(cudaGetLastError(), "moe_combine launch");
}

}  // namespace glms::ops::cuda
