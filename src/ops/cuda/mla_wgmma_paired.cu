// Sparse MLA attention of prefill chunks with bf16 rows, warp-specialised over pairs of stages:
// the persistent kernel of mla_wgmma_specialized.cu (a block an SM, its tokens in turn) with the
// work of its two consumers split another way.
//
// Why this shape: there each consumer scores 32 of a step's 64 rows, S = Q K^T as m64n32k16. A
// k16 step of that reads 3 KB of shared memory (the queries' 64 x 16 and the rows' 32 x 16) for
// 32K multiply-adds, more than the 128 bytes a cycle shared memory gives for the 16 cycles the
// tensor cores need: S ran at about two thirds of their rate. Here the two stages are one
// iteration of 128 rows and consumer c scores all 64 rows of stage c (m64n64k16: 4 KB for 64K,
// within the rate), so both consumers score at once on different rows. The P V stay as they
// were: consumer c keeps the output for latent columns 256 c .. 256 c + 255 and adds P V over
// both stages, its own stage's P from registers, the other's from shared memory.
//
// Who reads what, and so who hands each half of a stage back (left: column blocks 0..3, latent
// 0..255; right: blocks 4..8, latent 256..511 and the rope):
//   stage 0 left   consumer 0's S and its own P V            consumer 0, early (after that P V)
//   stage 1 right  consumer 1's S and its own P V            consumer 1, early
//   stage 0 right  consumer 0's S, consumer 1's other P V    consumer 1, late
//                  (consumer 0's P, in its rope block)
//   stage 1 left   consumer 1's S, consumer 0's other P V    consumer 0, late
// The producer refills the halves in that order; consumer 0 scores its stage left half first,
// consumer 1 right half first, each starting on the half it got back first. Consumer 0 issues
// that first half of its next S behind its other P V, before waiting for that P V: the tensor
// cores take the S while the P V drains, as in FlashMLA's sparse prefill.
//
// Shared memory as mla_specialized.cuh's two_stage lays it out; consumer 1's P fills its buffer's
// whole lines (64 values a head), consumer 0's the rope block of stage 0.
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

constexpr int kStageRows = kStepRows, kPairRows = 2 * kStageRows;

// Named barriers between the consumers (256 threads), as mla_wgmma_specialized.cu's.
enum Named { kMaxima0 = 1, kMaxima, kProbs0, kProbs1, kProbs1Read };
static_assert(kProbs1Read < kEpilogue, "the epilogue's named barrier is its own");

constexpr int kLeft = 0, kRight = 1;

// A consumer's S [64 heads, 64 rows] in wgmma's accumulator layout, and its P as the A operand of
// four k16 steps (mla_specialized.cuh's mask_and_max, exponentiate and store_probs take them).
using PairScores = float[32];
using PairProbs = uint32_t[4][4];

// S += Q K^T over column blocks [first, last) of a stage (k16 steps 4 b .. 4 b + 3 of block b);
// `start` clears S at the first of them.
__device__ __forceinline__ void score_blocks(PairScores& s, uint32_t queries, uint32_t stage, int first, int last,
                                             bool start) {
#pragma unroll
  for (int b = first; b < last; ++b)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      wgmma::m64n64k16(s, wgmma::descriptor(queries + b * kQueryBlockBytes + k * 32, 16, 1024),
                       wgmma::descriptor(stage + b * kBlockBytes + k * 32, 16, 1024),
                       start && b == first && k == 0 ? 0 : 1);
}

// O += P V over a stage's 64 rows for consumer c's columns, one commit group: P from registers
// (the consumer's own stage), or from `probs` (a head's 64 values a line: the other's).
__device__ __forceinline__ void own_values(float (&o)[128], const PairProbs& p, uint32_t stage, int consumer) {
  wgmma::pin(o);
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < 4; ++k) wgmma::rs_m64n256k16_mn(o, p[k], value_descriptor<kStageRows>(stage, consumer, k));
  wgmma::commit();
}
__device__ __forceinline__ void other_values(float (&o)[128], uint32_t probs, uint32_t stage, int consumer) {
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < 4; ++k)
    wgmma::m64n256k16<1>(o, wgmma::descriptor(probs + k * 32, 16, 1024),
                         value_descriptor<kStageRows>(stage, consumer, k));
  wgmma::commit();
}

// Token t's queries once the last token's are read (queries_read_parity >= 0: that phase of
// kQueriesFree; < 0: the block's first token), then its rows a pair of stages at a time, each
// half as its reader hands it back (index: the thread's within the warpgroup). first_pair: the
// block's pairs before this token's, on which the barrier phases run.
__device__ __forceinline__ void produce_pairs(const MlaAttentionArgs& a, int t, int count, int pairs, int index,
                                              const Block& block, int first_pair, int queries_read_parity) {
  const Producer<kStageRows> producer{a, a.selected + static_cast<int64_t>(t) * a.max_selected,
                                      a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks,
                                      count, index % 8, index / 8};
  auto copy_queries = [&] {
    producer.copy_queries(block.queries, t);
    pipeline::barrier_arrive_on_copies(block.barrier(kQueriesReady));
  };
  if (queries_read_parity < 0) copy_queries();
  // Slots of this thread's rows of the pair's two stages; positions of the next pair's, loaded
  // a pair ahead (two dependent loads, neither waited for until it is used).
  int32_t slots[2][Producer<kStageRows>::kRows], positions[2][Producer<kStageRows>::kRows];
  for (int s = 0; s < 2; ++s) {
    producer.load_positions(s, positions[s]);
    producer.slots_of(positions[s], slots[s]);
    producer.load_positions(2 + s, positions[s]);
  }
  // The halves in the order they come back: stage 0 left, stage 1 right, stage 0 right, stage 1 left.
  constexpr int kStageOf[4] = {0, 1, 0, 1}, kHalfOf[4] = {kLeft, kRight, kRight, kLeft};
  for (int pair = 0; pair < pairs; ++pair) {
    const uint32_t parity = ((first_pair + pair) & 1) ^ 1;  // the phase of the pair before
    for (unsigned pending = 15; pending != 0;) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int stage = kStageOf[i], half = kHalfOf[i];
        if ((pending >> i & 1) == 0 ||
            !pipeline::barrier_try_wait_for(block.barrier(kFree + half_index(stage, half)), parity,
                                            kPollNanoseconds))
          continue;
        producer.copy(block.stage(stage), slots[stage], half == kRight ? kLeftBlocks : 0,
                      half == kRight ? kColumnBlocks : kLeftBlocks);
        pipeline::barrier_arrive_on_copies(block.barrier(kReady + half_index(stage, half)));
        pending &= ~(1u << i);
      }
    }
    if (pair == 0 && queries_read_parity >= 0) {
      while (!pipeline::barrier_try_wait_for(block.barrier(kQueriesFree), queries_read_parity, kPollNanoseconds)) {
      }
      copy_queries();
    }
    if (pair + 1 < pairs)
      for (int s = 0; s < 2; ++s) {
        producer.slots_of(positions[s], slots[s]);
        producer.load_positions(2 * pair + 4 + s, positions[s]);
      }
  }
}

// Consumer c's S of its stage in pair phase `parity`: the half it gets back first, then the other.
// behind_values (consumer 0 after its first pair): issued while the last pair's other P V still
// runs, so the first half is a commit group of its own and `between_halves` waits for that P V
// (wgmma::wait<1>) and hands back what it read; s is not pinned first (ptxas serialises wgmma
// where another instruction defines an accumulator of one in flight).
template <typename BetweenHalves>
__device__ __forceinline__ void score_stage(PairScores& s, const Block& block, int consumer, uint32_t parity,
                                            bool behind_values, BetweenHalves between_halves) {
  const uint32_t stage = block.stage(consumer);
  const int first = consumer == 0 ? kLeft : kRight;
  pipeline::barrier_wait(block.barrier(kReady + half_index(consumer, first)), parity);
  wgmma::fence_async_proxy();  // the copies' writes before the tensor cores' reads
  if (!behind_values) wgmma::pin(s);
  wgmma::fence();
  if (first == kLeft) score_blocks(s, block.queries, stage, 0, kLeftBlocks, true);
  else score_blocks(s, block.queries, stage, kLeftBlocks, kColumnBlocks, true);
  if (behind_values) {
    wgmma::commit();
    between_halves();
  }
  pipeline::barrier_wait(block.barrier(kReady + half_index(consumer, first ^ 1)), parity);
  wgmma::fence_async_proxy();
  wgmma::fence();
  if (first == kLeft) score_blocks(s, block.queries, stage, kLeftBlocks, kColumnBlocks, false);
  else score_blocks(s, block.queries, stage, 0, kLeftBlocks, false);
  wgmma::commit();
}

// Consumer 0's pair once its S (its stage's rows, `valid` of them selected) is in s: its maxima
// posted, its P V issued from registers, the joint maxima read, its P stored for consumer 1 (in
// its stage's rope block, which only its own S read), its stage's left half handed back once
// that P V is done, then the P V of consumer 1's P over stage 1 issued (not waited for).
__device__ __forceinline__ void pair_step_consumer0(PairScores& s, PairProbs& p, float (&out)[128],
                                                    float (&run_max)[2], float (&run_sum)[2], int valid,
                                                    const ConsumerLane& lane, const Block& block) {
  float rows_max[2], own_max[2], factor[2];
  mask_and_max(s, valid, lane, rows_max);  // stage 0's first row is selected
  post_own_maxima(rows_max, run_max, own_max, factor, run_sum, block.row_max, lane);
  pipeline::named_arrive(kMaxima0, kConsumerThreads);
  scale_rows(out, factor);
  exponentiate(s, own_max, p, run_sum);
  own_values(out, p, block.stage(0), 0);
  pipeline::named_sync(kMaxima, kConsumerThreads);
  take_joint_maxima(own_max, run_max, factor, run_sum, block.row_max, lane);
  store_probs(block.at(block.stage(0) + 8 * kBlockBytes), s, factor, lane);
  wgmma::fence_async_proxy();
  pipeline::named_arrive(kProbs0, kConsumerThreads);
  wgmma::wait<0>();
  wgmma::pin(out);
  pipeline::barrier_arrive(block.barrier(kFree + half_index(0, kLeft)));
  scale_rows(out, factor);
  pipeline::named_sync(kProbs1, kConsumerThreads);
  other_values(out, block.probs1, block.stage(1), 0);
}

// Consumer 1's pair: the joint maxima (with consumer 0's), its P V from registers, its P stored
// for consumer 0 once that one has read the last, the P V of consumer 0's P over stage 0; its
// stage's right half handed back once its own P V is done (the other is waited for by the caller).
__device__ __forceinline__ void pair_step_consumer1(PairScores& s, PairProbs& p, float (&out)[128],
                                                    float (&run_max)[2], float (&run_sum)[2], int valid,
                                                    const ConsumerLane& lane, const Block& block) {
  float rows_max[2], joint[2], factor[2];
  mask_and_max(s, valid, lane, rows_max);
  pipeline::named_sync(kMaxima0, kConsumerThreads);
  post_joint_maxima(rows_max, run_max, joint, factor, run_sum, block.row_max, lane);
  pipeline::named_arrive(kMaxima, kConsumerThreads);
  scale_rows(out, factor);
  exponentiate(s, joint, p, run_sum);
  own_values(out, p, block.stage(1), 1);
  const float one[2] = {1.0f, 1.0f};
  pipeline::named_sync(kProbs1Read, kConsumerThreads);
  store_probs(block.at(block.probs1), s, one, lane);
  wgmma::fence_async_proxy();
  pipeline::named_arrive(kProbs1, kConsumerThreads);
  pipeline::named_sync(kProbs0, kConsumerThreads);
  other_values(out, block.stage(0) + 8 * kBlockBytes, block.stage(0), 1);
  wgmma::wait<1>();
  pipeline::barrier_arrive(block.barrier(kFree + half_index(1, kRight)));
}

// A consumer's pairs of one token (count selected rows): its queries awaited (phase
// queries_parity), then each pair's S, softmax and P V; every consumer thread arrives on
// kQueriesFree after the token's last S. Consumer 1 waits for its other P V at the end of each
// pair and hands back the late half it read. Consumer 0 issues the next pair's first S half
// behind its other P V (the tensor cores keep working while that P V drains) and waits for that
// P V between the halves; its last pair's, after the loop.
__device__ __forceinline__ void consume_token_pairs(const Block& block, int count, int pairs, int first_pair,
                                                    uint32_t queries_parity, int consumer, const ConsumerLane& lane,
                                                    float (&out)[128], float (&run_max)[2], float (&run_sum)[2]) {
  PairScores s;
  PairProbs p;
  pipeline::barrier_wait(block.barrier(kQueriesReady), queries_parity);
  if (consumer == 0) pipeline::named_arrive(kProbs1Read, kConsumerThreads);  // consumer 1's P buffer starts free
  // Pair `done`'s other P V finished: consumer 0 has read consumer 1's P and stage 1's left half,
  // consumer 1 stage 0's right half and consumer 0's P in it.
  auto hand_back_late = [&](int done) {
    if (consumer == 0 && done + 1 < pairs) pipeline::named_arrive(kProbs1Read, kConsumerThreads);
    pipeline::barrier_arrive(block.barrier(kFree + (consumer == 0 ? half_index(1, kLeft) : half_index(0, kRight))));
  };
  for (int pair = 0; pair < pairs; ++pair) {
    const bool behind_values = consumer == 0 && pair > 0;
    score_stage(s, block, consumer, (first_pair + pair) & 1, behind_values, [&] {
      wgmma::wait<1>();
      hand_back_late(pair - 1);
    });
    wgmma::wait<0>();
    wgmma::pin(s);
    wgmma::pin(out);
    if (pair + 1 == pairs) pipeline::barrier_arrive(block.barrier(kQueriesFree));
    const int valid = count - pair * kPairRows - consumer * kStageRows;
    if (consumer == 0) {
      pair_step_consumer0(s, p, out, run_max, run_sum, valid, lane, block);
    } else {
      pair_step_consumer1(s, p, out, run_max, run_sum, valid, lane, block);
      wgmma::wait<0>();
      wgmma::pin(out);
      hand_back_late(pair);
    }
  }
  if (consumer == 0) {
    wgmma::wait<0>();
    wgmma::pin(out);
    hand_back_late(pairs - 1);
  }
}

// Tokens of one split, a block an SM, as mla_wgmma_persistent_kernel takes them. Registers:
// 72 for the producer and 216 for each consumer (FlashMLA's split). At 56 / 224 ptxas spills 52
// bytes of consumer 0's S behind its P V; and a consumer 0 that waits for its P V before the next
// S, which spills at neither, runs 2.5% faster at 72 / 216 (8192 tokens, an H100, cuda_mla_prefill).
constexpr int kProducerRegisters = 72, kConsumerRegisters = 216;
static_assert(2 * 128 * kConsumerRegisters + 128 * kProducerRegisters <= kThreads * kLaunchRegisters,
              "the block's registers");
__global__ void __launch_bounds__(kThreads, 1) mla_wgmma_paired_kernel(MlaAttentionArgs a, int launch_tokens) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const Block block = block_at(shared_raw, 256);
  const int index = threadIdx.x % 128;

  if (block.warpgroup == 2) {
    pipeline::shrink_registers<kProducerRegisters>();
    int first_pair = 0, tokens = 0;  // the block's pairs and tokens with rows so far
    for (int launched = blockIdx.x; launched < launch_tokens; launched += gridDim.x) {
      const SplitRows rows = split_rows(a, a.max_selected, launched, 0);
      const int pairs = (rows.count + kPairRows - 1) / kPairRows;
      if (pairs == 0) continue;
      produce_pairs(a, rows.t, rows.count, pairs, index, block, first_pair, tokens == 0 ? -1 : (tokens - 1) & 1);
      first_pair += pairs;
      ++tokens;
    }
    return;
  }

  pipeline::grow_registers<kConsumerRegisters>();
  const int consumer = block.warpgroup;
  const ConsumerLane lane{index / 32, index % 32 / 4, index % 4};
  int first_pair = 0, tokens = 0;
  for (int launched = blockIdx.x; launched < launch_tokens; launched += gridDim.x) {
    const SplitRows rows = split_rows(a, a.max_selected, launched, 0);
    const int t = rows.t, count = rows.count;
    const int pairs = (count + kPairRows - 1) / kPairRows;
    if (pairs == 0) {
      write_zero_output(a, t, consumer, index);
      continue;
    }
    float out[128], run_max[2], run_sum[2];  // O[heads, 256 consumer + 8 j + 2 tq (+1)] at out[4 j + ...]
    clear_sums(out, run_max, run_sum);
    consume_token_pairs(block, count, pairs, first_pair, tokens & 1, consumer, lane, out, run_max, run_sum);
    store_output_from_registers(a, t, out, run_sum, block.row_sum, consumer, lane);
    first_pair += pairs;
    ++tokens;
  }
}

}  // namespace

void mla_attention_wgmma_paired(const MlaAttentionArgs& a, cudaStream_t stream) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0) return;
  GLMS_CHECK(mla_attention_wgmma_supported(a.num_heads, a.latent_dim, a.rope_dim) && a.storage == CacheStorage::kBf16,
             "mla_attention_wgmma_paired: bf16 rows, at most 64 heads, latent 512 and rope 64");
  check(cudaFuncSetAttribute(mla_wgmma_paired_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "cudaFuncSetAttribute(paired MLA kernel)");
  const int blocks = std::min(launch_tokens, a.persistent_blocks > 0 ? a.persistent_blocks : multiprocessor_count());
  launch_chained("mla_wgmma_paired launch", mla_wgmma_paired_kernel, static_cast<unsigned>(blocks), kThreads,
                 kSharedBytes, stream, a, launch_tokens);
}

}  // namespace glms::ops::cuda
