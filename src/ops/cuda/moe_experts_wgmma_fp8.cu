// Block-FP8 routed experts of prefill-sized batches on Hopper's FP8 warpgroup tensor cores
// (W8A8, as DeepSeek-V3 and GLM-5-FP8 are served): the tokens are quantised to E4M3 with one
// scale a row and 128 k (quantize_fp8_rows), the expert weights are the checkpoint's E4M3 codes
// with their 128 x 128 block scales, and each projection is one grouped GEMM over the plan's
// pairs; SwiGLU in the gate/up epilogue writes bf16 act, quantised again for down (the 256-line
// tiles quantise act in that epilogue: quantized_act_epilogue).
//
// Why this shape: a block takes 128 grouped rows of one expert and 128 weight lines
// (moe_grouped.cuh's TileLayout<128>: for gate/up 64 gate rows and the matching 64 up rows).
// One step is 128 k: a 128-byte line a row, one scale a token row and one a weight line, so
// each step's wgmma sums (four m64n128k32 a warpgroup) are scaled and added into the fp32
// accumulator in registers ("promotion": the tensor cores' own FP8 sums keep fewer bits, so
// they never run past one scale block). Measured on the H200 (GLM-5.2 width, prefill 8192),
// neither of two ways of hiding the promotion behind the tensor cores paid: a second step
// accumulator (ptxas then serialised every wgmma) or the two warpgroups half a step apart
// (43.8 against 44.2 ms of experts).
// The weight scales are uniform over a 128-line block (a checkpoint's block grid), so a thread
// needs one weight scale a step for its gate lines and one for its up lines (down: one).
//
// Shared memory (128-byte swizzle, wgmma.cuh), kStages stages of
//   tokens  [128 rows] lines of 128 codes
//   weights [128 features] lines of 128 codes
//   token scales [128] fp32
// filled by cp.async kStages - 1 steps ahead.
//
// The warp-specialised version (Fp8ExpertGemm::kWarpSpecialized, the second kernel below) takes
// the same tiles and stages, but a third warpgroup copies them, completing a transaction barrier
// a stage, and each consumer warpgroup waits only for its stage and hands it back once its wgmma
// have read it: no block-wide barrier a step, the copies issued by warps that do nothing else,
// and one consumer's promotion running while the other's wgmma do (the first kernel is
// issue-bound: its every warp copies, waits at the step's barrier, multiplies and promotes in
// turn).
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/linear_fp8.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_grouped.cuh"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/tensor_map.h"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda {

namespace {

using moe_grouped::GroupedArgs;
using moe_grouped::kThreads;
using moe_grouped::Projection;
using wgmma::descriptor;
using wgmma::swizzled;

constexpr int kRows = 128;
using Layout = moe_grouped::TileLayout<kRows>;
constexpr int kStepValues = static_cast<int>(kFp8ScaleBlock);  // 128 k: one line of codes a row
constexpr int kLine = wgmma::kLineBytes;
static_assert(kStepValues == kLine, "a step is one 128-byte line of E4M3 codes");
constexpr int kTileBytes = kRows * kLine;          // 128 lines; also the 128 weight lines
constexpr int kScalesOffset = 2 * kTileBytes;      // the stage's token scales
constexpr int kStageBytes = 2 * kTileBytes + 1024;  // token scales (512 bytes), stages 1024-aligned
constexpr int kStages = (232448 - 1024) / kStageBytes;  // 6
constexpr int kSharedBytes = 1024 + kStages * kStageBytes;
constexpr int kCopies = kRows * (kLine / 16) / kThreads;  // 16-byte chunks a thread a step, of each operand

// A stage's four m64n128k32 into part (64 token rows against 128 weight lines of 128 k; the
// descriptors of stage 0's rows and lines, stage_offset the stage's bytes / 16), committed.
__device__ __forceinline__ void multiply_stage(float (&part)[64], uint64_t token_descriptor, uint64_t weight_descriptor,
                                               uint64_t stage_offset) {
  wgmma::pin(part);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kStepValues / 32; ++kk)
    wgmma::m64n128k32_e4m3(part, token_descriptor + stage_offset + 2 * kk, weight_descriptor + stage_offset + 2 * kk,
                           kk);
  wgmma::commit();
}

// acc += part x token scale x weight scale, the promotion of a step's FP8 sums. part[4 j + q]:
// row 16 warp + g + 8 (q / 2) of the warpgroup's (token scales t0, t1), line 8 j + ..: j < 8 the
// gate lines (gate_scale), the rest the up lines (up_scale; down: the same scale for all).
__device__ __forceinline__ void promote(float (&acc)[64], const float (&part)[64], float t0, float t1, float gate_scale,
                                        float up_scale) {
  const float s[2][2] = {{t0 * gate_scale, t1 * gate_scale}, {t0 * up_scale, t1 * up_scale}};
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[4 * j + q] = fmaf(part[4 * j + q], s[j / 8][q / 2], acc[4 * j + q]);
}

template <Projection P>
__global__ void __launch_bounds__(kThreads, 1) fp8_grouped_experts_kernel(GroupedArgs a) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const moe_grouped::RowTile tile = moe_grouped::row_tile_of_block<kRows, kThreads>(a.offsets, a.num_experts);
  if (tile.expert < 0) return;
  const int e = tile.expert, first = tile.first, rows = tile.rows;

  const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
  const uint32_t stages = aligned.address;
  uint8_t* const stages_generic = aligned.generic;

  const int wg = threadIdx.x / 128, u = threadIdx.x % 128, warp = u / 32, g = (u % 32) / 4;
  const int64_t k = a.k;
  const int steps = static_cast<int>(k / kStepValues);
  constexpr int kHalf = Layout::kFeatures / 2;  // gate/up: lines 0..63 gate rows, 64..127 up rows
  auto weight_row = [&](int line) { return moe_grouped::weight_row<P, Layout::kFeatures>(a, e, line); };
  // The source row (token, or grouped pair for down) of tile row r, -1 past the tile's rows.
  auto source_of = [&](int r) -> int32_t {
    return r >= rows ? -1 : P == Projection::kGateUp ? a.sorted_pairs[first + r] / a.top_k : first + r;
  };
  // The loop issues few instructions a step (the kernel is issue-bound): each copy's source is a
  // pointer that advances a line a step, the stages and matrix descriptors advance by additions.
  // This thread copies chunk c of token rows and weight lines threadIdx.x / 8 + 32 i (rows past
  // the tile's: zeros, from a valid address), and (the first 128 threads) row threadIdx.x's scale.
  const int c = threadIdx.x % 8;
  const uint8_t* token_from[kCopies];
  const uint8_t* weight_from[kCopies];
  int token_bytes[kCopies];
  uint32_t line_offset[kCopies];  // in a stage
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const int r = threadIdx.x / 8 + 32 * i;
    const int32_t source = source_of(r);
    token_from[i] = a.x_codes + (source < 0 ? 0 : source * k) + 16 * c;
    token_bytes[i] = source < 0 ? 0 : 16;
    weight_from[i] = a.codes + weight_row(r) * k + 16 * c;
    line_offset[i] = swizzled(r, c);
  }
  const int32_t scale_source = threadIdx.x < kRows ? source_of(threadIdx.x) : -1;
  const float* scale_from = a.x_scales + (scale_source < 0 ? 0 : scale_source);
  const int scale_bytes = scale_source < 0 ? 0 : 4;
  int issued = 0, issue_stage = 0;  // steps whose copies are issued; the stage of the next
  // The copies of the next step into its stage, one commit group (empty past the last step, so
  // that the groups stay counted one a step).
  auto issue_copies = [&]() {
    if (issued < steps) {
      const uint32_t tokens = stages + static_cast<uint32_t>(issue_stage) * kStageBytes, weights = tokens + kTileBytes;
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        wgmma::copy_async_16(tokens + line_offset[i], token_from[i], token_bytes[i]);
        wgmma::copy_async_16(weights + line_offset[i], weight_from[i], 16);
        token_from[i] += kStepValues;
        weight_from[i] += kStepValues;
      }
      if (threadIdx.x < kRows) wgmma::copy_async_4(tokens + kScalesOffset + 4 * threadIdx.x, scale_from, scale_bytes);
      scale_from += a.x_scale_stride;
      ++issued;
      issue_stage = issue_stage + 1 == kStages ? 0 : issue_stage + 1;
    }
    wgmma::copy_async_commit();
  };
  // The weight scales of a step: this block's gate lines' and up lines' (down: one for all).
  const float* gate_scales = a.weight_scales + weight_row(0) * steps;
  const float* up_scales = a.weight_scales + weight_row(P == Projection::kGateUp ? kHalf : 0) * steps;

  // Each step's FP8 sums in part, promoted into acc.
  float acc[1][64], part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[0][i] = 0.0f;
  const int row = wg * Layout::kGroupRow0 + 16 * warp + g;
  // Stage 0's descriptors; a stage and 32 k further on add their byte offsets / 16 (the start
  // address field, which shared addresses under 256 KB never carry out of).
  const uint64_t token_descriptor = descriptor(stages + wg * Layout::kGroupRow0 * kLine, 16, 1024);
  const uint64_t weight_descriptor = descriptor(stages + kTileBytes, 16, 1024);
  for (int i = 0; i + 1 < kStages; ++i) issue_copies();
  int cur = 0;
  for (int step = 0; step < steps; ++step) {
    wgmma::copy_async_wait<kStages - 2>();  // this step's group; later steps' may be in flight
    wgmma::fence_async_proxy();
    __syncthreads();  // this step's operands are in; both warpgroups finished the last step
    issue_copies();   // step + kStages - 1, into the stage the last step read
    const float gate_scale = __ldg(gate_scales + step);
    const float up_scale = P == Projection::kGateUp ? __ldg(up_scales + step) : gate_scale;
    multiply_stage(part, token_descriptor, weight_descriptor, static_cast<uint64_t>(cur * kStageBytes) >> 4);
    const float* token_scales = reinterpret_cast<const float*>(stages_generic + cur * kStageBytes + kScalesOffset);
    const float t0 = token_scales[row], t1 = token_scales[row + 8];
    cur = cur + 1 == kStages ? 0 : cur + 1;
    wgmma::wait_all();
    wgmma::pin(part);
    promote(acc[0], part, t0, t1, gate_scale, up_scale);
  }
  moe_grouped::epilogue<P, kRows>(a, acc[0], first, rows, stages_generic);
}

// The warp-specialised kernel: warpgroups 0 and 1 multiply (rows 64 w .. of the tile, as the
// kernel above), warpgroup 2 copies.
namespace specialized {

constexpr int kThreads = 384;
constexpr int kConsumerThreads = 256;
constexpr int kStages = 6;
constexpr int kSharedBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;  // then the full and empty barriers
static_assert(kSharedBytes <= 232448, "one block an SM");
constexpr int kConsumerRegisters = 200, kProducerRegisters = 72;  // no spills either side
// setmaxnreg moves registers inside the block's launch allotment (kEntryRegisters a thread): the
// consumers can grow by no more than the producer gives up, or they wait for ever.
constexpr int kEntryRegisters = 65536 / kThreads / 8 * 8;  // 168
static_assert(kConsumerThreads * (kConsumerRegisters - kEntryRegisters) <=
                  128 * (kEntryRegisters - kProducerRegisters),
              "the consumers' registers come from the producer's");
constexpr int kProducerCopies = kRows * (kLine / 16) / 128;  // 8: a producer thread's chunks a step, of each operand

// The producer warpgroup: thread t copies 16-byte chunk t % 8 of token rows and weight lines
// t / 8 + 16 i (token rows past the tile's are not copied: their products are never stored) and
// the scale of token row t, then arrives on the stage's full barrier once its copies land.
template <Projection P>
__device__ __forceinline__ void produce(const GroupedArgs& a, int e, int first, int rows, int64_t slice,
                                        uint32_t stages, uint32_t full, uint32_t empty, int steps) {
  using TokenCopies = moe_grouped::TokenCopies<P, uint8_t>;
  const int index = threadIdx.x % 128, chunk = index % 8, line0 = index / 8;
  const int64_t k = a.k;
  const TokenCopies token_copies(a, index, first, rows);
  const int32_t scale_source = TokenCopies::source_row(a, first, rows, index);
  const float* scale_from = a.x_scales + (scale_source < 0 ? 0 : scale_source);
  // Lines 0..63 and 64..127 of the block (gate/up: its gate rows and their up rows; down: two
  // runs of 64 output features), each advanced by whole 16-line groups.
  const uint8_t* const lower =
      a.codes + moe_grouped::weight_row<P, Layout::kFeatures>(a, e, line0, slice) * k + 16 * chunk;
  const uint8_t* const upper =
      a.codes + moe_grouped::weight_row<P, Layout::kFeatures>(a, e, line0 + Layout::kFeatures / 2, slice) * k +
      16 * chunk;
  const int64_t lines16 = 16 * k;
  for (int step = 0; step < steps; ++step) {
    const int stage = step % kStages;
    pipeline::barrier_wait(empty + 8 * stage, ((step / kStages) & 1) ^ 1);  // the first round passes
    const uint32_t tokens = stages + stage * kStageBytes, weights = tokens + kTileBytes;
    const int64_t offset = int64_t{step} * kStepValues;
    token_copies.copy(a, tokens, offset);
#pragma unroll
    for (int i = 0; i < kProducerCopies; ++i) {
      constexpr int kHalf = kProducerCopies / 2;
      const int upper_half = i / kHalf, group = i % kHalf;
      wgmma::copy_async_16(weights + swizzled(line0 + 64 * upper_half + 16 * group, chunk),
                           (upper_half ? upper : lower) + group * lines16 + offset, 16);
    }
    if (scale_source >= 0)
      wgmma::copy_async_4(tokens + kScalesOffset + 4 * index, scale_from + step * a.x_scale_stride, 4);
    pipeline::barrier_arrive_on_copies(full + 8 * stage);
  }
  wgmma::copy_async_wait<0>();
}

// Consumer warpgroup `consumer`: rows 64 consumer .. of the tile against the block's 128 lines,
// each step's four m64n128k32 into `part`, then promoted into acc.
template <Projection P>
__device__ __forceinline__ void multiply(const GroupedArgs& a, float (&acc)[64], int e, int64_t slice, uint32_t stages,
                                         const uint8_t* stages_generic, uint32_t full, uint32_t empty, int steps,
                                         int consumer) {
  const int u = threadIdx.x % 128, warp = u / 32, g = u % 32 / 4;
  const int row = Layout::kGroupRow0 * consumer + 16 * warp + g;
  const uint64_t token_descriptor = descriptor(stages + Layout::kGroupRow0 * consumer * kLine, 16, 1024);
  const uint64_t weight_descriptor = descriptor(stages + kTileBytes, 16, 1024);
  const float* gate_scales = a.weight_scales + moe_grouped::weight_row<P, Layout::kFeatures>(a, e, 0, slice) * steps;
  const float* up_scales =
      a.weight_scales +
      moe_grouped::weight_row<P, Layout::kFeatures>(a, e, P == Projection::kGateUp ? Layout::kFeatures / 2 : 0, slice) *
          steps;
  float part[64];
  for (int step = 0; step < steps; ++step) {
    const int stage = step % kStages;
    const float gate_scale = __ldg(gate_scales + step);
    const float up_scale = P == Projection::kGateUp ? __ldg(up_scales + step) : gate_scale;
    pipeline::barrier_wait(full + 8 * stage, (step / kStages) & 1);
    wgmma::fence_async_proxy();  // the copies' writes before the tensor cores' reads
    multiply_stage(part, token_descriptor, weight_descriptor, static_cast<uint64_t>(stage * kStageBytes) >> 4);
    const float* token_scales = reinterpret_cast<const float*>(stages_generic + stage * kStageBytes + kScalesOffset);
    const float t0 = token_scales[row], t1 = token_scales[row + 8];
    wgmma::wait_all();
    wgmma::pin(part);
    pipeline::release_stage<false>(empty + 8 * stage);  // its codes and scales are read
    promote(acc, part, t0, t1, gate_scale, up_scale);
  }
}

template <Projection P>
__global__ void __launch_bounds__(kThreads, 1) fp8_specialized_experts_kernel(GroupedArgs a) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const moe_grouped::RowTile tile = moe_grouped::row_tile_of_block<kRows, kThreads>(a.offsets, a.num_experts);
  if (tile.expert < 0) return;
  const int64_t slice = tile.slice;
  const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
  const uint32_t stages = aligned.address;
  const uint32_t full = stages + kStages * kStageBytes, empty = full + 8 * kStages;  // copies landed; consumers done
  // Full: the producer's 128 cp.async arrivals. Empty: each consumer thread once.
  pipeline::init_ring<kStages, false>(full, empty, 128, kConsumerThreads);
  const int steps = static_cast<int>(a.k / kStepValues);
  // Broadcast from lane 0: the compiler then knows each warp takes one side of the branch.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (warpgroup == 2) {
    pipeline::shrink_registers<kProducerRegisters>();
    produce<P>(a, tile.expert, tile.first, tile.rows, slice, stages, full, empty, steps);
  } else {
    pipeline::grow_registers<kConsumerRegisters>();
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    multiply<P>(a, acc, tile.expert, slice, stages, aligned.generic, full, empty, steps, warpgroup);
    moe_grouped::epilogue<P, kRows>(a, acc, tile.first, tile.rows, aligned.generic);
  }
}

}  // namespace specialized

// The warp-specialised kernel over 256 weight lines a block (Fp8ExpertGemm::kWide): the same
// producer and consumers, each step's tile 128 rows x 256 lines, so a block reads 48 KB from L2
// a step for 8.4 MFLOP where the 128-line tile reads 32 KB for 4.2 (the 128-line GEMMs at 8192
// tokens are bound by their copies: on an H100 they alone took 7.0 of the 8.7 ms). The lines are
// four 64-line boxes (moe_grouped::slice_line_of: gate/up, the gate rows of 64 features, their up
// rows, then the next 64 features'; down, 256 output features), so that each 128-line half is
// the 128-line kernel's tile: a consumer takes its 64 rows against each half in turn, four
// m64n128k32 into one step sum promoted into that half's accumulator with the same scales, and the
// sums are the 128-line kernel's bit for bit. Two 64 x 128 accumulators and one step's sums are
// 192 registers (208 a consumer thread in all), where one m64n256 step sum and a 64 x 256
// accumulator would need 256 for the sums alone. A tile of 64 rows or fewer leaves consumer 1
// without rows: it only hands each stage back, and consumer 0 has the tensor cores to itself.
// Unpaired, gate/up leaves act as E4M3 codes (quantized_act_epilogue) and down takes its token
// rows by TMA: with both, the experts of a prefill of 8192 (GLM-5.2 width, 5 layers, FP8, an
// H100) took 26.32 / 26.22 ms against 26.55 / 26.38 without, at 2048 13.82 / 13.81 against
// 14.04 / 14.05, the same sums bit for bit.
//
// Paired (moe_tiles::TileSet::kPairs, as moe_experts_specialized's bf16 tiles): clusters of two
// blocks take two row tiles of one expert and slice, each block loading half of a stage's weight
// lines by TMA into both blocks' shared memory (multicast), so a block reads 32 KB from L2 a step
// instead of 48; an expert's odd last tile is one unit whose two blocks take half of the lines
// each. A stage is refilled once both blocks' consumers are done with it.
namespace wide {

constexpr int kLines = 256;
constexpr int kThreads = 384;
constexpr int kConsumerThreads = 256;
constexpr int kPairBlocks = 2;
constexpr int kWeightBytes = kLines * kLine;                   // 32 KB
constexpr int kHalfLines = kLines / 2;                         // a consumer's wgmma width
constexpr int kScales = kTileBytes + kWeightBytes;             // the stage's token scales
constexpr int kStageBytes = kTileBytes + kWeightBytes + 1024;  // token scales (512 bytes), stages 1024-aligned
constexpr int kStages = 4;
constexpr int kSharedBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;  // then the full and empty barriers
static_assert(kSharedBytes <= 232448, "one block an SM");
constexpr int kConsumerRegisters = 208, kProducerRegisters = 88;  // no spills either side
constexpr int kEntryRegisters = 65536 / kThreads / 8 * 8;  // 168: see the kernel above
static_assert(kConsumerThreads * (kConsumerRegisters - kEntryRegisters) <=
                  128 * (kEntryRegisters - kProducerRegisters),
              "the consumers' registers come from the producer's");

// Producer thread t: chunk t % 8 of token rows t / 8 + 16 i and the scale of token row t by
// cp.async, then its arrival on the stage's full barrier once they land. The weight lines by TMA
// from thread 0, which announces their bytes on the same barrier: the stage's four 64-line boxes
// (an H100 run read the experts of a prefill of 8192 in 27.3 / 27.8 ms against 28.8 / 29.5 with
// every producer thread copying its chunks of them); kPaired, this block's two boxes into both
// blocks of the pair (`rank`: this block's in the pair), or (`half` >= 0, an odd last tile) the
// two boxes of that half of the lines into this block alone. kTokenBoxes (down, whose token
// rows are the tile's grouped act rows, contiguous): the token rows as one 128-row box by TMA
// from thread 0 as well (token_map: act's codes [padded pairs, inter]; rows past the tile's are
// the next expert's or zeros, their products never stored), so that only the scales go by
// cp.async.
// `ring`: the steps this block's ring took before this tile's (a persistent block's earlier
// tiles), so that stage and phase run on; the caller waits for the last copies before it leaves.
template <Projection P, bool kPaired, bool kTokenBoxes>
__device__ __forceinline__ void produce(const GroupedArgs& a, const CUtensorMap& weight_map,
                                        const CUtensorMap& token_map, int e, int first, int rows, int64_t slice,
                                        uint32_t stages, uint32_t full, uint32_t empty, int steps, int rank,
                                        int half, int ring) {
  static_assert(!kTokenBoxes || P == Projection::kDown, "only down's token rows are contiguous");
  using TokenCopies = moe_grouped::TokenCopies<P, uint8_t>;
  const int index = threadIdx.x % 128;
  const TokenCopies token_copies(a, index, first, rows);
  const int32_t scale_source = TokenCopies::source_row(a, first, rows, index);
  const float* scale_from = a.x_scales + (scale_source < 0 ? 0 : scale_source);
  auto box_row = [&](int box) {
    return static_cast<int>(moe_grouped::weight_row<P, kLines>(a, e, moe_grouped::slice_line_of<P>(64 * box), slice));
  };
  for (int step = 0; step < steps; ++step) {
    const int stage = (ring + step) % kStages;
    const uint32_t parity = (((ring + step) / kStages) & 1) ^ 1;  // the first round passes
    const uint32_t tokens = stages + stage * kStageBytes, weights = tokens + kTileBytes;
    const int64_t offset = int64_t{step} * kStepValues;
    moe_grouped::copy_weight_boxes<kPaired, kPairBlocks>(weights, weight_map, offset, box_row, full + 8 * stage,
                                                         empty + 8 * stage, parity, index, rank, half,
                                                         kTokenBoxes ? kTileBytes : 0);
    if constexpr (kTokenBoxes) {
      if (index == 0) pipeline::tensor_copy_2d(tokens, &token_map, static_cast<int>(offset), first, full + 8 * stage);
    } else {
      token_copies.copy(a, tokens, offset);
    }
    if (scale_source >= 0) wgmma::copy_async_4(tokens + kScales + 4 * index, scale_from + step * a.x_scale_stride, 4);
    pipeline::barrier_arrive_on_copies(full + 8 * stage);
  }
}

// A consumer without rows (consumer 1 of a tile of 64 rows or fewer): hands each stage back
// (`ring` as produce's).
template <bool kPaired>
__device__ __forceinline__ void pass_stages(uint32_t full, uint32_t empty, int steps, int ring) {
  for (int step = ring; step < ring + steps; ++step) {
    const int stage = step % kStages;
    pipeline::barrier_wait(full + 8 * stage, (step / kStages) & 1);
    pipeline::release_stage<kPaired, kPairBlocks>(empty + 8 * stage);
  }
}

// What a consumer multiplies: its rows row0 .. row0 + 63 of the tile against kHalves 128-line
// halves of the stage, the first of which is the slice's half slice_half0.
struct Part {
  int row0, slice_half0;
};

// The weight scale of a half's gate lines and of its up lines (down: the half's one scale, twice)
// at `step`, for the slice's half h.
template <Projection P>
struct HalfScales {
  const float* gate;
  const float* up;
  __device__ __forceinline__ HalfScales(const GroupedArgs& a, int e, int64_t slice, int h, int steps) {
    // Gate/up: the slice's 128 features are one scale block of gate rows and one of up rows;
    // down: its halves are one block each.
    const int line = P == Projection::kGateUp ? 0 : kHalfLines * h;
    gate = a.weight_scales + moe_grouped::weight_row<P, kLines>(a, e, line, slice) * steps;
    up = P == Projection::kGateUp
             ? a.weight_scales + moe_grouped::weight_row<P, kLines>(a, e, kHalfLines, slice) * steps
             : gate;
  }
};

// A consumer's steps: its rows against each of its kHalves halves in turn, each half's four
// m64n128k32 into part_sums promoted into acc[h] with that half's scales.
template <Projection P, bool kPaired, int kHalves>
__device__ __forceinline__ void multiply(const GroupedArgs& a, float (&acc)[2][64], int e, int64_t slice,
                                         uint32_t stages, const uint8_t* stages_generic, uint32_t full, uint32_t empty,
                                         int steps, Part part, int ring) {
  const int u = threadIdx.x % 128, warp = u / 32, g = u % 32 / 4;
  const int row = part.row0 + 16 * warp + g;
  const uint64_t token_descriptor = descriptor(stages + part.row0 * kLine, 16, 1024);
  const uint64_t weight_descriptor = descriptor(stages + kTileBytes, 16, 1024);
  constexpr uint64_t kHalfOffset = (kHalfLines * kLine) >> 4;  // a half's lines in descriptor units
  const HalfScales<P> scales[2] = {HalfScales<P>(a, e, slice, part.slice_half0, steps),
                                   HalfScales<P>(a, e, slice, part.slice_half0 + kHalves - 1, steps)};
  float part_sums[64];
  for (int step = 0; step < steps; ++step) {
    const int stage = (ring + step) % kStages;
    float gate_scale[kHalves], up_scale[kHalves];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      gate_scale[h] = __ldg(scales[h].gate + step);
      up_scale[h] = __ldg(scales[h].up + step);
    }
    pipeline::barrier_wait(full + 8 * stage, ((ring + step) / kStages) & 1);
    wgmma::fence_async_proxy();  // the copies' writes before the tensor cores' reads
    const uint64_t stage_offset = static_cast<uint64_t>(stage * kStageBytes) >> 4;
    const float* token_scales = reinterpret_cast<const float*>(stages_generic + stage * kStageBytes + kScales);
    float t0 = 0.0f, t1 = 0.0f;
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      multiply_stage(part_sums, token_descriptor, weight_descriptor + h * kHalfOffset, stage_offset);
      if (h == 0) t0 = token_scales[row], t1 = token_scales[row + 8];
      wgmma::wait_all();
      wgmma::pin(part_sums);
      if (h + 1 == kHalves) pipeline::release_stage<kPaired, kPairBlocks>(empty + 8 * stage);  // all of it read
      promote(acc[h], part_sums, t0, t1, gate_scale[h], up_scale[h]);
    }
  }
}

// acc[h][4 j + q] of the consumer's thread (warp, g, tq): row part.row0 + 16 warp + g + 8 (q / 2),
// line 8 j + 2 tq + q % 2 of the slice's half part.slice_half0 + h. Gate/up: a half is the 128-line
// kernel's tile (64 gate lines, then their up lines); down: the sums as they are.
template <Projection P, int kHalves>
__device__ __forceinline__ void epilogue(const GroupedArgs& a, const float (&acc)[2][64], int first, int rows,
                                         int64_t slice, Part part) {
  const int u = threadIdx.x % 128, warp = u / 32, lane = u % 32, g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int r = part.row0 + 16 * warp + g + 8 * q;
    if (r >= rows) continue;
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const int slice_half = part.slice_half0 + h;
      if constexpr (P == Projection::kDown) {
        const int64_t out0 = (first + r) * a.rows_per_expert + slice * kLines + kHalfLines * slice_half + 2 * tq;
#pragma unroll
        for (int j = 0; j < 16; ++j)
          moe_grouped::store_out_pair(a, out0 + 8 * j, acc[h][4 * j + 2 * q], acc[h][4 * j + 2 * q + 1]);
      } else {
        uint16_t* const act_row = a.act + (first + r) * a.inter + slice * kHalfLines + 64 * slice_half + 2 * tq;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int i = 4 * j + 2 * q;
          *reinterpret_cast<uint32_t*>(act_row + 8 * j) =
              pack_bf16_pair(silu_mul(acc[h][i], acc[h][i + 32]), silu_mul(acc[h][i + 1], acc[h][i + 33]));
        }
      }
    }
  }
}

// Gate/up with a.act_codes (unpaired tiles: a slice's 128 act columns, one scale block, are all
// in one block): act as epilogue<kGateUp, 2> makes it, rounded to bf16, then quantised as
// quantize_fp8_rows quantises that bf16 act, so that down reads the same codes and scales as
// through act in bf16 (its sums bit for bit) without act's trip through memory and a launch. A
// row's 128 values lie in the four lanes tq of its quad (32 each): its scale is their largest
// magnitude / 448 (1 for zeros), found by two shuffles that every lane joins, the rows past the
// tile's too; only the tile's rows are stored.
static_assert(kHalfLines == kFp8ScaleBlock, "a slice's act columns are one scale block");
__device__ __forceinline__ void quantized_act_epilogue(const GroupedArgs& a, const float (&acc)[2][64], int first,
                                                       int rows, int64_t slice, Part part) {
  const int u = threadIdx.x % 128, warp = u / 32, lane = u % 32, g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    float act[2][8][2];  // [half][j][e]: act column 64 half + 8 j + 2 tq + e of the slice
    float amax = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * j + 2 * q + e;
          act[h][j][e] = bf16_to_float(float_to_bf16(silu_mul(acc[h][i], acc[h][i + 32])));
          amax = fmaxf(amax, fabsf(act[h][j][e]));
        }
    const float scale = activation_scale_over_lanes<4>(amax);
    const int r = part.row0 + 16 * warp + g + 8 * q;
    if (r >= rows) continue;
    uint8_t* const codes = a.act_codes + (first + r) * a.inter + slice * kHalfLines + 2 * tq;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        *reinterpret_cast<uint16_t*>(codes + 64 * h + 8 * j) =
            static_cast<uint16_t>(e4m3_of(act[h][j][0], scale) | e4m3_of(act[h][j][1], scale) << 8);
    if (tq == 0) a.act_scales[slice * a.act_scale_stride + first + r] = scale;
  }
}

// A consumer warpgroup's part of a tile (`ring` as produce's): its rows' sums and their epilogue,
// or (a tile of 64 rows or fewer, consumer 1) only the stages handed back.
template <Projection P, bool kPaired>
__device__ __forceinline__ void consume_tile(const GroupedArgs& a, const moe_grouped::RowTile& tile,
                                             const wgmma::AlignedShared& aligned, uint32_t full, uint32_t empty,
                                             int steps, int warpgroup, int half, int ring) {
  // Broadcast from lane 0: the compiler then knows each warp takes one side of each branch.
  if (__shfl_sync(0xffffffffu, 64 * warpgroup >= tile.rows ? 1 : 0, 0) != 0) {
    pass_stages<kPaired>(full, empty, steps, ring);
    return;
  }
  const int64_t slice = tile.slice;
  float acc[2][64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[0][i] = acc[1][i] = 0.0f;
  if (half < 0) {
    const Part part{64 * warpgroup, 0};
    multiply<P, kPaired, 2>(a, acc, tile.expert, slice, aligned.address, aligned.generic, full, empty, steps, part,
                            ring);
    if (P == Projection::kGateUp && a.act_codes) quantized_act_epilogue(a, acc, tile.first, tile.rows, slice, part);
    else epilogue<P, 2>(a, acc, tile.first, tile.rows, slice, part);
  } else {
    const Part part{64 * warpgroup, half};
    multiply<P, kPaired, 1>(a, acc, tile.expert, slice, aligned.address, aligned.generic, full, empty, steps, part,
                            ring);
    epilogue<P, 1>(a, acc, tile.first, tile.rows, slice, part);
  }
}

// The ring's barriers after its stages: full (each producer thread's cp.async arrival and thread
// 0's announcement of the TMA bytes) and empty (each consumer thread, paired: each consumer warp
// of both blocks, once), set up.
template <bool kPaired>
__device__ __forceinline__ void init_stage_barriers(uint32_t stages, uint32_t& full, uint32_t& empty) {
  full = stages + kStages * kStageBytes;
  empty = full + 8 * kStages;
  pipeline::init_ring<kStages, kPaired>(full, empty, 129,
                                        kPaired ? kPairBlocks * kConsumerThreads / 32 : kConsumerThreads);
}

// kSet kPairs: launched in clusters of kPairBlocks blocks (see above). weight_map: the stacked
// weights [experts x rows_per_expert, k] in 64-line boxes.
template <Projection P, moe_tiles::TileSet kSet, bool kTokenBoxes>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_wide_experts_kernel(GroupedArgs a, const __grid_constant__ CUtensorMap weight_map,
                            const __grid_constant__ CUtensorMap token_map) {
  chained_grid_prologue();
  constexpr bool kPaired = kSet == moe_tiles::TileSet::kPairs;
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const int unit = static_cast<int>(blockIdx.x) / (kPaired ? kPairBlocks : 1);
  const int rank = kPaired ? static_cast<int>(blockIdx.x) % kPairBlocks : 0;  // the cluster's rank along x
  const moe_grouped::RowTile tile =
      moe_grouped::unit_of_block<kRows, kThreads, kSet>(a.offsets, a.num_experts, unit, a.slices, rank);
  if (tile.expert < 0) return;  // both blocks of a pair alike
  const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
  uint32_t full, empty;
  init_stage_barriers<kPaired>(aligned.address, full, empty);
  const int steps = static_cast<int>(a.k / kStepValues);
  // Broadcast from lane 0: the compiler then knows each warp takes one side of each branch.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  const int half = __shfl_sync(0xffffffffu, tile.half, 0);
  if (warpgroup == 2) {
    pipeline::shrink_registers<kProducerRegisters>();
    produce<P, kPaired, kTokenBoxes>(a, weight_map, token_map, tile.expert, tile.first, tile.rows, tile.slice,
                                     aligned.address, full, empty, steps, rank, half, 0);
    wgmma::copy_async_wait<0>();
  } else {
    pipeline::grow_registers<kConsumerRegisters>();
    consume_tile<P, kPaired>(a, tile, aligned, full, empty, steps, warpgroup, half, 0);
  }
  // Neither block of a pair leaves while the other may still copy into its stages or arrive on
  // its barriers.
  if constexpr (kPaired) pipeline::cluster_sync();
}

// The persistent kernel (Fp8ExpertGemm::kWidePersistent): as many blocks as SMs, each claiming
// unit after unit (unit_of_block's numbering) from the launch's counters (moe_grouped::claim_tile:
// in unit order, so that an expert slice's row tiles run side by side), its ring running on from
// one tile to the next, so that a tile's first stages land while the consumers store the last
// one's sums: a block-per-tile launch pays its set-up, its ring's first fill and its epilogue in
// series every tile (a down tile's 16 steps take about 20 us on an H100). Shared memory after the
// ring's barriers: the claims, then expert_first_units' table.
template <Projection P, bool kTokenBoxes>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_persistent_experts_kernel(GroupedArgs a, const __grid_constant__ CUtensorMap weight_map,
                                  const __grid_constant__ CUtensorMap token_map, int* counters) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
  constexpr int kClaimsAt = kStages * kStageBytes + 2 * kStages * 8;
  auto* const claims = reinterpret_cast<moe_grouped::TileClaims*>(aligned.generic + kClaimsAt);
  const uint32_t claims_address = aligned.address + kClaimsAt;
  moe_grouped::init_tile_claims(claims_address, kConsumerThreads);
  uint32_t full, empty;
  init_stage_barriers<false>(aligned.address, full, empty);
  int* const first_unit = reinterpret_cast<int*>(aligned.generic + kClaimsAt + moe_grouped::kTileClaimsBytes);
  moe_grouped::expert_first_units<kRows, kThreads>(a.offsets, a.num_experts, a.slices, first_unit);
  const int units = first_unit[a.num_experts];
  const int steps = static_cast<int>(a.k / kStepValues);
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (warpgroup == 2) {
    pipeline::shrink_registers<kProducerRegisters>();
    moe_grouped::produce_claimed_tiles<kRows>(
        a, claims, claims_address, counters, first_unit, units, steps, [&](const moe_grouped::RowTile& tile, int ring) {
          produce<P, false, kTokenBoxes>(a, weight_map, token_map, tile.expert, tile.first, tile.rows, tile.slice,
                                         aligned.address, full, empty, steps, 0, -1, ring);
        });
    wgmma::copy_async_wait<0>();
  } else {
    pipeline::grow_registers<kConsumerRegisters>();
    moe_grouped::consume_claimed_tiles(claims, claims_address, steps, [&](const moe_grouped::RowTile& tile, int ring) {
      consume_tile<P, false>(a, tile, aligned, full, empty, steps, warpgroup, -1, ring);
    });
  }
}

// One projection over every row tile: a block a unit of moe_grouped::unit_of_block (an expert's
// row tiles of one slice one after another, so that blocks reading the same weight lines run at
// about the same time), (paired) clusters of two blocks on the pairs of row tiles and the odd
// last tiles, or (persistent) a block an SM claiming unit after unit.
template <Projection P>
void launch_projection(GroupedArgs a, int64_t features, int64_t num_pairs, Fp8ExpertGemm gemm,
                       const PersistentLaunch& persistent, cudaStream_t stream) {
  using moe_tiles::TileSet;
  const bool paired = gemm == Fp8ExpertGemm::kWidePaired;
  const TileSet set = paired ? TileSet::kPairs : TileSet::kEvery;
  const int64_t units = moe_tiles::units_bound(set, num_pairs, a.num_experts, kRows);
  a.slices = static_cast<int>(features / (P == Projection::kGateUp ? kHalfLines : kLines));
  const unsigned cluster = paired ? kPairBlocks : 1;
  const int64_t blocks = units * a.slices * cluster;
  GLMS_CHECK(blocks < (int64_t{1} << 31), "moe_experts_wgmma (FP8): too many pairs for one launch");
  // The stacked weights [experts x rows_per_expert, k] in 64-line boxes.
  const CUtensorMap map = swizzled_rows_tensor_map(a.codes, CU_TENSOR_MAP_DATA_TYPE_UINT8,
                                                   int64_t{a.num_experts} * a.rows_per_expert, a.k, 64);
  // Down's token rows (act's codes, [padded pairs, inter]) as 128-row boxes, unpaired; gate/up
  // gathers its token rows by cp.async (the map is then not read).
  constexpr bool kDown = P == Projection::kDown;
  const CUtensorMap token_map =
      kDown && !paired ? swizzled_rows_tensor_map(a.x_codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.x_scale_stride, a.k, kRows)
                       : map;
  if (gemm == Fp8ExpertGemm::kWidePersistent) {
    auto* kernel = fp8_persistent_experts_kernel<P, kDown>;
    const moe_grouped::PersistentGrid grid = moe_grouped::persistent_grid(
        "moe_experts_wgmma (FP8, persistent)", kSharedBytes, a.num_experts, blocks, persistent);
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, grid.shared_bytes),
          "moe_experts_wgmma (FP8, persistent) shared memory");
    launch_chained("moe_experts_wgmma (FP8, persistent) launch", kernel, grid.blocks, kThreads, grid.shared_bytes,
                   stream, a, map, token_map, persistent.unit_counters);
    return;
  }
  auto* kernel = paired ? fp8_wide_experts_kernel<P, TileSet::kPairs, false>
                        : fp8_wide_experts_kernel<P, TileSet::kEvery, kDown>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "moe_experts_wgmma (FP8, 256 lines) shared memory");
  launch_chained_clusters("moe_experts_wgmma (FP8, 256 lines) launch", kernel, cluster, static_cast<unsigned>(blocks),
                          kThreads, kSharedBytes, stream, a, map, token_map);
}

}  // namespace wide

// One projection's launch.
template <Projection P>
void launch_projection(const GroupedArgs& a, int64_t slices, int64_t tiles, Fp8ExpertGemm gemm, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(tiles));
  if (gemm == Fp8ExpertGemm::kBlockBarrier) {
    auto* kernel = fp8_grouped_experts_kernel<P>;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
          "moe_experts_wgmma (FP8) shared memory");
    launch_chained("moe_experts_wgmma (FP8) launch", kernel, grid, kThreads, kSharedBytes, stream, a);
    return;
  }
  constexpr int kSpecializedShared = specialized::kSharedBytes;
  auto* kernel = specialized::fp8_specialized_experts_kernel<P>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSpecializedShared),
        "moe_experts_wgmma (FP8, warp-specialised) shared memory");
  launch_chained("moe_experts_wgmma (FP8, warp-specialised) launch", kernel, grid, specialized::kThreads,
                 kSpecializedShared, stream, a);
}

bool wide_tiles(Fp8ExpertGemm gemm) {
  return gemm == Fp8ExpertGemm::kWide || gemm == Fp8ExpertGemm::kWidePaired || gemm == Fp8ExpertGemm::kWidePersistent;
}

// One projection over `features` output features (gate/up: inter; down: hidden) through `gemm`.
template <Projection P>
void run_projection(const GroupedArgs& a, int64_t features, int64_t num_pairs, int64_t tiles, Fp8ExpertGemm gemm,
                    const PersistentLaunch& persistent, cudaStream_t stream) {
  if (wide_tiles(gemm)) {
    wide::launch_projection<P>(a, features, num_pairs, gemm, persistent, stream);
    return;
  }
  const int64_t per_block = P == Projection::kGateUp ? Layout::kFeatures / 2 : Layout::kFeatures;
  launch_projection<P>(a, features / per_block, tiles, gemm, stream);
}

}  // namespace

bool moe_experts_wgmma_fp8_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter) {
  return experts.format == WeightFormat::Fp8Block && hidden % kFp8ScaleBlock == 0 && inter % kFp8ScaleBlock == 0;
}

void moe_experts_wgmma_fp8(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                           const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs,
                           const MoeFp8Staging& staging, uint16_t* act, ExpertSums expert_out, cudaStream_t stream,
                           Fp8ExpertGemm gemm) {
  if (num_pairs <= 0 || num_experts <= 0) return;
  GLMS_CHECK(moe_experts_wgmma_fp8_supported(experts, hidden, inter),
             "moe_experts_wgmma: FP8 experts with hidden and inter multiples of 128");
  GLMS_CHECK(staging.token_codes && staging.token_scales && staging.act_codes && staging.act_scales,
             "moe_experts_wgmma: FP8 experts need their staging buffers");
  const int64_t tokens = num_pairs / top_k;
  // Row tiles: at most one part-filled tile per expert beyond the full ones.
  const int64_t tiles = (num_pairs + kRows - 1) / kRows + std::min<int64_t>(num_experts, num_pairs);
  GLMS_CHECK(tiles <= 65535, "moe_experts_wgmma: too many pairs for one launch");
  GLMS_CHECK(num_pairs * std::max(hidden, inter) / 16 < (int64_t{1} << 32),
             "moe_experts_wgmma: too many pairs for one launch");
  GroupedArgs a = moe_grouped::grouped_args(plan, num_experts, top_k, inter, act, expert_out);
  // The 256-line tiles' down slices need hidden in whole 256s; otherwise the 128-line kernel.
  if (wide_tiles(gemm) && hidden % wide::kLines != 0) gemm = Fp8ExpertGemm::kWarpSpecialized;

  if (!staging.tokens_quantised) quantize_fp8_rows(x, tokens, hidden, staging.token_codes, staging.token_scales, stream);
  a.x_scale_stride = fp8_padded_tokens(tokens);
  a.x_codes = staging.token_codes;
  a.x_scales = staging.token_scales;
  a.codes = static_cast<const uint8_t*>(experts.gate_up);
  a.weight_scales = static_cast<const float*>(experts.gate_up_scales);
  a.k = hidden;
  a.rows_per_expert = 2 * inter;
  // The unpaired 256-line tiles quantise act in their epilogue; the others write it in bf16.
  const bool act_quantised = gemm == Fp8ExpertGemm::kWide || gemm == Fp8ExpertGemm::kWidePersistent;
  if (act_quantised) {
    a.act_codes = staging.act_codes;
    a.act_scales = staging.act_scales;
    a.act_scale_stride = fp8_padded_tokens(num_pairs);
  }
  run_projection<Projection::kGateUp>(a, inter, num_pairs, tiles, gemm, staging.persistent, stream);

  if (!act_quantised) quantize_fp8_rows(act, num_pairs, inter, staging.act_codes, staging.act_scales, stream);
  a.act_codes = nullptr;
  a.x_codes = staging.act_codes;
  a.x_scales = staging.act_scales;
  a.x_scale_stride = fp8_padded_tokens(num_pairs);
  a.codes = static_cast<const uint8_t*>(experts.down);
  a.weight_scales = static_cast<const float*>(experts.down_scales);
  a.k = inter;
  a.rows_per_expert = hidden;
  // The same counters: gate/up's last block has set them back to zero before down's read them.
  run_projection<Projection::kDown>(a, hidden, num_pairs, tiles, gemm, staging.persistent, stream);
}

}  // namespace glms::ops::cuda
