// Sparse MLA attention for prefill chunks with bf16 rows, warp-specialised: a producer
// warpgroup gathers each token's selected latent rows into shared memory while two consumer
// warpgroups multiply, for GLM-5's shapes (64 heads, latent 512, rope 64).
//
// Why this shape: mla_wgmma.cu's kernel has all its warps wait together for every copy, the
// softmax and each barrier, so the tensor cores idle through each. Here the rows come in steps
// of 64 into two stages (the next step's copies land while this one is multiplied); consumer c
// scores rows 32 c .. 32 c + 31 of a step (mla_specialized.cuh describes what the consumers
// share), adding P V over all 64 rows of the step: its own rows' P from registers (the S
// accumulators become wgmma's A operand), the other consumer's from shared memory. The two
// exchange their running maxima once a step, so both halves of the step's P share one maximum;
// while one runs its softmax, the other's wgmma run.
//
// Decode tokens' selections go in splits over blocks: their sums leave as partials for
// mla_merge_splits or, a token's splits launched as one thread block cluster, are combined by the
// cluster's blocks through distributed shared memory (merge_cluster_splits).
//
// Shared memory as mla_specialized.cuh's two_stage lays it out: a stage's rope block holds
// consumer 0's P once both scored, consumer 1's P the first 32 values of each line of its buffer.
// Both consumers' S read both halves of a stage; then only consumer 0 reads
// the left half (its P V) and only consumer 1 the right (its P V, and consumer 0's P in the rope
// block). So each half goes back to the producer when its one reader's P V are done.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla.h"
#include "ops/cuda/mla_specialized.cuh"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda {

namespace {

using namespace sparse_mla;
using namespace sparse_mla::two_stage;

// Named barriers between the consumers (256 threads): consumer 0's maxima posted, the joint
// maxima posted (by consumer 1), consumer 0's P stored, consumer 1's P stored, consumer 1's P
// read (its buffer free again); then the epilogue's (kEpilogue).
enum Named { kMaxima0 = 1, kMaxima, kProbs0, kProbs1, kProbs1Read };
static_assert(kProbs1Read < kEpilogue, "the epilogue's named barrier is its own");

// A block's token and shared memory (two_stage::block_at).
struct TokenBlock : Block {
  int t, count;  // the token, its split's selected rows
  int begin;     // the split's first row of the token's selection
};
__device__ __forceinline__ TokenBlock token_block(uint8_t* shared_raw, const MlaAttentionArgs& a, int rows_per_split,
                                                  int launched_token, int split, int queries_free_count = 0) {
  TokenBlock b;
  const SplitRows rows = split_rows(a, rows_per_split, launched_token, split);  // its load before the barriers' set-up
  static_cast<Block&>(b) = block_at(shared_raw, queries_free_count);
  b.t = rows.t;
  b.begin = rows.begin;
  b.count = rows.count;
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
    post_own_maxima(rows_max, run_max, own_max, factor, run_sum, row_max, lane);
    pipeline::named_arrive(kMaxima0, kConsumerThreads);
    scale_rows(out, factor);
    exponentiate(s, own_max, p, run_sum);
    issue_own_values<kStepRows>(out, p, v.stage, 0, 0);
    // The joint maxima (consumer 1 posts them once it has scored); this step's P relative to
    // them, for consumer 1.
    pipeline::named_sync(kMaxima, kConsumerThreads);
    take_joint_maxima(own_max, run_max, factor, run_sum, row_max, lane);
    store_probs(generic + (v.probs0 - queries), s, factor, lane);
    wgmma::fence_async_proxy();
    pipeline::named_arrive(kProbs0, kConsumerThreads);
    wgmma::wait<0>();
    wgmma::pin(out);
    scale_rows(out, factor);
    pipeline::named_sync(kProbs1, kConsumerThreads);
    issue_other_values<kStepRows, 128>(out, v.probs1, v.stage, 2, 0);
  } else {
    float joint[2];
    pipeline::named_sync(kMaxima0, kConsumerThreads);
    post_joint_maxima(rows_max, run_max, joint, factor, run_sum, row_max, lane);
    pipeline::named_arrive(kMaxima, kConsumerThreads);
    scale_rows(out, factor);
    exponentiate(s, joint, p, run_sum);
    issue_own_values<kStepRows>(out, p, v.stage, 2, 1);
    // This step's P for consumer 0, once it has read the last step's.
    const float one[2] = {1.0f, 1.0f};
    pipeline::named_sync(kProbs1Read, kConsumerThreads);
    store_probs(generic + (v.probs1 - queries), s, one, lane);
    wgmma::fence_async_proxy();
    pipeline::named_arrive(kProbs1, kConsumerThreads);
    pipeline::named_sync(kProbs0, kConsumerThreads);
    issue_other_values<kStepRows, 128>(out, v.probs0, v.stage, 0, 1);
  }
}

// Token t's queries, then each step's rows into its stage as the consumers hand the halves back
// (index: the thread's within the warpgroup). first_step: the block's count of steps before this
// token's (the persistent kernel's stages and barrier phases run on from token to token);
// queries_read_parity >= 0: the queries' region still holds the last token's until that phase
// of kQueriesFree, so the first step's rows go first and the queries once it completes.
__device__ __forceinline__ void produce_rows(const MlaAttentionArgs& a, int t, int begin, int count, int steps,
                                             int index, uint32_t queries, uint32_t stages, uint32_t barriers,
                                             int first_step = 0, int queries_read_parity = -1) {
  auto barrier = [&](int i) { return barriers + 8 * i; };
  auto stage_at = [&](int step) { return stages + ((first_step + step) & 1) * kStageBytes; };
  const Producer<kStepRows> producer{a, a.selected + static_cast<int64_t>(t) * a.max_selected + begin,
                          a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks, count,
                          index % 8, index / 8};
  auto copy_queries = [&] {
    producer.copy_queries(queries, t);
    pipeline::barrier_arrive_on_copies(barrier(kQueriesReady));
  };
  if (queries_read_parity < 0) copy_queries();
  // The slots of this thread's rows of a step, and the positions of the next step's. Each
  // step's copies are issued, then the next step's slots looked up from positions loaded a
  // step earlier and the positions of the step after loaded: neither load is waited for until
  // the next step (the producer was stalled on the two in a row for about 80% of its time,
  // with the consumers waiting for the copies half of theirs: at 8192 tokens 5.19 -> 4.47 ms a
  // layer on the H200).
  int32_t slots[Producer<kStepRows>::kRows], positions[Producer<kStepRows>::kRows];
  producer.load_positions(0, positions);
  producer.slots_of(positions, slots);
  producer.load_positions(1, positions);
  for (int step = 0; step < steps; ++step) {
    const int stage = (first_step + step) & 1;
    const uint32_t parity = (((first_step + step) >> 1) & 1) ^ 1;  // the phase of two steps before
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
    if (step == 0 && queries_read_parity >= 0) {
      while (!pipeline::barrier_try_wait_for(barrier(kQueriesFree), queries_read_parity, kPollNanoseconds)) {
      }
      copy_queries();
    }
    if (step + 1 < steps) {
      producer.slots_of(positions, slots);
      producer.load_positions(step + 2, positions);
    }
  }
}

// A consumer's steps of one token (count selected rows, in steps of kStepRows): its queries
// awaited (phase queries_parity of kQueriesReady), then each step's S over both halves of its
// stage (this consumer's own half awaited first, the one the producer refills first for it),
// the softmax and both P V (softmax_and_values_step), and the halves handed back once their
// reader is done. Stages and barrier phases are numbered on from first_step (the block's steps
// before this token's). release_queries: every consumer thread arrives on kQueriesFree after the
// token's last S, so that the persistent producer may load the next token's queries.
// out, run_max and run_sum come cleared (clear_sums) and end as store_output reads them.
__device__ __forceinline__ void consume_token_steps(const TokenBlock& block, int count, int steps, int first_step,
                                                    uint32_t queries_parity, bool release_queries, int consumer,
                                                    const ConsumerLane& lane, float (&out)[128], float (&run_max)[2],
                                                    float (&run_sum)[2]) {
  auto barrier = [&](int index) { return block.barriers + 8 * index; };
  Scores s;
  Probs p;
  pipeline::barrier_wait(barrier(kQueriesReady), queries_parity);
  // Consumer 1's P buffer starts free: one arrival for each of its `steps` waits, the rest after
  // each step but the last.
  if (consumer == 0) pipeline::named_arrive(kProbs1Read, kConsumerThreads);
  for (int step = 0; step < steps; ++step) {
    const int global_step = first_step + step;
    const int stage_index = global_step & 1;
    const uint32_t parity = (global_step >> 1) & 1, stage = block.stages + stage_index * kStageBytes;
    pipeline::barrier_wait(barrier(kReady + half_index(stage_index, consumer)), parity);
    pipeline::barrier_wait(barrier(kReady + half_index(stage_index, consumer ^ 1)), parity);
    wgmma::fence_async_proxy();  // the copies' writes before the tensor cores' reads
    wgmma::pin(s);
    wgmma::fence();
    score_rows<kStepRows>(s, block.queries, stage + consumer * kConsumerRows * kLineBytes);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::pin(s);
    if (release_queries && step + 1 == steps) pipeline::barrier_arrive(barrier(kQueriesFree));
    const StepValues values{stage, stage + 8 * kBlockBytes, block.probs1};
    softmax_and_values_step(s, p, out, run_max, run_sum, count - step * kStepRows - consumer * kConsumerRows,
                            consumer, lane, block.row_max, block.generic, block.queries, values);
    wgmma::wait<0>();
    wgmma::pin(out);
    // This step's P V done: consumer 0 has read consumer 1's P and the stage's left half for the
    // last time, consumer 1 the right half (and consumer 0's P in its rope block).
    if (consumer == 0 && step + 1 < steps) pipeline::named_arrive(kProbs1Read, kConsumerThreads);
    pipeline::barrier_arrive(barrier(kFree + half_index(stage_index, consumer)));
  }
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
  float run_max[2], run_sum[2];
  clear_sums(out, run_max, run_sum);
  if (steps > 0) consume_token_steps(block, count, steps, 0, 0, false, consumer, lane, out, run_max, run_sum);

  if constexpr (kClustered) {
    const MergeMemory memory{generic, queries, stages, probs1, row_max + kHeads};
    merge_cluster_splits(a, t, out, run_max, run_sum, memory, consumer, lane);
  } else {
    const int64_t split_rows = int64_t{gridDim.x} * gridDim.y;
    const SplitOutput split{partials, int64_t{blockIdx.x} * gridDim.y + blockIdx.y, split_rows};
    store_output(a, t, out, run_max, run_sum, row_max + kHeads, generic, consumer, lane, split);
  }
}

// Tokens of one split (prefill chunks, decode batches of a block an SM or more), a block an SM:
// block b takes launched tokens b, b + gridDim.x, ..., its stages and barrier phases running on
// from token to token, so that the next token's look-ups and first rows land while this token's
// last steps run, and its queries while this token's last P V and epilogue do (the epilogue
// writes from registers). A block a token paid those in series: at 8192 tokens of 64 selected
// rows (one step) a token took about 11 us of an SM against about 2 us a step more for longer
// selections (an H100, cuda_mla_prefill). A fixed stride, where the persistent expert GEMMs
// claim their tiles in order (moe_grouped::claim_tile): their neighbouring tiles share weight
// lines in L2, which drifting blocks lost, while tokens share no rows that L2 could keep.
// Its producer's token loop needs more registers than produce_rows alone (40 bytes spilled at
// 40), taken from the consumers (which ptxas fits in 224 without spills).
constexpr int kPersistentProducerRegisters = 56, kPersistentConsumerRegisters = 224;
static_assert(2 * 128 * kPersistentConsumerRegisters + 128 * kPersistentProducerRegisters <=
                  kThreads * kLaunchRegisters,
              "the block's registers");
__global__ void __launch_bounds__(kThreads, 1) mla_wgmma_persistent_kernel(MlaAttentionArgs a, int launch_tokens) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const TokenBlock block = token_block(shared_raw, a, a.max_selected, blockIdx.x, 0, 256);
  const int warpgroup = block.warpgroup, index = threadIdx.x % 128;

  if (warpgroup == 2) {
    pipeline::shrink_registers<kPersistentProducerRegisters>();
    int first_step = 0, tokens = 0;  // the block's steps and tokens with rows so far
    for (int launched = blockIdx.x; launched < launch_tokens; launched += gridDim.x) {
      const SplitRows rows = split_rows(a, a.max_selected, launched, 0);
      const int steps = (rows.count + kStepRows - 1) / kStepRows;
      if (steps == 0) continue;
      produce_rows(a, rows.t, 0, rows.count, steps, index, block.queries, block.stages, block.barriers, first_step,
                   tokens == 0 ? -1 : (tokens - 1) & 1);
      first_step += steps;
      ++tokens;
    }
    return;
  }

  pipeline::grow_registers<kPersistentConsumerRegisters>();
  const int consumer = warpgroup;
  const ConsumerLane lane{index / 32, index % 32 / 4, index % 4};
  int first_step = 0, tokens = 0;
  for (int launched = blockIdx.x; launched < launch_tokens; launched += gridDim.x) {
    const SplitRows rows = split_rows(a, a.max_selected, launched, 0);
    const int t = rows.t, count = rows.count;
    const int steps = (count + kStepRows - 1) / kStepRows;
    if (steps == 0) {
      write_zero_output(a, t, consumer, index);
      continue;
    }
    float out[128], run_max[2], run_sum[2];  // as mla_wgmma_specialized_kernel's
    clear_sums(out, run_max, run_sum);
    consume_token_steps(block, count, steps, first_step, tokens & 1, true, consumer, lane, out, run_max, run_sum);
    store_output_from_registers(a, t, out, run_sum, block.row_sum, consumer, lane);
    first_step += steps;
    ++tokens;
  }
}

// The ring's kernels or this file's.
SpecializedKernels kernels_of(const MlaAttentionArgs& a) {
  if (a.ring_stages) return ring_kernels();
  return {mla_wgmma_specialized_kernel<false, false>, mla_wgmma_specialized_kernel<false, true>,
          mla_wgmma_specialized_kernel<true, false>, kSharedBytes, kStepRows};
}

// The most blocks of `kernel` (each k.shared_bytes of shared memory) in one cluster that the
// current device holds at once: 16, 8, 4 or 2, else 0. A cluster's blocks share a GPC, one an SM
// here, so a MIG slice or a GPC short of SMs may hold none of 16.
int largest_cluster(const SpecializedKernels& k) {
  check(cudaFuncSetAttribute(k.clustered, cudaFuncAttributeMaxDynamicSharedMemorySize, k.shared_bytes),
        "cudaFuncSetAttribute(warp-specialised MLA kernel)");
  // Clusters above 8 blocks need the non-portable size; a device that refuses it starts at 8.
  unsigned largest = kMlaMaxClusterSplits;
  if (cudaFuncSetAttribute(k.clustered, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    largest = 8;
  }
  for (unsigned blocks = largest; blocks >= 2; blocks /= 2) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(blocks, 1);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = k.shared_bytes;
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim = {blocks, 1, 1};
    config.attrs = &cluster;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, k.clustered, &config) != cudaSuccess) {
      cudaGetLastError();  // a size the device refuses: try the next smaller
      continue;
    }
    if (clusters > 0) return static_cast<int>(blocks);
  }
  return 0;
}

}  // namespace

int mla_largest_cluster_splits(bool ring_stages) {
  MlaAttentionArgs a;
  a.ring_stages = ring_stages;
  return largest_cluster(kernels_of(a));
}

void mla_attention_wgmma_specialized(const MlaAttentionArgs& a, cudaStream_t stream, int rows_per_split, int splits,
                                     float* partials) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0) return;
  GLMS_CHECK(mla_attention_wgmma_supported(a.num_heads, a.latent_dim, a.rope_dim) && a.storage == CacheStorage::kBf16,
             "mla_attention_wgmma_specialized: bf16 rows, at most 64 heads, latent 512 and rope 64");
  const SpecializedKernels k = kernels_of(a);
  if (mla_splits_clustered(a, splits)) {
    GLMS_CHECK(rows_per_split > 0 && rows_per_split % k.step_rows == 0,
               "mla_attention_wgmma_specialized: clustered splits of whole steps");
    check(cudaFuncSetAttribute(k.clustered, cudaFuncAttributeMaxDynamicSharedMemorySize, k.shared_bytes),
          "cudaFuncSetAttribute(warp-specialised MLA kernel)");
    if (splits > 8)
      check(cudaFuncSetAttribute(k.clustered, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
            "cudaFuncSetAttribute(warp-specialised MLA kernel, non-portable clusters)");
    launch_chained_clusters("mla_wgmma_specialized launch", k.clustered, static_cast<unsigned>(splits),
                            dim3(splits, launch_tokens), kThreads, k.shared_bytes, stream, a, rows_per_split, nullptr);
    return;
  }
  if (splits == 1 && a.persistent && !a.ring_stages && a.paired_stages) {
    mla_attention_wgmma_paired(a, stream);
    return;
  }
  if (splits == 1 && a.persistent && !a.ring_stages) {
    check(cudaFuncSetAttribute(mla_wgmma_persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
          "cudaFuncSetAttribute(persistent MLA kernel)");
    const int blocks = std::min(launch_tokens, a.persistent_blocks > 0 ? a.persistent_blocks : multiprocessor_count());
    launch_chained("mla_wgmma_persistent launch", mla_wgmma_persistent_kernel, static_cast<unsigned>(blocks), kThreads,
                   kSharedBytes, stream, a, launch_tokens);
    return;
  }
  check(cudaFuncSetAttribute(k.unclustered, cudaFuncAttributeMaxDynamicSharedMemorySize, k.shared_bytes),
        "cudaFuncSetAttribute(warp-specialised MLA kernel)");
  GLMS_CHECK(splits == 1 || (partials && rows_per_split > 0 && rows_per_split % k.step_rows == 0),
             "mla_attention_wgmma_specialized: splits need partials and whole steps a split");
  if (splits == 1) rows_per_split = a.max_selected;
  launch_chained("mla_wgmma_specialized launch", k.unclustered, dim3(launch_tokens, splits), kThreads, k.shared_bytes,
                 stream, a, rows_per_split, splits > 1 ? partials : nullptr);
}

void mla_attention_copies_only(const MlaAttentionArgs& a, cudaStream_t stream) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0) return;
  GLMS_CHECK(mla_attention_wgmma_supported(a.num_heads, a.latent_dim, a.rope_dim) && a.storage == CacheStorage::kBf16,
             "mla_attention_copies_only: bf16 rows, at most 64 heads, latent 512 and rope 64");
  const SpecializedKernels k = kernels_of(a);
  check(cudaFuncSetAttribute(k.copies_only, cudaFuncAttributeMaxDynamicSharedMemorySize, k.shared_bytes),
        "cudaFuncSetAttribute(warp-specialised MLA kernel)");
  launch_chained("mla_attention_copies_only launch", k.copies_only, dim3(launch_tokens, 1), kThreads, k.shared_bytes,
                 stream, a, a.max_selected, nullptr);
}

}  // namespace glms::ops::cuda
