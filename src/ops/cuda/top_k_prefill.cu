// The indexer's top-k for a prefill chunk (select_top_k's path for 512 tokens or more): one
// 256-thread block a token, a token's row of up to its whole context in scores (global memory).
//
// A radix select over the scores mapped to order-preserving unsigned keys, in three digits of
// 11, 11 and 10 bits (2048-bin histograms: the first digit, sign, exponent and two mantissa bits,
// already splits a row's scores into a few dozen bins, where an 8-bit first digit left nearly all
// of them in one and needed a fourth pass). After the first digit, the keys of the threshold bin
// (a small share of the row) are compacted into shared memory and the last two digits are
// counted there: a row is read from global memory three times (the first digit, the compaction,
// the ordered write) instead of once a digit and twice for the write. A threshold bin larger
// than the shared buffer (rows of many equal scores) has its digits counted over the row instead.
//
// The ordered write stages the row in segments of 4096 scores through shared memory (loads
// coalesced), each thread then taking 16 consecutive positions, and one block scan a segment
// gives each thread where its positions go: keys above the threshold all, keys equal to it the
// first `remaining` in position order, so ties go to the lower position as on the CPU.

#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/indexer.h"
#include "ops/cuda/launch.cuh"

namespace glms::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kLoads = 8;                  // reads in flight a thread in a pass over the row
constexpr int kPositionsPerThread = 16;    // consecutive positions a thread takes in the write
constexpr int kSegment = kThreads * kPositionsPerThread;
// Staged position p sits at word p + p / 16: a thread's 16 consecutive keys then start 17 words
// after its neighbour's, in another bank, so the threads' reads do not conflict.
constexpr int kStagedWords = kSegment + kSegment / kPositionsPerThread;
constexpr int kBins = 2048;
constexpr uint32_t kNoDigit = 0xffffffffu;

struct TopKShared {
  unsigned histogram[kBins];
  uint32_t staged[kStagedWords];  // the threshold bin's keys during the digits, then a segment of the row
  typename cub::BlockScan<int, kThreads>::TempStorage scan;
  uint32_t prefix;       // the digits picked so far, in place
  int remaining;         // of the keys matching prefix, how many still to select
  int bin_count;         // the keys in the last picked digit
  int num_candidates;
};

// This thread's kLoads keys of row[base, base + kLoads * kThreads) (0 past context), all loads
// issued before any is used.
__device__ __forceinline__ void load_row_keys(const float* row, int base, int context, uint32_t (&keys)[kLoads]) {
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    const int j = base + l * kThreads + static_cast<int>(threadIdx.x);
    keys[l] = j < context ? order_key(__ldg(row + j)) : 0u;
  }
}

// Adds to histogram the digit (key >> shift) & digit_mask of each key of row[0, context) whose
// bits under mask equal prefix. kPeersAddOnce: lanes with the same digit add once (the later
// digits of a tied row, whose keys all fall in one bin, where an atomic a key would serialise the
// pass); otherwise a shared atomic a key (the first digit, whose few dozen bins take a row's keys
// with few collisions in a warp: 19% less time than matching peers first, H100, 8192-token step).
template <bool kPeersAddOnce>
__device__ __forceinline__ void count_row_digits(const float* row, int context, uint32_t prefix, uint32_t mask,
                                                 int shift, uint32_t digit_mask, unsigned* histogram) {
  const int warp_first = static_cast<int>(threadIdx.x) / 32 * 32;
  for (int base = 0; base < context; base += kThreads * kLoads) {
    uint32_t keys[kLoads];
    load_row_keys(row, base, context, keys);
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      if (base + l * kThreads + warp_first >= context) break;  // warp-uniform: no key past here
      const int j = base + l * kThreads + static_cast<int>(threadIdx.x);
      const uint32_t digit = j < context && (keys[l] & mask) == prefix ? (keys[l] >> shift) & digit_mask : kNoDigit;
      if constexpr (kPeersAddOnce) {
        const unsigned peers = __match_any_sync(0xffffffffu, digit);
        if (digit != kNoDigit && static_cast<int>(threadIdx.x % 32) == __ffs(peers) - 1)
          atomicAdd(&histogram[digit], __popc(peers));
      } else if (digit != kNoDigit) {
        atomicAdd(&histogram[digit], 1u);
      }
    }
  }
}

// Appends to candidates (in no particular order) each key of row[0, context) whose bits under
// mask equal prefix; *count ends at their number.
__device__ __forceinline__ void compact_row(const float* row, int context, uint32_t prefix, uint32_t mask,
                                            uint32_t* candidates, int* count) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp_first = static_cast<int>(threadIdx.x) - lane;
  for (int base = 0; base < context; base += kThreads * kLoads) {
    uint32_t keys[kLoads];
    load_row_keys(row, base, context, keys);
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      if (base + l * kThreads + warp_first >= context) break;  // warp-uniform
      const int j = base + l * kThreads + static_cast<int>(threadIdx.x);
      const bool match = j < context && (keys[l] & mask) == prefix;
      const unsigned ballot = __ballot_sync(0xffffffffu, match);
      if (ballot == 0) continue;
      int slot = 0;
      if (lane == 0) slot = atomicAdd(count, __popc(ballot));
      slot = __shfl_sync(0xffffffffu, slot, 0);
      if (match) candidates[slot + __popc(ballot & ((1u << lane) - 1u))] = keys[l];
    }
  }
}

// As count_row_digits<false> over the compacted keys candidates[0, count).
__device__ __forceinline__ void count_candidate_digits(const uint32_t* candidates, int count, uint32_t prefix,
                                                       uint32_t mask, int shift, uint32_t digit_mask,
                                                       unsigned* histogram) {
  for (int i = static_cast<int>(threadIdx.x); i < count; i += kThreads) {
    const uint32_t key = candidates[i];
    if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & digit_mask], 1u);
  }
}

// The digit of histogram[0, kDigits) holding the s.remaining-th largest of the counted keys:
// thread i takes digits kDigits - 1 - i * kPer downwards, a block scan counts the keys at or
// above each thread's digits, and the thread holding the crossing sets s.prefix (the digit at
// shift), s.remaining and s.bin_count. Ends synchronised.
template <int kDigits>
__device__ __forceinline__ void pick_digit(TopKShared& s, int shift) {
  constexpr int kPer = kDigits / kThreads;
  const int remaining = s.remaining;
  int counts[kPer];
  int sum = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    counts[k] = static_cast<int>(s.histogram[kDigits - 1 - static_cast<int>(threadIdx.x) * kPer - k]);
    sum += counts[k];
  }
  int at_or_above = 0;
  cub::BlockScan<int, kThreads>(s.scan).InclusiveSum(sum, at_or_above);
  int above = at_or_above - sum;
  if (above < remaining && at_or_above >= remaining) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (above + counts[k] >= remaining) {
        s.prefix |= static_cast<uint32_t>(kDigits - 1 - static_cast<int>(threadIdx.x) * kPer - k) << shift;
        s.remaining = remaining - above;
        s.bin_count = counts[k];
        break;
      }
      above += counts[k];
    }
  }
  __syncthreads();
}

__device__ __forceinline__ void clear_histogram(TopKShared& s) {
  for (int i = static_cast<int>(threadIdx.x); i < kBins; i += kThreads) s.histogram[i] = 0;
}

// Writes to out, in position order, the positions of row[0, context) whose keys are above
// threshold and the first `remaining` of those equal to it.
__device__ __forceinline__ void write_selected(const float* row, int context, uint32_t threshold, int remaining,
                                               TopKShared& s, int32_t* out) {
  int greater_seen = 0, equal_seen = 0;  // in earlier segments
  const int first = static_cast<int>(threadIdx.x) * kPositionsPerThread;
  for (int segment = 0; segment < context; segment += kSegment) {
#pragma unroll
    for (int l = 0; l < kPositionsPerThread; ++l) {
      const int p = l * kThreads + static_cast<int>(threadIdx.x);
      s.staged[p + p / kPositionsPerThread] = segment + p < context ? order_key(__ldg(row + segment + p)) : 0u;
    }
    __syncthreads();
    // This thread's keys: read twice from shared memory (cheaper than holding 16 registers).
    const uint32_t* keys = s.staged + first + static_cast<int>(threadIdx.x);
    int greater = 0, equal = 0;
#pragma unroll
    for (int k = 0; k < kPositionsPerThread; ++k) {
      const bool inside = segment + first + k < context;
      greater += inside && keys[k] > threshold;
      equal += inside && keys[k] == threshold;
    }
    // One scan of both counts: equal in the high 16 bits (a segment holds at most 4096 of each).
    int before = 0, total = 0;
    cub::BlockScan<int, kThreads>(s.scan).ExclusiveSum(equal << 16 | greater, before, total);
    int equal_rank = equal_seen + (before >> 16);
    int index = greater_seen + (before & 0xffff) + min(equal_rank, remaining);
    // Not unrolled: unrolled, the kernel took 80 registers a thread (3 blocks an SM, not 6).
#pragma unroll 1
    for (int k = 0; k < kPositionsPerThread; ++k) {
      if (segment + first + k >= context) break;
      if (keys[k] > threshold || (keys[k] == threshold && equal_rank++ < remaining)) out[index++] = segment + first + k;
    }
    greater_seen += total & 0xffff;
    equal_seen += total >> 16;
    __syncthreads();  // the next segment overwrites staged and reuses the scan's storage
  }
}

// 40 registers a thread (no spills), six 256-thread blocks an SM: left to itself ptxas takes 59
// (four blocks) once the first digit's atomics are per key.
__global__ void __maxnreg__(40) prefill_top_k_kernel(const float* scores, int64_t score_stride,
                                                     const int32_t* positions, int top_k, int32_t* selected,
                                                     int max_selected, int32_t* num_selected) {
  chained_grid_prologue();
  __shared__ TopKShared s;
  const int t = static_cast<int>(blockIdx.x);
  const int context = positions[t] + 1;
  int32_t* out = selected + static_cast<int64_t>(t) * max_selected;
  if (context <= top_k) {
    for (int j = static_cast<int>(threadIdx.x); j < context; j += kThreads) out[j] = j;
    if (threadIdx.x == 0) num_selected[t] = context;
    return;
  }
  const float* row = scores + static_cast<int64_t>(t) * score_stride;
  clear_histogram(s);
  if (threadIdx.x == 0) s.prefix = 0, s.remaining = top_k, s.num_candidates = 0;
  __syncthreads();
  // Digit 1: bits 21..31 of every key.
  count_row_digits<false>(row, context, 0u, 0u, 21, 0x7ffu, s.histogram);
  __syncthreads();
  pick_digit<2048>(s, 21);
  uint32_t prefix = s.prefix, mask = 0xffe00000u;
  const bool compacted = s.bin_count <= kStagedWords;
  clear_histogram(s);
  if (compacted) compact_row(row, context, prefix, mask, s.staged, &s.num_candidates);
  __syncthreads();
  // Digit 2: bits 10..20 of the keys in digit 1's bin.
  const int num_candidates = s.num_candidates;
  if (compacted) count_candidate_digits(s.staged, num_candidates, prefix, mask, 10, 0x7ffu, s.histogram);
  else count_row_digits<true>(row, context, prefix, mask, 10, 0x7ffu, s.histogram);
  __syncthreads();
  pick_digit<2048>(s, 10);
  prefix = s.prefix, mask = 0xfffffc00u;
  clear_histogram(s);
  __syncthreads();
  // Digit 3: bits 0..9.
  if (compacted) count_candidate_digits(s.staged, num_candidates, prefix, mask, 0, 0x3ffu, s.histogram);
  else count_row_digits<true>(row, context, prefix, mask, 0, 0x3ffu, s.histogram);
  __syncthreads();
  pick_digit<1024>(s, 0);
  write_selected(row, context, s.prefix, s.remaining, s, out);
  if (threadIdx.x == 0) num_selected[t] = top_k;
}

}  // namespace

void select_top_k_prefill(const float* scores, int64_t score_stride, const int32_t* positions, int64_t n, int top_k,
                          int32_t* selected, int max_selected, int32_t* num_selected, cudaStream_t stream) {
  if (n == 0) return;
  launch_chained("select_top_k launch (prefill)", prefill_top_k_kernel, static_cast<unsigned>(n), kThreads, 0,
                 stream, scores, score_stride, positions, top_k, selected, max_selected, num_selected);
}

}  // namespace glms::ops::cuda
