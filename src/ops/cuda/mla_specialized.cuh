// Pieces shared by the warp-specialised sparse MLA kernels for GLM-5's shapes (64 heads, latent
// 512, rope 64): mla_wgmma_specialized.cu (two stages of 64 rows, each consumer scoring 32 rows of
// every step), mla_wgmma_paired.cu (the same stages as one iteration, each consumer scoring a
// whole stage) and mla_wgmma_ring.cu (a ring of four stages of 32 rows, the consumers scoring
// alternate steps). In each a producer warpgroup gathers each token's selected latent rows into
// shared memory and two consumer warpgroups multiply: a consumer scores 32 (paired: 64) rows at a
// time against all 64 heads (S = Q K^T over the 576 columns) and keeps the output for half the latent
// columns (consumer 0 columns 0..255, consumer 1 256..511: 64 x 256 fp32 in registers), adding
// P V over every row: the rows it scored with P from registers, the others with P from shared
// memory.
//
// Shared memory holds 128-byte swizzled lines as wgmma.cuh describes; a column block is 64
// columns, one line per head or row: the queries [9 column blocks][64 heads], a stage [9 column
// blocks][its rows].
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mla.h"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda::sparse_mla {

using wgmma::copy_async_16;
using wgmma::descriptor;
using wgmma::swizzled;

constexpr int kHeads = 64, kLatent = 512, kRope = 64, kRow = kLatent + kRope;
constexpr int kConsumerRows = 32, kColumnBlocks = kRow / 64, kLeftBlocks = 4;
constexpr int kThreads = 384;  // consumers: warpgroups 0 and 1; producer: warpgroup 2
constexpr int kLineBytes = wgmma::kLineBytes;
constexpr int kQueryBlockBytes = kHeads * kLineBytes;         // one column block of the queries: 8192
constexpr int kQueryBytes = kColumnBlocks * kQueryBlockBytes;  // 73728
constexpr int kOutLineBytes = kLatent * 2 + 16;  // a head's bf16 output staged in shared memory
static_assert(kHeads * kOutLineBytes <= kQueryBytes, "the staged output fits the queries' region");
constexpr int kConsumerRegisters = 232, kProducerRegisters = 40;
constexpr uint32_t kPollNanoseconds = 64;  // the producer's longest suspension while it polls a stage
// setmaxnreg moves registers within the block's launch allocation (what ptxas gives kThreads
// threads at one block an SM: 168 a thread), so a consumer would wait forever in grow_registers
// unless the producer released at least what the consumers take.
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
static_assert(2 * 128 * kConsumerRegisters + 128 * kProducerRegisters <= kThreads * kLaunchRegisters,
              "the block's registers");
constexpr int kConsumerThreads = 256;
constexpr int kMaxClusterSplits = kMlaMaxClusterSplits;  // a token's blocks in one cluster
// The consumers' named barrier of the epilogue (each kernel numbers its others below it).
constexpr int kEpilogue = 6;

// A block's part of its token's selection: the token, the split's first row of the selection and
// the split's rows.
struct SplitRows {
  int t, begin, count;
};
__device__ __forceinline__ SplitRows split_rows(const MlaAttentionArgs& a, int rows_per_split, int launched_token,
                                                int split) {
  SplitRows r;
  r.t = a.first_token + launched_token;
  r.begin = split * rows_per_split;
  r.count = max(0, min(a.num_selected[r.t] - r.begin, rows_per_split));
  return r;
}

// Thread 0 sets up a block's barriers from `barriers` (8 bytes each): the queries landed (128
// arrivals: the producer's threads), then `count` ready (128) and `count` free (free_count),
// then, where queries_free_count > 0, the queries read (that many arrivals); then every thread
// meets. Returns the thread's warpgroup, broadcast from lane 0 so that the compiler knows each
// warp takes one side of the branches on it (wgmma on a path it thinks divergent are serialised).
__device__ __forceinline__ int set_up_barriers(uint32_t barriers, int count, int free_count,
                                               int queries_free_count = 0) {
  if (threadIdx.x == 0) {
    pipeline::barrier_init(barriers, 128);
    for (int i = 0; i < count; ++i) {
      pipeline::barrier_init(barriers + 8 * (1 + i), 128);
      pipeline::barrier_init(barriers + 8 * (1 + count + i), free_count);
    }
    if (queries_free_count > 0) pipeline::barrier_init(barriers + 8 * (1 + 2 * count), queries_free_count);
    pipeline::barrier_init_fence();
  }
  __syncthreads();
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

// The producer of steps of kStepRows rows: thread t copies 16-byte chunk t % 8 of each 128-byte
// line of rows t / 8 + 16 i (i < kStepRows / 16), so that eight threads read one line of a row
// and each row's lines are one source. A stage is [9 column blocks][kStepRows rows].
template <int kStepRows>
struct Producer {
  static constexpr int kRows = kStepRows / 16;                // a thread's rows of a step
  static constexpr int kBlockBytes = kStepRows * kLineBytes;  // one column block of a stage
  const MlaAttentionArgs& a;
  const int32_t* chosen;  // this token's selected positions
  const int32_t* blocks;  // its sequence's block table
  int count;              // its selected rows
  int chunk, row0;

  // This thread's rows of a step (row0 + 16 i) as their selected positions (-1 past the
  // selection), then as cache slots through the block table (-1 where the position is). Two
  // dependent loads: the producer issues each a step before its result is used (see the kernels).
  __device__ void load_positions(int step, int32_t (&positions)[kRows]) const {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int j = step * kStepRows + row0 + 16 * i;
      positions[i] = j < count ? chosen[j] : -1;
    }
  }
  __device__ void slots_of(const int32_t (&positions)[kRows], int32_t (&slots)[kRows]) const {
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      slots[i] = positions[i] < 0 ? -1
                                  : blocks[positions[i] / a.block_size] * a.block_size + positions[i] % a.block_size;
  }
  // Token t's queries (heads past H: zeros), this thread's chunk of heads row0 + 16 i.
  __device__ void copy_queries(uint32_t queries, int t) const {
    const uint16_t* token_queries = a.queries + static_cast<int64_t>(t) * a.num_heads * kRow;
#pragma unroll
    for (int i = 0; i < kHeads / 16; ++i) {
      const int head = row0 + 16 * i;
      const uint16_t* src = token_queries + (head < a.num_heads ? head * kRow : 0) + chunk * 8;
      const uint32_t dst = queries + swizzled(head, chunk);
      const int bytes = head < a.num_heads ? 16 : 0;
      for (int b = 0; b < kColumnBlocks; ++b) copy_async_16(dst + b * kQueryBlockBytes, src + b * 64, bytes);
    }
  }
  // Column blocks [first, last) of this thread's rows of a step into `stage`.
  __device__ void copy(uint32_t stage, const int32_t (&slots)[kRows], int first, int last) const {
    const uint16_t* cache = static_cast<const uint16_t*>(a.cache);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int row = row0 + 16 * i;
      const uint16_t* src = cache + (slots[i] >= 0 ? static_cast<int64_t>(slots[i]) * kRow : 0) + chunk * 8;
      const uint32_t dst = stage + swizzled(row, chunk);
      const int bytes = slots[i] >= 0 ? 16 : 0;
      for (int b = first; b < last; ++b) wgmma::copy_async_16_l2_256(dst + b * kBlockBytes, src + b * 64, bytes);
    }
  }
};

// The consumers' per-thread view: warp w of the warpgroup, lane (g, tq); accumulator rows
// (heads) 16 w + g and 16 w + g + 8.
struct ConsumerLane {
  int warp, g, tq;
  __device__ int head(int h) const { return 16 * warp + g + 8 * h; }
};

// The two-stage kernels' shared memory (mla_wgmma_specialized.cu, mla_wgmma_paired.cu; the ring
// lays out its own), from its first 1024-byte boundary:
//   queries [9 column blocks][64 heads]                      73728 B
//   stages  [2][9 column blocks][64 rows]                   147456 B
//   probs   [64 heads] lines of consumer 1's P                8192 B
//   barriers (kBarriers of 8 bytes), the row maxima [64], the row sums [2][64]
// Barriers: queries landed; [stage][half] ready (the producer's copies landed) and free (the
// half's last reader is done); the persistent kernels' queries read (every consumer thread's last
// S of a token done). A stage's left half is column blocks 0..3 (latent 0..255), its right half
// blocks 4..8 (latent 256..511 and the rope).
namespace two_stage {
constexpr int kStepRows = 64;
constexpr int kBlockBytes = kStepRows * kLineBytes;       // one column block of a stage: 8192
constexpr int kStageBytes = kColumnBlocks * kBlockBytes;  // 73728
constexpr int kProbBytes = kHeads * kLineBytes;           // 8192
enum Barrier { kQueriesReady, kReady, kFree = kReady + 4, kQueriesFree = kFree + 4, kBarriers };
constexpr int kSharedBytes = 1024 + kQueryBytes + 2 * kStageBytes + kProbBytes + 8 * kBarriers +
                             static_cast<int>(sizeof(float)) * 3 * kHeads;  // 1024: alignment
static_assert(kSharedBytes <= 232448, "one block an SM");
__device__ __forceinline__ int half_index(int stage, int half) { return 2 * stage + half; }

struct Block {
  uint8_t* generic;                            // the queries' first byte
  uint32_t queries, stages, probs1, barriers;  // shared-window addresses
  float* row_max;                              // [64]
  float* row_sum;                              // [2][64]
  int warpgroup;
  __device__ uint32_t barrier(int i) const { return barriers + 8 * i; }
  __device__ uint32_t stage(int s) const { return stages + s * kStageBytes; }
  __device__ uint8_t* at(uint32_t address) const { return generic + (address - queries); }
};
// The layout of shared_raw, its barriers set up (queries_free_count: kQueriesFree's arrivals, 0
// where the kernel does not use it).
__device__ __forceinline__ Block block_at(uint8_t* shared_raw, int queries_free_count) {
  const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
  Block b;
  b.generic = aligned.generic;
  b.queries = aligned.address;
  b.stages = b.queries + kQueryBytes;
  b.probs1 = b.stages + 2 * kStageBytes;
  b.barriers = b.probs1 + kProbBytes;
  b.row_max = reinterpret_cast<float*>(b.generic + (b.barriers - b.queries) + 8 * kBarriers);
  b.row_sum = b.row_max + kHeads;
  static_assert(kQueriesReady == 0 && kReady == 1 && kFree == kReady + 4 && kQueriesFree == kFree + 4,
                "set_up_barriers' order");
  b.warpgroup = set_up_barriers(b.barriers, 4, 128, queries_free_count);
  return b;
}
}  // namespace two_stage

// A consumer's S [64 heads, its 32 rows of a step] in wgmma's accumulator layout, and its P as the
// A operand of two k16 steps. The helpers below take S of any multiple of 16 rows (2 N of them
// for float[N]: columns 8 n + 2 tq (+1) of heads g, g + 8 at s[4 n + 2 h (+1)]).
using Scores = float[kConsumerRows / 2];
using Probs = uint32_t[kConsumerRows / 16][4];

// Rows at or past `valid` (none where valid <= 0) get -inf; each head's maximum over the rows.
template <int N>
__device__ __forceinline__ void mask_and_max(float (&s)[N], int valid, const ConsumerLane& lane,
                                             float (&rows_max)[2]) {
  rows_max[0] = rows_max[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < N / 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (8 * n + 2 * lane.tq + (e & 1) >= valid) s[4 * n + e] = -INFINITY;
      rows_max[e / 2] = fmaxf(rows_max[e / 2], s[4 * n + e]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rows_max[h] = fmaxf(rows_max[h], __shfl_xor_sync(0xffffffffu, rows_max[h], 1));
    rows_max[h] = fmaxf(rows_max[h], __shfl_xor_sync(0xffffffffu, rows_max[h], 2));
  }
}

// s becomes exp(s - max) in fp32; p the same rounded to bf16 as the A operand of N / 8 k16 steps
// (rs_m64n8k16's layout: S columns 8 n + 2 tq are k 2 tq of step n / 2, + 8 for odd n);
// the rounded values are added to `sum`.
template <int N>
__device__ __forceinline__ void exponentiate(float (&s)[N], const float (&max)[2], uint32_t (&p)[N / 8][4],
                                             float (&sum)[2]) {
#pragma unroll
  for (int n = 0; n < N / 4; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s[4 * n + 2 * h] = __expf(s[4 * n + 2 * h] - max[h]);
      s[4 * n + 2 * h + 1] = __expf(s[4 * n + 2 * h + 1] - max[h]);
      const uint32_t pair = pack_bf16_pair(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]);
      p[n / 2][2 * (n % 2) + h] = pair;
      sum[h] += __uint_as_float(pair << 16) + __uint_as_float(pair & 0xffff0000u);
    }
}

// P (fp32, times factor[h]) as bf16 values at the start of each head's 128-byte swizzled line
// (32 rows: its first half; 64: all of it), for the other consumer's P V.
template <int N>
__device__ __forceinline__ void store_probs(uint8_t* probs, const float (&s)[N], const float (&factor)[2],
                                            const ConsumerLane& lane) {
#pragma unroll
  for (int n = 0; n < N / 4; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int column = 8 * n + 2 * lane.tq;
      *reinterpret_cast<uint32_t*>(probs + swizzled(lane.head(h), column / 8) + (column % 8) * 2) =
          pack_bf16_pair(s[4 * n + 2 * h] * factor[h], s[4 * n + 2 * h + 1] * factor[h]);
    }
}

// S[64 heads, a consumer's 32 rows from `rows` (a stage's line of the first of them; a stage of
// kStepRows rows)] over the 36 k16 steps of the row.
template <int kStepRows>
__device__ __forceinline__ void score_rows(Scores& s, uint32_t queries, uint32_t rows) {
#pragma unroll
  for (int k = 0; k < kRow / 16; ++k) {
    const uint32_t query_column = (k / 4) * kQueryBlockBytes + (k % 4) * 32;
    const uint32_t row_column = (k / 4) * kStepRows * kLineBytes + (k % 4) * 32;
    wgmma::m64n32k16(s, descriptor(queries + query_column, 16, 1024), descriptor(rows + row_column, 16, 1024), k > 0);
  }
}

__device__ __forceinline__ void scale_rows(float (&o)[128], const float (&factor)[2]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j] *= factor[0];
    o[4 * j + 1] *= factor[0];
    o[4 * j + 2] *= factor[1];
    o[4 * j + 3] *= factor[1];
  }
}

// V of a stage for consumer c's 256 columns, MN-major (a line holds 64 latent columns of one
// row), rows 16 k .. 16 k + 15 of a stage of kStepRows rows.
template <int kStepRows>
__device__ __forceinline__ uint64_t value_descriptor(uint32_t stage, int consumer, int k) {
  constexpr int kBlockBytes = kStepRows * kLineBytes;
  return descriptor(stage + consumer * kLeftBlocks * kBlockBytes + k * 16 * kLineBytes, kBlockBytes, 1024);
}

// O += P V for consumer c's columns over 32 rows of V (k16 steps first_k .. of a stage of
// kStepRows rows), each a commit group: the rows it scored with P from registers, or the other
// consumer's with P from `other_probs`, a head's 32 values a line: the first 32 of each 128-byte
// swizzled line (kProbLineBytes 128) or 64-byte swizzled lines (64).
template <int kStepRows>
__device__ __forceinline__ void issue_own_values(float (&o)[128], const Probs& p, uint32_t stage, int first_k,
                                                 int consumer) {
  wgmma::pin(o);
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < kConsumerRows / 16; ++k)
    wgmma::rs_m64n256k16_mn(o, p[k], value_descriptor<kStepRows>(stage, consumer, first_k + k));
  wgmma::commit();
}
template <int kStepRows, int kProbLineBytes>
__device__ __forceinline__ void issue_other_values(float (&o)[128], uint32_t other_probs, uint32_t stage, int first_k,
                                                   int consumer) {
  static_assert(kProbLineBytes == 128 || kProbLineBytes == 64, "128- or 64-byte swizzled lines of P");
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < kConsumerRows / 16; ++k) {
    const uint64_t probs = kProbLineBytes == 128 ? descriptor(other_probs + k * 32, 16, 1024)
                                                 : wgmma::descriptor_64B(other_probs + k * 32, 16, 512);
    wgmma::m64n256k16<1>(o, probs, value_descriptor<kStepRows>(stage, consumer, first_k + k));
  }
  wgmma::commit();
}

// Where a split's block leaves its sums for mla_merge_splits: partials[split_row][H][512] fp32
// relative to the heads' maxima, then stats[split_row][H] (maximum, sum of exponentials).
struct SplitOutput {
  float* partials;
  int64_t split_row;  // launched token x splits + split
  int64_t rows;       // launched tokens x splits
};

// A consumer's end of a split: its heads' unnormalised sums (its 256 columns) and, from consumer
// 0, the heads' statistics. total: each head's sum over both consumers' rows.
__device__ __forceinline__ void store_partials(const SplitOutput& o, int H, const float (&out)[128],
                                               const float (&run_max)[2], const float (&total)[2], int consumer,
                                               const ConsumerLane& lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = lane.head(h);
    if (head >= H) continue;
    float* dst = o.partials + (o.split_row * H + head) * kLatent + 256 * consumer + 2 * lane.tq;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(out[4 * j + 2 * h], out[4 * j + 2 * h + 1]);
    if (consumer == 0 && lane.tq == 0) {
      float* stats = o.partials + o.rows * H * kLatent + (o.split_row * H + head) * 2;
      stats[0] = run_max[h];
      stats[1] = total[h];
    }
  }
}

// Each head's sum of exponentials over this consumer's rows (its four lanes' summed) into
// row_sum[consumer][64] in shared memory; both consumers meet once every sum is posted.
__device__ __forceinline__ void post_head_sums(float (&run_sum)[2], float* row_sum, int consumer,
                                               const ConsumerLane& lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 1);
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 2);
    if (lane.tq == 0) row_sum[consumer * kHeads + lane.head(h)] = run_sum[h];
  }
  pipeline::named_sync(kEpilogue, kConsumerThreads);
}

// A consumer's end of a token: each head's sum over both consumers' rows, then with one split its
// half of the normalised output staged in the queries' region (every wgmma reading it finished
// before the steps' last barriers), and the token's [H, 512] bf16 output written from there
// (contiguous: whole 16-byte chunks, consecutive threads consecutive chunks); with several, the
// split's partials. row_sum: [2][64] in shared memory.
__device__ __forceinline__ void store_output(const MlaAttentionArgs& a, int t, const float (&out)[128],
                                             const float (&run_max)[2], float (&run_sum)[2], float* row_sum,
                                             uint8_t* generic, int consumer, const ConsumerLane& lane,
                                             const SplitOutput& split) {
  post_head_sums(run_sum, row_sum, consumer, lane);
  if (split.partials) {
    const float total[2] = {row_sum[lane.head(0)] + row_sum[kHeads + lane.head(0)],
                            row_sum[lane.head(1)] + row_sum[kHeads + lane.head(1)]};
    store_partials(split, a.num_heads, out, run_max, total, consumer, lane);
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = lane.head(h);
    const float total = row_sum[head] + row_sum[kHeads + head];
    const float norm = total > 0.0f ? 1.0f / total : 0.0f;
    uint8_t* line = generic + head * kOutLineBytes + 2 * (256 * consumer + 2 * lane.tq);
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<uint32_t*>(line + 16 * j) =
          pack_bf16_pair(out[4 * j + 2 * h] * norm, out[4 * j + 2 * h + 1] * norm);
  }
  pipeline::named_sync(kEpilogue, kConsumerThreads);
  constexpr int kChunksPerHead = kLatent / 8;
  const int H = a.num_heads;
  uint4* token_out = reinterpret_cast<uint4*>(a.out + static_cast<int64_t>(t) * H * kLatent);
  for (int c = threadIdx.x; c < H * kChunksPerHead; c += kConsumerThreads)
    token_out[c] =
        *reinterpret_cast<const uint4*>(generic + c / kChunksPerHead * kOutLineBytes + c % kChunksPerHead * 16);
}

// store_output's end of a token with one split, written from registers (the queries' region may
// already hold the next token's): each head's sum over both consumers' rows, then this
// consumer's half of the normalised output, bf16 values rounded as store_output rounds them. The
// lanes of a quad trade pairs (k = 2p, 2p + 1) so that each writes 8 bytes and a quad 32
// contiguous bytes of a head's line: lane tq keeps columns 4 (tq / 2) .. + 3 of k = 2p + tq % 2.
__device__ __forceinline__ void store_output_from_registers(const MlaAttentionArgs& a, int t, const float (&out)[128],
                                                            float (&run_sum)[2], float* row_sum, int consumer,
                                                            const ConsumerLane& lane) {
  post_head_sums(run_sum, row_sum, consumer, lane);
  const bool odd = lane.tq & 1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = lane.head(h);
    const float total = row_sum[head] + row_sum[kHeads + head];
    const float norm = total > 0.0f ? 1.0f / total : 0.0f;
    uint16_t* line = a.out + (static_cast<int64_t>(t) * a.num_heads + head) * kLatent + 256 * consumer +
                     4 * (lane.tq >> 1);
#pragma unroll
    for (int p = 0; p < 16; ++p) {
      const uint32_t even_k = pack_bf16_pair(out[8 * p + 2 * h] * norm, out[8 * p + 2 * h + 1] * norm);
      const uint32_t odd_k = pack_bf16_pair(out[8 * p + 4 + 2 * h] * norm, out[8 * p + 4 + 2 * h + 1] * norm);
      const uint32_t other = __shfl_xor_sync(0xffffffffu, odd ? even_k : odd_k, 1);
      if (head < a.num_heads)
        *reinterpret_cast<uint2*>(line + 8 * (2 * p + (odd ? 1 : 0))) =
            odd ? make_uint2(other, odd_k) : make_uint2(even_k, other);
    }
  }
}

// The consumers' exchange of each head's maximum, once both have scored their rows (rows_max):
// consumer 0 moves its own maximum to include its rows (finite: its first row is selected) and
// posts it in row_max [64]; consumer 1, once that is posted, joins it with its rows' and posts the
// joint maximum, its running maximum from then on; consumer 0 then takes the joint one. Each
// rescales its running sum to the maximum it moved to and returns that factor for its output.
__device__ __forceinline__ void post_own_maxima(const float (&rows_max)[2], const float (&run_max)[2],
                                                float (&own_max)[2], float (&factor)[2], float (&run_sum)[2],
                                                float* row_max, const ConsumerLane& lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    own_max[h] = fmaxf(run_max[h], rows_max[h]);
    factor[h] = run_max[h] == -INFINITY ? 0.0f : __expf(run_max[h] - own_max[h]);
    run_sum[h] *= factor[h];
  }
  __syncwarp();
  if (lane.tq == 0)
    for (int h = 0; h < 2; ++h) row_max[lane.head(h)] = own_max[h];
}
__device__ __forceinline__ void post_joint_maxima(const float (&rows_max)[2], float (&run_max)[2],
                                                  float (&joint)[2], float (&factor)[2], float (&run_sum)[2],
                                                  float* row_max, const ConsumerLane& lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    joint[h] = fmaxf(row_max[lane.head(h)], rows_max[h]);
    factor[h] = run_max[h] == -INFINITY ? 0.0f : __expf(run_max[h] - joint[h]);
    run_max[h] = joint[h];
    run_sum[h] *= factor[h];
  }
  __syncwarp();
  if (lane.tq == 0)
    for (int h = 0; h < 2; ++h) row_max[lane.head(h)] = joint[h];
}
__device__ __forceinline__ void take_joint_maxima(const float (&own_max)[2], float (&run_max)[2], float (&factor)[2],
                                                  float (&run_sum)[2], const float* row_max,
                                                  const ConsumerLane& lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float joint = row_max[lane.head(h)];
    factor[h] = __expf(own_max[h] - joint);
    run_max[h] = joint;
    run_sum[h] *= factor[h];
  }
}

// A consumer's sums before a token's first step (and a split's without rows).
__device__ __forceinline__ void clear_sums(float (&out)[128], float (&run_max)[2], float (&run_sum)[2]) {
#pragma unroll
  for (int k = 0; k < 128; ++k) out[k] = 0.0f;
  run_max[0] = run_max[1] = -INFINITY;
  run_sum[0] = run_sum[1] = 0.0f;
}

// A persistent kernel's token without rows: its [H, 512] output as zeros, as store_output writes
// them (consumer c's thread `index` the c-th of each pair of 16-byte chunks).
__device__ __forceinline__ void write_zero_output(const MlaAttentionArgs& a, int t, int consumer, int index) {
  uint4* token_out = reinterpret_cast<uint4*>(a.out + static_cast<int64_t>(t) * a.num_heads * kLatent);
  for (int c = index; c < a.num_heads * kLatent / 16; c += 128) token_out[2 * c + consumer] = make_uint4(0, 0, 0, 0);
}

// Where merge_cluster_splits works, in a block's shared memory: `generic` is the queries' first
// byte (the queries' address as a pointer); sums: [64 heads][512] fp32 (in the stages, which
// every wgmma has read once the epilogue begins); stats: [64] float2; row_sum: [2][64].
struct MergeMemory {
  uint8_t* generic;
  uint32_t queries, sums, stats;
  float* row_sum;
};

// A consumer's end of a token's split when the token's splits are one cluster (grid (split,
// launched token)): after the epilogue barrier, the block's unnormalised [64 heads, 512] fp32
// sums and each head's (maximum, sum of exponentials) go into shared memory (m); then block r of
// the cluster combines heads [64 r / splits, 64 (r + 1) / splits) over every block's, in split
// order (as mla_merge_splits does, without the partials' trip through global memory or a second
// launch), and writes them as bf16. The producer warpgroup meets both cluster barriers too.
__device__ __forceinline__ void merge_cluster_splits(const MlaAttentionArgs& a, int t, const float (&out)[128],
                                                     const float (&run_max)[2], float (&run_sum)[2],
                                                     const MergeMemory& m, int consumer, const ConsumerLane& lane) {
  float* const row_sum = m.row_sum;
  post_head_sums(run_sum, row_sum, consumer, lane);
  const uint32_t sums = m.sums;
  float* const sums_generic = reinterpret_cast<float*>(m.generic + (sums - m.queries));
  float2* const stats = reinterpret_cast<float2*>(m.generic + (m.stats - m.queries));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* line = sums_generic + lane.head(h) * kLatent + 256 * consumer + 2 * lane.tq;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<float2*>(line + 8 * j) = make_float2(out[4 * j + 2 * h], out[4 * j + 2 * h + 1]);
    if (consumer == 0 && lane.tq == 0)
      stats[lane.head(h)] = make_float2(run_max[h], row_sum[lane.head(h)] + row_sum[kHeads + lane.head(h)]);
  }
  pipeline::cluster_sync();

  const int splits = static_cast<int>(gridDim.x), rank = static_cast<int>(blockIdx.x);
  const int first = rank * kHeads / splits, heads = (rank + 1) * kHeads / splits - first;
  // Each of this block's heads' split weights (0 for a split without rows) and 1 / their sum.
  float* const weight = reinterpret_cast<float*>(m.generic);  // [heads][splits], the queries' place
  float* const inverse_total = weight + kHeads * kMaxClusterSplits;  // [heads]
  const int thread = static_cast<int>(threadIdx.x);
  if (thread < heads) {
    const uint32_t stat = m.stats + static_cast<uint32_t>(sizeof(float2)) * (first + thread);
    float top = -INFINITY;
    for (int q = 0; q < splits; ++q) {
      const float2 v = pipeline::load_cluster_float2(pipeline::cluster_address(stat, q));
      if (v.y > 0.0f) top = fmaxf(top, v.x);
    }
    float total = 0.0f;
    for (int q = 0; q < splits; ++q) {
      const float2 v = pipeline::load_cluster_float2(pipeline::cluster_address(stat, q));
      const float w = v.y > 0.0f ? __expf(v.x - top) : 0.0f;
      weight[thread * kMaxClusterSplits + q] = w;
      total += w * v.y;
    }
    inverse_total[thread] = total > 0.0f ? 1.0f / total : 0.0f;
  }
  pipeline::named_sync(kEpilogue, kConsumerThreads);
  constexpr int kQuads = kLatent / 4;
  for (int item = thread; item < heads * kQuads; item += kConsumerThreads) {
    const int local = item / kQuads, head = first + local, column = 4 * (item % kQuads);
    const uint32_t at = sums + static_cast<uint32_t>(sizeof(float)) * (head * kLatent + column);
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int q = 0; q < splits; ++q) {
      const float w = weight[local * kMaxClusterSplits + q];
      const float4 v = pipeline::load_cluster_float4(pipeline::cluster_address(at, q));
      sum.x += w * v.x, sum.y += w * v.y, sum.z += w * v.z, sum.w += w * v.w;
    }
    if (head < a.num_heads) {
      const float norm = inverse_total[local];
      *reinterpret_cast<uint2*>(a.out + (static_cast<int64_t>(t) * a.num_heads + head) * kLatent + column) =
          make_uint2(pack_bf16_pair(sum.x * norm, sum.y * norm), pack_bf16_pair(sum.z * norm, sum.w * norm));
    }
  }
  pipeline::cluster_sync();  // no block leaves while another reads its sums
}

// A warp-specialised kernel's launches: grid (launched token, split), or (split, launched token)
// in clusters of a token's splits, and its copies alone (one split); the shared memory they ask
// for, and the rows of a step (a split's rows are a multiple of them).
// mla_attention_wgmma_specialized and mla_attention_copies_only launch either kernel.
using SpecializedKernel = void (*)(MlaAttentionArgs, int, float*);
struct SpecializedKernels {
  SpecializedKernel unclustered, clustered, copies_only;
  int shared_bytes, step_rows;
};
SpecializedKernels ring_kernels();  // mla_wgmma_ring.cu

}  // namespace glms::ops::cuda::sparse_mla
