// Routed experts of prefill-sized batches on Hopper's warpgroup tensor cores: each projection is
// one grouped GEMM over the plan's grouped pairs, the tokens bf16, fp32 sums, SwiGLU in the
// gate/up epilogue (the gate and up sums never leave the SM). Two weight sources:
//   MXFP4 (W4A16): the codes are loaded into registers two steps ahead and widened to bf16 in
//     shared memory with their block scale (exact: an E2M1 value times a power of two) while
//     the tensor cores multiply the step before;
//   bf16: the weight rows are copied by cp.async like the tokens.
//
// Why this shape: a block takes a tile of one expert's grouped rows and a slice of its output
// features, and walks K in steps of 128 values (one 64-byte group of quant/mxfp4_tiles.h's
// layout a weight row). Token rows (and bf16 weights) arrive by cp.async kStages - 1 steps
// ahead, so a copy has that many steps of multiplies to land in. Widening (about 2.5 integer
// and bf16 ops a weight) hides behind the wgmma. Two tile shapes (moe_grouped.cuh's TileLayout:
// 64 rows x 256 features or 128 x 128), each warpgroup a 64 x 128 wgmma accumulator.
// The wide tile reads (and widens) each weight once for twice the rows (experts with many
// pairs: long prefills); the narrow one wastes less on experts with few. The mma.sync kernels
// (moe_experts_mma.cu) widen in registers for every 8-token tile instead.
//
// Shared memory (128-byte swizzle, wgmma.cuh), kStages stages of
//   tokens  [2 blocks of 64 k][rows] lines
//   weights [2 blocks of 64 k][features] lines
//
// Each block finds its tile from plan.offsets (experts' row tiles in expert order), so the
// launch depends only on the pair count and needs no host copy (graph-capturable).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_grouped.cuh"
#include "ops/cuda/wgmma.cuh"
#include "quant/mxfp4_tiles.h"

namespace glms::ops::cuda {

namespace {

using wgmma::descriptor;
using wgmma::swizzled;

using moe_grouped::epilogue;
using moe_grouped::GroupedArgs;
using moe_grouped::kThreads;
using moe_grouped::Projection;
using moe_grouped::WeightSource;
constexpr int kStepValues = quant::kMxfp4TileValues;  // 128 k a step
constexpr int kLine = wgmma::kLineBytes;
// Average pairs per expert from which the wide tile is taken: an expert's pairs vary about the
// average, so from somewhat above 64 most experts would spill a part-filled second narrow tile.
constexpr int kWideTilePairsPerExpert = 80;

template <int kRows>
struct TileShape : moe_grouped::TileLayout<kRows> {
  using Layout = moe_grouped::TileLayout<kRows>;
  using Layout::kFeatures;
  static constexpr int kTokenBlockBytes = kRows * kLine;       // 64 k of the rows
  static constexpr int kTokenStageBytes = 2 * kTokenBlockBytes;
  static constexpr int kWeightBlockBytes = kFeatures * kLine;  // 64 k of the features
  static constexpr int kWeightStageBytes = 2 * kWeightBlockBytes;
  static constexpr int kPasses = kFeatures / 64;       // widening passes: 64 lines, 4 threads a line
  static constexpr int kTokenCopies = kRows * 16 / kThreads;  // 16-byte chunks a thread a step
  static constexpr int kWeightCopies = kFeatures * 16 / kThreads;  // bf16 weights: chunks a thread a step
  // As many stages as one block an SM holds (227 KB), at most 4: 3 for 128 rows, 2 for 64.
  static constexpr int kStageBytes = kTokenStageBytes + kWeightStageBytes;
  static constexpr int kStages = (232448 - 1024) / kStageBytes < 4 ? (232448 - 1024) / kStageBytes : 4;
  static constexpr int kSharedBytes = 1024 + kStages * kStageBytes;  // 1024: alignment
  static_assert(kStages >= 2, "two stages at least");
  static_assert(kRows != 64 || 64 * 128 * 4 <= kStageBytes, "the up sums fit a stage");
};

// Four words of codes (one per MX block of the step) and their four scale codes, widened into
// 16-byte chunks 4 w + t (w < 4) of `line` of a weight stage whose 64-k blocks are
// `block_bytes` apart: values 32 w + 8 t .. + 7 of the step, in bf16.
template <bool kOneMultiply>
__device__ __forceinline__ void widen_chunk(uint8_t* stage, int block_bytes, int line, int t, const uint4& q,
                                            uint32_t scale_codes) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const int chunk = 4 * w + t;  // of the step's 16; column block chunk / 8
    *reinterpret_cast<uint4*>(stage + (chunk / 8) * block_bytes + swizzled(line, chunk % 8)) =
        moe_grouped::widen_mxfp4_word<kOneMultiply>(words[w], (scale_codes >> (8 * w)) & 0xffu);
  }
}

__device__ __forceinline__ uint4 load_codes(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}


// A step's codes and scale words of this thread's passes into q and sc, the sources then advanced
// a step.
template <int kPasses>
__device__ __forceinline__ void load_step_codes(const uint8_t* (&codes)[kPasses], const uint8_t* (&scales)[kPasses],
                                                uint4 (&q)[kPasses], uint32_t (&sc)[kPasses]) {
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    q[p] = load_codes(codes[p]);
    sc[p] = __ldg(reinterpret_cast<const uint32_t*>(scales[p]));
    codes[p] += quant::kMxfp4TileStepBytes;
    scales[p] += 4 * quant::kMxfp4TileScaleStepWords;
  }
}

// Those codes widened into the weight stage at `weights` (its 64-k blocks `block_bytes` apart),
// pass p's into line 64 p + threadIdx.x / 4.
template <int kPasses>
__device__ __forceinline__ void widen_step(uint8_t* weights, int block_bytes, int t, const uint4 (&q)[kPasses],
                                           const uint32_t (&sc)[kPasses]) {
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    // Checkpoints' scales are small (codes under 128 for weights under 2): the warp takes the
    // one-multiply widening unless one of its scale codes is above 128.
    if (moe_grouped::warp_scales_one_multiply(sc[p]))
      widen_chunk<true>(weights, block_bytes, 64 * p + threadIdx.x / 4, t, q[p], sc[p]);
    else
      widen_chunk<false>(weights, block_bytes, 64 * p + threadIdx.x / 4, t, q[p], sc[p]);
  }
}

// The token rows this thread copies, chunk c of tile rows threadIdx.x / 16 + 16 i: step 0's
// source and its bytes (rows past the tile's: 0 bytes, from a valid address, so zeros).
template <Projection P, int kCopies>
__device__ __forceinline__ void token_copy_sources(const GroupedArgs& a, int64_t k, int first, int rows, int c,
                                                   const uint16_t* (&from)[kCopies], int (&bytes)[kCopies]) {
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const int r = threadIdx.x / 16 + 16 * i;
    const int32_t source =
        r >= rows ? -1 : P == Projection::kGateUp ? a.sorted_pairs[first + r] / a.top_k : first + r;
    from[i] = a.x + (source < 0 ? 0 : source * k) + 8 * c;
    bytes[i] = source < 0 ? 0 : 16;
  }
}

// The MXFP4 codes and scale word of step 0 that this thread widens: pass p's weight line
// 64 p + threadIdx.x / 4, 16 bytes t = threadIdx.x % 4 of it.
template <Projection P, int kFeatures, int kPasses>
__device__ __forceinline__ void mxfp4_pass_sources(const GroupedArgs& a, int64_t k, int e, int t,
                                                   const uint8_t* (&codes)[kPasses], const uint8_t* (&scales)[kPasses]) {
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t row = moe_grouped::weight_row<P, kFeatures>(a, e, 64 * p + threadIdx.x / 4);
    codes[p] = a.codes + quant::mxfp4_tile_row_offset(row, k) + 16 * t;
    scales[p] = a.scales + 4 * quant::mxfp4_tile_scale_word(row, k);
  }
}

// One step's copies into the stage at `tokens` (a shared address): this thread's token chunks and,
// for bf16 weights, its weight-line chunks, each source then advanced a step.
template <int kRows, WeightSource W>
__device__ __forceinline__ void copy_step(uint32_t tokens, int c, const uint16_t* (&token_from)[TileShape<kRows>::kTokenCopies],
                                          const int (&token_bytes)[TileShape<kRows>::kTokenCopies],
                                          const uint16_t* (&weight_from)[W == WeightSource::kBf16
                                                                              ? TileShape<kRows>::kWeightCopies
                                                                              : 1]) {
  using S = TileShape<kRows>;
#pragma unroll
  for (int i = 0; i < S::kTokenCopies; ++i) {
    const int r = threadIdx.x / 16 + 16 * i;
    wgmma::copy_async_16(tokens + (c / 8) * S::kTokenBlockBytes + swizzled(r, c % 8), token_from[i], token_bytes[i]);
    token_from[i] += kStepValues;
  }
  if constexpr (W == WeightSource::kBf16) {
    const uint32_t weights = tokens + S::kTokenStageBytes;
#pragma unroll
    for (int i = 0; i < S::kWeightCopies; ++i) {
      wgmma::copy_async_16(weights + (c / 8) * S::kWeightBlockBytes + swizzled(threadIdx.x / 16 + 16 * i, c % 8),
                           weight_from[i], 16);
      weight_from[i] += kStepValues;
    }
  }
}

template <Projection P, int kRows, WeightSource W>
__global__ void __launch_bounds__(kThreads, 1) grouped_experts_kernel(GroupedArgs a) {
  chained_grid_prologue();
  using S = TileShape<kRows>;
  constexpr int kStages = S::kStages;
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const moe_grouped::RowTile tile = moe_grouped::row_tile_of_block<kRows, kThreads>(a.offsets, a.num_experts);
  if (tile.expert < 0) return;
  const int e = tile.expert, first = tile.first, rows = tile.rows;

  const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
  // Stage i: tokens at stages + i * kStageBytes, its weights kTokenStageBytes on.
  const uint32_t stages = aligned.address;
  uint8_t* const stages_generic = aligned.generic;

  const int wg = threadIdx.x / 128;
  const int64_t k = a.k;
  const int steps = static_cast<int>(k / kStepValues);
  auto weight_row = [&](int line) { return moe_grouped::weight_row<P, S::kFeatures>(a, e, line); };
  // The loop issues few instructions a step besides the widening: each copy's source is a pointer
  // that advances a step at a time, the stages and matrix descriptors advance by additions.
  // Token rows (and bf16 weight lines): this thread copies chunk c of rows threadIdx.x / 16 + 16 i
  // (rows past the tile's: zeros, from a valid address).
  const int c = threadIdx.x % 16;
  const uint16_t* token_from[S::kTokenCopies];
  int token_bytes[S::kTokenCopies];
  token_copy_sources<P, S::kTokenCopies>(a, k, first, rows, c, token_from, token_bytes);
  const uint16_t* weight_from[W == WeightSource::kBf16 ? S::kWeightCopies : 1];
  if constexpr (W == WeightSource::kBf16) {
#pragma unroll
    for (int i = 0; i < S::kWeightCopies; ++i) weight_from[i] = a.weights + weight_row(threadIdx.x / 16 + 16 * i) * k + 8 * c;
  }
  int issued = 0, issue_stage = 0;  // steps whose copies are issued; the stage of the next
  // The copies of the next step into its stage, one commit group (empty past the last step, so
  // that the groups stay counted one a step).
  auto issue_copies = [&]() {
    if (issued < steps) {
      copy_step<kRows, W>(stages + static_cast<uint32_t>(issue_stage) * S::kStageBytes, c, token_from, token_bytes,
                          weight_from);
      ++issued;
      issue_stage = issue_stage + 1 == kStages ? 0 : issue_stage + 1;
    }
    wgmma::copy_async_commit();
  };
  // MXFP4 widening: pass p covers lines 64 p + threadIdx.x / 4, 16 bytes (t = threadIdx.x % 4) each.
  const int t = threadIdx.x % 4;
  constexpr int kPasses = W == WeightSource::kMxfp4 ? S::kPasses : 1;
  const uint8_t* codes[kPasses];   // the next step's to load
  const uint8_t* scales[kPasses];
  uint4 q[kPasses];
  uint32_t sc[kPasses];
  if constexpr (W == WeightSource::kMxfp4) mxfp4_pass_sources<P, S::kFeatures, kPasses>(a, k, e, t, codes, scales);
  // The codes of the next step (steps in order) into q and sc.
  auto load_next_codes = [&]() { load_step_codes<kPasses>(codes, scales, q, sc); };
  auto widen_into = [&](int to) {
    widen_step<kPasses>(stages_generic + to * S::kStageBytes + S::kTokenStageBytes, S::kWeightBlockBytes, t, q, sc);
  };

  // This warpgroup's accumulator: rows wg * kGroupRow0 .., weight lines wg * kGroupLine0 ...; stage 0's
  // descriptors, which a stage, a 64-k block and 16 k further on advance (descriptor_advanced).
  const uint64_t token_descriptor = descriptor(stages + wg * S::kGroupRow0 * kLine, 16, 1024);
  const uint64_t weight_descriptor = descriptor(stages + S::kTokenStageBytes + wg * S::kGroupLine0 * kLine, 16, 1024);
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  for (int i = 0; i + 1 < kStages; ++i) issue_copies();
  if constexpr (W == WeightSource::kMxfp4) {
    load_next_codes();
    widen_into(0);
    if (steps > 1) load_next_codes();
  }
  int cur = 0;
  for (int step = 0; step < steps; ++step) {
    wgmma::copy_async_wait<kStages - 2>();  // this step's group; later steps' may still be in flight
    wgmma::fence_async_proxy();
    __syncthreads();  // this step's operands are in; both warpgroups finished the last step's wgmma
    // The stage the last step read is free: the copies kStages - 1 steps ahead go there.
    issue_copies();
    wgmma::pin(acc);
    wgmma::fence();
    const uint64_t stage_tokens = wgmma::descriptor_advanced(token_descriptor, cur * S::kStageBytes);
    const uint64_t stage_weights = wgmma::descriptor_advanced(weight_descriptor, cur * S::kStageBytes);
#pragma unroll
    for (int kk = 0; kk < kStepValues / 16; ++kk) {
      const uint32_t column = (kk % 4) * 32;  // 16 k a step inside the 64-k block
      wgmma::m64n128k16<0>(acc, wgmma::descriptor_advanced(stage_tokens, (kk / 4) * S::kTokenBlockBytes + column),
                           wgmma::descriptor_advanced(stage_weights, (kk / 4) * S::kWeightBlockBytes + column));
    }
    wgmma::commit();
    cur = cur + 1 == kStages ? 0 : cur + 1;
    if constexpr (W == WeightSource::kMxfp4) {
      // The next step's weights go to its stage, which no wgmma reads now (kStages >= 2).
      if (step + 1 < steps) {
        widen_into(cur);
        if (step + 2 < steps) load_next_codes();
      }
    }
    wgmma::wait_all();
    wgmma::pin(acc);
  }
  epilogue<P, kRows>(a, acc, first, rows, stages_generic);
}

}  // namespace

bool moe_experts_wgmma_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter) {
  const bool weights = experts.format == WeightFormat::Plain ||
                       (experts.format == WeightFormat::Mxfp4 && experts.mxfp4_tiled);
  return weights && hidden % 256 == 0 && inter % 128 == 0;
}

namespace {

// One projection's launch over `tiles` row tiles, its weights and widths set in `a`.
template <Projection P, int kRows, WeightSource W>
void launch_projection(const GroupedArgs& a, int64_t features, int64_t tiles, cudaStream_t stream) {
  using S = TileShape<kRows>;
  auto* kernel = grouped_experts_kernel<P, kRows, W>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSharedBytes),
        "moe_experts_wgmma shared memory");
  const int64_t per_block = P == Projection::kGateUp ? S::kFeatures / 2 : S::kFeatures;
  launch_chained("moe_experts_wgmma launch", kernel,
                 dim3(static_cast<unsigned>(features / per_block), static_cast<unsigned>(tiles)), kThreads,
                 S::kSharedBytes, stream, a);
}

// Both projections with tiles of kRows rows. `a` holds the plan and the outputs.
template <int kRows, WeightSource W>
void launch_grouped(const GroupedArgs& a, const uint16_t* x, const ExpertWeights& experts, int64_t hidden,
                    int64_t inter, int64_t num_pairs, cudaStream_t stream) {
  // Row tiles: at most one part-filled tile per expert beyond the full ones.
  const int64_t tiles = (num_pairs + kRows - 1) / kRows + std::min<int64_t>(a.num_experts, num_pairs);
  GLMS_CHECK(tiles <= 65535, "moe_experts_wgmma: too many pairs for one launch");
  launch_projection<Projection::kGateUp, kRows, W>(moe_grouped::gate_up_projection(a, x, experts, hidden, inter), inter,
                                                   tiles, stream);
  launch_projection<Projection::kDown, kRows, W>(moe_grouped::down_projection(a, experts, hidden, inter), hidden, tiles,
                                                 stream);
}

template <WeightSource W>
void launch_tiles(int tile_rows, const GroupedArgs& a, const uint16_t* x, const ExpertWeights& experts, int64_t hidden,
                  int64_t inter, int64_t num_pairs, cudaStream_t stream) {
  if (tile_rows == 128) launch_grouped<128, W>(a, x, experts, hidden, inter, num_pairs, stream);
  else launch_grouped<64, W>(a, x, experts, hidden, inter, num_pairs, stream);
}

}  // namespace

void moe_experts_wgmma(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                       const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, uint16_t* act,
                       ExpertSums expert_out, cudaStream_t stream, int tile_rows) {
  if (num_pairs <= 0 || num_experts <= 0) return;
  GLMS_CHECK(moe_experts_wgmma_supported(experts, hidden, inter),
             "moe_experts_wgmma: bf16 or tiled MXFP4 experts with hidden a multiple of 256 and inter of 128");
  if (tile_rows == 0) tile_rows = num_pairs >= int64_t{kWideTilePairsPerExpert} * num_experts ? 128 : 64;
  GLMS_CHECK(tile_rows == 64 || tile_rows == 128, "moe_experts_wgmma: tiles of 64 or 128 rows");
  GroupedArgs a = moe_grouped::grouped_args(plan, num_experts, top_k, inter, act, expert_out);
  if (experts.format == WeightFormat::Plain)
    launch_tiles<WeightSource::kBf16>(tile_rows, a, x, experts, hidden, inter, num_pairs, stream);
  else
    launch_tiles<WeightSource::kMxfp4>(tile_rows, a, x, experts, hidden, inter, num_pairs, stream);
}

}  // namespace glms::ops::cuda
