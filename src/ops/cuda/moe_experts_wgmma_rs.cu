// Routed experts of prefills with tiled MXFP4 weights on wgmma, the widened weights in registers
// ("rs": A from registers, B from shared memory): each projection one grouped GEMM over the
// plan's grouped pairs, where a producer warpgroup copies a ring of stages (the tile's token rows,
// staged in the A fragments' k order, and the codes and scale words of the block's weight rows)
// while two consumer warpgroups widen their rows' codes with the block scales straight into
// wgmma's A registers (moe_fragments.cuh's widen_mxfp4_fragments, as the streamed decode kernels
// do) and multiply them against the token rows, which the tensor cores read from shared memory.
//
// Why: moe_experts_specialized.cu's MXFP4 form widens into shared memory, so that a step's weights
// cross it three times (stored widened, read by both consumers): at 2048 tokens on the H200 shared
// memory is its busy unit (Nsight Compute: LSU wavefronts at 71% of peak) and it reaches 241
// TFLOP/s. Here the weights enter shared memory only as codes (a quarter of the bytes, read once),
// the widening is spread over the eight consumer warps, and the token rows are the only wgmma
// operand read from shared memory: about 116 KB a 4.2 MFLOP step against about 150.
//
// A block: 128 weight rows (consumer warp w, 0..7, one 16-row fragment: gate/up, the gate rows
// of 8 features as rows a and their up rows as rows b, so that SwiGLU is in registers; down, 16
// output features) against a row tile of up to 128 grouped pairs (wgmma N = 128, or 64 for a tile
// of 64 rows or fewer), K in steps of 128 (one 64-byte group of the tiled codes a row). Each
// consumer waits for its step's wgmmas before widening the next (their A registers are read
// while they run); the other consumer's wgmmas fill that wait.
//
// Shared memory (128-byte swizzle, wgmma.cuh), kStages stages of
//   tokens [2 blocks of 64 k][128 lines]      32 KB (rows past the tile's are not copied: their
//                                                    products are never stored)
//   codes  [warp][row a, b][lane] 16 bytes    8 KB  (lane (g, t): chunk t of its row's group)
//   scales [warp][row a, b][lane] 4 bytes     2 KB  (each lane its row's word)
// then the stages' full and empty barriers.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_fragments.cuh"
#include "ops/cuda/moe_grouped.cuh"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/wgmma.cuh"
#include "quant/mxfp4_tiles.h"

namespace glms::ops::cuda {

namespace {

using moe_grouped::GroupedArgs;
using moe_grouped::Projection;
using wgmma::swizzled;

constexpr int kConsumerThreads = 256, kProducerThreads = 128;
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kRows = 128;                             // grouped pairs a tile at most
constexpr int kWeightRows = 128;                       // weight rows a block: 8 warps of 16
constexpr int kStepK = quant::kMxfp4TileValues;        // 128 k a step
constexpr int kTokenBlockBytes = kRows * wgmma::kLineBytes;  // 64 k of the tile's rows: 16 KB
constexpr int kTokenBytes = 2 * kTokenBlockBytes;
constexpr int kCodeUnits = kWeightRows * 4;            // 16-byte chunks of codes a step (512)
constexpr int kCodeBytes = kCodeUnits * 16;
constexpr int kStageBytes = kTokenBytes + kCodeBytes + kCodeUnits * 4;  // 42 KB
constexpr int kStages = 5;
constexpr int kSharedBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;  // 1024: alignment
static_assert(kStageBytes % 1024 == 0, "stages keep the 1024-byte alignment of the swizzle");
static_assert(kSharedBytes <= 232448, "one block an SM");
// The producer's copies a step: token chunk p % 16 of lines p / 16 + 8 i; code units p + 128 i.
constexpr int kTokenCopies = kRows * 16 / kProducerThreads, kCodeCopies = kCodeUnits / kProducerThreads;
// Slice widths: gate/up 64 features (a gate and an up row each), down 128 output features.
template <Projection P>
constexpr int kSliceFeatures = P == Projection::kGateUp ? kWeightRows / 2 : kWeightRows;

// The weight row (of the stacked [E x rows_per_expert, k] codes; moe_grouped::weight_row maps a
// block's stage lines instead) that consumer warp `warp`'s lane row g takes as row a (b = false)
// or b: gate/up, the gate row of the slice's feature 8 warp + g or its up row; down, the slice's
// output 16 warp + g or + 8.
template <Projection P>
__device__ __forceinline__ int64_t lane_weight_row(const GroupedArgs& a, int e, int64_t slice, int warp, int g,
                                                   bool b) {
  const int64_t base = int64_t{e} * a.rows_per_expert;
  if constexpr (P == Projection::kGateUp) return base + (b ? a.inter : 0) + slice * kSliceFeatures<P> + 8 * warp + g;
  return base + slice * kSliceFeatures<P> + 16 * warp + 8 * (b ? 1 : 0) + g;
}

// The producer warpgroup's steps: the tile's token rows (staged [pairs, k / 2] bf16 pairs, rows
// past the tile's skipped), each consumer lane's two 16-byte code chunks and two scale words.
template <Projection P>
__device__ __forceinline__ void produce(const GroupedArgs& a, const uint32_t* staged, int e, int first, int rows,
                                        int64_t slice, uint32_t stages, uint32_t full, uint32_t empty, int steps) {
  const int p = static_cast<int>(threadIdx.x) - kConsumerThreads;
  const int64_t k = a.k;
  const int chunk = p % 16, line0 = p / 16;  // chunk: 16 bytes of a token line's 128 k
  uint32_t token_at[kTokenCopies];           // words from `staged`: under 2^32 (checked on the host)
  uint32_t token_valid = 0;
#pragma unroll
  for (int i = 0; i < kTokenCopies; ++i) {
    const int line = line0 + 8 * i;
    token_at[i] = static_cast<uint32_t>((first + min(line, rows - 1)) * (k / 2) + 4 * chunk);
    token_valid |= line < rows ? 1u << i : 0u;
  }
  const uint8_t* codes_from[kCodeCopies];
  const uint8_t* scales_from[kCodeCopies];
#pragma unroll
  for (int i = 0; i < kCodeCopies; ++i) {
    const int unit = p + kProducerThreads * i;  // [warp][row a, b][lane]
    const int warp = unit / 64, b = unit / 32 % 2, lane = unit % 32;
    const int64_t row = lane_weight_row<P>(a, e, slice, warp, lane / 4, b != 0);
    codes_from[i] = a.codes + quant::mxfp4_tile_row_offset(row, k) + 16 * (lane % 4);
    scales_from[i] = a.scales + 4 * quant::mxfp4_tile_scale_word(row, k);
  }
  for (int step = 0; step < steps; ++step) {
    const int stage = step % kStages;
    pipeline::barrier_wait(empty + 8 * stage, ((step / kStages) & 1) ^ 1);  // the first round passes
    const uint32_t tokens = stages + stage * kStageBytes, codes = tokens + kTokenBytes, scales = codes + kCodeBytes;
    const int64_t words = int64_t{step} * (kStepK / 2);
#pragma unroll
    for (int i = 0; i < kTokenCopies; ++i)
      if (token_valid >> i & 1)
        wgmma::copy_async_16(tokens + (chunk / 8) * kTokenBlockBytes + swizzled(line0 + 8 * i, chunk % 8),
                             staged + token_at[i] + words, 16);
#pragma unroll
    for (int i = 0; i < kCodeCopies; ++i) {
      const int unit = p + kProducerThreads * i;
      wgmma::copy_async_16(codes + unit * 16, codes_from[i] + int64_t{step} * quant::kMxfp4TileStepBytes, 16);
      wgmma::copy_async_4(scales + unit * 4, scales_from[i] + 4 * int64_t{step} * quant::kMxfp4TileScaleStepWords, 4);
    }
    pipeline::barrier_arrive_on_copies(full + 8 * stage);
  }
  wgmma::copy_async_wait<0>();
}

// A consumer warp's steps against kN token lines: wait for a stage, widen this lane's codes into
// the step's eight A fragments, multiply, wait for the wgmmas (their A registers are read while
// they run) and hand the stage back. acc[4 j + i]: row a (i < 2) or b, token 8 j + 2 t + i % 2.
template <int kN>
__device__ __forceinline__ void multiply_steps(float (&acc)[kN / 2], const wgmma::AlignedShared& shared, uint32_t full,
                                               uint32_t empty, int steps) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int unit_a = warp * 64 + lane, unit_b = unit_a + 32;
  for (int step = 0; step < steps; ++step) {
    const int stage = step % kStages;
    pipeline::barrier_wait(full + 8 * stage, (step / kStages) & 1);
    wgmma::fence_async_proxy();  // the copies' writes before the tensor cores' reads
    const uint8_t* const at = shared.generic + stage * kStageBytes;
    const uint4 codes_a = *reinterpret_cast<const uint4*>(at + kTokenBytes + unit_a * 16);
    const uint4 codes_b = *reinterpret_cast<const uint4*>(at + kTokenBytes + unit_b * 16);
    const uint32_t scales_a = *reinterpret_cast<const uint32_t*>(at + kTokenBytes + kCodeBytes + unit_a * 4);
    const uint32_t scales_b = *reinterpret_cast<const uint32_t*>(at + kTokenBytes + kCodeBytes + unit_b * 4);
    uint32_t frag[8][4];  // A registers of the step's eight wgmmas (16 k each)
    const bool large =
        (moe_grouped::scale_codes_above_128(scales_a) | moe_grouped::scale_codes_above_128(scales_b)) != 0;
    if (__any_sync(0xffffffffu, large)) widen_mxfp4_fragments<false>(codes_a, codes_b, scales_a, scales_b, frag, 0);
    else widen_mxfp4_fragments<true>(codes_a, codes_b, scales_a, scales_b, frag, 0);
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) wgmma::pin(frag[ks]);  // written before the fence
    wgmma::pin(acc);
    wgmma::fence();
    const uint32_t tokens = shared.address + stage * kStageBytes;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks)
      wgmma::rs_m64k16<kN>(acc, frag[ks],
                           wgmma::descriptor(tokens + (ks / 4) * kTokenBlockBytes + (ks % 4) * 32, 16, 1024));
    wgmma::commit();
    wgmma::wait_all();
    wgmma::pin(acc);
    pipeline::barrier_arrive(empty + 8 * stage);
  }
}

// The consumer warp's sums into the outputs: gate/up act[pair, feature] = bf16(silu(gate) * up)
// (rows a and b of the lane's feature); down expert_out[pair, output] for rows a and b.
template <Projection P, int kN>
__device__ __forceinline__ void store_rows(const GroupedArgs& a, const float (&acc)[kN / 2], int first, int rows,
                                           int64_t slice) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int n = 8 * j + 2 * t + i;
      if (n >= rows) continue;
      const float row_a = acc[4 * j + i], row_b = acc[4 * j + 2 + i];
      if constexpr (P == Projection::kGateUp) {
        const int64_t feature = slice * kSliceFeatures<P> + 8 * warp + g;
        a.act[(first + n) * a.inter + feature] = float_to_bf16(silu_mul(row_a, row_b));
      } else {
        const int64_t out = (first + n) * a.rows_per_expert + slice * kSliceFeatures<P> + 16 * warp + g;
        moe_grouped::store_out(a, out, row_a);
        moe_grouped::store_out(a, out + 8, row_b);
      }
    }
}

template <Projection P, int kN>
__device__ __forceinline__ void consume(const GroupedArgs& a, const wgmma::AlignedShared& shared, uint32_t full,
                                        uint32_t empty, int steps, int first, int rows, int64_t slice) {
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
  multiply_steps<kN>(acc, shared, full, empty, steps);
  store_rows<P, kN>(a, acc, first, rows, slice);
}

// A block a unit of moe_grouped::unit_of_block (an expert's row tile and output slice).
// a.x is unused: the token rows come from `staged`.
template <Projection P>
__global__ void __launch_bounds__(kThreads, 1) wgmma_rs_experts_kernel(GroupedArgs a, const uint32_t* staged) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const moe_grouped::RowTile tile = moe_grouped::unit_of_block<kRows, kThreads>(
      a.offsets, a.num_experts, static_cast<int>(blockIdx.x), a.slices);
  if (tile.expert < 0) return;
  const wgmma::AlignedShared shared = wgmma::align_to_1024(shared_raw);
  const uint32_t full = shared.address + kStages * kStageBytes, empty = full + 8 * kStages;
  // Full: each producer thread's cp.async arrival. Empty: each consumer thread once.
  pipeline::init_ring<kStages, false>(full, empty, kProducerThreads, kConsumerThreads);
  const int steps = static_cast<int>(a.k / kStepK);
  // Broadcast from lane 0: the compiler then knows each warp takes one side of the branches (wgmma
  // on a path it thinks divergent are serialised).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (warpgroup == 2) {
    produce<P>(a, staged, tile.expert, tile.first, tile.rows, tile.slice, shared.address, full, empty, steps);
  } else if (__shfl_sync(0xffffffffu, tile.rows <= 64 ? 1 : 0, 0) != 0) {
    consume<P, 64>(a, shared, full, empty, steps, tile.first, tile.rows, tile.slice);
  } else {
    consume<P, 128>(a, shared, full, empty, steps, tile.first, tile.rows, tile.slice);
  }
}

// One projection over every row tile and output slice.
template <Projection P>
void launch_projection(GroupedArgs a, const uint32_t* staged, int64_t features, int64_t num_pairs,
                       cudaStream_t stream) {
  auto* kernel = wgmma_rs_experts_kernel<P>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "moe_experts_wgmma_rs shared memory");
  a.slices = static_cast<int>(features / kSliceFeatures<P>);
  const int64_t blocks = moe_tiles::units_bound(moe_tiles::TileSet::kEvery, num_pairs, a.num_experts, kRows) * a.slices;
  GLMS_CHECK(blocks < (int64_t{1} << 31), "moe_experts_wgmma_rs: too many pairs for one launch");
  launch_chained("moe_experts_wgmma_rs launch", kernel, static_cast<unsigned>(blocks), kThreads, kSharedBytes, stream,
                 a, staged);
}

}  // namespace

bool moe_experts_wgmma_rs_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter) {
  return experts.format == WeightFormat::Mxfp4 && experts.mxfp4_tiled && hidden % kStepK == 0 &&
         inter % kStepK == 0;
}

void moe_experts_wgmma_rs(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                          const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, uint32_t* staged,
                          uint16_t* act, ExpertSums expert_out, cudaStream_t stream) {
  if (num_pairs <= 0 || num_experts <= 0) return;
  GLMS_CHECK(moe_experts_wgmma_rs_supported(experts, hidden, inter),
             "moe_experts_wgmma_rs: tiled MXFP4 experts with hidden and inter multiples of 128");
  GLMS_CHECK(num_pairs * std::max(hidden, inter) / 2 < (int64_t{1} << 32),
             "moe_experts_wgmma_rs: too many pairs for one launch");
  const GroupedArgs base = moe_grouped::grouped_args(plan, num_experts, top_k, inter, act, expert_out);
  moe_stage_pairs_permuted(x, hidden, plan.sorted_pairs, top_k, plan, num_experts, num_pairs, staged, stream);
  launch_projection<Projection::kGateUp>(moe_grouped::gate_up_projection(base, x, experts, hidden, inter), staged,
                                         inter, num_pairs, stream);
  moe_stage_pairs_permuted(act, inter, nullptr, 1, plan, num_experts, num_pairs, staged, stream);
  launch_projection<Projection::kDown>(moe_grouped::down_projection(base, experts, hidden, inter), staged, hidden,
                                       num_pairs, stream);
}

}  // namespace glms::ops::cuda
