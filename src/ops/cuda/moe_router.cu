// The MoE router's product of a decode step on the bf16 tensor cores, as accurate as an fp32
// GEMM: the router's weights are bf16 values, and each fp32 input is the sum of its three bf16
// terms (core/bf16_terms.h), so x . w is three bf16 products, each exact in fp32.
//
// Why this shape: below 256 tokens the product (256 experts x 6144 bf16, 3.1 MB, against T x
// 6144 fp32 rows) is a read of the weights; cuBLAS's fp32 GEMM took 13-20 us a MoE layer there
// (a SIMT kernel and its split-K reduction), and a CUDA-core kernel of our own no less, its
// multiply-adds too many to hide. Here 64 blocks along k per 64 experts (256 blocks for GLM-5's
// 256) load their weights before waiting for the kernel before them; each block splits its x
// columns into terms once, in shared memory as the mma B fragments its four row tiles' warps
// read, so the three bf16 mmas a k16 step and their adds are most of what a warp runs. The tensor
// cores sum in fp32 with truncation, so every k16 step's three mmas start from zero (the smallest
// term first) and their sum joins the warp's fp32 total by a rounded add: no truncated sum runs
// over more than one step's 48 products. A cluster of 8 blocks along k adds its blocks' sums
// through distributed shared memory in rank order, so the output is kRouterProductPlanes planes
// that moe_route adds in plane order: the same bits on every run.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <limits>

#include "core/error.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.h"

namespace glms::ops::cuda {

namespace {

constexpr int kSlices = 64;               // blocks along k (grid.x)
constexpr int kCluster = 8;               // blocks along k summed in one cluster
constexpr int kExperts = 64;              // a block's weight rows: four 16-row tiles
constexpr int kTokens = 64;               // a block's tokens: eight 8-token tiles
constexpr int kTiles = kTokens / 8;
constexpr int kThreads = 256;             // warp w: row tile w % 4, the block's steps of parity w / 4
constexpr int kStepStride = 2 * kSlices;  // k16 steps between one warp's consecutive steps
constexpr int kMaxSteps = 4;              // a warp's steps: cols <= kMaxSteps * kStepStride * 16
static_assert(kSlices / kCluster == kRouterProductPlanes, "one plane a cluster");

__device__ __forceinline__ uint32_t load_u32(const uint16_t* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }

// d = a b (c zero) or d += a b: m16n8k16, bf16 in, fp32 out (not volatile: the compiler may
// interleave the token tiles' independent chains).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint2 b, bool add) {
  const float zero = 0.0f;
  if (add) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "f"(zero));
  }
}

// The block's k16 steps: two a warp step (parities 0 and 1), for the most steps a warp takes.
__host__ __device__ constexpr int block_steps(int cols) {
  return 2 * ((cols / 16 + kStepStride - 1) / kStepStride);
}

// Shared memory: the terms of the block's x as mma B fragments, [3][block steps][kTiles][32]
// uint2 (term, step, token tile, lane: the lane's b0 and b1 words); after the products, the
// odd steps' sums and the block's, [kTokens][kExperts] fp32 each.
__host__ __device__ constexpr int shared_bytes(int cols) {
  const int terms = 3 * block_steps(cols) * kTiles * 32 * 8, sums = 2 * kTokens * kExperts * 4;
  return terms > sums ? terms : sums;
}

// The three bf16 terms of a block's x columns as mma B fragment words, [3][block steps][kTiles]
// [32] uint2 (see shared_bytes) for tokens token0 .. + live_tokens - 1 of x [n, cols] fp32:
// item (token, block step, quad of columns), a float4 of x each.
__device__ __forceinline__ void write_x_terms(const float* x, int token0, int live_tokens, int cols, int steps,
                                              int steps_here, int slice_step, uint32_t* terms) {
  const int items = live_tokens * steps_here * 4;
  for (int item = static_cast<int>(threadIdx.x); item < items; item += kThreads) {
    const int quad = item % 4, block_step = item / 4 % steps_here, t = item / 4 / steps_here;
    const int step = slice_step + block_step % 2 + block_step / 2 * kStepStride;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float* row = x + static_cast<int64_t>(token0 + t) * cols;
    if (step < steps) v = __ldg(reinterpret_cast<const float4*>(row + step * 16) + quad);
    // Columns 4 quad .. 4 quad + 3: pairs 2 quad and 2 quad + 1, of lanes (t % 8, pair % 4), word pair / 4.
    const float values[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int pair = 2 * quad + half;
      float low = values[2 * half], high = values[2 * half + 1];
      const int slot = ((block_step * kTiles + t / 8) * 32 + (t % 8) * 4 + pair % 4) * 2 + pair / 4;
#pragma unroll
      for (int term = 0; term < 3; ++term) {
        const uint32_t word = pack_bf16_pair(low, high);
        terms[term * steps_here * kTiles * 64 + slot] = word;
        low -= __uint_as_float(word << 16);
        high -= __uint_as_float(word & 0xffff0000u);
      }
    }
  }
}

// Block (slice, expert tile, token tile): x [n, cols] fp32, w [rows, cols] bf16; planes
// [kRouterProductPlanes, n, rows] fp32. The block's steps are 2 * slice + parity + kStepStride * j.
// The block first writes the three bf16 terms of its x columns into shared memory once (each
// lane's B fragment words in place), so that its four row tiles' warps share them; a warp's mma
// rows are then weight rows (experts), its columns tokens: lane (g, c) = (lane / 4, lane % 4)
// holds rows g and g + 8, tokens 2c and 2c + 1 of each 8-token tile.
__global__ void __launch_bounds__(kThreads, 2)
    router_product_kernel(const float* x, int n, const uint16_t* w, int rows, int cols, float* planes) {
  extern __shared__ __align__(16) uint8_t shared[];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, c = lane % 4;
  const int tile_row = (warp % 4) * 16, row0 = static_cast<int>(blockIdx.y) * kExperts + tile_row;
  const int token0 = static_cast<int>(blockIdx.z) * kTokens, parity = warp / 4;
  const int steps = cols / 16, steps_here = block_steps(cols), slice_step = 2 * static_cast<int>(blockIdx.x);
  const bool has_rows = row0 < rows;
  // The weights (no kernel writes them) load before the wait for the previous kernel.
  uint32_t a[kMaxSteps][4];
#pragma unroll
  for (int j = 0; j < kMaxSteps; ++j) {
    const int step = slice_step + parity + j * kStepStride;
    if (has_rows && step < steps) {
      const uint16_t* p = w + static_cast<int64_t>(row0 + g) * cols + step * 16 + 2 * c;
      a[j][0] = load_u32(p);
      a[j][1] = load_u32(p + 8 * static_cast<int64_t>(cols));
      a[j][2] = load_u32(p + 8);
      a[j][3] = load_u32(p + 8 * static_cast<int64_t>(cols) + 8);
    }
  }
  wait_for_previous_grid();
  release_dependent_grids();
  uint32_t* terms = reinterpret_cast<uint32_t*>(shared);
  const int live_tokens = min(kTokens, n - token0);
  write_x_terms(x, token0, live_tokens, cols, steps, steps_here, slice_step, terms);
  __syncthreads();
  const int live_tiles = (live_tokens + 7) / 8;
  const uint2* fragments = reinterpret_cast<const uint2*>(terms);
  float sums[kTiles][4] = {};
#pragma unroll
  for (int j = 0; j < kMaxSteps; ++j) {
    const int step = slice_step + parity + j * kStepStride;
    if (!has_rows || step >= steps) break;
    const int block_step = 2 * j + parity;
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
      if (tile >= live_tiles) break;  // the same in every lane
      const uint2* b = fragments + (block_step * kTiles + tile) * 32 + lane;
      float step_sum[4];  // the smallest term first; no truncated fp32 sum spans more than this step
      mma_bf16(step_sum, a[j], b[2 * steps_here * kTiles * 32], false);
      mma_bf16(step_sum, a[j], b[steps_here * kTiles * 32], true);
      mma_bf16(step_sum, a[j], b[0], true);
#pragma unroll
      for (int i = 0; i < 4; ++i) sums[tile][i] += step_sum[i];
    }
  }
  // The block's slice: even steps' sums + odd steps' sums, [token][row] in shared memory (over
  // the terms, once every warp is done with them).
  float* upper_sums = reinterpret_cast<float*>(shared);
  float* block_sums = upper_sums + kTokens * kExperts;
  auto index = [&](int tile, int i) { return (tile * 8 + 2 * c + (i & 1)) * kExperts + tile_row + g + (i >> 1) * 8; };
  __syncthreads();
  if (parity == 1) {
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
      for (int i = 0; i < 4; ++i) upper_sums[index(tile, i)] = sums[tile][i];
  }
  __syncthreads();
  if (parity == 0) {
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
      for (int i = 0; i < 4; ++i) block_sums[index(tile, i)] = sums[tile][i] + upper_sums[index(tile, i)];
  }
  // The cluster's slices summed in rank order, each block writing an eighth of the values.
  auto cluster = cooperative_groups::this_cluster();
  cluster.sync();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t plane = blockIdx.x / kCluster;
  constexpr int kShare = kTokens * kExperts / kCluster;
  for (int v = rank * kShare + static_cast<int>(threadIdx.x); v < (rank + 1) * kShare; v += kThreads) {
    const int t = token0 + v / kExperts, row = static_cast<int>(blockIdx.y) * kExperts + v % kExperts;
    if (t >= n) break;  // v / kExperts only grows
    float total = *cluster.map_shared_rank(block_sums + v, 0);
#pragma unroll
    for (int b = 1; b < kCluster; ++b) total += *cluster.map_shared_rank(block_sums + v, b);
    if (row < rows) planes[(plane * n + t) * rows + row] = total;
  }
  cluster.sync();  // every block has read this block's sums
}

}  // namespace

bool router_product_fits(int64_t rows, int64_t cols) {
  return rows > 0 && rows % 16 == 0 && cols > 0 && cols % 16 == 0 && cols <= kMaxSteps * kStepStride * 16 &&
         rows <= std::numeric_limits<int>::max();
}

void router_product(const float* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols, float* planes,
                    cudaStream_t stream) {
  if (n == 0) return;
  GLMS_CHECK(router_product_fits(rows, cols), "router_product: rows and cols must be multiples of 16, cols <= 8192");
  GLMS_CHECK(n <= std::numeric_limits<int>::max() / kTokens, "router_product: too many tokens");
  const dim3 grid(kSlices, static_cast<unsigned>((rows + kExperts - 1) / kExperts),
                  static_cast<unsigned>((n + kTokens - 1) / kTokens));
  const int bytes = shared_bytes(static_cast<int>(cols));
  // Per device (each rank's thread has its own), so set on every launch: a host call of a microsecond.
  check(cudaFuncSetAttribute(router_product_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "router_product shared memory");
  launch_chained_clusters("router_product launch", router_product_kernel, kCluster, grid, kThreads, bytes, stream, x,
                          static_cast<int>(n), w, static_cast<int>(rows), static_cast<int>(cols), planes);
}

}  // namespace glms::ops::cuda
