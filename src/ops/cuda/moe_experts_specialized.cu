// Routed experts of long prefills with bf16 weights, warp-specialised: each projection is one
// grouped GEMM over the plan's grouped pairs, where a producer warpgroup copies token rows and
// weight lines into a ring of shared-memory stages while two consumer warpgroups multiply, the
// gate/up epilogue applying SwiGLU in registers.
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
// consumer c the lines 128 c .. (m64n128k16), so it takes half a full tile's time: an expert's
// pairs seldom fill whole 128-row tiles (256 +- 16 pairs at 8192 tokens, 64 +- 8 at 2048).
//
// Shared memory (128-byte swizzle, wgmma.cuh), kStages stages of
//   tokens  [128 rows] lines of 64 k     16 KB (rows past the tile's are not copied: their
//                                                 products are never stored)
//   weights [256 lines] of 64 k          32 KB
// then the stages' full and empty barriers.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_grouped.cuh"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda {

namespace {

using moe_grouped::GroupedArgs;
using moe_grouped::Projection;
using wgmma::swizzled;

constexpr int kThreads = 384;  // consumers: warpgroups 0 and 1; producer: warpgroup 2
constexpr int kConsumerThreads = 256;
constexpr int kRows = 128, kLines = 256, kStepK = 64;
constexpr int kLine = wgmma::kLineBytes;
constexpr int kTokenBytes = kRows * kLine;    // 16 KB
constexpr int kWeightBytes = kLines * kLine;  // 32 KB
constexpr int kStageBytes = kTokenBytes + kWeightBytes;
constexpr int kStages = 4;
constexpr int kSharedBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;  // 1024: alignment
constexpr int kConsumerRegisters = 232, kProducerRegisters = 40;
static_assert(2 * 128 * kConsumerRegisters + 128 * kProducerRegisters <= 65536, "the register file");
static_assert(kSharedBytes <= 232448, "one block an SM");
// The producer's 16-byte copies a stage: thread t takes chunk t % 8 of lines t / 8 + 16 i.
constexpr int kTokenCopies = kRows * 8 / 128, kWeightCopies = kLines * 8 / 128;

// acc[4 j + e] of consumer c's thread (warp, g, tq): grouped row r0 + 16 warp + g + 8 (e / 2),
// line l0 + 8 j + 2 tq + e % 2 of the block's 256; (r0, l0) = (64 c, 0) in a full tile, (0, 128 c)
// in a short one (j < 16 there).
template <Projection P, bool kShort>
__device__ __forceinline__ void store_tile(const GroupedArgs& a, const float (&acc)[128], int consumer, int first,
                                           int rows, int64_t slice) {
  const int u = threadIdx.x % 128, warp = u / 32, g = u % 32 / 4, tq = u % 4;
  const int row0 = (kShort ? 0 : 64 * consumer) + 16 * warp + g;
  constexpr int kGroups = kShort ? 16 : 32;  // of 8 lines
  if constexpr (P == Projection::kDown) {
    const int64_t feature0 = slice * kLines + (kShort ? 128 * consumer : 0) + 2 * tq;
#pragma unroll
    for (int j = 0; j < kGroups; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h;
        if (r < rows)
          *reinterpret_cast<float2*>(a.out + (first + r) * a.rows_per_expert + feature0 + 8 * j) =
              make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
  } else {
    // 64 gate lines, then the matching 64 up lines: feature i's up sum is 8 register groups on,
    // in this thread. act[row, 128 x + i] = bf16(silu(gate_i) * up_i).
    uint16_t* const act0 = a.act + slice * (kLines / 2) + (kShort ? 64 * consumer : 0) + 2 * tq;
#pragma unroll
    for (int f = 0; f < kGroups / 2; ++f)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h, i = 4 * (f % 8 + 16 * (f / 8)) + 2 * h;  // gate groups 0..7, 16..23
        if (r >= rows) continue;
        const float gate0 = acc[i], gate1 = acc[i + 1], up0 = acc[i + 32], up1 = acc[i + 33];
        *reinterpret_cast<uint32_t*>(act0 + (first + r) * a.inter + 8 * f) =
            pack_bf16_pair(gate0 / (1.0f + expf(-gate0)) * up0, gate1 / (1.0f + expf(-gate1)) * up1);
      }
  }
}

// A consumer's steps: wait for a stage, multiply it, keep one step's wgmma in flight and hand the
// step before back to the producer. kShort: rows 0..63 against this consumer's 128 lines.
template <bool kShort>
__device__ __forceinline__ void multiply_steps(float (&acc)[128], uint32_t stages, uint32_t full, uint32_t empty,
                                               int steps, int consumer) {
  // Stage 0's rows and lines for this consumer; 16 k further on is 32 bytes.
  const uint64_t token_descriptor = wgmma::descriptor(stages + (kShort ? 0 : consumer * 64 * kLine), 16, 1024);
  const uint64_t weight_descriptor =
      wgmma::descriptor(stages + kTokenBytes + (kShort ? consumer * (kLines / 2) * kLine : 0), 16, 1024);
  for (int step = 0; step < steps; ++step) {
    const int stage = step % kStages;
    pipeline::barrier_wait(full + 8 * stage, (step / kStages) & 1);
    wgmma::fence_async_proxy();  // the copies' writes before the tensor cores' reads
    wgmma::pin(acc);
    wgmma::fence();
    const uint32_t at = stage * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < kStepK / 16; ++kk) {
      const uint64_t tokens = wgmma::descriptor_advanced(token_descriptor, at + kk * 32);
      const uint64_t weights = wgmma::descriptor_advanced(weight_descriptor, at + kk * 32);
      if constexpr (kShort) wgmma::m64n128k16<0>(reinterpret_cast<float(&)[64]>(acc), tokens, weights);
      else wgmma::m64n256k16<0>(acc, tokens, weights);
    }
    wgmma::commit();
    // The previous step's products are done: its stage goes back to the producer.
    wgmma::wait<1>();
    wgmma::pin(acc);
    if (step > 0) pipeline::barrier_arrive(empty + 8 * ((step - 1) % kStages));
  }
  wgmma::wait_all();
  wgmma::pin(acc);
}

template <Projection P>
__global__ void __launch_bounds__(kThreads, 1) specialized_experts_kernel(GroupedArgs a) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const moe_grouped::RowTile tile =
      moe_grouped::unit_of_block<kRows, kThreads>(a.offsets, a.num_experts, static_cast<int>(blockIdx.x), a.slices);
  if (tile.expert < 0) return;
  const int e = tile.expert, first = tile.first, rows = tile.rows;
  const int64_t slice = tile.slice;
  const uint32_t stages = wgmma::align_to_1024(shared_raw).address;
  const uint32_t barriers = stages + kStages * kStageBytes;
  const uint32_t full = barriers, empty = barriers + 8 * kStages;  // copies landed; both consumers done
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      pipeline::barrier_init(full + 8 * s, 128);
      pipeline::barrier_init(empty + 8 * s, kConsumerThreads);
    }
    pipeline::barrier_init_fence();
  }
  __syncthreads();
  const int64_t k = a.k;
  const int steps = static_cast<int>(k / kStepK);
  // Broadcast from lane 0: the compiler then knows each warp takes one side of the branch (wgmma
  // on a path it thinks divergent are serialised).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);

  if (warpgroup == 2) {
    pipeline::shrink_registers<kProducerRegisters>();
    const int index = threadIdx.x % 128, chunk = index % 8, line0 = index / 8;
    // Few registers here: the token rows' element offsets (rows past the tile's are skipped),
    // and two weight bases that whole 16-line groups advance: gate/up, the gate rows and the up
    // rows of the block's features (stage lines 64 h .. 64 h + 63 are gate rows 64 (h / 2) .. for
    // even h, the same up rows for odd h); down, lines 0..127 and 128..255.
    uint32_t token_at[kTokenCopies];  // in 16-byte units: under 2^32 for any launch (checked on the host)
    uint32_t token_valid = 0;
#pragma unroll
    for (int i = 0; i < kTokenCopies; ++i) {
      const int r = line0 + 16 * i;
      const int32_t source =
          r >= rows ? -1 : P == Projection::kGateUp ? a.sorted_pairs[first + r] / a.top_k : first + r;
      token_at[i] = static_cast<uint32_t>(((source < 0 ? 0 : source * k) + 8 * chunk) / 8);
      token_valid |= source < 0 ? 0u : 1u << i;
    }
    const uint16_t* const lower = a.weights + moe_grouped::weight_row<P, kLines>(a, e, line0, slice) * k + 8 * chunk;
    const uint16_t* const upper =
        a.weights + moe_grouped::weight_row<P, kLines>(a, e, line0 + kLines / 2, slice) * k + 8 * chunk;
    const int64_t lines16 = 16 * k;  // elements between lines 16 apart
    for (int step = 0; step < steps; ++step) {
      const int stage = step % kStages;
      pipeline::barrier_wait(empty + 8 * stage, ((step / kStages) & 1) ^ 1);  // the first round passes
      const uint32_t tokens = stages + stage * kStageBytes, weights = tokens + kTokenBytes;
      const int64_t offset = int64_t{step} * kStepK;
#pragma unroll
      for (int i = 0; i < kTokenCopies; ++i)
        if (token_valid >> i & 1)
          wgmma::copy_async_16(tokens + swizzled(line0 + 16 * i, chunk), a.x + 8 * int64_t{token_at[i]} + offset, 16);
#pragma unroll
      for (int i = 0; i < kWeightCopies; ++i) {
        // Copy i reads 16-line group i % 8 of the lower or upper rows (in that order, so that each
        // source is the last one plus 16 lines) into its stage line.
        constexpr int kHalf = kWeightCopies / 2;
        const int upper_half = i / kHalf, group = i % kHalf;
        const int line = P == Projection::kGateUp ? 64 * (2 * (group / 4) + upper_half) + 16 * (group % 4)
                                                  : 128 * upper_half + 16 * group;
        wgmma::copy_async_16(weights + swizzled(line0 + line, chunk),
                             (upper_half ? upper : lower) + group * lines16 + offset, 16);
      }
      pipeline::barrier_arrive_on_copies(full + 8 * stage);
    }
    wgmma::copy_async_wait<0>();
    return;
  }

  pipeline::grow_registers<kConsumerRegisters>();
  const int consumer = warpgroup;
  // A tile of 64 rows or fewer: both consumers on rows 0..63, each on half the lines (broadcast,
  // so that the compiler sees the branch taken by whole warps).
  const bool short_tile = __shfl_sync(0xffffffffu, rows <= 64 ? 1 : 0, 0) != 0;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  if (short_tile) {
    multiply_steps<true>(acc, stages, full, empty, steps, consumer);
    store_tile<P, true>(a, acc, consumer, first, rows, slice);
  } else {
    multiply_steps<false>(acc, stages, full, empty, steps, consumer);
    store_tile<P, false>(a, acc, consumer, first, rows, slice);
  }
}

// A block a unit of moe_grouped::unit_of_block: an expert's row tiles of one output slice come
// one after another, so that the blocks reading the same weight lines run at about the same time
// and share them in L2 (by row tile, then slice, each weight line came from DRAM up to 1.4 times).
template <Projection P>
void launch_projection(GroupedArgs a, int64_t features, int64_t tiles, cudaStream_t stream) {
  auto* kernel = specialized_experts_kernel<P>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "moe_experts_specialized shared memory");
  const int64_t per_block = P == Projection::kGateUp ? kLines / 2 : kLines;
  a.slices = static_cast<int>(features / per_block);
  GLMS_CHECK(tiles * a.slices < (int64_t{1} << 31), "moe_experts_specialized: too many pairs for one launch");
  launch_chained("moe_experts_specialized launch", kernel, static_cast<unsigned>(tiles * a.slices), kThreads,
                 kSharedBytes, stream, a);
}

}  // namespace

bool moe_experts_specialized_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter) {
  return experts.format == WeightFormat::Plain && hidden % kLines == 0 && inter % (kLines / 2) == 0 &&
         hidden % kStepK == 0 && inter % kStepK == 0;
}

void moe_experts_specialized(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                             const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, uint16_t* act,
                             float* expert_out, cudaStream_t stream) {
  if (num_pairs <= 0 || num_experts <= 0) return;
  GLMS_CHECK(moe_experts_specialized_supported(experts, hidden, inter),
             "moe_experts_specialized: bf16 experts with hidden a multiple of 256 and inter of 128");
  // Row tiles: at most one part-filled tile per expert beyond the full ones.
  const int64_t tiles = (num_pairs + kRows - 1) / kRows + std::min<int64_t>(num_experts, num_pairs);
  GLMS_CHECK(num_pairs * std::max(hidden, inter) / 8 < (int64_t{1} << 32),
             "moe_experts_specialized: too many pairs for one launch");
  GroupedArgs a = moe_grouped::grouped_args(plan, num_experts, top_k, inter, act, expert_out);
  a.x = x;
  a.weights = static_cast<const uint16_t*>(experts.gate_up);
  a.k = hidden;
  a.rows_per_expert = 2 * inter;
  launch_projection<Projection::kGateUp>(a, inter, tiles, stream);
  a.x = act;
  a.weights = static_cast<const uint16_t*>(experts.down);
  a.k = inter;
  a.rows_per_expert = hidden;
  launch_projection<Projection::kDown>(a, hidden, tiles, stream);
}

}  // namespace glms::ops::cuda
