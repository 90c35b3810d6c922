// Sparse MLA attention for prefill chunks with bf16 rows, warp-specialised: a producer
// warpgroup gathers each token's selected latent rows into shared memory while two consumer
// warpgroups multiply, for GLM-5's shapes (64 heads, latent 512, rope 64).
//
// Why this shape: mla_wgmma.cu's kernel has all its warps wait together for every copy, the
// softmax and each barrier, so the tensor cores idle through each. Here the rows come in steps
// of 64 into two stages (the next step's copies land while this one is multiplied); consumer c
// scores rows 32 c .. 32 c + 31 of a step against all 64 heads (S = Q K^T, m64n32 over the 576
// columns) and keeps the output for half the latent columns (consumer 0 columns 0..255, consumer
// 1 256..511: 64 x 256 fp32 in registers), adding P V over all 64 rows of the step: its own rows'
// P from registers (the S accumulators become wgmma's A operand), the other consumer's from
// shared memory. The two exchange their running maxima once a step, so both halves of the step's
// P share one maximum; while one runs its softmax, the other's wgmma run.
//
// Decode tokens' selections go in splits over blocks: their sums leave as partials for
// mla_merge_splits or, a token's splits launched as one thread block cluster, are combined by the
// cluster's blocks through distributed shared memory (merge_cluster_splits).
//
// Shared memory (128-byte swizzled lines as wgmma.cuh describes; a column block is 64 columns,
// one line per head or row):
//   queries [9 column blocks][64 heads]                    73728 B
//   stages  [2][9 column blocks][64 rows]                 147456 B  (a stage's rope block holds
//                                                                    consumer 0's P once both scored)
//   probs   [64 heads] lines of consumer 1's P (32 of 64)    8192 B
//   barriers, the row maxima [64], the row sums [2][64]
// A stage's "left" half is column blocks 0..3 (latent 0..255), its "right" half blocks 4..8
// (latent 256..511 and the rope). Both consumers' S read both halves; then only consumer 0 reads
// the left half (its P V) and only consumer 1 the right (its P V, and consumer 0's P in the rope
// block). So each half goes back to the producer when its one reader's P V are done.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla.h"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda {

namespace {

using wgmma::copy_async_16;
using wgmma::descriptor;
using wgmma::swizzled;

constexpr int kHeads = 64, kLatent = 512, kRope = 64, kRow = kLatent + kRope;
constexpr int kStepRows = 64, kConsumerRows = 32, kColumnBlocks = kRow / 64, kLeftBlocks = 4;
constexpr int kThreads = 384;  // consumers: warpgroups 0 and 1; producer: warpgroup 2
constexpr int kLineBytes = wgmma::kLineBytes;
constexpr int kBlockBytes = kStepRows * kLineBytes;               // one column block of a stage: 8192
constexpr int kStageBytes = kColumnBlocks * kBlockBytes;          // 73728
constexpr int kQueryBytes = kColumnBlocks * kHeads * kLineBytes;  // 73728
constexpr int kProbBytes = kHeads * kLineBytes;                   // 8192
constexpr int kOutLineBytes = kLatent * 2 + 16;  // a head's bf16 output staged in shared memory
static_assert(kHeads * kOutLineBytes <= kQueryBytes, "the staged output fits the queries' region");

// Barriers: queries landed; [stage][half] ready (the producer's copies landed) and free (its
// reader's P V are done).
enum Barrier { kQueriesReady, kReady, kFree = kReady + 4, kBarriers = kFree + 4 };
constexpr int kSmallBytes = 8 * kBarriers + sizeof(float) * 3 * kHeads;
constexpr int kSharedBytes = 1024 + kQueryBytes + 2 * kStageBytes + kProbBytes + kSmallBytes;  // 1024: alignment
static_assert(kSharedBytes <= 232448, "one block an SM");
constexpr int kConsumerRegisters = 232, kProducerRegisters = 40;
constexpr uint32_t kPollNanoseconds = 64;  // the producer's longest suspension while it polls a stage
static_assert(2 * 128 * kConsumerRegisters + 128 * kProducerRegisters <= 65536, "the register file");

// Named barriers between the consumers (256 threads): consumer 0's maxima posted, the joint
// maxima posted (by consumer 1), consumer 0's P stored, consumer 1's P stored, consumer 1's P
// read (its buffer free again), the epilogue.
enum Named { kMaxima0 = 1, kMaxima, kProbs0, kProbs1, kProbs1Read, kEpilogue };
constexpr int kConsumerThreads = 256;
constexpr int kMaxClusterSplits = kMlaMaxClusterSplits;  // a token's blocks in one cluster

__device__ __forceinline__ int half_index(int stage, int half) { return 2 * stage + half; }

// The producer: thread t copies 16-byte chunk t % 8 of each 128-byte line of rows t / 8 + 16 i
// (i = 0..3), so that eight threads read one line of a row and each row's lines are one source.
struct Producer {
  const MlaAttentionArgs& a;
  const int32_t* chosen;  // this token's selected positions
  const int32_t* blocks;  // its sequence's block table
  int count;              // its selected rows
  int chunk, row0;

  // This thread's rows of a step (row0 + 16 i) as their selected positions (-1 past the
  // selection), then as cache slots through the block table (-1 where the position is). Two
  // dependent loads: the producer issues each a step before its result is used (see the kernel).
  __device__ void load_positions(int step, int32_t (&positions)[4]) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = step * kStepRows + row0 + 16 * i;
      positions[i] = j < count ? chosen[j] : -1;
    }
  }
  __device__ void slots_of(const int32_t (&positions)[4], int32_t (&slots)[4]) const {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      slots[i] = positions[i] < 0 ? -1
                                  : blocks[positions[i] / a.block_size] * a.block_size + positions[i] % a.block_size;
  }
  // Token t's queries (heads past H: zeros), this thread's chunk of heads row0 + 16 i.
  __device__ void copy_queries(uint32_t queries, int t) const {
    const uint16_t* token_queries = a.queries + static_cast<int64_t>(t) * a.num_heads * kRow;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int head = row0 + 16 * i;
      const uint16_t* src = token_queries + (head < a.num_heads ? head * kRow : 0) + chunk * 8;
      const uint32_t dst = queries + swizzled(head, chunk);
      const int bytes = head < a.num_heads ? 16 : 0;
      for (int b = 0; b < kColumnBlocks; ++b) copy_async_16(dst + b * kBlockBytes, src + b * 64, bytes);
    }
  }
  // Column blocks [first, last) of this thread's rows of a step into `stage`.
  __device__ void copy(uint32_t stage, const int32_t (&slots)[4], int first, int last) const {
    const uint16_t* cache = static_cast<const uint16_t*>(a.cache);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
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

// A consumer's S [64 heads, its 32 rows of a step] in wgmma's accumulator layout, and its P as the
// A operand of two k16 steps.
using Scores = float[kConsumerRows / 2];
using Probs = uint32_t[kConsumerRows / 16][4];

// S[64 heads, a consumer's 32 rows of a step from `rows` (a stage's line of the first of
// them)] over the 36 k16 steps of the row.
__device__ __forceinline__ void score_rows(Scores& s, uint32_t queries, uint32_t rows) {
#pragma unroll
  for (int k = 0; k < kRow / 16; ++k) {
    const uint32_t column = (k / 4) * kBlockBytes + (k % 4) * 32;
    wgmma::m64n32k16(s, descriptor(queries + column, 16, 1024), descriptor(rows + column, 16, 1024), k > 0);
  }
}

// Rows at or past `valid` get -inf; each head's maximum over this consumer's rows.
__device__ __forceinline__ void mask_and_max(Scores& s, int valid, const ConsumerLane& lane, float (&rows_max)[2]) {
  rows_max[0] = rows_max[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < kConsumerRows / 8; ++n)
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

// s becomes exp(s - max) in fp32; p the same rounded to bf16 as the A operand of two k16 steps
// (rs_m64n8k16's layout: S columns 8 n + 2 tq are k 2 tq of step n / 2, + 8 for odd n);
// the rounded values are added to `sum`.
__device__ __forceinline__ void exponentiate(Scores& s, const float (&max)[2], Probs& p, float (&sum)[2]) {
#pragma unroll
  for (int n = 0; n < kConsumerRows / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s[4 * n + 2 * h] = __expf(s[4 * n + 2 * h] - max[h]);
      s[4 * n + 2 * h + 1] = __expf(s[4 * n + 2 * h + 1] - max[h]);
      const uint32_t pair = pack_bf16_pair(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]);
      p[n / 2][2 * (n % 2) + h] = pair;
      sum[h] += __uint_as_float(pair << 16) + __uint_as_float(pair & 0xffff0000u);
    }
}

// P (fp32, times factor[h]) as bf16 lines of a head's 32 rows (the first 32 of each 64-value
// line), for the other consumer's P V.
__device__ __forceinline__ void store_probs(uint8_t* probs, const Scores& s, const float (&factor)[2],
                                            const ConsumerLane& lane) {
#pragma unroll
  for (int n = 0; n < kConsumerRows / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int column = 8 * n + 2 * lane.tq;
      *reinterpret_cast<uint32_t*>(probs + swizzled(lane.head(h), column / 8) + (column % 8) * 2) =
          pack_bf16_pair(s[4 * n + 2 * h] * factor[h], s[4 * n + 2 * h + 1] * factor[h]);
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
// row), rows 16 k .. 16 k + 15.
__device__ __forceinline__ uint64_t value_descriptor(uint32_t stage, int consumer, int k) {
  return descriptor(stage + consumer * kLeftBlocks * kBlockBytes + k * 16 * kLineBytes, kBlockBytes, 1024);
}

// O += P V for consumer c's columns over 32 rows of V: its own rows' P from registers, the
// other consumer's from `other_probs` (32 of each line's 64 values); the rows are k16 steps
// first_k .. of `stage`'s. Two commit groups: the own rows', then the other's.
__device__ __forceinline__ void issue_own_values(float (&o)[128], const Probs& p, uint32_t stage, int first_k,
                                                 int consumer) {
  wgmma::pin(o);
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < kConsumerRows / 16; ++k)
    wgmma::rs_m64n256k16_mn(o, p[k], value_descriptor(stage, consumer, first_k + k));
  wgmma::commit();
}
__device__ __forceinline__ void issue_other_values(float (&o)[128], uint32_t other_probs, uint32_t stage, int first_k,
                                                   int consumer) {
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < kConsumerRows / 16; ++k)
    wgmma::m64n256k16<1>(o, descriptor(other_probs + k * 32, 16, 1024), value_descriptor(stage, consumer, first_k + k));
  wgmma::commit();
}

// A block's token and shared memory as the header lays it out (from the first 1024-byte
// boundary), its barriers set up; warpgroup broadcast from lane 0, so that the compiler knows
// each warp takes one side of the branches on it (wgmma on a path it thinks divergent are
// serialised).
struct TokenBlock {
  uint8_t* generic;                          // the queries' first byte
  uint32_t queries, stages, probs1, barriers;  // shared-window addresses
  float* row_max;                            // [64]
  float* row_sum;                            // [2][64]
  int t, count, warpgroup;                   // the token, its split's selected rows
  int begin;                                 // the split's first row of the token's selection
  __device__ uint32_t barrier(int index) const { return barriers + 8 * index; }
};
__device__ __forceinline__ TokenBlock token_block(uint8_t* shared_raw, const MlaAttentionArgs& a, int rows_per_split,
                                                  int launched_token, int split) {
  const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
  TokenBlock b;
  b.generic = aligned.generic;
  b.queries = aligned.address;
  b.stages = b.queries + kQueryBytes;
  b.probs1 = b.stages + 2 * kStageBytes;
  b.barriers = b.probs1 + kProbBytes;
  b.row_max = reinterpret_cast<float*>(b.generic + (b.barriers - b.queries) + 8 * kBarriers);
  b.row_sum = b.row_max + kHeads;
  b.t = a.first_token + launched_token;
  b.begin = split * rows_per_split;
  b.count = max(0, min(a.num_selected[b.t] - b.begin, rows_per_split));
  if (threadIdx.x == 0) {
    pipeline::barrier_init(b.barrier(kQueriesReady), 128);
    for (int i = 0; i < 4; ++i) {
      pipeline::barrier_init(b.barrier(kReady + i), 128);
      pipeline::barrier_init(b.barrier(kFree + i), 128);
    }
    pipeline::barrier_init_fence();
  }
  __syncthreads();
  b.warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  return b;
}

// What a step's P V read: the step's stage (consumer c's own rows are its k16 steps 2 c, 2 c + 1),
// and where the consumers' P are exchanged (consumer 0's in the stage's rope block, which both
// have finished scoring; consumer 1's in its own buffer).
struct StepValues {
  uint32_t stage, probs0, probs1;
};

// A consumer's step once its S (32 rows, `valid` of them selected) is in s: the heads' maxima
// joined with the other consumer's (consumer 0 posts its own, consumer 1 the joint ones), this
// consumer's P V issued from registers, its P stored for the other, and the other's P V issued
// (committed last, not waited for). out: [heads, its 256 columns] relative to run_max; row_max:
// [64] in shared memory.
__device__ __forceinline__ void softmax_and_values_step(Scores& s, Probs& p, float (&out)[128], float (&run_max)[2],
                                                        float (&run_sum)[2], int valid, int consumer,
                                                        const ConsumerLane& lane, float* row_max, uint8_t* generic,
                                                        uint32_t queries, const StepValues& v) {
  float rows_max[2], factor[2];
  mask_and_max(s, valid, lane, rows_max);
  if (consumer == 0) {
    float own_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      own_max[h] = fmaxf(run_max[h], rows_max[h]);  // finite: the step's first row is selected
      factor[h] = run_max[h] == -INFINITY ? 0.0f : __expf(run_max[h] - own_max[h]);
      run_sum[h] *= factor[h];
    }
    __syncwarp();
    if (lane.tq == 0)
      for (int h = 0; h < 2; ++h) row_max[lane.head(h)] = own_max[h];
    pipeline::named_arrive(kMaxima0, kConsumerThreads);
    scale_rows(out, factor);
    exponentiate(s, own_max, p, run_sum);
    issue_own_values(out, p, v.stage, 0, 0);
    // The joint maxima (consumer 1 posts them once it has scored); this step's P relative to
    // them, for consumer 1.
    pipeline::named_sync(kMaxima, kConsumerThreads);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float joint = row_max[lane.head(h)];
      factor[h] = __expf(own_max[h] - joint);
      run_max[h] = joint;
      run_sum[h] *= factor[h];
    }
    store_probs(generic + (v.probs0 - queries), s, factor, lane);
    wgmma::fence_async_proxy();
    pipeline::named_arrive(kProbs0, kConsumerThreads);
    wgmma::wait<0>();
    wgmma::pin(out);
    scale_rows(out, factor);
    pipeline::named_sync(kProbs1, kConsumerThreads);
    issue_other_values(out, v.probs1, v.stage, 2, 0);
  } else {
    float joint[2];
    pipeline::named_sync(kMaxima0, kConsumerThreads);
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
    pipeline::named_arrive(kMaxima, kConsumerThreads);
    scale_rows(out, factor);
    exponentiate(s, joint, p, run_sum);
    issue_own_values(out, p, v.stage, 2, 1);
    // This step's P for consumer 0, once it has read the last step's.
    const float one[2] = {1.0f, 1.0f};
    pipeline::named_sync(kProbs1Read, kConsumerThreads);
    store_probs(generic + (v.probs1 - queries), s, one, lane);
    wgmma::fence_async_proxy();
    pipeline::named_arrive(kProbs1, kConsumerThreads);
    pipeline::named_sync(kProbs0, kConsumerThreads);
    issue_other_values(out, v.probs0, v.stage, 0, 1);
  }
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

// The producer warpgroup's work for token t's rows [begin, begin + count) (steps > 0): the
// queries, then each step's rows into its stage as the consumers hand the halves back (index:
// the thread's within the warpgroup).
__device__ __forceinline__ void produce_rows(const MlaAttentionArgs& a, int t, int begin, int count, int steps,
                                             int index, uint32_t queries, uint32_t stages, uint32_t barriers) {
  auto barrier = [&](int i) { return barriers + 8 * i; };
  auto stage_at = [&](int step) { return stages + (step & 1) * kStageBytes; };
  const Producer producer{a, a.selected + static_cast<int64_t>(t) * a.max_selected + begin,
                          a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks, count,
                          index % 8, index / 8};
  producer.copy_queries(queries, t);
  pipeline::barrier_arrive_on_copies(barrier(kQueriesReady));
  // The slots of this thread's rows of a step, and the positions of the next step's. Each
  // step's copies are issued, then the next step's slots looked up from positions loaded a
  // step earlier and the positions of the step after loaded: neither load is waited for until
  // the next step (the producer was stalled on the two in a row for about 80% of its time,
  // with the consumers waiting for the copies half of theirs: at 8192 tokens 5.19 -> 4.47 ms a
  // layer on the H200).
  int32_t slots[4], positions[4];
  producer.load_positions(0, positions);
  producer.slots_of(positions, slots);
  producer.load_positions(1, positions);
  for (int step = 0; step < steps; ++step) {
    const int stage = step & 1;
    const uint32_t parity = ((step >> 1) & 1) ^ 1;  // the phase of two steps before
    // Each half as soon as its reader is done with it, the left (needed first) where both are.
    // A poll suspends the thread for a short while rather than spinning: a spinning producer
    // issued 8% of the kernel's instructions on the consumers' schedulers (8192 tokens, 4.48 ->
    // 4.42 ms a layer alone, attention.core 28.3 -> 27.9 ms in the 5-layer prefill step).
    for (unsigned pending = 3; pending != 0;) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if ((pending >> half & 1) == 0 ||
            !pipeline::barrier_try_wait_for(barrier(kFree + half_index(stage, half)), parity, kPollNanoseconds))
          continue;
        producer.copy(stage_at(step), slots, half ? kLeftBlocks : 0, half ? kColumnBlocks : kLeftBlocks);
        pipeline::barrier_arrive_on_copies(barrier(kReady + half_index(stage, half)));
        pending &= ~(1u << half);
      }
    }
    if (step + 1 < steps) {
      producer.slots_of(positions, slots);
      producer.load_positions(step + 2, positions);
    }
  }
}

// A consumer's end of a token's split when the token's splits are one cluster (grid (split,
// launched token)): the block's unnormalised [64 heads, 512] fp32 sums go into its stages (every
// wgmma of either consumer has read them: the epilogue barrier comes first) and each head's
// (maximum, sum of exponentials) into the P buffer; then block r of the cluster combines heads
// [64 r / splits, 64 (r + 1) / splits) over every block's, in split order (as mla_merge_splits
// does, without the partials' trip through global memory or a second launch), and writes them
// as bf16. The producer warpgroup meets both cluster barriers too.
__device__ __forceinline__ void merge_cluster_splits(const MlaAttentionArgs& a, int t, const float (&out)[128],
                                                     const float (&run_max)[2], float (&run_sum)[2],
                                                     const TokenBlock& b, int consumer, const ConsumerLane& lane) {
  float* const row_sum = b.row_max + kHeads;  // [2][64]
  post_head_sums(run_sum, row_sum, consumer, lane);
  const uint32_t sums = b.stages;  // [64 heads][512] fp32
  float* const sums_generic = reinterpret_cast<float*>(b.generic + (sums - b.queries));
  float2* const stats = reinterpret_cast<float2*>(b.generic + (b.probs1 - b.queries));  // [64]
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
  float* const weight = reinterpret_cast<float*>(b.generic);  // [heads][splits], the queries' place
  float* const inverse_total = weight + kHeads * kMaxClusterSplits;  // [heads]
  const int thread = static_cast<int>(threadIdx.x);
  if (thread < heads) {
    const uint32_t stat = b.probs1 + static_cast<uint32_t>(sizeof(float2)) * (first + thread);
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

// Grid (launched token, split); a split covers selected rows [split * rows_per_split, +
// rows_per_split). a.queries: [T, H, 576] bf16, pre-scaled. With one split the block writes
// a.out ([T, H, 512] bf16); otherwise `partials` as mla_merge_splits reads them. kCopiesOnly:
// the consumers hand each stage back as soon as it has landed and write nothing, so that the
// launch takes what the producer's copies alone take (mla_attention_copies_only). kClustered: grid
// (split, launched token) in clusters of a token's splits, merged by merge_cluster_splits.
template <bool kCopiesOnly, bool kClustered>
__global__ void __launch_bounds__(kThreads, 1)
    mla_wgmma_specialized_kernel(MlaAttentionArgs a, int rows_per_split, float* partials) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const int launched_token = kClustered ? blockIdx.y : blockIdx.x, split = kClustered ? blockIdx.x : blockIdx.y;
  const TokenBlock block = token_block(shared_raw, a, rows_per_split, launched_token, split);
  uint8_t* const generic = block.generic;
  const uint32_t queries = block.queries, stages = block.stages, probs1 = block.probs1, barriers = block.barriers;
  float* const row_max = block.row_max;
  auto barrier = [&](int index) { return barriers + 8 * index; };
  auto stage_at = [&](int step) { return stages + (step & 1) * kStageBytes; };
  const int t = block.t, count = block.count;
  const int steps = (count + kStepRows - 1) / kStepRows;
  const int warpgroup = block.warpgroup, index = threadIdx.x % 128;

  if (warpgroup == 2) {
    pipeline::shrink_registers<kProducerRegisters>();
    if constexpr (kClustered) {
      if (steps > 0) produce_rows(a, t, block.begin, count, steps, index, queries, stages, barriers);
      pipeline::cluster_sync();  // the consumers' two cluster barriers of merge_cluster_splits
      pipeline::cluster_sync();
    } else {
      if (steps == 0) return;
      produce_rows(a, t, block.begin, count, steps, index, queries, stages, barriers);
    }
    return;
  }

  pipeline::grow_registers<kConsumerRegisters>();
  const int consumer = warpgroup;
  if constexpr (kCopiesOnly) {
    if (steps > 0) pipeline::barrier_wait(barrier(kQueriesReady), 0);
    for (int step = 0; step < steps; ++step) {
      for (int half = 0; half < 2; ++half)
        pipeline::barrier_wait(barrier(kReady + half_index(step & 1, half)), (step >> 1) & 1);
      pipeline::barrier_arrive(barrier(kFree + half_index(step & 1, consumer)));
    }
    return;
  }
  const ConsumerLane lane{index / 32, index % 32 / 4, index % 4};
  float out[128];  // O[heads, 256 consumer + 8 j + 2 tq (+1)] at out[4 j + ...], relative to run_max
#pragma unroll
  for (int k = 0; k < 128; ++k) out[k] = 0.0f;
  float run_max[2] = {-INFINITY, -INFINITY}, run_sum[2] = {0.0f, 0.0f};
  Scores s;
  Probs p;
  // S of a step: both halves of its stage landed (consumer 0 waits for the left first, the first
  // the producer refills), the copies' writes ordered before the tensor cores' reads.
  auto issue_scores = [&](int step) {
    const int first = consumer;  // consumer 1 waits for the right half first
    pipeline::barrier_wait(barrier(kReady + half_index(step & 1, first)), (step >> 1) & 1);
    pipeline::barrier_wait(barrier(kReady + half_index(step & 1, first ^ 1)), (step >> 1) & 1);
    wgmma::fence_async_proxy();
    wgmma::pin(s);
    wgmma::fence();
    score_rows(s, queries, stage_at(step) + consumer * kConsumerRows * kLineBytes);
    wgmma::commit();
  };
  if (steps > 0) pipeline::barrier_wait(barrier(kQueriesReady), 0);
  // Consumer 1's P buffer starts free: one arrival for each of its `steps` waits, the rest after
  // each step but the last.
  if (consumer == 0 && steps > 0) pipeline::named_arrive(kProbs1Read, kConsumerThreads);

  // A step once its S is in registers: the softmax and both P V issued (the other consumer's
  // committed last, not waited for).
  auto softmax_and_values = [&](int step) {
    const uint32_t stage = stage_at(step);
    const StepValues values{stage, stage + 8 * kBlockBytes, probs1};
    const int valid = count - step * kStepRows - consumer * kConsumerRows;
    softmax_and_values_step(s, p, out, run_max, run_sum, valid, consumer, lane, row_max, generic, queries, values);
  };
  // A step's P V done: consumer 0 has read consumer 1's P and the stage's left half for the last
  // time, consumer 1 the right half (and consumer 0's P in its rope block).
  auto hand_back = [&](int step) {
    if (consumer == 0 && step + 1 < steps) pipeline::named_arrive(kProbs1Read, kConsumerThreads);
    pipeline::barrier_arrive(barrier(kFree + half_index(step & 1, consumer)));
  };
  for (int step = 0; step < steps; ++step) {
    issue_scores(step);
    wgmma::wait<0>();
    wgmma::pin(s);
    softmax_and_values(step);
    wgmma::wait<0>();
    wgmma::pin(out);
    hand_back(step);
  }

  if constexpr (kClustered) {
    merge_cluster_splits(a, t, out, run_max, run_sum, block, consumer, lane);
  } else {
    const int64_t split_rows = int64_t{gridDim.x} * gridDim.y;
    const SplitOutput split{partials, int64_t{blockIdx.x} * gridDim.y + blockIdx.y, split_rows};
    store_output(a, t, out, run_max, run_sum, row_max + kHeads, generic, consumer, lane, split);
  }
}


}  // namespace

void mla_attention_wgmma_specialized(const MlaAttentionArgs& a, cudaStream_t stream, int rows_per_split, int splits,
                                     float* partials) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0) return;
  GLMS_CHECK(mla_attention_wgmma_supported(a.num_heads, a.latent_dim, a.rope_dim) && a.storage == CacheStorage::kBf16,
             "mla_attention_wgmma_specialized: bf16 rows, at most 64 heads, latent 512 and rope 64");
  if (mla_splits_clustered(a, splits)) {
    GLMS_CHECK(rows_per_split > 0 && rows_per_split % kStepRows == 0,
               "mla_attention_wgmma_specialized: clustered splits of whole steps");
    auto* kernel = mla_wgmma_specialized_kernel<false, true>;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
          "cudaFuncSetAttribute(mla_wgmma_specialized_kernel)");
    if (splits > 8)
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
            "cudaFuncSetAttribute(mla_wgmma_specialized_kernel, non-portable clusters)");
    launch_chained_clusters("mla_wgmma_specialized launch", kernel, static_cast<unsigned>(splits),
                            dim3(splits, launch_tokens), kThreads, kSharedBytes, stream, a, rows_per_split, nullptr);
    return;
  }
  auto* kernel = mla_wgmma_specialized_kernel<false, false>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "cudaFuncSetAttribute(mla_wgmma_specialized_kernel)");
  GLMS_CHECK(splits == 1 || (partials && rows_per_split > 0 && rows_per_split % kStepRows == 0),
             "mla_attention_wgmma_specialized: splits need partials and whole steps a split");
  if (splits == 1) rows_per_split = a.max_selected;
  launch_chained("mla_wgmma_specialized launch", kernel, dim3(launch_tokens, splits), kThreads, kSharedBytes, stream, a,
                 rows_per_split, splits > 1 ? partials : nullptr);
}

void mla_attention_copies_only(const MlaAttentionArgs& a, cudaStream_t stream) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0) return;
  GLMS_CHECK(mla_attention_wgmma_supported(a.num_heads, a.latent_dim, a.rope_dim) && a.storage == CacheStorage::kBf16,
             "mla_attention_copies_only: bf16 rows, at most 64 heads, latent 512 and rope 64");
  auto* kernel = mla_wgmma_specialized_kernel<true, false>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "cudaFuncSetAttribute(mla_wgmma_specialized_kernel)");
  launch_chained("mla_attention_copies_only launch", kernel, dim3(launch_tokens, 1), kThreads, kSharedBytes, stream, a,
                 a.max_selected, nullptr);
}

}  // namespace glms::ops::cuda
