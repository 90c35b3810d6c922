// Block-FP8 routed experts of prefill-sized batches on Hopper's FP8 warpgroup tensor cores
// (W8A8, as DeepSeek-V3 and GLM-5-FP8 are served): the tokens are quantised to E4M3 with one
// scale a row and 128 k (quantize_fp8_rows), the expert weights are the checkpoint's E4M3 codes
// with their 128 x 128 block scales, and each projection is one grouped GEMM over the plan's
// pairs; SwiGLU in the gate/up epilogue writes bf16 act, quantised again for down.
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
#include "ops/cuda/launch.cuh"
#include "ops/cuda/linear_fp8.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_grouped.cuh"
#include "ops/cuda/pipeline.cuh"
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
static_assert(2 * 128 * kConsumerRegisters + 128 * kProducerRegisters <= 65536, "the register file");
constexpr int kProducerCopies = kRows * (kLine / 16) / 128;  // 8: a producer thread's chunks a step, of each operand

// The producer warpgroup: thread t copies 16-byte chunk t % 8 of token rows and weight lines
// t / 8 + 16 i (token rows past the tile's are not copied: their products are never stored) and
// the scale of token row t, then arrives on the stage's full barrier once its copies land.
template <Projection P>
__device__ __forceinline__ void produce(const GroupedArgs& a, int e, int first, int rows, int64_t slice,
                                        uint32_t stages, uint32_t full, uint32_t empty, int steps) {
  const int index = threadIdx.x % 128, chunk = index % 8, line0 = index / 8;
  const int64_t k = a.k;
  auto source_of = [&](int r) -> int32_t {
    return r >= rows ? -1 : P == Projection::kGateUp ? a.sorted_pairs[first + r] / a.top_k : first + r;
  };
  uint32_t token_at[kProducerCopies];  // in 16-byte units: under 2^32 for any launch (checked on the host)
  uint32_t token_valid = 0;
#pragma unroll
  for (int i = 0; i < kProducerCopies; ++i) {
    const int32_t source = source_of(line0 + 16 * i);
    token_at[i] = static_cast<uint32_t>(((source < 0 ? 0 : source * k) + 16 * chunk) / 16);
    token_valid |= source < 0 ? 0u : 1u << i;
  }
  const int32_t scale_source = source_of(index);
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
#pragma unroll
    for (int i = 0; i < kProducerCopies; ++i)
      if (token_valid >> i & 1)
        wgmma::copy_async_16(tokens + swizzled(line0 + 16 * i, chunk), a.x_codes + 16 * int64_t{token_at[i]} + offset,
                             16);
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
  const int64_t gate_up_slices = inter / (Layout::kFeatures / 2), down_slices = hidden / Layout::kFeatures;

  quantize_fp8_rows(x, tokens, hidden, staging.token_codes, staging.token_scales, stream);
  a.x_scale_stride = fp8_padded_tokens(tokens);
  a.x_codes = staging.token_codes;
  a.x_scales = staging.token_scales;
  a.codes = static_cast<const uint8_t*>(experts.gate_up);
  a.weight_scales = static_cast<const float*>(experts.gate_up_scales);
  a.k = hidden;
  a.rows_per_expert = 2 * inter;
  launch_projection<Projection::kGateUp>(a, gate_up_slices, tiles, gemm, stream);

  quantize_fp8_rows(act, num_pairs, inter, staging.act_codes, staging.act_scales, stream);
  a.x_codes = staging.act_codes;
  a.x_scales = staging.act_scales;
  a.x_scale_stride = fp8_padded_tokens(num_pairs);
  a.codes = static_cast<const uint8_t*>(experts.down);
  a.weight_scales = static_cast<const float*>(experts.down_scales);
  a.k = inter;
  a.rows_per_expert = hidden;
  launch_projection<Projection::kDown>(a, down_slices, tiles, gemm, stream);
}

}  // namespace glms::ops::cuda
