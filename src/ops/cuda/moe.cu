// MoE routing, grouping and the weighted combine (the expert kernels are in moe_experts.cu).
//
// Routing runs one warp per token. Grouping counts pairs per expert, scans the counts in one
// block, then places each pair (the order inside an expert's group does not change any value:
// every row is computed on its own); up to 8192 pairs one block does all three.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <cub/block/block_scan.cuh>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.h"

namespace glms::ops::cuda {

namespace {

// Group-limited routing (n_group > 1): a group's score is the sum of its two best choices, and the
// choices of all but the topk_group best groups become -inf. choice[i]: lane j's choice for
// expert j + 32 i. Called by the whole warp.
template <int kPerLane>
__device__ __forceinline__ void limit_to_best_groups(const MoeRouting& r, float (&choice)[kPerLane]) {
  __shared__ float group_choice[kPerLane * 32];
  __shared__ float group_scores[32];
  __shared__ bool keep_group[32];
  const int lane = threadIdx.x, E = r.num_experts;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (32 * i + lane < E) group_choice[32 * i + lane] = choice[i];
  __syncwarp();
  const int per_group = E / r.n_group;
  if (lane < r.n_group) {
    float best = -INFINITY, second = -INFINITY;
    for (int i = 0; i < per_group; ++i) {
      const float v = group_choice[lane * per_group + i];
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
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (32 * i + lane < E && !keep_group[(32 * i + lane) / per_group]) choice[i] = -INFINITY;
}

// One warp a token; lane j holds experts j + 32 i (i < kPerLane) in registers: their sigmoid
// scores and choices (score + correction bias). Each of the top_k rounds takes the warp's best
// choice (ties to the lower expert id) by a local pass and two warp reductions of order keys
// (redux.sync, an instruction each, in place of five steps of two dependent shuffles), with
// shared memory only in the group stage: a decode token's routing is one warp's chain of
// dependent steps, so each round is kept to register work.
// Blocks from `routed` (or *routed_on_device, where given) on write a padding row (ids -1,
// weights 0).
template <int kPerLane, int kPlanes>
__global__ void __launch_bounds__(32)
    moe_route_kernel(const float* logits, const float* bias, MoeRouting r, int routed, const int32_t* routed_on_device,
                     int32_t* ids, float* weights) {
  chained_grid_prologue();
  if (static_cast<int>(blockIdx.x) >= (routed_on_device ? *routed_on_device : routed)) {
    for (int k = static_cast<int>(threadIdx.x); k < r.top_k; k += 32) {
      ids[static_cast<int64_t>(blockIdx.x) * r.top_k + k] = -1;
      weights[static_cast<int64_t>(blockIdx.x) * r.top_k + k] = 0.0f;
    }
    return;
  }
  const int t = blockIdx.x, lane = threadIdx.x, E = r.num_experts;
  float score[kPerLane], choice[kPerLane];
  {
    float logit[kPlanes][kPerLane], offset[kPerLane];  // every load in flight before the first use
    const int64_t plane_stride = static_cast<int64_t>(routed) * E;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = 32 * i + lane;
#pragma unroll
      for (int p = 0; p < kPlanes; ++p)
        logit[p][i] = e < E ? logits[p * plane_stride + static_cast<int64_t>(t) * E + e] : 0.0f;
      offset[i] = e < E ? bias[e] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
#pragma unroll
      for (int p = 1; p < kPlanes; ++p) logit[0][i] += logit[p][i];
      score[i] = 1.0f / (1.0f + expf(-logit[0][i]));
      choice[i] = score[i] + offset[i];
    }
  }
  if (r.n_group > 1) limit_to_best_groups<kPerLane>(r, choice);
  // Lane k % 32 keeps round k's expert and score (top_k <= 64: two slots a lane).
  int my_id[2] = {0, 0};
  float my_score[2] = {0.0f, 0.0f};
  float total = 0.0f;
  for (int k = 0; k < r.top_k; ++k) {
    float best = -INFINITY;
    int best_index = -1;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (32 * i + lane < E && (best_index < 0 || choice[i] > best)) {
        best = choice[i];
        best_index = 32 * i + lane;
      }
    // The warp's best: the largest key in one reduction, then the lowest id among the lanes that
    // hold it in another (a lane's best is already its lowest id of that value).
    const uint32_t key = best_index >= 0 ? order_key(best) : 0u;
    const uint32_t top = __reduce_max_sync(0xffffffffu, key);
    best_index = static_cast<int>(__reduce_min_sync(
        0xffffffffu, best_index >= 0 && key == top ? static_cast<uint32_t>(best_index) : 0xffffffffu));
    // Every lane now holds the same best_index; its owner retires it and hands its score over.
    float owned = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (32 * i + lane == best_index) {
        owned = score[i];
        choice[i] = -INFINITY;
      }
    const float chosen_score = __shfl_sync(0xffffffffu, owned, best_index % 32);
    total += chosen_score;
    if (lane == k % 32) {
      my_id[k / 32] = best_index;
      my_score[k / 32] = chosen_score;
    }
  }
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    const int k = lane + 32 * slot;
    if (k < r.top_k) {
      const int64_t i = static_cast<int64_t>(t) * r.top_k + k;
      float w = my_score[slot];
      if (r.norm_topk_prob) w /= total + 1e-20f;
      ids[i] = my_id[slot];
      weights[i] = w * r.routed_scaling_factor;
    }
  }
}

// Pair p's expert among this rank's [first, first + num_experts), or -1 for another rank's
// expert or a padding row's (id -1).
__device__ __forceinline__ int local_expert(const int32_t* ids, int64_t p, int first, int num_experts) {
  const int e = ids[p] - first;
  return e >= 0 && e < num_experts ? e : -1;
}

__global__ void moe_count_kernel(const int32_t* ids, int64_t num_pairs, int first, int num_experts, int32_t* counts) {
  chained_grid_prologue();
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= num_pairs) return;
  const int e = local_expert(ids, p, first, num_experts);
  if (e >= 0) atomicAdd(&counts[e], 1);
}

constexpr int kScanThreads = 1024;
using CountScan = cub::BlockScan<int, kScanThreads>;

// Thread e (< kScanThreads) of the block holds expert e's pair count (0 past num_experts):
// writes plan.offsets and the active list, returns e's offset. Synchronises the block.
__device__ __forceinline__ int scan_counts(int count, int num_experts, const MoePlan& plan,
                                           CountScan::TempStorage& storage) {
  const int e = threadIdx.x;
  int offset = 0, active_index = 0, total = 0, total_active = 0;
  CountScan(storage).ExclusiveSum(count, offset, total);
  __syncthreads();
  CountScan(storage).ExclusiveSum(count > 0 ? 1 : 0, active_index, total_active);
  if (e < num_experts) {
    plan.offsets[e] = offset;
    if (count > 0) plan.active_experts[active_index] = e;
  }
  if (e == 0) {
    plan.offsets[num_experts] = total;
    *plan.num_active = total_active;
  }
  return offset;
}

__global__ void __launch_bounds__(kScanThreads) moe_scan_kernel(int num_experts, MoePlan plan) {
  chained_grid_prologue();
  __shared__ CountScan::TempStorage storage;
  const int e = threadIdx.x;
  const int offset = scan_counts(e < num_experts ? plan.counts[e] : 0, num_experts, plan, storage);
  if (e < num_experts) plan.counts[e] = offset;  // becomes the placement cursor
}

// The whole plan in one block for a decode step's few pairs (the count, scan and place kernels
// and the memset are four launches of a few microseconds each, in series).
constexpr int64_t kOneBlockPlanPairs = 8192;

__global__ void __launch_bounds__(kScanThreads) moe_plan_one_block_kernel(const int32_t* ids, int64_t num_pairs,
                                                                          int first, int num_experts, MoePlan plan) {
  chained_grid_prologue();
  __shared__ CountScan::TempStorage storage;
  __shared__ int cursor[kScanThreads];
  const int e = threadIdx.x;
  cursor[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < num_pairs; p += kScanThreads) {
    const int expert = local_expert(ids, p, first, num_experts);
    if (expert >= 0) atomicAdd(&cursor[expert], 1);
  }
  __syncthreads();
  const int offset = scan_counts(e < num_experts ? cursor[e] : 0, num_experts, plan, storage);
  cursor[e] = offset;  // each thread rewrites only its own count, read above
  __syncthreads();
  for (int64_t p = threadIdx.x; p < num_pairs; p += kScanThreads) {
    const int expert = local_expert(ids, p, first, num_experts);
    if (expert < 0) {
      plan.pair_slot[p] = -1;
      continue;
    }
    const int slot = atomicAdd(&cursor[expert], 1);
    plan.sorted_pairs[slot] = static_cast<int32_t>(p);
    plan.pair_slot[p] = slot;
  }
}

__global__ void moe_place_kernel(const int32_t* ids, int64_t num_pairs, int first, int num_experts, MoePlan plan) {
  chained_grid_prologue();
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= num_pairs) return;
  const int expert = local_expert(ids, p, first, num_experts);
  if (expert < 0) {
    plan.pair_slot[p] = -1;
    return;
  }
  const int slot = atomicAdd(&plan.counts[expert], 1);
  plan.sorted_pairs[slot] = static_cast<int32_t>(p);
  plan.pair_slot[p] = slot;
}

// A block per (token, kCombineDims dims). The token's pairs come into shared memory by one
// parallel load (thread k, pair k) and thread 0 orders them from there: a serial loop over
// global loads made every block of a batch-64 decode wait about a microsecond a pair.
constexpr int kCombineThreads = 256, kCombineDims = 4 * kCombineThreads;
// Sum: an expert's sums as fp32 or bf16 rows (ExpertSums), read as fp32 (load_as_float). Out:
// float, or uint16_t for bf16 rows (never accumulated).
template <typename Sum, typename Out>
__global__ void moe_combine_kernel(Out* out, bool accumulate, const float* shared_out, const Sum* expert_out,
                                   const int32_t* pair_slot, const int32_t* ids, const float* weights, int top_k,
                                   int64_t hidden) {
  chained_grid_prologue();
  constexpr bool kBf16Out = std::is_same_v<Out, uint16_t>;
  __shared__ int order[64], token_ids[64], slots[64];
  __shared__ float pair_weights[64];
  __shared__ int count;
  const int64_t t = blockIdx.x;
  if (threadIdx.x < top_k) {
    const int64_t pair = t * top_k + threadIdx.x;
    token_ids[threadIdx.x] = ids[pair];
    slots[threadIdx.x] = pair_slot[pair];
    pair_weights[threadIdx.x] = weights[pair];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // The token's pairs on this rank, in increasing expert id (the CPU path adds them so).
    count = 0;
    for (int k = 0; k < top_k; ++k)
      if (slots[k] >= 0) order[count++] = k;
    for (int i = 1; i < count; ++i)
      for (int j = i; j > 0 && token_ids[order[j]] < token_ids[order[j - 1]]; --j) {
        const int tmp = order[j];
        order[j] = order[j - 1];
        order[j - 1] = tmp;
      }
  }
  __syncthreads();
  const int64_t begin = blockIdx.y * int64_t{kCombineDims}, end = min(hidden, begin + kCombineDims);
  Out* const token_out = out + t * hidden;
  if (hidden % 4 == 0) {
    for (int64_t d = begin + 4 * threadIdx.x; d < end; d += 4 * kCombineThreads) {
      float4 sum = shared_out ? *reinterpret_cast<const float4*>(shared_out + t * hidden + d)
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int i = 0; i < count; ++i) {
        const float w = pair_weights[order[i]];
        const float4 v = load4_as_float(expert_out + static_cast<int64_t>(slots[order[i]]) * hidden + d);
        sum.x += w * v.x, sum.y += w * v.y, sum.z += w * v.z, sum.w += w * v.w;
      }
      if constexpr (kBf16Out) {
        *reinterpret_cast<uint2*>(token_out + d) =
            make_uint2(pack_bf16_pair(sum.x, sum.y), pack_bf16_pair(sum.z, sum.w));
      } else {
        float4* dst = reinterpret_cast<float4*>(token_out + d);
        if (accumulate) {
          const float4 old = *dst;
          sum = make_float4(old.x + sum.x, old.y + sum.y, old.z + sum.z, old.w + sum.w);
        }
        *dst = sum;
      }
    }
    return;
  }
  for (int64_t d = begin + threadIdx.x; d < end; d += kCombineThreads) {
    float sum = shared_out ? shared_out[t * hidden + d] : 0.0f;
    for (int i = 0; i < count; ++i)
      sum += pair_weights[order[i]] * load_as_float(expert_out + static_cast<int64_t>(slots[order[i]]) * hidden + d);
    if constexpr (kBf16Out) token_out[d] = float_to_bf16(sum);
    else token_out[d] = accumulate ? token_out[d] + sum : sum;
  }
}

template <typename Sum, typename Out>
void launch_combine(dim3 grid, Out* out, bool accumulate, const float* shared_out, const Sum* expert_out,
                    const int32_t* pair_slot, const int32_t* ids, const float* weights, int top_k, int64_t hidden,
                    cudaStream_t stream) {
  launch_chained("moe_combine launch", moe_combine_kernel<Sum, Out>, grid, kCombineThreads, 0, stream, out, accumulate,
                 shared_out, expert_out, pair_slot, ids, weights, top_k, hidden);
}

}  // namespace

void moe_route(const float* logits, const float* correction_bias, int64_t n, const MoeRouting& routing,
               int32_t* expert_ids, float* expert_weights, cudaStream_t stream, int64_t padded_rows,
               const int32_t* routed_on_device) {
  const int64_t rows = std::max(n, padded_rows);
  if (rows == 0) return;
  GLMS_CHECK(routing.num_experts <= 1024 && routing.n_group <= 32 && routing.top_k <= 64 &&
                 routing.top_k <= routing.num_experts,
             "moe_route: at most 1024 experts, 32 groups and top-64");
  GLMS_CHECK(rows <= std::numeric_limits<int>::max(), "moe_route: too many rows");
  auto launch = [&](auto kernel) {
    launch_chained("moe_route launch", kernel, static_cast<unsigned>(rows), 32, 0, stream, logits, correction_bias,
                   routing, static_cast<int>(n), routed_on_device, expert_ids, expert_weights);
  };
  GLMS_CHECK(routing.logit_planes == 1 || routing.logit_planes == kRouterProductPlanes,
             "moe_route: logits in 1 or kRouterProductPlanes planes");
  if (routing.num_experts <= 256 && routing.logit_planes == 1) launch(moe_route_kernel<8, 1>);
  else if (routing.num_experts <= 256) launch(moe_route_kernel<8, kRouterProductPlanes>);
  else if (routing.logit_planes == 1) launch(moe_route_kernel<32, 1>);
  else launch(moe_route_kernel<32, kRouterProductPlanes>);
}

void moe_plan(const int32_t* expert_ids, int64_t num_pairs, int num_experts, const MoePlan& plan, cudaStream_t stream,
              int first_expert) {
  GLMS_CHECK(num_experts <= kScanThreads, "moe_plan: at most 1024 experts");
  if (num_pairs <= kOneBlockPlanPairs) {
    launch_chained("moe_plan launch", moe_plan_one_block_kernel, 1, kScanThreads, 0, stream, expert_ids, num_pairs,
                   first_expert, num_experts, plan);
    return;
  }
  check(cudaMemsetAsync(plan.counts, 0, sizeof(int32_t) * (num_experts + 1), stream), "moe_plan memset");
  if (num_pairs > 0) {
    launch_chained("moe_count launch", moe_count_kernel, blocks_for(num_pairs, 256), 256, 0, stream, expert_ids,
                   num_pairs, first_expert, num_experts, plan.counts);
  }
  launch_chained("moe_scan launch", moe_scan_kernel, 1, kScanThreads, 0, stream, num_experts, plan);
  if (num_pairs > 0) {
    launch_chained("moe_place launch", moe_place_kernel, blocks_for(num_pairs, 256), 256, 0, stream, expert_ids,
                   num_pairs, first_expert, num_experts, plan);
  }
}

void moe_combine(ExpertSums out, bool accumulate, const float* shared_out, ExpertSums expert_out,
                 const int32_t* pair_slot, const int32_t* expert_ids, const float* expert_weights, int64_t n,
                 int top_k, int64_t hidden, cudaStream_t stream) {
  if (n == 0) return;
  GLMS_CHECK(top_k <= 64, "moe_combine: at most top-64");
  GLMS_CHECK(!out.bf16 || (!accumulate && !shared_out), "moe_combine: bf16 rows are written, neither added to nor "
                                                        "with the shared expert");
  // A block per (token, 1024 dims): a lone decode token still spreads over a few SMs.
  const dim3 grid(static_cast<unsigned>(n), blocks_for(hidden, kCombineDims));
  auto with_sums = [&](auto* rows) {
    if (expert_out.bf16)
      launch_combine(grid, rows, accumulate, shared_out, static_cast<const uint16_t*>(expert_out.bf16), pair_slot,
                     expert_ids, expert_weights, top_k, hidden, stream);
    else
      launch_combine(grid, rows, accumulate, shared_out, static_cast<const float*>(expert_out.f32), pair_slot,
                     expert_ids, expert_weights, top_k, hidden, stream);
  };
  if (out.bf16) with_sums(out.bf16);
  else with_sums(out.f32);
}

}  // namespace glms::ops::cuda
