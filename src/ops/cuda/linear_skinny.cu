// Linear layers of a few to 128 tokens on Hopper's warpgroup tensor cores (a data-parallel rank's
// decode batch: q_a / kv_a / the indexer's weights, q_b, o_proj, the shared expert, the dense
// MLP): y_m[n, rows_m] (fp32) = x[n, cols] . w_m[rows_m, cols]^T for up to kGemvMaxGroup
// matrices that read the same x, in one launch.
//
// Why this shape: at 64 tokens a layer's GEMMs stream their weights once and are bound by memory,
// but cuBLAS takes one launch a matrix and picks split-K tiles with a separate reduction kernel
// for the narrow ones (Nsight Compute on an EP8 rank at batch 64: kv_a at 1.1 TB/s, q_a at 2.5,
// 36 reduction launches in 8 layers; the four projections of x take 46 us a layer). Here the
// weights are the wgmma's A operand (64 rows a wgmma) and the tokens its N (32, 64 or 128
// columns), both copied by TMA into a ring of stages by one producer thread; a block of one
// consumer warpgroup takes 64 or 128 weight rows over a range of k (plan_launch says which).
// Where the row tiles are too few to fill the GPU, the k range is split over the blocks of a
// thread block cluster (2 to 8), which add their partial sums through distributed shared memory
// in a fixed order: no workspace, no second launch, the same sums every run.
//
// Shared memory (128-byte swizzle, wgmma.cuh), kStages stages of
//   weights [64 or 128 rows] lines of 64 k   8 or 16 KB
//   tokens  [kN rows] lines of 64 k          kN x 128 bytes (rows past n: zeros, by TMA)
// then the stages' full and empty barriers; after the loop the stages hold the block's partial
// sums [n][kPartStride] fp32 for the cluster's reduction.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/tensor_map.h"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda {

namespace {

constexpr int kStepK = 64;  // k a stage: one 128-byte line a row
constexpr int kConsumerThreads = 128;
constexpr int kThreads = kConsumerThreads + 32;  // the consumer warpgroup, then the producer warp
constexpr int kLine = wgmma::kLineBytes;
constexpr int kMaxSplits = 8;  // blocks of a cluster (the portable most)
constexpr int kSharedPerSm = 233472;  // bytes of shared memory an SM (228 KB), 1 KB of it the system's a block

// A block's tile: kHalves m64 halves of weight rows (64 or 128 rows) against kN token columns,
// kStages stages in the ring.
template <int kN, int kHalves, int kStages>
struct Tile {
  static constexpr int kRows = 64 * kHalves;
  static constexpr int kWeightBytes = kRows * kLine;
  static constexpr int kStageBytes = kWeightBytes + kN * kLine;  // a multiple of 1024: the swizzle's alignment
  static constexpr int kSharedBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;  // 1024: alignment
  static constexpr int kPartStride = kRows + 4;  // floats between tokens' partial rows: 4 t apart, 4 bank groups
  static constexpr int kBlocksPerSm = kSharedPerSm / (kSharedBytes + 1024);
  static_assert(kStageBytes % 1024 == 0, "stages keep the 1024-byte alignment");
  static_assert(kN * kPartStride * 4 <= kStages * kStageBytes, "the partial sums fit in the stages");
  static_assert(kSharedBytes <= 232448, "one block an SM at least");
};

struct SkinnyMaps {
  CUtensorMap x;                 // [n, cols] bf16 (row stride ld_x), boxes of kN rows x 64 k
  CUtensorMap w[kGemvMaxGroup];  // [rows_m, cols] bf16, boxes of the tile's rows x 64 k
};

struct SkinnyArgs {
  float* y[kGemvMaxGroup] = {};
  int64_t ld_y[kGemvMaxGroup] = {};
  int rows[kGemvMaxGroup] = {};
  int first_tile[kGemvMaxGroup + 1] = {};  // row tiles of the matrices before m; [count]: all
  int count = 0;
  int n = 0;
  int steps = 0;  // cols / kStepK
};

// d (+)= A[64 x 16] B[16 x kN], both K-major in shared memory.
template <int kN>
__device__ __forceinline__ void multiply(float (&d)[kN / 2], uint64_t a, uint64_t b) {
  if constexpr (kN == 32) wgmma::m64n32k16(d, a, b, 1);
  else if constexpr (kN == 64) wgmma::m64n64k16(d, a, b, 1);
  else wgmma::m64n128k16<0>(d, a, b);
}

// The producer thread: steps [step0, step0 + steps) of the block's weight rows and the tokens.
// The first stages' weights are requested before the wait for the previous kernel (no kernel
// writes them), so that their latency passes while that kernel finishes.
template <class T, int kStages>
__device__ __forceinline__ void produce(const SkinnyMaps& maps, int m, int row0, int step0, int steps, uint32_t stages,
                                        uint32_t full, uint32_t empty) {
  const int early = steps < kStages ? steps : kStages;
  for (int i = 0; i < early; ++i) {
    pipeline::barrier_arrive_expect_bytes(full + 8 * i, T::kStageBytes);
    pipeline::tensor_copy_2d(stages + i * T::kStageBytes, &maps.w[m], (step0 + i) * kStepK, row0, full + 8 * i);
  }
  chained_grid_prologue();
  for (int i = 0; i < early; ++i)
    pipeline::tensor_copy_2d(stages + i * T::kStageBytes + T::kWeightBytes, &maps.x, (step0 + i) * kStepK, 0,
                             full + 8 * i);
  for (int i = early; i < steps; ++i) {
    const int stage = i % kStages;
    pipeline::barrier_wait(empty + 8 * stage, ((i / kStages) & 1) ^ 1);
    const uint32_t at = stages + stage * T::kStageBytes;
    pipeline::barrier_arrive_expect_bytes(full + 8 * stage, T::kStageBytes);
    const int k0 = (step0 + i) * kStepK;
    pipeline::tensor_copy_2d(at, &maps.w[m], k0, row0, full + 8 * stage);
    pipeline::tensor_copy_2d(at + T::kWeightBytes, &maps.x, k0, 0, full + 8 * stage);
  }
}

// The consumer warpgroup's steps: acc[h] the sums of weight rows 64 h .. 64 h + 63 of the tile;
// one step's wgmma stay in flight while the next is issued, and the step before goes back.
template <class T, int kN, int kHalves, int kStages>
__device__ __forceinline__ void consume(float (&acc)[kHalves][kN / 2], int steps, uint32_t stages, uint32_t full,
                                        uint32_t empty) {
  const uint64_t weights = wgmma::descriptor(stages, 16, 1024);
  const uint64_t tokens = wgmma::descriptor(stages + T::kWeightBytes, 16, 1024);
  for (int i = 0; i < steps; ++i) {
    const int stage = i % kStages;
    pipeline::barrier_wait(full + 8 * stage, (i / kStages) & 1);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) wgmma::pin(acc[h]);
    wgmma::fence();
    const uint32_t at = stage * T::kStageBytes;
#pragma unroll
    for (int kk = 0; kk < kStepK / 16; ++kk) {
      const uint64_t b = wgmma::descriptor_advanced(tokens, at + kk * 32);
#pragma unroll
      for (int h = 0; h < kHalves; ++h)
        multiply<kN>(acc[h], wgmma::descriptor_advanced(weights, at + h * 64 * kLine + kk * 32), b);
    }
    wgmma::commit();
    wgmma::wait<1>();
#pragma unroll
    for (int h = 0; h < kHalves; ++h) wgmma::pin(acc[h]);
    if (i > 0) pipeline::barrier_arrive(empty + 8 * ((i - 1) % kStages));
  }
  wgmma::wait_all();
#pragma unroll
  for (int h = 0; h < kHalves; ++h) wgmma::pin(acc[h]);
}

// store(row, token, sum) for each sum of consumer thread (warp, lane): acc[h][4 j + e] is the
// tile's weight row 64 h + 16 warp + g + 8 (e / 2) against token 8 j + 2 t + e % 2 (g = lane / 4,
// t = lane % 4), wgmma's accumulator layout.
template <int kN, int kHalves, typename Store>
__device__ __forceinline__ void for_each_sum(const float (&acc)[kHalves][kN / 2], int warp, int lane, Store store) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        store(64 * h + 16 * warp + g + 8 * (e / 2), 8 * j + 2 * t + e % 2, acc[h][4 * j + e]);
}

// Block (split, row tile): the tile's rows of matrix m over split's share of k. Launched in
// clusters of gridDim.x blocks along x (the splits) when there are several.
template <int kN, int kHalves, int kStages>
__global__ void __launch_bounds__(kThreads) skinny_linear_kernel(const __grid_constant__ SkinnyMaps maps,
                                                                 SkinnyArgs a) {
  using T = Tile<kN, kHalves, kStages>;
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const int split = static_cast<int>(blockIdx.x), splits = static_cast<int>(gridDim.x);
  const int tile = static_cast<int>(blockIdx.y);
  // The tile's matrix, picked by constant indices (a runtime index would copy the parameters to
  // local memory).
  int m = 0, first_tile = 0, rows = a.rows[0];
  float* y = a.y[0];
  int64_t ld_y = a.ld_y[0];
#pragma unroll
  for (int i = 1; i < kGemvMaxGroup; ++i)
    if (i < a.count && tile >= a.first_tile[i]) {
      m = i, first_tile = a.first_tile[i], rows = a.rows[i];
      y = a.y[i], ld_y = a.ld_y[i];
    }
  const int row0 = (tile - first_tile) * T::kRows;
  const int step0 = split * a.steps / splits, steps = (split + 1) * a.steps / splits - step0;
  const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
  const uint32_t stages = aligned.address;
  const uint32_t full = stages + kStages * T::kStageBytes, empty = full + 8 * kStages;
  // Full: the producer's announcement of a stage's bytes; empty: each consumer thread once.
  pipeline::init_ring<kStages, false>(full, empty, 1, kConsumerThreads);
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 32, 0);

  float acc[kHalves][kN / 2];
  if (warp == kConsumerThreads / 32) {
    if (threadIdx.x == kConsumerThreads) produce<T, kStages>(maps, m, row0, step0, steps, stages, full, empty);
    else chained_grid_prologue();
    __syncwarp();
  } else {
    wait_for_previous_grid();  // before the stores of y (a previous kernel may still read it)
    release_dependent_grids();
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) acc[h][i] = 0.0f;
    consume<T, kN, kHalves, kStages>(acc, steps, stages, full, empty);
  }
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (splits == 1) {
    if (warp == kConsumerThreads / 32) return;
    for_each_sum<kN, kHalves>(acc, warp, lane, [&](int row, int token, float sum) {
      const int r = row0 + row;
      if (r < rows && token < a.n) y[int64_t{token} * ld_y + r] = sum;
    });
    return;
  }

  // Each block's partial sums into its own stages (every wgmma read of them is done: the
  // consumers meet first), then block r of the cluster adds rows r x kRows / splits .. of every
  // block's, in cluster order.
  float* const part = reinterpret_cast<float*>(aligned.generic);
  if (warp < kConsumerThreads / 32) {
    pipeline::named_sync(1, kConsumerThreads);
    for_each_sum<kN, kHalves>(acc, warp, lane, [&](int row, int token, float sum) {
      if (token < a.n) part[token * T::kPartStride + row] = sum;
    });
  }
  pipeline::cluster_sync();
  const int block_rows = T::kRows / splits, quads = block_rows / 4, first_row = split * block_rows;
  for (int item = static_cast<int>(threadIdx.x); item < a.n * quads; item += kThreads) {
    const int token = item / quads, row = first_row + 4 * (item % quads);
    const uint32_t at = stages + static_cast<uint32_t>(sizeof(float)) * (token * T::kPartStride + row);
    float4 sum = pipeline::load_cluster_float4(pipeline::cluster_address(at, 0));
    for (int q = 1; q < splits; ++q) {
      const float4 v = pipeline::load_cluster_float4(pipeline::cluster_address(at, static_cast<uint32_t>(q)));
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    float* const out = y + int64_t{token} * ld_y + row0 + row;
    const float values[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (row0 + row + c < rows) out[c] = values[c];
  }
  pipeline::cluster_sync();  // no block leaves while another reads its partial sums
}

template <int kN, int kHalves, int kStages>
void launch_skinny(const uint16_t* x, int64_t ld_x, int64_t cols, const GemvOutput* outputs, SkinnyArgs args,
                   int splits, cudaStream_t stream) {
  using T = Tile<kN, kHalves, kStages>;
  SkinnyMaps maps;
  maps.x = swizzled_rows_tensor_map(x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, args.n, cols, kN, ld_x);
  int tiles = 0;
  for (int m = 0; m < args.count; ++m) {
    maps.w[m] =
        swizzled_rows_tensor_map(outputs[m].w, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, outputs[m].rows, cols, T::kRows);
    args.first_tile[m] = tiles;
    tiles += static_cast<int>((outputs[m].rows + T::kRows - 1) / T::kRows);
  }
  args.first_tile[args.count] = tiles;
  GLMS_CHECK(tiles <= 65535, "linear_skinny: more row tiles than a grid's y dimension takes");
  // Per device (each rank's thread has its own), so set on every launch: a host call of a microsecond.
  check(cudaFuncSetAttribute(skinny_linear_kernel<kN, kHalves, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             T::kSharedBytes),
        "skinny_linear shared memory");
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(tiles));
  launch_chained_clusters("skinny_linear launch", skinny_linear_kernel<kN, kHalves, kStages>,
                          static_cast<unsigned>(splits), grid, dim3(kThreads), T::kSharedBytes, stream, maps, args);
}

// Stages of a tile in about 200 KB (one block an SM), at most 16.
template <int kN, int kHalves>
constexpr int kDeepStages = std::min(16, (200 * 1024) / ((64 * kHalves + kN) * kLine));

// The two shapes a launch takes, chosen by measurement on the H200 at GLM-5.2's decode shapes, 8
// to 64 tokens (benchmarks/cuda_linear_skinny, docs/performance.md):
// - kDeep: 64-row tiles with a deep ring, one block an SM, k split until the blocks come near
//   the SMs' count, where the matrices' 64-row tiles are at most one an SM (the attention's
//   input projections, the shared expert); a memory-bound launch of k up to 6144 ran best as
//   about one long block an SM keeping 100-190 KB of weights in flight (more blocks with
//   smaller k ranges measured slower: each pays its ring's fill). The same unsplit over up to
//   three waves where those fill 90% of them (the dense MLP's gate/up).
// - kWide: 128-row tiles, two blocks an SM with half the ring each: over long k (o_proj's 16384,
//   the dense down's 12288; k split until the blocks come near the SMs' count), a step of 16 KB
//   a barrier round measured 2-10% faster; unsplit over waves that fill less (q_b with wq_b).
enum class SkinnyShape { kDeep, kWide };

struct SkinnyPlan {
  SkinnyShape shape = SkinnyShape::kWide;
  int splits = 1;
};

constexpr int kLongSteps = 192;  // k of 12288 and more

int row_tiles(const SkinnyArgs& args, int tile_rows) {
  int tiles = 0;
  for (int m = 0; m < args.count; ++m) tiles += (args.rows[m] + tile_rows - 1) / tile_rows;
  return tiles;
}

SkinnyPlan plan_launch(const SkinnyArgs& args) {
  const int tiles64 = row_tiles(args, 64), sms = multiprocessor_count();
  SkinnyPlan plan;
  if (tiles64 <= sms) {
    const int tiles = args.steps >= kLongSteps ? row_tiles(args, 128) : tiles64;
    plan.shape = args.steps >= kLongSteps ? SkinnyShape::kWide : SkinnyShape::kDeep;
    while (plan.splits < kMaxSplits && tiles * 2 * plan.splits <= sms && args.steps >= 4 * plan.splits)
      plan.splits *= 2;
    return plan;
  }
  const int waves = (tiles64 + sms - 1) / sms;
  if (10 * tiles64 >= 9 * waves * sms) plan.shape = SkinnyShape::kDeep;
  return plan;
}

template <int kN>
void launch_planned(const uint16_t* x, int64_t ld_x, int64_t cols, const GemvOutput* outputs, const SkinnyArgs& args,
                    cudaStream_t stream) {
  using Deep = Tile<kN, 1, kDeepStages<kN, 1>>;
  using Wide = Tile<kN, 2, kDeepStages<kN, 2> / 2>;
  static_assert(Deep::kBlocksPerSm == 1 && Wide::kBlocksPerSm == 2, "the shapes' blocks an SM, as planned");
  const SkinnyPlan plan = plan_launch(args);
  if (plan.shape == SkinnyShape::kDeep)
    launch_skinny<kN, 1, kDeepStages<kN, 1>>(x, ld_x, cols, outputs, args, plan.splits, stream);
  else
    launch_skinny<kN, 2, kDeepStages<kN, 2> / 2>(x, ld_x, cols, outputs, args, plan.splits, stream);
}

bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool linear_skinny_fits(const uint16_t* x, int64_t n, int64_t ld_x, int64_t cols, const GemvOutput* outputs,
                        int count) {
  if (n < 1 || n > kSkinnyMaxTokens || count < 1 || count > kGemvMaxGroup || cols < kStepK || cols % kStepK != 0 ||
      ld_x < cols || ld_x % 8 != 0 || !aligned_16(x) || cols / kStepK > (1 << 24))
    return false;
  int64_t tiles64 = 0;
  for (int m = 0; m < count; ++m) {
    if (outputs[m].rows < 1 || outputs[m].rows > (1 << 30) || !aligned_16(outputs[m].w)) return false;
    tiles64 += (outputs[m].rows + 63) / 64;
  }
  return tiles64 <= kSkinnyMaxWaves * int64_t{multiprocessor_count()};
}

void linear_skinny(const uint16_t* x, int64_t n, int64_t ld_x, int64_t cols, const GemvOutput* outputs, int count,
                   cudaStream_t stream) {
  GLMS_CHECK(linear_skinny_fits(x, n, ld_x, cols, outputs, count),
             "linear_skinny: 1 to 128 tokens, up to 4 matrices, 16-byte aligned rows of a multiple of 64 columns");
  SkinnyArgs args;
  for (int m = 0; m < count; ++m) {
    args.y[m] = outputs[m].y;
    args.ld_y[m] = outputs[m].ld_y ? outputs[m].ld_y : outputs[m].rows;
    args.rows[m] = static_cast<int>(outputs[m].rows);
  }
  args.count = count;
  args.n = static_cast<int>(n);
  args.steps = static_cast<int>(cols / kStepK);
  if (n <= 32) launch_planned<32>(x, ld_x, cols, outputs, args, stream);
  else if (n <= 64) launch_planned<64>(x, ld_x, cols, outputs, args, stream);
  else launch_planned<128>(x, ld_x, cols, outputs, args, stream);
}

}  // namespace glms::ops::cuda
