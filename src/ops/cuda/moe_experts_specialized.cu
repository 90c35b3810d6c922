// Routed experts of long prefills with bf16 or tiled MXFP4 weights, warp-specialised: each
// projection is one grouped GEMM over the plan's grouped pairs, where producer warps copy token
// rows and weight lines (MXFP4: widened to bf16) into a ring of shared-memory stages while two
// consumer warpgroups multiply, the gate/up epilogue applying SwiGLU in registers.
//
// Why this shape: in moe_experts_wgmma.cu's kernel every warp copies, waits for the copies and
// meets at a barrier each step, so the tensor cores idle through each (Nsight Compute at 256
// pairs an expert: a third of the issue gaps at that barrier, half the SM throughput). Here the
// consumers only wait on a stage's transaction barrier, keep one step's wgmma in flight while
// issuing the next, and hand the stage back; the producer refills it as soon as both are done.
// A block takes up to 128 grouped rows of one expert and 256 weight lines (gate/up: 128 gate
// rows and their up rows, as 64 gate lines then their 64 up lines, twice; down: 256 output
// features). A tile of more than 64 rows gives consumer c the rows 64 c .. and all 256 lines
// (a 64 x 256 fp32 accumulator, m64n256k16: a step of 64 k reads 48 KB for 4.2 MFLOP); a tile
// of 64 rows or fewer (an expert's last, part-filled tile) gives both consumers rows 0..63 and
// consumer c the lines 128 c .. (m64n128k16), half a full tile's tensor work: an expert's
// pairs seldom fill whole 128-row tiles (256 +- 16 pairs at 8192 tokens, 64 +- 8 at 2048). A
// tile of 32 rows or fewer turns round: consumer c's 128 lines are the rows of two m64n16k16 or
// m64n32k16 against the tile's token rows as columns, an eighth or a quarter of a full tile's
// tensor work (multiply_steps_by_lines). Its weight lines still stream in whole, so the gain is
// small where those reads bound the GEMM: the bf16 experts of an 8192-token step (uniform
// routing) 1.3% faster on an H100, 2048 tokens unchanged.
//
// At 8192 tokens the gate/up GEMM is bound by L2 throughput (Nsight Compute: 94%), and an
// expert's two or three row tiles read the same weight lines. With SpecializedTiles::kPaired,
// a thread block cluster of two blocks takes two row tiles of one expert and slice: each block
// loads half of a stage's weight lines by TMA into both blocks' shared memory (multicast), so a
// block reads 32 KB from L2 a step instead of 48; a stage is refilled once both blocks'
// consumers are done with it. An expert's odd last tile is a unit of the same launch, each block
// taking it against half of the lines (a separate launch of those tiles read their weights from
// DRAM a second time). SpecializedTiles::kPersistent (bf16; MXFP4 tiles too, as an option): a
// block an SM claims unit after unit in order (moe_grouped::claim_tile), its ring running on
// from tile to tile.
//
// MXFP4 (W4A16): the producer warpgroup copies the tiled codes and their scale words as they are
// (quant/mxfp4_tiles.h, a quarter of the bf16 bytes) into a ring of its own, kCodeGroups groups
// of 128 k ahead, and widens them into the stages' weight lines (exact: an E2M1 value times a
// power of two); the consumers are the bf16 kernel's. Widening costs about 3 integer and bf16
// ops a weight, 16 K weights a step for 4 warps, beside the consumers' 2 to 4 MFLOP of tensor
// work; the producer bounds the GEMM (about 1 us a step at 2048 tokens on the H200, where the
// consumers' tensor work is 0.3-0.6 us), so a step's widening is laid out for instruction-level
// parallelism: all its ring reads first, one branch for the step.
//
// Shared memory (128-byte swizzle, wgmma.cuh), kStages stages of
//   tokens  [128 rows] lines of 64 k     16 KB (rows past the tile's are not copied: their
//                                                 products are never stored)
//   weights [256 lines] of 64 k          32 KB
// then (MXFP4) kCodeGroups groups of codes [items][halves][producer threads] 8 bytes and scale
// words [items][producer threads], then the stages' full and empty barriers, then (persistent)
// the tile claims (moe_grouped::TileClaims) and the experts' first units [experts + 1] int.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_grouped.cuh"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/tensor_map.h"
#include "ops/cuda/wgmma.cuh"
#include "quant/mxfp4_tiles.h"

namespace glms::ops::cuda {

namespace {

using moe_grouped::GroupedArgs;
using moe_grouped::Projection;
using moe_grouped::WeightSource;
using wgmma::swizzled;

// Consumers: warpgroups 0 and 1; the producer: warpgroup 2. One producer warpgroup for either
// weight source: the consumers' m64n256k16 needs more registers (154) than a 512-thread block's
// entry gives (128), and ptxas allots the whole kernel that count.
constexpr int kConsumerThreads = 256, kProducerThreads = 128;
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kRows = 128, kLines = 256, kStepK = 64;
constexpr int kLine = wgmma::kLineBytes;
constexpr int kTokenBytes = kRows * kLine;    // 16 KB
constexpr int kWeightBytes = kLines * kLine;  // 32 KB
constexpr int kStageBytes = kTokenBytes + kWeightBytes;
constexpr int kPairBlocks = 2;  // blocks of a cluster in the paired launch

// A block's ring and registers for each weight source: bf16, four stages; MXFP4, three stages and
// the codes' ring.
template <WeightSource W>
struct Ring {
  static constexpr bool kMxfp4 = W == WeightSource::kMxfp4;
  static constexpr int kStages = kMxfp4 ? 3 : 4;
  // MXFP4: each producer thread's 16-byte chunks of a 128-k group (4 a line), groups in the ring.
  static constexpr int kItems = kLines * 4 / kProducerThreads;
  static constexpr int kCodeGroups = kMxfp4 ? 3 : 0;
  static constexpr int kCodeBytes = kItems * kProducerThreads * 16;  // 16 KB a group
  static constexpr int kCodeGroupBytes = kCodeBytes + kItems * kProducerThreads * 4;  // and the scale words
  static constexpr int kBarrierOffset = kStages * kStageBytes + kCodeGroups * kCodeGroupBytes;
  static constexpr int kSharedBytes = 1024 + kBarrierOffset + 2 * kStages * 8;  // 1024: alignment
  // setmaxnreg moves registers inside the block's launch allotment (kEntryRegisters a thread):
  // the consumers can grow by no more than the producers give up, or they wait for ever. ptxas
  // fits the whole kernel in kEntryRegisters and the producers' code in kProducerRegisters.
  static constexpr int kEntryRegisters = 65536 / kThreads / 8 * 8;  // 168
  static constexpr int kConsumerRegisters = kMxfp4 ? 200 : 232;
  static constexpr int kProducerRegisters = kMxfp4 ? 104 : 40;
  static_assert(kConsumerThreads * (kConsumerRegisters - kEntryRegisters) <=
                    kProducerThreads * (kEntryRegisters - kProducerRegisters),
                "the consumers' registers come from the producers'");
  static_assert(kSharedBytes <= 232448, "one block an SM");
};

// What one consumer warpgroup multiplies: its tile's rows row0 .. row0 + 63 against kN (256 or
// 128) lines of a stage from stage_line0, which are the slice's lines from slice_line0.
struct ConsumerPart {
  int row0, stage_line0, slice_line0;
};

// acc[4 j + e] of the consumer's thread (warp, g, tq): grouped row part.row0 + 16 warp + g +
// 8 (e / 2), the slice's line part.slice_line0 + 8 j + 2 tq + e % 2 (j < kN / 8).
template <Projection P, int kN>
__device__ __forceinline__ void store_tile(const GroupedArgs& a, const float (&acc)[128], ConsumerPart part,
                                           int first, int rows, int64_t slice) {
  const int u = threadIdx.x % 128, warp = u / 32, g = u % 32 / 4, tq = u % 4;
  const int row0 = part.row0 + 16 * warp + g;
  constexpr int kGroups = kN / 8;  // of 8 lines
  if constexpr (P == Projection::kDown) {
    const int64_t feature0 = slice * kLines + part.slice_line0 + 2 * tq;
#pragma unroll
    for (int j = 0; j < kGroups; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h;
        if (r < rows)
          moe_grouped::store_out_pair(a, (first + r) * a.rows_per_expert + feature0 + 8 * j, acc[4 * j + 2 * h],
                                      acc[4 * j + 2 * h + 1]);
      }
  } else {
    // 64 gate lines, then the matching 64 up lines: feature i's up sum is 8 register groups on,
    // in this thread. act[row, 128 x + i] = bf16(silu(gate_i) * up_i).
    uint16_t* const act0 = a.act + slice * (kLines / 2) + part.slice_line0 / 2 + 2 * tq;
#pragma unroll
    for (int f = 0; f < kGroups / 2; ++f)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h, i = 4 * (f % 8 + 16 * (f / 8)) + 2 * h;  // gate groups 0..7, 16..23
        if (r >= rows) continue;
        const float gate0 = acc[i], gate1 = acc[i + 1], up0 = acc[i + 32], up1 = acc[i + 33];
        *reinterpret_cast<uint32_t*>(act0 + (first + r) * a.inter + 8 * f) =
            pack_bf16_pair(silu_mul(gate0, up0), silu_mul(gate1, up1));
      }
  }
}

// A consumer's ring of steps: for each, wait for its stage, issue `multiply(at)` (the stage's
// byte offset in the ring) as one commit group, keep that step's wgmma in flight and hand the
// step before back to the producer (the last once its products are done); `pin()` orders the
// accumulators' uses around the asynchronous wgmma. `ring`: the steps the block's ring took
// before this tile's (a persistent block's earlier tiles), so that stage and phase run on.
template <bool kPaired, int kStages, typename Multiply, typename Pin>
__device__ __forceinline__ void consume_steps(uint32_t full, uint32_t empty, int steps, int ring, Multiply multiply,
                                              Pin pin) {
  for (int step = ring; step < ring + steps; ++step) {
    const int stage = step % kStages;
    pipeline::barrier_wait(full + 8 * stage, (step / kStages) & 1);
    wgmma::fence_async_proxy();  // the copies' writes before the tensor cores' reads
    pin();
    wgmma::fence();
    multiply(static_cast<uint32_t>(stage * kStageBytes));
    wgmma::commit();
    // The previous step's products are done: its stage goes back to the producer.
    wgmma::wait<1>();
    pin();
    if (step > ring) pipeline::release_stage<kPaired, kPairBlocks>(empty + 8 * ((step - 1) % kStages));
  }
  wgmma::wait_all();
  pin();
  pipeline::release_stage<kPaired, kPairBlocks>(empty + 8 * ((ring + steps - 1) % kStages));
}

// A consumer's part of each step: its rows against kN (256 or 128) of the stage's lines.
template <int kN, bool kPaired, int kStages>
__device__ __forceinline__ void multiply_steps(float (&acc)[128], uint32_t stages, uint32_t full, uint32_t empty,
                                               int steps, ConsumerPart part, int ring) {
  // Stage 0's rows and lines for this consumer; 16 k further on is 32 bytes.
  const uint64_t token_descriptor = wgmma::descriptor(stages + part.row0 * kLine, 16, 1024);
  const uint64_t weight_descriptor = wgmma::descriptor(stages + kTokenBytes + part.stage_line0 * kLine, 16, 1024);
  auto multiply = [&](uint32_t at) {
#pragma unroll
    for (int kk = 0; kk < kStepK / 16; ++kk) {
      const uint64_t tokens = wgmma::descriptor_advanced(token_descriptor, at + kk * 32);
      const uint64_t weights = wgmma::descriptor_advanced(weight_descriptor, at + kk * 32);
      if constexpr (kN == 128) wgmma::m64n128k16<0>(reinterpret_cast<float(&)[64]>(acc), tokens, weights);
      else wgmma::m64n256k16<0>(acc, tokens, weights);
    }
  };
  consume_steps<kPaired, kStages>(full, empty, steps, ring, multiply, [&] { wgmma::pin(acc); });
}

// A short tile's consumer the other way round: its 128 lines (line0 ..) as the multiplies' 64
// rows twice (lines line0 .. + 63 into `low`, the next 64 into `high`) against the tile's first
// kTokens token rows as their columns. A tile of 16 rows then costs m64n16k16 twice a k16
// instead of one m64n128k16: an eighth of the tensor work, and a quarter at 32 rows (a short
// last tile holds 1..64 rows; at 8192 tokens, uniform routing, nearly all hold 32 or fewer).
template <int kTokens, bool kPaired, int kStages>
__device__ __forceinline__ void multiply_steps_by_lines(float (&low)[kTokens / 2], float (&high)[kTokens / 2],
                                                        uint32_t stages, uint32_t full, uint32_t empty, int steps,
                                                        int line0, int ring) {
  static_assert(kTokens == 16 || kTokens == 32, "m64n16k16 or m64n32k16");
  const uint64_t token_descriptor = wgmma::descriptor(stages, 16, 1024);
  const uint64_t weight_descriptor = wgmma::descriptor(stages + kTokenBytes + line0 * kLine, 16, 1024);
  auto multiply_into = [](float(&d)[kTokens / 2], uint64_t weights, uint64_t tokens) {
    if constexpr (kTokens == 16) wgmma::m64n16k16(d, weights, tokens, 1);
    else wgmma::m64n32k16(d, weights, tokens, 1);
  };
  auto multiply = [&](uint32_t at) {
#pragma unroll
    for (int kk = 0; kk < kStepK / 16; ++kk) {
      const uint64_t tokens = wgmma::descriptor_advanced(token_descriptor, at + kk * 32);
      const uint64_t weights = wgmma::descriptor_advanced(weight_descriptor, at + kk * 32);
      multiply_into(low, weights, tokens);
      multiply_into(high, wgmma::descriptor_advanced(weights, 64 * kLine), tokens);
    }
  };
  consume_steps<kPaired, kStages>(full, empty, steps, ring, multiply, [&] {
    wgmma::pin(low);
    wgmma::pin(high);
  });
}

// multiply_steps_by_lines' sums stored: low[4 j + e] / high[4 j + e] of thread (warp, g, tq) is
// line line0 + 16 warp + g + 8 (e / 2) (high: 64 further on) of the slice, token row 8 j + 2 tq +
// e % 2 of the tile. Lanes g and g ^ 1 swap one value, so that each holds two neighbouring
// features of one token for a paired store: even g tokens 8 j + 2 tq, odd g the next.
// Gate/up: low holds the gate lines of features line0 / 2 .., high their up lines.
template <Projection P, int kTokens>
__device__ __forceinline__ void store_tile_by_lines(const GroupedArgs& a, const float (&low)[kTokens / 2],
                                                    const float (&high)[kTokens / 2], int line0, int first, int rows,
                                                    int64_t slice) {
  const int u = threadIdx.x % 128, warp = u / 32, g = u % 32 / 4, tq = u % 4;
  const int odd = g % 2;
  // This lane's two values (tokens t and t + 1 of one line) to the pair the lane stores.
  auto paired = [odd](float v0, float v1) {
    const float other = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
    return odd ? make_float2(other, v1) : make_float2(v0, other);
  };
#pragma unroll
  for (int j = 0; j < kTokens / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 4 * j + 2 * h, token = 8 * j + 2 * tq + odd, line = 16 * warp + g + 8 * h - odd;
      const int64_t row = first + token;
      if constexpr (P == Projection::kDown) {
        const float2 lows = paired(low[i], low[i + 1]), highs = paired(high[i], high[i + 1]);
        if (token < rows) {
          const int64_t feature = slice * kLines + line0 + line;
          moe_grouped::store_out_pair(a, row * a.rows_per_expert + feature, lows.x, lows.y);
          moe_grouped::store_out_pair(a, row * a.rows_per_expert + feature + 64, highs.x, highs.y);
        }
      } else {
        const float2 act = paired(silu_mul(low[i], high[i]), silu_mul(low[i + 1], high[i + 1]));
        if (token < rows)
          *reinterpret_cast<uint32_t*>(a.act + row * a.inter + slice * (kLines / 2) + line0 / 2 + line) =
              pack_bf16_pair(act.x, act.y);
      }
    }
}

// A consumer with no part in the unit (the second of an odd last tile of 64 rows or fewer, against
// half the lines) still hands each stage back, as the barriers count it (`ring` as consume_steps').
template <bool kPaired, int kStages>
__device__ __forceinline__ void pass_steps(uint32_t full, uint32_t empty, int steps, int ring) {
  for (int step = ring; step < ring + steps; ++step) {
    const int stage = step % kStages;
    pipeline::barrier_wait(full + 8 * stage, (step / kStages) & 1);
    pipeline::release_stage<kPaired, kPairBlocks>(empty + 8 * stage);
  }
}

// The bf16 producer warpgroup's steps: the tile's token rows by cp.async (moe_grouped::TokenCopies),
// and the weight lines by TMA from thread 0 (moe_grouped::copy_weight_boxes): the stage's four
// 64-line boxes (stage lines 64 b ..: moe_grouped::slice_line_of) into this block; kPaired, this
// block's half of them into both blocks of the pair (`rank`: this block's in the pair), or
// (`half` >= 0, an odd last tile) the two boxes of that half of the lines into this block alone.
// An H100 run, GLM-5.2 width, 3 layers (bench/results/cuda-fp8-wide-experts-20261206.json,
// `bf16_weights_by_tma`): experts of a prefill 14.18 -> 13.28 ms at 2048 tokens, 15.35 -> 14.94
// at 4096, 20.73 / 21.39 -> 20.26 / 19.69 at 8192, with each producer thread copying its chunks
// of the lines by cp.async before. `ring` as consume_steps'; the caller waits for the last copies
// before it leaves.
template <Projection P, bool kPaired>
__device__ __forceinline__ void produce(const GroupedArgs& a, const CUtensorMap& weight_map, int e, int first,
                                        int rows, int64_t slice, uint32_t stages, uint32_t full, uint32_t empty,
                                        int steps, int rank, int half, int ring) {
  constexpr int kStages = Ring<WeightSource::kBf16>::kStages;
  const int index = threadIdx.x % 128;
  const moe_grouped::TokenCopies<P, uint16_t> token_copies(a, index, first, rows);
  auto box_row = [&](int box) {
    return static_cast<int>(moe_grouped::weight_row<P, kLines>(a, e, moe_grouped::slice_line_of<P>(64 * box), slice));
  };
  for (int step = 0; step < steps; ++step) {
    const int stage = (ring + step) % kStages;
    const uint32_t parity = (((ring + step) / kStages) & 1) ^ 1;  // the first round passes
    const uint32_t tokens = stages + stage * kStageBytes, weights = tokens + kTokenBytes;
    const int64_t offset = int64_t{step} * kStepK;
    moe_grouped::copy_weight_boxes<kPaired, kPairBlocks>(weights, weight_map, offset, box_row, full + 8 * stage,
                                                         empty + 8 * stage, parity, index, rank, half);
    token_copies.copy(a, tokens, offset);
    pipeline::barrier_arrive_on_copies(full + 8 * stage);
  }
}

// The MXFP4 producer warpgroup's steps: the token rows as produce's, and the weights from the
// tiled codes. Producer thread p takes chunk t = p % 4 of the 64-byte group of stage lines
// p / 4 + 32 j (j < kItems): 16 bytes, word w of which is values 32 w + 8 t .. + 7 of the group's
// 128. It copies them, as two halves of 8 bytes (words 2 h and 2 h + 1: the values of step
// 2 g + h of group g), and the line's scale word into the codes' ring kCodeGroups groups of 128 k
// ahead; at step 2 g + h it widens half h into the stage, where its two words are chunks t and
// 4 + t of the line's 64 values. Few registers (ptxas holds this warpgroup to
// kProducerRegisters): item j's weight row is a fixed number of rows after item 0's, and the ring
// is read again at each step rather than kept. `ring` as consume_steps' (the codes' ring starts
// over each tile: its copies are all waited for at its end).
template <Projection P>
__device__ __forceinline__ void produce_mxfp4(const GroupedArgs& a, int e, int first, int rows, int64_t slice,
                                              const wgmma::AlignedShared& shared, uint32_t full, uint32_t empty,
                                              int steps, int ring) {
  using R = Ring<WeightSource::kMxfp4>;
  const int p = static_cast<int>(threadIdx.x) % 128, t = p % 4, line0 = p / 4;
  const int64_t k = a.k;
  const moe_grouped::TokenCopies<P, uint16_t> token_copies(a, p, first, rows);
  const int64_t row0 = moe_grouped::weight_row<P, kLines>(a, e, moe_grouped::slice_line_of<P>(line0), slice);
  const uint8_t* const codes0 = a.codes + quant::mxfp4_tile_row_offset(row0, k) + 16 * t;
  const uint8_t* const scales0 = a.scales + 4 * quant::mxfp4_tile_scale_word(row0, k);
  // Rows from item 0's to item j's (slice_line_of): gate/up, box j / 2 holds gate (even) or up
  // (odd) rows of the features 64 (j / 4) .., and j % 2 the second 32 of them; down, 32 j. Every
  // one a multiple of 16, so a whole number of fragments in the tiled codes and scales.
  auto rows_on = [&](int j) -> int64_t {
    return P == Projection::kGateUp ? (j / 2 % 2) * a.inter + 64 * (j / 4) + 32 * (j % 2) : 32 * j;
  };
  const uint32_t code_ring = shared.address + R::kStages * kStageBytes;
  const uint8_t* const code_ring_generic = shared.generic + R::kStages * kStageBytes;
  // Slot layout: codes [j][h][p] 8 bytes, then scale words [j][p] (lanes read consecutive words).
  auto code_at = [](int j, int h, int thread) { return ((2 * j + h) * kProducerThreads + thread) * 8; };
  auto scale_at = [](int j, int thread) { return R::kCodeBytes + (j * kProducerThreads + thread) * 4; };
  const int groups = steps / 2;
  // Group g's copies into its slot, one commit group (empty past the last group, so that the
  // groups stay counted one a group).
  auto copy_group = [&](int g) {
    if (g < groups) {
      const uint32_t slot = code_ring + (g % R::kCodeGroups) * R::kCodeGroupBytes;
#pragma unroll
      for (int j = 0; j < R::kItems; ++j) {
        const uint8_t* const codes = codes0 + rows_on(j) * (k / 2) + g * quant::kMxfp4TileStepBytes;
        wgmma::copy_async_8(slot + code_at(j, 0, p), codes);
        wgmma::copy_async_8(slot + code_at(j, 1, p), codes + 8);
        wgmma::copy_async_4(
            slot + scale_at(j, p),
            scales0 + 4 * (rows_on(j) * (k / quant::kMxfp4TileValues) + g * quant::kMxfp4TileScaleStepWords), 4);
      }
    }
    wgmma::copy_async_commit();
  };
  for (int g = 0; g < R::kCodeGroups; ++g) copy_group(g);
  for (int g = 0; g < groups; ++g) {
    // Group g's codes are in (kCodeGroups - 1 later groups may still be in flight).
    wgmma::copy_async_wait<R::kCodeGroups - 1>();
    const uint8_t* const slot = code_ring_generic + (g % R::kCodeGroups) * R::kCodeGroupBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int step = 2 * g + h, stage = (ring + step) % R::kStages;
      pipeline::barrier_wait(empty + 8 * stage, (((ring + step) / R::kStages) & 1) ^ 1);  // the first round passes
      token_copies.copy(a, shared.address + stage * kStageBytes, int64_t{step} * kStepK);
      pipeline::barrier_arrive_on_copies(full + 8 * stage);
      // The step's words and scale codes first, then one branch for all of them (so that the
      // items' loads, widening and stores interleave).
      uint2 words[R::kItems];
      uint32_t scale_codes[R::kItems], large_scales = 0;
#pragma unroll
      for (int j = 0; j < R::kItems; ++j) {
        words[j] = *reinterpret_cast<const uint2*>(slot + code_at(j, h, p));
        scale_codes[j] = *reinterpret_cast<const uint32_t*>(slot + scale_at(j, p));
        large_scales |= moe_grouped::scale_codes_above_128(scale_codes[j]);
      }
      uint8_t* const weights = shared.generic + stage * kStageBytes + kTokenBytes;
      auto widen_step = [&](auto one_multiply) {
#pragma unroll
        for (int j = 0; j < R::kItems; ++j) {
          const int line = line0 + 32 * j;
          const uint32_t low_code = (scale_codes[j] >> (16 * h)) & 0xffu;
          const uint32_t high_code = (scale_codes[j] >> (16 * h + 8)) & 0xffu;
          *reinterpret_cast<uint4*>(weights + swizzled(line, t)) =
              moe_grouped::widen_mxfp4_word<decltype(one_multiply)::value>(words[j].x, low_code);
          *reinterpret_cast<uint4*>(weights + swizzled(line, 4 + t)) =
              moe_grouped::widen_mxfp4_word<decltype(one_multiply)::value>(words[j].y, high_code);
        }
      };
      // Checkpoints' scales are small (codes under 128 for weights under 2): the warp takes the
      // one-multiply widening unless one of its scale codes is above 128.
      if (__any_sync(0xffffffffu, large_scales != 0)) widen_step(std::false_type{});
      else widen_step(std::true_type{});
      // No proxy fence here: the consumer's, after it acquires the stage, orders these stores before
      // its wgmma as it does the cp.async writes (a fence here cost 5% at 2048 tokens).
      pipeline::barrier_arrive(full + 8 * stage);
    }
    copy_group(g + R::kCodeGroups);  // into the slot just widened
  }
  wgmma::copy_async_wait<0>();
}

// A consumer warpgroup's part of a tile (`ring` as consume_steps'): its rows against all 256 lines,
// or (a tile of 64 rows or fewer) rows 0..63 against its half of the lines (32 rows or fewer: its
// half of the lines against the rows, multiply_steps_by_lines), or (against half the slice's
// lines) consumer 0 alone, consumer 1 only handing the stages back; then its sums' store.
template <Projection P, bool kPaired, int kStages>
__device__ __forceinline__ void consume_tile(const GroupedArgs& a, const moe_grouped::RowTile& tile, uint32_t stages,
                                             uint32_t full, uint32_t empty, int steps, int consumer, int ring) {
  // Broadcast from lane 0, so that the compiler sees each branch taken by whole warps.
  const bool short_tile = __shfl_sync(0xffffffffu, tile.rows <= 64 ? 1 : 0, 0) != 0;
  const int half = __shfl_sync(0xffffffffu, tile.half, 0);
  // A tile of 32 rows or fewer: its tokens as the multiplies' columns (multiply_steps_by_lines).
  const int tokens_as_columns = __shfl_sync(0xffffffffu, tile.rows <= 16 ? 16 : tile.rows <= 32 ? 32 : 0, 0);
  const int slice_line0 = half < 0 ? 0 : (kLines / 2) * half;
  const int64_t slice = tile.slice;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  if (half < 0 && !short_tile) {
    const ConsumerPart part{64 * consumer, 0, 0};
    multiply_steps<kLines, kPaired, kStages>(acc, stages, full, empty, steps, part, ring);
    store_tile<P, kLines>(a, acc, part, tile.first, tile.rows, slice);
  } else if (half >= 0 && short_tile && consumer == 1) {
    pass_steps<kPaired, kStages>(full, empty, steps, ring);
  } else if (half < 0 && tokens_as_columns > 0) {
    auto by_lines = [&](auto tokens) {
      constexpr int kTokens = decltype(tokens)::value;
      float(&low)[kTokens / 2] = reinterpret_cast<float(&)[kTokens / 2]>(acc[0]);
      float(&high)[kTokens / 2] = reinterpret_cast<float(&)[kTokens / 2]>(acc[64]);
      const int line0 = (kLines / 2) * consumer;
      multiply_steps_by_lines<kTokens, kPaired, kStages>(low, high, stages, full, empty, steps, line0, ring);
      store_tile_by_lines<P, kTokens>(a, low, high, line0, tile.first, tile.rows, slice);
    };
    if (tokens_as_columns == 16) by_lines(std::integral_constant<int, 16>{});
    else by_lines(std::integral_constant<int, 32>{});
  } else {
    const int line0 = half < 0 ? (kLines / 2) * consumer : 0;
    const ConsumerPart part{short_tile ? 0 : 64 * consumer, line0, slice_line0 + line0};
    multiply_steps<kLines / 2, kPaired, kStages>(acc, stages, full, empty, steps, part, ring);
    store_tile<P, kLines / 2>(a, acc, part, tile.first, tile.rows, slice);
  }
}

// kSet kPairs (bf16 only): launched in clusters of kPairBlocks blocks, the pair's two row tiles of
// one expert and slice, each block loading half the weight lines into both (an L2 read of 32 KB a
// step instead of 48: the GEMM at 8192 tokens is bound by L2 throughput), or an odd last tile,
// each block against half the lines. weight_map: the stacked bf16 weights [experts x
// rows_per_expert, k] in 64-line boxes (swizzled_rows_tensor_map; unused for MXFP4).
template <Projection P, moe_tiles::TileSet kSet, WeightSource W>
__global__ void __launch_bounds__(kThreads, 1)
    specialized_experts_kernel(GroupedArgs a, const __grid_constant__ CUtensorMap weight_map) {
  chained_grid_prologue();
  using R = Ring<W>;
  constexpr bool kPaired = kSet == moe_tiles::TileSet::kPairs;
  static_assert(!kPaired || !R::kMxfp4, "MXFP4 row tiles are not paired");
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const int unit = static_cast<int>(blockIdx.x) / (kPaired ? kPairBlocks : 1);
  const int rank = kPaired ? static_cast<int>(blockIdx.x) % kPairBlocks : 0;  // the cluster's rank along x
  const moe_grouped::RowTile tile =
      moe_grouped::unit_of_block<kRows, kThreads, kSet>(a.offsets, a.num_experts, unit, a.slices, rank);
  if (tile.expert < 0) return;  // both blocks of a pair alike
  const int e = tile.expert, first = tile.first, rows = tile.rows;
  const int64_t slice = tile.slice;
  const wgmma::AlignedShared shared = wgmma::align_to_1024(shared_raw);
  const uint32_t stages = shared.address;
  const uint32_t barriers = stages + R::kBarrierOffset;
  const uint32_t full = barriers, empty = barriers + 8 * R::kStages;  // copies landed; consumers done
  // Full: each producer thread's cp.async arrival (MXFP4: and its arrival once it has widened;
  // bf16: and thread 0's announcement of the TMA bytes). Empty: each consumer thread (paired: each
  // consumer warp of both blocks) once.
  const int full_count = R::kMxfp4 ? 2 * kProducerThreads : kProducerThreads + 1;
  pipeline::init_ring<R::kStages, kPaired>(full, empty, full_count,
                                           kPaired ? kPairBlocks * kConsumerThreads / 32 : kConsumerThreads);
  const int steps = static_cast<int>(a.k / kStepK);
  // Broadcast from lane 0: the compiler then knows each warp takes one side of the branch (wgmma
  // on a path it thinks divergent are serialised).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);

  if (warpgroup >= 2) {
    pipeline::shrink_registers<R::kProducerRegisters>();
    if constexpr (R::kMxfp4) {
      produce_mxfp4<P>(a, e, first, rows, slice, shared, full, empty, steps, 0);
    } else {
      produce<P, kPaired>(a, weight_map, e, first, rows, slice, stages, full, empty, steps, rank, tile.half, 0);
      wgmma::copy_async_wait<0>();
    }
  } else {
    pipeline::grow_registers<R::kConsumerRegisters>();
    consume_tile<P, kPaired, R::kStages>(a, tile, stages, full, empty, steps, warpgroup, 0);
  }
  // Neither block of a pair leaves while the other may still copy into its stages or arrive on
  // its barriers.
  if constexpr (kPaired) pipeline::cluster_sync();
}

// The persistent launch (SpecializedTiles::kPersistent, unpaired): as many blocks as SMs, each
// claiming unit after unit (unit_of_block's numbering) from `counters`
// (moe_grouped::claim_tile: in unit order, so that an expert slice's row tiles run side by side
// and share its weight lines in L2), its ring running on from one tile to the next, so that a
// tile's first stages land while the consumers store the last one's sums. Shared memory after
// the ring's barriers: the claims, then expert_first_units' table.
template <Projection P, WeightSource W>
__global__ void __launch_bounds__(kThreads, 1)
    persistent_experts_kernel(GroupedArgs a, const __grid_constant__ CUtensorMap weight_map, int* counters) {
  chained_grid_prologue();
  using R = Ring<W>;
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const wgmma::AlignedShared shared = wgmma::align_to_1024(shared_raw);
  const uint32_t stages = shared.address;
  const uint32_t full = stages + R::kBarrierOffset, empty = full + 8 * R::kStages;
  constexpr int kClaimsAt = R::kBarrierOffset + 2 * R::kStages * 8;
  auto* const claims = reinterpret_cast<moe_grouped::TileClaims*>(shared.generic + kClaimsAt);
  const uint32_t claims_address = shared.address + kClaimsAt;
  moe_grouped::init_tile_claims(claims_address, kConsumerThreads);
  // As specialized_experts_kernel's barriers.
  pipeline::init_ring<R::kStages, false>(full, empty, R::kMxfp4 ? 2 * kProducerThreads : kProducerThreads + 1,
                                         kConsumerThreads);
  int* const first_unit = reinterpret_cast<int*>(shared.generic + kClaimsAt + moe_grouped::kTileClaimsBytes);
  moe_grouped::expert_first_units<kRows, kThreads>(a.offsets, a.num_experts, a.slices, first_unit);
  const int units = first_unit[a.num_experts];
  const int steps = static_cast<int>(a.k / kStepK);
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (warpgroup == 2) {
    pipeline::shrink_registers<R::kProducerRegisters>();
    moe_grouped::produce_claimed_tiles<kRows>(
        a, claims, claims_address, counters, first_unit, units, steps, [&](const moe_grouped::RowTile& tile, int ring) {
          if constexpr (R::kMxfp4)
            produce_mxfp4<P>(a, tile.expert, tile.first, tile.rows, tile.slice, shared, full, empty, steps, ring);
          else
            produce<P, false>(a, weight_map, tile.expert, tile.first, tile.rows, tile.slice, stages, full, empty,
                              steps, 0, -1, ring);
        });
    wgmma::copy_async_wait<0>();
  } else {
    pipeline::grow_registers<R::kConsumerRegisters>();
    moe_grouped::consume_claimed_tiles(claims, claims_address, steps, [&](const moe_grouped::RowTile& tile, int ring) {
      consume_tile<P, false, R::kStages>(a, tile, stages, full, empty, steps, warpgroup, ring);
    });
  }
}

// A block a unit of moe_grouped::unit_of_block: an expert's row tiles of one output slice come
// one after another, so that the blocks reading the same weight lines run at about the same time
// and share them in L2 (taken by row tile, then slice, the gate/up launch at 8192 tokens read its
// weights from DRAM 1.4 times). `units`: at least the set's units in one slice.
template <Projection P, moe_tiles::TileSet kSet, WeightSource W>
void launch_projection(GroupedArgs a, const CUtensorMap& weight_map, int64_t features, int64_t units,
                       cudaStream_t stream) {
  using R = Ring<W>;
  constexpr unsigned kCluster = kSet == moe_tiles::TileSet::kPairs ? kPairBlocks : 1;
  auto* kernel = specialized_experts_kernel<P, kSet, W>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, R::kSharedBytes),
        "moe_experts_specialized shared memory");
  const int64_t per_block = P == Projection::kGateUp ? kLines / 2 : kLines;
  a.slices = static_cast<int>(features / per_block);
  const int64_t blocks = units * a.slices * kCluster;
  GLMS_CHECK(blocks < (int64_t{1} << 31), "moe_experts_specialized: too many pairs for one launch");
  launch_chained_clusters("moe_experts_specialized launch", kernel, kCluster, static_cast<unsigned>(blocks),
                          kThreads, R::kSharedBytes, stream, a, weight_map);
}

// The persistent launch: a block an SM at most, claiming the units from `counters`.
template <Projection P, WeightSource W>
void launch_persistent(GroupedArgs a, const CUtensorMap& weight_map, int64_t features, int64_t units,
                       const PersistentLaunch& persistent, cudaStream_t stream) {
  using R = Ring<W>;
  auto* kernel = persistent_experts_kernel<P, W>;
  const int64_t per_block = P == Projection::kGateUp ? kLines / 2 : kLines;
  a.slices = static_cast<int>(features / per_block);
  const moe_grouped::PersistentGrid grid = moe_grouped::persistent_grid(
      "moe_experts_specialized (persistent)", R::kSharedBytes, a.num_experts, units * a.slices, persistent);
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, grid.shared_bytes),
        "moe_experts_specialized (persistent) shared memory");
  launch_chained("moe_experts_specialized (persistent) launch", kernel, grid.blocks, kThreads, grid.shared_bytes,
                 stream, a, weight_map, persistent.unit_counters);
}

// One projection over every row tile: a block a tile, or (bf16) clusters of two blocks on the
// pairs of row tiles and the odd last tiles, or a block an SM claiming tile after tile.
template <Projection P, WeightSource W>
void run_projection(const GroupedArgs& a, int64_t features, int64_t num_pairs, SpecializedTiles tiles,
                    const PersistentLaunch& persistent, cudaStream_t stream) {
  using moe_tiles::TileSet;
  const TileSet set = tiles == SpecializedTiles::kPaired ? TileSet::kPairs : TileSet::kEvery;
  const int64_t units = moe_tiles::units_bound(set, num_pairs, a.num_experts, kRows);
  if constexpr (W == WeightSource::kBf16) {
    // The stacked weights [experts x rows_per_expert, k] in 64-line boxes.
    const CUtensorMap map = swizzled_rows_tensor_map(a.weights, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                                     int64_t{a.num_experts} * a.rows_per_expert, a.k, 64);
    if (tiles == SpecializedTiles::kPaired) launch_projection<P, TileSet::kPairs, W>(a, map, features, units, stream);
    else if (tiles == SpecializedTiles::kPersistent)
      launch_persistent<P, W>(a, map, features, units, persistent, stream);
    else launch_projection<P, TileSet::kEvery, W>(a, map, features, units, stream);
    return;
  }
  const CUtensorMap unused{};  // MXFP4's producer copies the codes itself
  if (tiles == SpecializedTiles::kPersistent) launch_persistent<P, W>(a, unused, features, units, persistent, stream);
  else launch_projection<P, TileSet::kEvery, W>(a, unused, features, units, stream);
}

// Both projections, or one; `a` holds the plan and the outputs.
// (persistent: down claims from the same counters, which gate/up's last block set back to zero
// before down's blocks read them)
template <WeightSource W>
void run_projections(const GroupedArgs& a, const uint16_t* x, const ExpertWeights& experts, int64_t hidden,
                     int64_t inter, int64_t num_pairs, SpecializedTiles tiles, const PersistentLaunch& persistent,
                     ExpertProjections projections, cudaStream_t stream) {
  if (projections != ExpertProjections::kDown)
    run_projection<Projection::kGateUp, W>(moe_grouped::gate_up_projection(a, x, experts, hidden, inter), inter,
                                           num_pairs, tiles, persistent, stream);
  if (projections != ExpertProjections::kGateUp)
    run_projection<Projection::kDown, W>(moe_grouped::down_projection(a, experts, hidden, inter), hidden, num_pairs,
                                         tiles, persistent, stream);
}

}  // namespace

bool moe_experts_specialized_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter) {
  const bool weights = experts.format == WeightFormat::Plain ||
                       (experts.format == WeightFormat::Mxfp4 && experts.mxfp4_tiled);
  return weights && hidden % kLines == 0 && inter % (kLines / 2) == 0 && hidden % kStepK == 0 &&
         inter % kStepK == 0;
}

void moe_experts_specialized(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                             const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, uint16_t* act,
                             ExpertSums expert_out, cudaStream_t stream, SpecializedTiles tiles,
                             const PersistentLaunch& persistent, ExpertProjections projections) {
  if (num_pairs <= 0 || num_experts <= 0) return;
  GLMS_CHECK(moe_experts_specialized_supported(experts, hidden, inter),
             "moe_experts_specialized: bf16 or tiled MXFP4 experts with hidden a multiple of 256 and inter of 128");
  GLMS_CHECK(num_pairs * std::max(hidden, inter) / 8 < (int64_t{1} << 32),
             "moe_experts_specialized: too many pairs for one launch");
  const GroupedArgs a = moe_grouped::grouped_args(plan, num_experts, top_k, inter, act, expert_out);
  if (experts.format == WeightFormat::Plain) {
    run_projections<WeightSource::kBf16>(a, x, experts, hidden, inter, num_pairs, tiles, persistent, projections,
                                         stream);
  } else {
    GLMS_CHECK(tiles != SpecializedTiles::kPaired, "moe_experts_specialized: MXFP4 row tiles are not paired");
    run_projections<WeightSource::kMxfp4>(a, x, experts, hidden, inter, num_pairs, tiles, persistent, projections,
                                          stream);
  }
}

void moe_experts_widened(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                         const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, uint16_t* widened,
                         uint16_t* act, ExpertSums expert_out, cudaStream_t stream, SpecializedTiles tiles,
                         const PersistentLaunch& persistent) {
  if (num_pairs <= 0 || num_experts <= 0) return;
  ExpertWeights bf16;  // gate/up, then down, in the same bytes
  bf16.gate_up = widened;
  bf16.down = widened;
  dequantize_experts(experts, 0, num_experts, hidden, inter, widened, nullptr, stream);
  moe_experts_specialized(x, hidden, inter, bf16, plan, num_experts, top_k, num_pairs, act, expert_out, stream, tiles,
                          persistent, ExpertProjections::kGateUp);
  dequantize_experts(experts, 0, num_experts, hidden, inter, nullptr, widened, stream);
  moe_experts_specialized(x, hidden, inter, bf16, plan, num_experts, top_k, num_pairs, act, expert_out, stream, tiles,
                          persistent, ExpertProjections::kDown);
}

}  // namespace glms::ops::cuda
