// Sparse MLA attention with bf16 rows, warp-specialised, over a ring of four stages of 32 rows
// (MlaAttentionArgs::ring_stages): the same shared memory as mla_wgmma_specialized.cu's two
// stages of 64 rows, cut finer so that a stage handed back has three steps' time to be refilled
// before it is needed again, where a half stage there has one (its consumers waited for the
// copies 43-45% of their cycles with the L2 delivering rows twice as fast as they are used).
//
// The consumers score alternate steps: consumer c scores the steps with step % 2 == c, all 32
// rows against the 64 heads (m64n32 over the 576 columns, as there), so the scores read shared
// memory at the same rate per product. Both add P V over every step for their half of the latent
// columns (mla_specialized.cuh): the scorer's P from registers, the other's from the step's rope
// block, which its scorer no longer reads once it has scored. The running maxima go down one
// chain: the scorer of step j joins its rows' maxima with those after step j - 1 (which it has
// read as the other consumer of step j - 1) and posts them for the other, so both scale their
// sums by the same factors. A consumer issues its next step's S before it waits for the other's
// maxima and P of this one, so that its S run while the other scores and runs its softmax.
//
// Shared memory (1024-byte aligned):
//   queries [9 column blocks][64 heads]                        73728 B
//   stages  [4][9 column blocks][32 rows]                     147456 B  (step j's P in its stage's
//                                                                        rope block, 64-byte lines)
//   barriers, the maxima posted [2][64], the row sums [2][64]
// With clustered splits, the epilogue's [64, 512] fp32 sums and [64] statistics use the stages.
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla.h"
#include "ops/cuda/mla_specialized.cuh"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda {

namespace {

using namespace sparse_mla;

constexpr int kStepRows = 32, kStages = 4;
constexpr int kBlockBytes = kStepRows * kLineBytes;       // one column block of a stage: 4096
constexpr int kStageBytes = kColumnBlocks * kBlockBytes;  // 36864
constexpr int kRopeBlock = kLatent / 64 * kBlockBytes;    // the rope block's offset in a stage
static_assert(kHeads * 64 <= kBlockBytes, "a step's P (64 heads x 32 rows, 64-byte lines) fits its rope block");
static_assert(kHeads * kLatent * 4 + kHeads * 8 <= kStages * kStageBytes, "the clustered epilogue fits the stages");

// Barriers: queries landed; each stage ready (the producer's copies landed: 128 arrivals) and
// free (both consumers' P V over it done: 256 arrivals).
enum Barrier { kQueriesReady, kReady, kFree = kReady + kStages, kBarriers = kFree + kStages };
constexpr int kSmallBytes = 8 * kBarriers + sizeof(float) * 4 * kHeads;
constexpr int kSharedBytes = 1024 + kQueryBytes + kStages * kStageBytes + kSmallBytes;  // 1024: alignment
static_assert(kSharedBytes <= 232448, "one block an SM");

// Named barriers between the consumers (256 threads): consumer c's maxima posted (kMaximaPosted
// + c), consumer c's P stored (kProbsPosted + c); then the epilogue's (kEpilogue). Each is
// arrived at by its poster and synced on by the other; a poster's next arrival follows the
// other's sync on the last (it needs the maxima the other posts after that sync).
enum Named { kMaximaPosted = 1, kProbsPosted = 3 };
static_assert(kProbsPosted + 1 < kEpilogue, "the epilogue's named barrier is its own");

// A block's token and shared memory, its barriers set up.
struct RingBlock {
  uint8_t* generic;                   // the queries' first byte
  uint32_t queries, stages, barriers;  // shared-window addresses
  float* maxima;                      // [2][64]: each head's running maximum consumer c posted last
  float* row_sum;                     // [2][64]
  SplitRows rows;
  int warpgroup;
  __device__ uint32_t barrier(int index) const { return barriers + 8 * index; }
  __device__ uint32_t stage(int step) const { return stages + (step % kStages) * kStageBytes; }
};
__device__ __forceinline__ RingBlock ring_block(uint8_t* shared_raw, const MlaAttentionArgs& a, int rows_per_split,
                                                int launched_token, int split) {
  const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
  RingBlock b;
  b.generic = aligned.generic;
  b.queries = aligned.address;
  b.stages = b.queries + kQueryBytes;
  b.barriers = b.stages + kStages * kStageBytes;
  b.maxima = reinterpret_cast<float*>(b.generic + (b.barriers - b.queries) + 8 * kBarriers);
  b.row_sum = b.maxima + 2 * kHeads;
  b.rows = split_rows(a, rows_per_split, launched_token, split);
  static_assert(kQueriesReady == 0 && kReady == 1 && kFree == kReady + kStages, "set_up_barriers' order");
  b.warpgroup = set_up_barriers(b.barriers, kStages, kConsumerThreads);
  return b;
}

// The producer warpgroup (index: the thread's within it): the queries, then each step's rows into
// its stage once both consumers have handed the stage back, the slots looked up a step ahead as
// mla_wgmma_specialized.cu's producer does.
__device__ __forceinline__ void produce_ring(const MlaAttentionArgs& a, const RingBlock& b, int steps, int index) {
  const SplitRows& r = b.rows;
  const Producer<kStepRows> producer{a, a.selected + static_cast<int64_t>(r.t) * a.max_selected + r.begin,
                                     a.block_tables + static_cast<int64_t>(a.token_sequence[r.t]) * a.max_blocks,
                                     r.count, index % 8, index / 8};
  producer.copy_queries(b.queries, r.t);
  pipeline::barrier_arrive_on_copies(b.barrier(kQueriesReady));
  int32_t slots[Producer<kStepRows>::kRows], positions[Producer<kStepRows>::kRows];
  producer.load_positions(0, positions);
  producer.slots_of(positions, slots);
  producer.load_positions(1, positions);
  for (int step = 0; step < steps; ++step) {
    const uint32_t parity = ((step / kStages) & 1) ^ 1;  // the phase of kStages steps before
    while (!pipeline::barrier_try_wait_for(b.barrier(kFree + step % kStages), parity, kPollNanoseconds)) {
    }
    producer.copy(b.stage(step), slots, 0, kColumnBlocks);
    pipeline::barrier_arrive_on_copies(b.barrier(kReady + step % kStages));
    if (step + 1 < steps) {
      producer.slots_of(positions, slots);
      producer.load_positions(step + 2, positions);
    }
  }
}

// Each head's maximum over a step's rows below `valid` (rows_max), and P = exp(S - max) over
// them rounded to bf16 as wgmma's A operand (rs_m64n8k16's layout: S columns 8 n + 2 tq are k
// 2 tq of step n / 2, + 8 for odd n), zero past them; the rounded values are added to `sum`.
// S is only read: its registers are the next S's accumulators.
__device__ __forceinline__ void masked_max(const Scores& s, int valid, const ConsumerLane& lane, float (&rows_max)[2]) {
  rows_max[0] = rows_max[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < kStepRows / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (8 * n + 2 * lane.tq + (e & 1) < valid) rows_max[e / 2] = fmaxf(rows_max[e / 2], s[4 * n + e]);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rows_max[h] = fmaxf(rows_max[h], __shfl_xor_sync(0xffffffffu, rows_max[h], 1));
    rows_max[h] = fmaxf(rows_max[h], __shfl_xor_sync(0xffffffffu, rows_max[h], 2));
  }
}
__device__ __forceinline__ void masked_probs(const Scores& s, int valid, const float (&max)[2],
                                             const ConsumerLane& lane, Probs& p, float (&sum)[2]) {
#pragma unroll
  for (int n = 0; n < kStepRows / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 8 * n + 2 * lane.tq;
      const float e0 = row < valid ? __expf(s[4 * n + 2 * h] - max[h]) : 0.0f;
      const float e1 = row + 1 < valid ? __expf(s[4 * n + 2 * h + 1] - max[h]) : 0.0f;
      const uint32_t pair = pack_bf16_pair(e0, e1);
      p[n / 2][2 * (n % 2) + h] = pair;
      sum[h] += __uint_as_float(pair << 16) + __uint_as_float(pair & 0xffff0000u);
    }
}

// A step's P (p: bf16 pairs in wgmma's A layout, as masked_probs leaves them) into `probs` as
// 64-byte swizzled lines, a head's 32 rows a line, for the other consumer's P V.
__device__ __forceinline__ void store_probs_64B(uint8_t* probs, const Probs& p, const ConsumerLane& lane) {
#pragma unroll
  for (int n = 0; n < kStepRows / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 8 * n + 2 * lane.tq;
      *reinterpret_cast<uint32_t*>(probs + wgmma::swizzled_64B(lane.head(h), row / 8) + (row % 8) * 2) =
          p[n / 2][2 * (n % 2) + h];
    }
}

// run_max becomes `joined` (each head's maximum after this step); factor: what the sums so far
// are multiplied by (0 while there are none).
__device__ __forceinline__ void move_maxima(float (&run_max)[2], const float (&joined)[2], float (&run_sum)[2],
                                            float (&factor)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    factor[h] = run_max[h] == -INFINITY ? 0.0f : __expf(run_max[h] - joined[h]);
    run_max[h] = joined[h];
    run_sum[h] *= factor[h];
  }
}

// A consumer's pass over a token's `steps` (> 0) steps. out: [heads, its 256 columns] relative
// to run_max; run_sum: each head's sum of the P it computed, relative to run_max.
//
// Commit groups in flight, oldest first: entering a step it scores, its S and the P V of the
// other's step before (wait<1>: the S done, the P V running through the softmax); entering the
// other's step, its own last P V (waited for before the next S is issued).
__device__ __forceinline__ void consume_ring(const RingBlock& b, int steps, int consumer, const ConsumerLane& lane,
                                             float (&out)[128], float (&run_max)[2], float (&run_sum)[2]) {
  Scores s;
  Probs p;
  auto issue_scores = [&](int step) {
    pipeline::barrier_wait(b.barrier(kReady + step % kStages), (step / kStages) & 1);
    wgmma::fence_async_proxy();
    wgmma::pin(s);
    wgmma::fence();
    score_rows<kStepRows>(s, b.queries, b.stage(step));
    wgmma::commit();
  };
  // This consumer's P V over a step's stage are done.
  auto hand_back = [&](int step) { pipeline::barrier_arrive(b.barrier(kFree + step % kStages)); };
  // The step this consumer scores: its S issued a step earlier (or just before, kFirst), the P V
  // of the other's step before still running through the softmax (wait<1> leaves it).
  auto scored_step = [&](int step, auto first) {
    const uint32_t stage = b.stage(step);
    if constexpr (decltype(first)::value) wgmma::wait<0>();
    else wgmma::wait<1>();
    wgmma::pin(s);
    float joined[2], factor[2];
    const int valid = b.rows.count - step * kStepRows;
    masked_max(s, valid, lane, joined);  // finite: the step's first row is selected
#pragma unroll
    for (int h = 0; h < 2; ++h) joined[h] = fmaxf(joined[h], run_max[h]);
    __syncwarp();
    if (lane.tq == 0)
      for (int h = 0; h < 2; ++h) b.maxima[consumer * kHeads + lane.head(h)] = joined[h];
    pipeline::named_arrive(kMaximaPosted + consumer, kConsumerThreads);
    move_maxima(run_max, joined, run_sum, factor);
    masked_probs(s, valid, run_max, lane, p, run_sum);
    store_probs_64B(b.generic + (stage + kRopeBlock - b.queries), p, lane);
    wgmma::fence_async_proxy();
    pipeline::named_arrive(kProbsPosted + consumer, kConsumerThreads);
    wgmma::wait<0>();
    wgmma::pin(out);
    if (step > 0) hand_back(step - 1);
    scale_rows(out, factor);
    issue_own_values<kStepRows>(out, p, stage, 0, consumer);
  };
  // The other consumer's step: this consumer's own last P V waited for (it is short, and ptxas
  // serialises the kernel's wgmma if `out` is read with it still counted in flight), its next S
  // issued where there is one (kNextScores: running through the other's softmax, and not
  // waiting for it), then the other's maxima, this consumer's sums scaled to them, and the
  // other's P V once its P is stored.
  auto other_step = [&](int step, auto next_scores) {
    const uint32_t stage = b.stage(step);
    wgmma::wait<0>();
    wgmma::pin(out);
    if (step > 0) hand_back(step - 1);
    if constexpr (decltype(next_scores)::value) issue_scores(step + 1);
    pipeline::named_sync(kMaximaPosted + (consumer ^ 1), kConsumerThreads);
    float joined[2], factor[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) joined[h] = b.maxima[(consumer ^ 1) * kHeads + lane.head(h)];
    move_maxima(run_max, joined, run_sum, factor);
    scale_rows(out, factor);
    pipeline::named_sync(kProbsPosted + (consumer ^ 1), kConsumerThreads);
    // The step's rows as this consumer's own wait sees them (the scorer waited for them; the
    // phase cannot move on before this consumer hands the stage back), ordered before its wgmma.
    pipeline::barrier_wait(b.barrier(kReady + step % kStages), (step / kStages) & 1);
    wgmma::fence_async_proxy();
    wgmma::pin(out);
    issue_other_values<kStepRows, 64>(out, stage + kRopeBlock, stage, 0, consumer);
  };
  constexpr std::true_type kNextScores, kFirst;
  constexpr std::false_type kLastStep, kLater;
  pipeline::barrier_wait(b.barrier(kQueriesReady), 0);
  // Consumer 0 scores the even steps, consumer 1 the odd. Each call site's wait depth is fixed at
  // compile time and no group is committed empty: with an empty group keeping the count, or the
  // next S issued before the last P V was waited for, ptxas 13.0 serialised every wgmma of the
  // kernel (C7515, C7514).
  int step = 0;
  if (consumer == 0) {
    issue_scores(0);
    scored_step(0, kFirst);
    step = 1;
  }
  for (; step + 1 < steps; step += 2) {
    other_step(step, kNextScores);
    scored_step(step + 1, kLater);
  }
  if (step < steps) other_step(step, kLastStep);
  wgmma::wait<0>();
  wgmma::pin(out);
}

// Grid (launched token, split), or (split, launched token) in clusters of a token's splits
// (kClustered); as mla_wgmma_specialized_kernel's, kCopiesOnly too (the consumers hand each
// stage back as soon as it lands and write nothing: the producer's copies alone).
template <bool kCopiesOnly, bool kClustered>
__global__ void __launch_bounds__(kThreads, 1)
    mla_wgmma_ring_kernel(MlaAttentionArgs a, int rows_per_split, float* partials) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const int launched_token = kClustered ? blockIdx.y : blockIdx.x, split = kClustered ? blockIdx.x : blockIdx.y;
  const RingBlock block = ring_block(shared_raw, a, rows_per_split, launched_token, split);
  const int steps = (block.rows.count + kStepRows - 1) / kStepRows;
  const int index = threadIdx.x % 128;

  if (block.warpgroup == 2) {
    pipeline::shrink_registers<kProducerRegisters>();
    if (steps > 0) produce_ring(a, block, steps, index);
    if constexpr (kClustered) {
      pipeline::cluster_sync();  // the consumers' two cluster barriers of merge_cluster_splits
      pipeline::cluster_sync();
    }
    return;
  }

  pipeline::grow_registers<kConsumerRegisters>();
  const int consumer = block.warpgroup;
  if constexpr (kCopiesOnly) {
    if (steps > 0) pipeline::barrier_wait(block.barrier(kQueriesReady), 0);
    for (int step = 0; step < steps; ++step) {
      pipeline::barrier_wait(block.barrier(kReady + step % kStages), (step / kStages) & 1);
      pipeline::barrier_arrive(block.barrier(kFree + step % kStages));
    }
    return;
  }
  const ConsumerLane lane{index / 32, index % 32 / 4, index % 4};
  float out[128];  // O[heads, 256 consumer + 8 j + 2 tq (+1)] at out[4 j + ...], relative to run_max
#pragma unroll
  for (int k = 0; k < 128; ++k) out[k] = 0.0f;
  float run_max[2] = {-INFINITY, -INFINITY}, run_sum[2] = {0.0f, 0.0f};
  if (steps > 0) consume_ring(block, steps, consumer, lane, out, run_max, run_sum);

  if constexpr (kClustered) {
    const uint32_t stats = block.stages + kHeads * kLatent * static_cast<uint32_t>(sizeof(float));
    const MergeMemory memory{block.generic, block.queries, block.stages, stats, block.row_sum};
    merge_cluster_splits(a, block.rows.t, out, run_max, run_sum, memory, consumer, lane);
  } else {
    const SplitOutput split{partials, int64_t{blockIdx.x} * gridDim.y + blockIdx.y, int64_t{gridDim.x} * gridDim.y};
    store_output(a, block.rows.t, out, run_max, run_sum, block.row_sum, block.generic, consumer, lane, split);
  }
}

}  // namespace

namespace sparse_mla {
SpecializedKernels ring_kernels() {
  return {mla_wgmma_ring_kernel<false, false>, mla_wgmma_ring_kernel<false, true>, mla_wgmma_ring_kernel<true, false>,
          kSharedBytes, kStepRows};
}
}  // namespace sparse_mla

}  // namespace glms::ops::cuda
