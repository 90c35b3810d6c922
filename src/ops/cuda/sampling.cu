// Sampling on the device: ops::sample_row's filters and draw for every logits row of a step at
// once, so that a sampled request sends four bytes to the host instead of a vocabulary of fp32.
//
// A block of 1024 threads per row. Warp w owns the contiguous ids [w * span, (w + 1) * span) and
// reads them 32 at a time (lane l the l-th of each group: coalesced), so that "in id order" (the
// draw's walk, the lower ids among equal logits) is a scan over the warps' totals, then ballots
// and warp scans inside each group. Nothing is sorted: top_k's threshold is a radix select over
// order-preserving keys of the logits (eight 4-bit passes of counts), top_p's boundary the same
// select over masses instead of counts (the key where the mass of larger keys stops short of
// top_p and reaching past it does), and the weights exp((logit - max) / T) are recomputed in each
// pass rather than stored (the row stays in L2), by ops::sampling_exp, bit for bit as the host
// sampler makes them.
//
// Each thread counts a pass into its own 16 bins of shared memory, summed over the block after
// the pass: a flat distribution puts nearly every logit of a pass in one or two bins, where
// shared atomics (a compare-and-swap loop for doubles) serialise the whole row.
//
// One block makes some 13 passes over a row alone (about 0.45 ms for 154880 ids on an H200,
// bound by that SM's issue rate); with blocks_per_row > 1 a thread block cluster shares the row,
// the warps of its blocks in rank order, and each pass's totals and prefix sums are combined
// through distributed shared memory in rank order, so every block takes the same decisions.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "core/error.h"
#include "ops/cuda/cluster.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/sampling_exp.h"

namespace glms::ops::cuda {

namespace {

constexpr int kSampleThreads = 1024;
constexpr int kWarps = kSampleThreads / 32;  // 32: one lane of one warp per warp in the reductions
constexpr unsigned kAllLanes = 0xffffffffu;
constexpr int kGroupLoads = 8;
constexpr int kDigitBits = 4;
constexpr int kDigits = 1 << kDigitBits;  // bins a pass
// Dynamic shared memory: the threads' bins, [kDigits][kSampleThreads] (a warp's updates fall in
// distinct banks), as double masses or, for top_k, int counts.
constexpr size_t kBinBytes = sizeof(double) * kDigits * kSampleThreads;  // 128 KiB

template <typename T, typename Op>
__device__ T warp_all_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kAllLanes, v, offset));
  return v;
}

// op over the block's 1024 values; every thread gets the result. scratch: kWarps values of shared memory.
template <typename T, typename Op>
__device__ T block_all_reduce(T v, T* scratch, Op op) {
  v = warp_all_reduce(v, op);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  return warp_all_reduce(scratch[threadIdx.x % 32], op);
}

// The sum of the warps before this one of `warp_total` (the same in each lane of a warp), in warp
// order; *through gets the same sum through this warp, *all the sum over every warp. scratch:
// kWarps values of shared memory.
template <typename T>
__device__ T sum_of_earlier_warps(T warp_total, T* scratch, T* all, T* through = nullptr) {
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = warp_total;
  __syncthreads();
  T before = 0, sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == static_cast<int>(threadIdx.x / 32)) before = sum;
    sum += scratch[w];
    if (through && w == static_cast<int>(threadIdx.x / 32)) *through = sum;
  }
  *all = sum;
  return before;
}

// Inclusive sum of v over lanes 0..lane.
__device__ __forceinline__ double warp_inclusive_sum(double v) {
  const int lane = threadIdx.x % 32;
  for (int offset = 1; offset < 32; offset *= 2) {
    const double earlier = __shfl_up_sync(kAllLanes, v, offset);
    if (lane >= offset) v += earlier;
  }
  return v;
}

// f(v, g) for each group of 32 ids [g, g + 32) of [lo, hi) in order, v this lane's logit (NaN
// past hi, which every filter drops); called by every lane. kGroupLoads groups' reads are in
// flight at once: one at a time, a pass waited out a memory latency per group.
template <typename F>
__device__ __forceinline__ void for_each_group(const float* row, int64_t lo, int64_t hi, F&& f) {
  const int lane = threadIdx.x % 32;
  for (int64_t g0 = lo; g0 < hi; g0 += 32 * kGroupLoads) {
    float v[kGroupLoads];
#pragma unroll
    for (int u = 0; u < kGroupLoads; ++u) {
      const int64_t i = g0 + 32 * u + lane;
      v[u] = i < hi ? __ldg(row + i) : __int_as_float(0x7fc00000);
    }
#pragma unroll
    for (int u = 0; u < kGroupLoads; ++u) f(v[u], g0 + 32 * u);
  }
}

// totals[d] = the sum of bin d over the block's threads (bins[d * kSampleThreads + t]), in a
// fixed order; every thread sees it.
template <typename T>
__device__ void sum_bins(const T* bins, double* totals) {
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < kDigits) {
    double sum = 0.0;
    for (int t = lane; t < kSampleThreads; t += 32) sum += static_cast<double>(bins[warp * kSampleThreads + t]);
    sum = warp_all_reduce(sum, [](double a, double b) { return a + b; });
    if (lane == 0) totals[warp] = sum;
  }
  __syncthreads();
}

// What a warp's passes over its row read: the row and this warp's ids [lo, hi), a multiple of 32
// wide but for the last (the row's warps in order: the blocks by rank, then the warps of each).
struct WarpSlice {
  const float* row;
  int64_t lo, hi;
};

// Where a radix select's passes count and decide: the threads' bins (kBinBytes of dynamic shared
// memory), the block's and the cluster's totals a digit, and thread 0's decision for the block.
struct RadixShared {
  double* bins;
  double* block_bin_totals;
  double* cluster_bin_totals;
  uint32_t* prefix;
};

// A row's filters as its passes learn them, and what a lane asks of a value: its weight
// exp((v - max) / T), and whether top_k, then every filter, keeps it. The keep tests are called by
// every lane of a warp for each group in id order: their ballots rank equal keys across the warp.
struct RowFilters {
  RowSampling p;
  float max_logit, inv_temperature;
  unsigned lanes_below;   // this lane's bit mask of the lanes before it
  bool use_top_k;
  uint32_t kth_key = 0;   // top_k's k-th largest order key
  int equal_keep = 0;     // how many of the ids equal to it, the lowest, stay
  double total = 0.0;     // the weight top_k keeps
  bool keep_all = true;   // top_p keeps every value top_k keeps
  uint32_t tau = 0;       // top_p's boundary key
  double above = 0.0;     // the weight of the keys above tau

  __device__ __forceinline__ float weight(float v) const {
    return sampling_exp(__fmul_rn(__fsub_rn(v, max_logit), inv_temperature));
  }
  // equal_seen: the ids equal to the k-th key before the group, from the warp's equal_base.
  __device__ __forceinline__ bool top_k_keeps(float v, int& equal_seen) const {
    const bool valid = v == v;
    if (!use_top_k) return valid;
    const uint32_t key = order_key(v);
    const bool equal = valid && key == kth_key;
    const unsigned equals = __ballot_sync(kAllLanes, equal);
    const int rank = equal_seen + __popc(equals & lanes_below);
    equal_seen += __popc(equals);
    return valid && (key > kth_key || (equal && rank < equal_keep));
  }
  // Every filter, the weight in *w; tie_seen: the weight at tau before the group, from the warp's
  // tie_base (the ids at tau are kept in id order while the weight before them stays short of
  // top_p). min_p's floor is min_p x the largest weight (1, the largest logit's, which every
  // filter keeps).
  __device__ __forceinline__ bool keeps(float v, int& equal_seen, double& tie_seen, float* w) const {
    const bool survivor = top_k_keeps(v, equal_seen);
    *w = survivor ? weight(v) : 0.0f;
    bool kept = survivor;
    if (!keep_all) {
      const uint32_t key = order_key(v);
      const bool at_tau = survivor && key == tau;
      if (__ballot_sync(kAllLanes, at_tau) != 0) {  // the mass at tau before each lane, in id order
        const double tie_mass = at_tau ? *w : 0.0;
        const double through = warp_inclusive_sum(tie_mass);
        double before = __shfl_up_sync(kAllLanes, through, 1);
        if (threadIdx.x % 32 == 0) before = 0.0;
        if (at_tau) kept = (above + tie_seen + before) / total < p.top_p;
        tie_seen += __shfl_sync(kAllLanes, through, 31);
      }
      if (survivor && !at_tau) kept = key > tau;
    }
    return kept && !(p.min_p > 0.0f && *w < p.min_p);
  }
};

// top_k's threshold: the k-th largest order key of the row (*kth_key) and how many of the ids
// equal to it, the lowest, are kept (*equal_keep), digit by digit from the top (counts a pass).
template <int kCluster>
__device__ __forceinline__ void select_top_k(const WarpSlice& slice, int top_k, const RadixShared& radix,
                                             int* remaining_shared, uint32_t* kth_key, int* equal_keep) {
  using Blocks = ClusterBlocks<kCluster>;
  uint32_t prefix = 0;
  int remaining = top_k;
  int* counts = reinterpret_cast<int*>(radix.bins) + threadIdx.x;  // this thread's bin d: counts[d * kSampleThreads]
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    const uint32_t high_mask = shift + kDigitBits == 32 ? 0u : 0xffffffffu << (shift + kDigitBits);
    for (int d = 0; d < kDigits; ++d) counts[d * kSampleThreads] = 0;
    for_each_group(slice.row, slice.lo, slice.hi, [&](float v, int64_t) {
      const uint32_t key = order_key(v);
      if (v == v && (key & high_mask) == prefix) ++counts[((key >> shift) & (kDigits - 1)) * kSampleThreads];
    });
    sum_bins(reinterpret_cast<const int*>(radix.bins), radix.block_bin_totals);
    const double* bin_totals = Blocks::sum_arrays(radix.block_bin_totals, radix.cluster_bin_totals, kDigits);
    if (threadIdx.x == 0) {
      int above = 0, d = kDigits - 1;
      for (; d > 0 && above + static_cast<int>(bin_totals[d]) < remaining; --d) above += static_cast<int>(bin_totals[d]);
      *radix.prefix = prefix | static_cast<uint32_t>(d) << shift;
      *remaining_shared = remaining - above;
    }
    __syncthreads();
    prefix = *radix.prefix;
    remaining = *remaining_shared;
  }
  *kth_key = prefix;
  *equal_keep = remaining;
}

// top_p's boundary key *tau: the masses of larger keys (*above) < top_p x total <= *above + the
// mass at tau, digit by digit from the top over the values top_k keeps (f's top_k filter and
// total). *keep_all when rounding kept the mass short of top_p.
template <int kCluster>
__device__ __forceinline__ void select_top_p(const WarpSlice& slice, const RowFilters& f, int equal_base,
                                             const RadixShared& radix, double* above_shared, int* keep_all_shared,
                                             uint32_t* tau, double* above, bool* keep_all) {
  using Blocks = ClusterBlocks<kCluster>;
  if (threadIdx.x == 0) *keep_all_shared = 0;
  uint32_t prefix = 0;
  double* masses = radix.bins + threadIdx.x;  // this thread's bin d: masses[d * kSampleThreads]
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    const uint32_t high_mask = shift + kDigitBits == 32 ? 0u : 0xffffffffu << (shift + kDigitBits);
    for (int d = 0; d < kDigits; ++d) masses[d * kSampleThreads] = 0.0;
    int equal_seen = equal_base;
    for_each_group(slice.row, slice.lo, slice.hi, [&](float v, int64_t) {
      const uint32_t key = order_key(v);
      if (f.top_k_keeps(v, equal_seen) && (key & high_mask) == prefix)
        masses[((key >> shift) & (kDigits - 1)) * kSampleThreads] += f.weight(v);
    });
    sum_bins(radix.bins, radix.block_bin_totals);
    const double* bin_totals = Blocks::sum_arrays(radix.block_bin_totals, radix.cluster_bin_totals, kDigits);
    if (threadIdx.x == 0) {
      int d = kDigits - 1;
      for (; d >= 0 && (*above + bin_totals[d]) / f.total < f.p.top_p; --d) *above += bin_totals[d];
      if (d < 0) *keep_all_shared = 1;  // rounding kept the mass short of top_p: every token stays
      *radix.prefix = prefix | static_cast<uint32_t>(max(d, 0)) << shift;
      *above_shared = *above;
    }
    __syncthreads();
    prefix = *radix.prefix;
    *above = *above_shared;
    if (*keep_all_shared) {
      *keep_all = true;
      break;
    }
  }
  *tau = prefix;
}

// The walk of the one warp whose range of cumulative kept weight holds `draw` (the target less
// the kept mass before the warp): the first kept id whose cumulative weight reaches it, or, when
// rounding kept the draw short, the warp's last kept id (`last_kept`: this lane's); equal_seen and
// tie_seen start at the warp's bases.
__device__ __forceinline__ int draw_in_warp(const WarpSlice& slice, const RowFilters& f, double draw, int equal_seen,
                                            double tie_seen, int last_kept) {
  int chosen = -1;
  for_each_group(slice.row, slice.lo, slice.hi, [&](float v, int64_t g) {
    if (chosen >= 0) return;  // the same in every lane
    float w;
    const bool kept = f.keeps(v, equal_seen, tie_seen, &w);
    const double through = warp_inclusive_sum(kept ? w : 0.0);
    const unsigned reached = __ballot_sync(kAllLanes, kept && draw - through <= 0.0);
    if (reached != 0) chosen = static_cast<int>(g) + __ffs(reached) - 1;
    draw -= __shfl_sync(kAllLanes, through, 31);
  });
  const int warp_last = warp_all_reduce(last_kept, [](int a, int b) { return max(a, b); });
  return chosen >= 0 ? chosen : warp_last;
}

// The rank of this warp's first id equal to the k-th key among all of them (lower ids rank first).
template <int kCluster>
__device__ __forceinline__ int equal_ids_before(const WarpSlice& slice, uint32_t kth_key, int* scratch_i, int* slot_i) {
  int equal_here = 0;
  for_each_group(slice.row, slice.lo, slice.hi,
                 [&](float v, int64_t) { equal_here += v == v && order_key(v) == kth_key; });
  int block_all = 0, all = 0;
  const int base =
      sum_of_earlier_warps(warp_all_reduce(equal_here, [](int a, int b) { return a + b; }), scratch_i, &block_all);
  return base + ClusterBlocks<kCluster>::sum_of_earlier_blocks(block_all, slot_i, &all);
}

// The weight at tau of the warps before this one (what top_p's ties in id order start from).
template <int kCluster>
__device__ __forceinline__ double tie_mass_before(const WarpSlice& slice, const RowFilters& f, int equal_base,
                                                  double* scratch_d, double* slot_d) {
  double tie_here = 0.0;
  int equal_seen = equal_base;
  for_each_group(slice.row, slice.lo, slice.hi, [&](float v, int64_t) {
    if (f.top_k_keeps(v, equal_seen) && order_key(v) == f.tau) tie_here += f.weight(v);
  });
  double block_all = 0.0, all = 0.0;
  const double base =
      sum_of_earlier_warps(warp_all_reduce(tie_here, [](double a, double b) { return a + b; }), scratch_d, &block_all);
  return base + ClusterBlocks<kCluster>::sum_of_earlier_blocks(block_all, slot_d, &all);
}

// A row per kCluster blocks (a thread block cluster when kCluster > 1): the row's ids split over
// the cluster's kCluster x kWarps warps, each pass's totals combined across the blocks.
template <int kCluster>
__global__ void __launch_bounds__(kSampleThreads)
    sample_rows_kernel(const float* logits, int64_t vocab, const int32_t* row_of, const RowSampling* params,
                       int32_t* out) {
  chained_grid_prologue();
  using Blocks = ClusterBlocks<kCluster>;
  extern __shared__ double bins[];  // kBinBytes: see kBinBytes
  __shared__ double block_bin_totals[kDigits], cluster_bin_totals[kDigits];
  __shared__ float slot_f;
  __shared__ double slot_d;
  __shared__ int slot_i;
  __shared__ float scratch_f[kWarps];
  __shared__ double scratch_d[kWarps];
  __shared__ int scratch_i[kWarps];
  __shared__ uint32_t prefix_shared;
  __shared__ int remaining_shared, keep_all_shared, token_shared;
  __shared__ double above_shared;
  const RadixShared radix{bins, block_bin_totals, cluster_bin_totals, &prefix_shared};

  const int row_index = static_cast<int>(blockIdx.x) / kCluster;
  const float* row = logits + static_cast<int64_t>(row_of ? row_of[row_index] : row_index) * vocab;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t span = (vocab + kCluster * kSampleThreads - 1) / (kCluster * kSampleThreads) * 32;
  const int64_t row_warp = static_cast<int64_t>(Blocks::rank()) * kWarps + warp;
  const int64_t warp_lo = min(vocab, row_warp * span);
  const WarpSlice slice{row, warp_lo, min(vocab, warp_lo + span)};
  RowFilters f;
  f.p = params[row_index];
  f.inv_temperature = 1.0f / f.p.temperature;
  f.lanes_below = (1u << lane) - 1u;

  float local_max = -INFINITY;
  for_each_group(row, slice.lo, slice.hi, [&](float v, int64_t) { local_max = fmaxf(local_max, v); });  // fmaxf skips NaN
  const auto float_max = [](float a, float b) { return fmaxf(a, b); };
  f.max_logit = Blocks::all_reduce(block_all_reduce(local_max, scratch_f, float_max), &slot_f, float_max);

  f.use_top_k = f.p.top_k > 0 && f.p.top_k < vocab;
  int equal_base = 0;  // the ids equal to the k-th key before this warp's
  if (f.use_top_k) {
    select_top_k<kCluster>(slice, f.p.top_k, radix, &remaining_shared, &f.kth_key, &f.equal_keep);
    equal_base = equal_ids_before<kCluster>(slice, f.kth_key, scratch_i, &slot_i);
  }
  double local_total = 0.0;
  {
    int equal_seen = equal_base;
    for_each_group(row, slice.lo, slice.hi, [&](float v, int64_t) {
      if (f.top_k_keeps(v, equal_seen)) local_total += f.weight(v);
    });
  }
  const auto double_sum = [](double a, double b) { return a + b; };
  f.total = Blocks::all_reduce(block_all_reduce(local_total, scratch_d, double_sum), &slot_d, double_sum);

  const bool use_top_p = f.p.top_p < 1.0f;
  f.keep_all = !use_top_p;
  if (use_top_p)
    select_top_p<kCluster>(slice, f, equal_base, radix, &above_shared, &keep_all_shared, &f.tau, &f.above,
                           &f.keep_all);
  const double tie_base = f.keep_all ? 0.0 : tie_mass_before<kCluster>(slice, f, equal_base, scratch_d, &slot_d);

  double own = 0.0;
  int first_kept = INT_MAX, last_kept = -1;
  {
    int equal_seen = equal_base;
    double tie_seen = tie_base;
    for_each_group(row, slice.lo, slice.hi, [&](float v, int64_t g) {
      float w;
      if (!f.keeps(v, equal_seen, tie_seen, &w)) return;
      own += w;
      first_kept = min(first_kept, static_cast<int>(g + lane));
      last_kept = static_cast<int>(g + lane);
    });
  }
  // The kept mass before this warp (base) and through it (reach), the row's warps in order; the
  // next warp's base is this one's reach, bit for bit, so exactly one warp holds a target.
  const double warp_own = warp_all_reduce(own, double_sum);
  double block_kept = 0.0, block_reach = 0.0, kept_total = 0.0;
  const double block_base =
      sum_of_earlier_warps(warp_own, scratch_d, &block_kept, kCluster == 1 ? nullptr : &block_reach);
  const double blocks_before = Blocks::sum_of_earlier_blocks(block_kept, &slot_d, &kept_total);
  const double base = kCluster == 1 ? block_base : blocks_before + block_base;
  const double reach = kCluster == 1 ? block_base + warp_own : blocks_before + block_reach;
  const auto int_min = [](int a, int b) { return min(a, b); };
  const auto int_max = [](int a, int b) { return max(a, b); };
  const int first = Blocks::all_reduce(block_all_reduce(first_kept, scratch_i, int_min), &slot_i, int_min);
  const int last = Blocks::all_reduce(block_all_reduce(last_kept, scratch_i, int_max), &slot_i, int_max);
  if (threadIdx.x == 0) token_shared = -1;
  __syncthreads();
  // The first kept id whose cumulative weight reaches canonical x kept_total.
  const double target = f.p.canonical * kept_total;
  if (target > 0.0 && warp_own > 0.0 && base < target && target <= reach) {
    const int chosen = draw_in_warp(slice, f, target - base, equal_base, tie_base, last_kept);
    if (lane == 0) token_shared = chosen;
  }
  __syncthreads();
  const int token = Blocks::all_reduce(token_shared, &slot_i, int_max);  // -1 but in the block that drew
  if (threadIdx.x == 0 && Blocks::rank() == 0) out[row_index] = token >= 0 ? token : (target <= 0.0 ? first : last);
}

}  // namespace

namespace {

template <int kCluster>
void launch_sample_rows(const float* logits, int64_t rows, int64_t vocab, const int32_t* row_of,
                        const RowSampling* params, int32_t* out, cudaStream_t stream) {
  check(cudaFuncSetAttribute(sample_rows_kernel<kCluster>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kBinBytes)),
        "sample_rows shared memory");
  if constexpr (kCluster == 1) {
    launch_chained("sample_rows launch", sample_rows_kernel<1>, static_cast<unsigned>(rows), kSampleThreads, kBinBytes,
                   stream, logits, vocab, row_of, params, out);
  } else {
    launch_chained_clusters("sample_rows launch (cluster)", sample_rows_kernel<kCluster>, kCluster,
                            dim3(static_cast<unsigned>(rows * kCluster)), dim3(kSampleThreads), kBinBytes, stream,
                            logits, vocab, row_of, params, out);
  }
}

}  // namespace

void sample_rows(const float* logits, int64_t rows, int64_t vocab, const int32_t* row_of, const RowSampling* params,
                 int32_t* out, cudaStream_t stream, int blocks_per_row) {
  if (rows == 0) return;
  GLMS_CHECK(vocab > 0 && vocab <= INT_MAX, "sample_rows: 1 to 2^31 - 1 logits a row");
  switch (blocks_per_row) {
    case 1: return launch_sample_rows<1>(logits, rows, vocab, row_of, params, out, stream);
    case 2: return launch_sample_rows<2>(logits, rows, vocab, row_of, params, out, stream);
    case 4: return launch_sample_rows<4>(logits, rows, vocab, row_of, params, out, stream);
    case 8: return launch_sample_rows<8>(logits, rows, vocab, row_of, params, out, stream);
    default: fail("sample_rows: 1, 2, 4 or 8 blocks a row, not " + std::to_string(blocks_per_row));
  }
}

}  // namespace glms::ops::cuda
