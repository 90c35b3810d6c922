// Sampling on the device: ops::sample_row's filters and draw for every logits row of a step at
// once, so that a sampled request sends four bytes to the host instead of a vocabulary of fp32.
//
// A block of 1024 threads per row; thread t owns the contiguous ids [t * chunk, (t + 1) * chunk),
// so that "in id order" (the draw's walk, the lower ids among equal logits) is a block scan over
// per-thread sums followed by a walk inside one chunk. Nothing is sorted: top_k's threshold is a
// radix select over order-preserving keys of the logits (four 8-bit passes of counts), top_p's
// boundary the same select over masses instead of counts (the key where the mass of larger keys
// stops short of top_p and reaching past it does), and the weights exp((logit - max) / T) are
// recomputed in each pass rather than stored (the row stays in L2; the passes are cheap), by
// ops::sampling_exp, bit for bit as the host sampler makes them.
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/sampling_exp.h"

namespace glms::ops::cuda {

namespace {

constexpr int kSampleThreads = 1024;  // 32 warps: the block reductions below assume it

// Larger float, larger key (for non-NaN values; -0 is taken as +0, as the comparisons do).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// op over the block's 1024 values; every thread gets the result. scratch: 32 values of shared memory.
template <typename T, typename Op>
__device__ T block_all_reduce(T v, T* scratch, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[lane];
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__global__ void __launch_bounds__(kSampleThreads)
    sample_rows_kernel(const float* logits, int64_t vocab, const int32_t* row_of, const RowSampling* params,
                       int32_t* out) {
  using IntScan = cub::BlockScan<int, kSampleThreads>;
  using DoubleScan = cub::BlockScan<double, kSampleThreads>;
  __shared__ union {
    typename IntScan::TempStorage ints;
    typename DoubleScan::TempStorage doubles;
  } scan;
  __shared__ int count_hist[256];
  __shared__ double mass_hist[256];
  __shared__ float scratch_f[32];
  __shared__ double scratch_d[32];
  __shared__ int scratch_i[32];
  __shared__ uint32_t prefix_shared;
  __shared__ int remaining_shared, keep_all_shared, token_shared;
  __shared__ double above_shared;

  const RowSampling p = params[blockIdx.x];
  const float* row = logits + static_cast<int64_t>(row_of ? row_of[blockIdx.x] : blockIdx.x) * vocab;
  const int64_t chunk = (vocab + kSampleThreads - 1) / kSampleThreads;
  const int64_t start = int64_t{threadIdx.x} * chunk;
  const int64_t lo = start < vocab ? start : vocab, hi = lo + chunk < vocab ? lo + chunk : vocab;
  const float inv_temperature = 1.0f / p.temperature;

  float local_max = -INFINITY;
  for (int64_t i = lo; i < hi; ++i) local_max = fmaxf(local_max, row[i]);  // fmaxf skips NaN
  const float max_logit = block_all_reduce(local_max, scratch_f, [](float a, float b) { return fmaxf(a, b); });
  auto weight = [&](float v) { return sampling_exp(__fmul_rn(__fsub_rn(v, max_logit), inv_temperature)); };

  // top_k: the k-th largest key, and how many of the ids equal to it (the lowest) are kept.
  const bool use_top_k = p.top_k > 0 && p.top_k < vocab;
  uint32_t kth_key = 0;
  int equal_keep = 0;
  if (use_top_k) {
    uint32_t prefix = 0;
    int remaining = p.top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      const uint32_t high_mask = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
      for (int d = threadIdx.x; d < 256; d += kSampleThreads) count_hist[d] = 0;
      __syncthreads();
      for (int64_t i = lo; i < hi; ++i) {
        const float v = row[i];
        if (v != v) continue;
        const uint32_t key = order_key(v);
        if ((key & high_mask) == prefix) atomicAdd(&count_hist[(key >> shift) & 255], 1);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int above = 0, d = 255;
        for (; d > 0 && above + count_hist[d] < remaining; --d) above += count_hist[d];
        prefix_shared = prefix | static_cast<uint32_t>(d) << shift;
        remaining_shared = remaining - above;
      }
      __syncthreads();
      prefix = prefix_shared;
      remaining = remaining_shared;
    }
    kth_key = prefix;
    equal_keep = remaining;
  }
  // Each thread's first rank among the ids equal to the k-th key (lower ids rank first).
  int equal_base = 0;
  if (use_top_k) {
    int equal_here = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const float v = row[i];
      equal_here += v == v && order_key(v) == kth_key;
    }
    IntScan(scan.ints).ExclusiveSum(equal_here, equal_base);
    __syncthreads();
  }
  // Whether a value survives top_k, walking a chunk in id order (equal_rank counts the
  // k-th-equal ids seen, from equal_base).
  auto top_k_keeps = [&](float v, int& equal_rank) {
    if (v != v) return false;
    if (!use_top_k) return true;
    const uint32_t key = order_key(v);
    if (key != kth_key) return key > kth_key;
    return equal_rank++ < equal_keep;
  };

  double local_total = 0.0;
  {
    int rank = equal_base;
    for (int64_t i = lo; i < hi; ++i)
      if (top_k_keeps(row[i], rank)) local_total += weight(row[i]);
  }
  const double total = block_all_reduce(local_total, scratch_d, [](double a, double b) { return a + b; });

  // top_p: the boundary key tau (masses of larger keys `above` < top_p x total <= above + the
  // mass at tau), found digit by digit from the top.
  const bool use_top_p = p.top_p < 1.0f;
  uint32_t tau = 0;
  double above = 0.0;
  bool keep_all = !use_top_p;
  if (use_top_p) {
    if (threadIdx.x == 0) keep_all_shared = 0;
    uint32_t prefix = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      const uint32_t high_mask = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
      for (int d = threadIdx.x; d < 256; d += kSampleThreads) mass_hist[d] = 0.0;
      __syncthreads();
      int rank = equal_base;
      for (int64_t i = lo; i < hi; ++i) {
        const float v = row[i];
        if (!top_k_keeps(v, rank)) continue;
        const uint32_t key = order_key(v);
        if ((key & high_mask) == prefix) atomicAdd(&mass_hist[(key >> shift) & 255], static_cast<double>(weight(v)));
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int d = 255;
        for (; d >= 0 && (above + mass_hist[d]) / total < p.top_p; --d) above += mass_hist[d];
        if (d < 0) keep_all_shared = 1;  // rounding kept the mass short of top_p: every token stays
        prefix_shared = prefix | static_cast<uint32_t>(max(d, 0)) << shift;
        above_shared = above;
      }
      __syncthreads();
      prefix = prefix_shared;
      above = above_shared;
      if (keep_all_shared) {
        keep_all = true;
        break;
      }
    }
    tau = prefix;
  }
  // The ids at tau are kept in id order while the mass before them stays short of top_p.
  double tie_base = 0.0;
  if (!keep_all) {
    double tie_here = 0.0;
    int rank = equal_base;
    for (int64_t i = lo; i < hi; ++i) {
      const float v = row[i];
      if (top_k_keeps(v, rank) && order_key(v) == tau) tie_here += weight(v);
    }
    DoubleScan(scan.doubles).ExclusiveSum(tie_here, tie_base);
    __syncthreads();
  }
  // Every filter, walking a chunk in id order; min_p's floor is min_p x the largest weight (1,
  // the largest logit's, which every filter keeps).
  auto keeps = [&](float v, int& equal_rank, double& tie_mass) {
    if (!top_k_keeps(v, equal_rank)) return false;
    const float w = weight(v);
    if (!keep_all) {
      const uint32_t key = order_key(v);
      if (key < tau) return false;
      if (key == tau) {
        const bool short_of_top_p = (above + tie_mass) / total < p.top_p;
        tie_mass += w;
        if (!short_of_top_p) return false;
      }
    }
    return !(p.min_p > 0.0f && w < p.min_p);
  };

  double own = 0.0;
  int first_kept = INT_MAX, last_kept = -1;
  {
    int rank = equal_base;
    double tie_mass = tie_base;
    for (int64_t i = lo; i < hi; ++i) {
      const float v = row[i];
      if (!keeps(v, rank, tie_mass)) continue;
      own += weight(v);
      first_kept = min(first_kept, static_cast<int>(i));
      last_kept = static_cast<int>(i);
    }
  }
  double base = 0.0, kept_total = 0.0;
  DoubleScan(scan.doubles).ExclusiveSum(own, base, kept_total);
  const int first = block_all_reduce(first_kept, scratch_i, [](int a, int b) { return min(a, b); });
  const int last = block_all_reduce(last_kept, scratch_i, [](int a, int b) { return max(a, b); });
  if (threadIdx.x == 0) token_shared = -1;
  __syncthreads();
  // The first kept id whose cumulative weight reaches canonical x kept_total: in the one chunk
  // whose range of cumulative weight holds that point.
  const double target = p.canonical * kept_total;
  if (target > 0.0 && own > 0.0 && base < target && target <= base + own) {
    double draw = target - base;
    int rank = equal_base;
    double tie_mass = tie_base;
    int chosen = last_kept;
    for (int64_t i = lo; i < hi; ++i) {
      const float v = row[i];
      if (!keeps(v, rank, tie_mass)) continue;
      draw -= weight(v);
      if (draw <= 0.0) {
        chosen = static_cast<int>(i);
        break;
      }
    }
    token_shared = chosen;
  }
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = token_shared >= 0 ? token_shared : (target <= 0.0 ? first : last);
}

}  // namespace

void sample_rows(const float* logits, int64_t rows, int64_t vocab, const int32_t* row_of, const RowSampling* params,
                 int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  GLMS_CHECK(vocab > 0 && vocab <= INT_MAX, "sample_rows: 1 to 2^31 - 1 logits a row");
  sample_rows_kernel<<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(logits, vocab, row_of, params, out);
  check(cudaGetLastError(), "sample_rows launch");
}

}  // namespace glms::ops::cuda
