// Expert MLPs on tensor cores for quantised experts, decode to mid-size prefill: mma.sync
// m16n8k16 with fp16 inputs and fp32 accumulation, the weights as the A operand (16 rows) and 8
// tokens a tile as B. An expert's tokens go in chunks of 8 (one tile; the whole rows staged) or
// of 64 (8 tiles sharing each widened weight step; the rows staged a slab at a time).
//
// Why this shape: widening 4-bit codes to fp32 for CUDA-core FMAs costs about three integer ops
// per weight plus the unpacking of the inputs, which keeps a GEMV at a third of the memory bound.
// A code becomes part of an fp16 pair in about one integer op, and the tensor cores take the
// multiplies. At batch 1 the kernel pair still issues an instruction for every few bytes it
// reads, so the instruction count per weight byte is what the layouts below minimise.
//
// Fragments (PTX m16n8k16): lane = 4 * g + t holds A rows g and g + 8 at k = {2t, 2t+1, 2t+8,
// 2t+9}, B column (token) g at the same k, and C rows g, g + 8 at tokens 2t, 2t + 1. The k order
// inside an mma is free as long as A and B agree, so each lane streams one 16-byte chunk of its
// rows a step (MXFP4: a warp's rows g and g + 8 are halves of tile fragments, so a step's reads
// are two contiguous pieces of 512 bytes), and the inputs are staged in row order:
//   MXFP4 (quant/mxfp4_tiles.h's layout): step s covers values 128s .. 128s + 127 of a row;
//     word w of lane t's chunk holds values 32 (4s + w) + 8t .. + 7 of MX block 4s + w, whose
//     pairs are the A registers of two mmas (the lane's inputs: one 16-byte read). So the quad
//     stays inside one block for both mmas: they sum into a fresh fp32 fragment that the block
//     scale then multiplies once (4 FMAs, not a multiply per fp16 pair).
//   FP8: a chunk is 16 E4M3 codes, converted in pairs by the hardware (exact in fp16); the four
//     lanes of a quad cover 64 values inside one 128 x 128 scale block, so the fp32 block scale
//     multiplies the quad's partial sums once.
// Inputs are staged as fp16 with a power-of-two scale per token (the token's largest value
// lands in [2^13, 2^14)), undone on the fp32 results.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_fragments.cuh"
#include "quant/mxfp4_tiles.h"

namespace glms::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Steps in flight per lane (DownShape has the 8-token down kernel's): 6 measured fastest on the
// H200 at batch 1-64 in both formats (4: 2% slower, 2 slower still, 8 spills); 128-thread blocks
// and 3 blocks an SM were no faster (for both kernels of a pair at once).
constexpr int kUnroll = 6;
// Average pairs per expert above which chunks are wide: at 4 (batch 128) 64-token chunks measured
// slower than 8-token ones (MXFP4 experts 8.2 -> 10.8 ms of 4 layers), at 16 (prefill 512) the
// wide ones 25.1 -> 21.8 ms.
constexpr int kWidePairsPerExpert = 8;
// What the fp32 sums are multiplied by besides the token's unscale: MXFP4 pairs are code x 2^-14.
template <WeightFormat F>
constexpr float kWeightUnscale = F == WeightFormat::Mxfp4 ? 16384.0f : 1.0f;

// token_max[j] and unscale[j], j < count (<= kThreads), for rows input_row(j) of src ([*, dim]
// bf16): the bits of the row's largest magnitude, and what undoes token_multiplier of it and the
// weights' own factor (`weight_unscale`: 2^14 for MXFP4's code x 2^-14). Synchronises the block.
template <typename RowOf>
__device__ void measure_rows(const uint16_t* src, int64_t dim, int count, RowOf input_row, float weight_unscale,
                             float* unscale, uint32_t* token_max) {
  const int64_t groups = dim / 8;
  if (threadIdx.x < count) token_max[threadIdx.x] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < count * groups; i += blockDim.x) {
    const int j = static_cast<int>(i / groups);
    const uint4 v = reinterpret_cast<const uint4*>(src + input_row(j) * dim)[i % groups];
    atomicMax(&token_max[j], __float_as_uint(bf16x8_max_abs(v)));
  }
  __syncthreads();
  if (threadIdx.x < count) unscale[threadIdx.x] = weight_unscale / token_multiplier(token_max[threadIdx.x]);
  __syncthreads();
}

// Stages values v0 .. v0 + len (len % 8 == 0) of rows input_row(j), j < count, as fp16 times
// the row's multiplier into xs (row j at word j * stride, in row order). No synchronisation.
template <typename RowOf>
__device__ void stage_values(const uint16_t* src, int64_t dim, int count, RowOf input_row, const uint32_t* token_max,
                             int64_t v0, int len, int stride, uint32_t* xs) {
  const int groups = len / 8;
  for (int i = threadIdx.x; i < count * groups; i += blockDim.x) {
    const int j = i / groups, k = i % groups;
    const float multiplier = token_multiplier(token_max[j]);
    const uint4 v = *reinterpret_cast<const uint4*>(src + input_row(j) * dim + v0 + 8 * k);
    *reinterpret_cast<uint4*>(xs + j * stride + 4 * k) = bf16x8_to_scaled_fp16(v, multiplier);
  }
}

// Whole rows input_row(j), j < count, into xs ([count, dim] fp16 pairs); unscale as
// measure_rows. Synchronises the block.
template <typename RowOf>
__device__ void stage_fp16(const uint16_t* src, int64_t dim, int count, RowOf input_row, float weight_unscale,
                           uint32_t* xs, float* unscale, uint32_t* token_max) {
  measure_rows(src, dim, count, input_row, weight_unscale, unscale, token_max);
  stage_values(src, dim, count, input_row, token_max, 0, static_cast<int>(dim), static_cast<int>(dim / 2), xs);
  __syncthreads();
}

// One warp's stream over two weight rows (mma rows g and g + 8 of its lanes), `dim` wide:
// load() puts kLoadSteps steps of 16-byte chunks and their scales in registers, compute() adds
// W[rows] . x of those steps to acc (C of the two rows x 8 tokens). (Loading the first steps
// before staging the inputs measured slower: batch 64 MXFP4 experts 6.25 -> 6.55 ms, FP8 8.77 ->
// 9.44, batch 1 even.)
template <WeightFormat F, int kTokens, int kLoadSteps = kUnroll>
struct RowPairStream {
  static constexpr int kStepValues = F == WeightFormat::Mxfp4 ? 128 : 64;  // a row's values per quad step
  // From a row's step s to s + 1 in 16-byte chunks: MXFP4 rows are tiled in 16-row fragments.
  static constexpr int64_t kStepStride = F == WeightFormat::Mxfp4 ? quant::kMxfp4TileStepBytes / 16 : 4;
  const uint4* chunks_a;
  const uint4* chunks_b;
  const void* scales_a;
  const void* scales_b;
  int64_t steps;
  uint4 wa[kLoadSteps], wb[kLoadSteps];
  // MXFP4: the E8M0 codes of the step's 4 blocks (one byte each); FP8: the step's block scale.
  uint32_t sa[kLoadSteps], sb[kLoadSteps];

  __device__ __forceinline__ RowPairStream(const uint8_t* row_a, const uint8_t* row_b, const void* row_scales_a,
                                           const void* row_scales_b, int64_t dim)
      : chunks_a(reinterpret_cast<const uint4*>(row_a)),
        chunks_b(reinterpret_cast<const uint4*>(row_b)),
        scales_a(row_scales_a),
        scales_b(row_scales_b),
        steps(dim / kStepValues) {}

  __device__ __forceinline__ void load(int64_t s0) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int u = 0; u < kLoadSteps; ++u) {
      const int64_t s = s0 + u, c = 4 * s + t;
      if (s < steps) {
        wa[u] = __ldg(chunks_a + kStepStride * s + t);
        wb[u] = __ldg(chunks_b + kStepStride * s + t);
        if constexpr (F == WeightFormat::Mxfp4) {
          sa[u] = __ldg(static_cast<const uint32_t*>(scales_a) + quant::kMxfp4TileScaleStepWords * s);
          sb[u] = __ldg(static_cast<const uint32_t*>(scales_b) + quant::kMxfp4TileScaleStepWords * s);
        } else {
          sa[u] = __float_as_uint(__ldg(static_cast<const float*>(scales_a) + (c >> 3)));
          sb[u] = __float_as_uint(__ldg(static_cast<const float*>(scales_b) + (c >> 3)));
        }
      }
    }
  }

  // Adds the scaled fragment part (rows g, g + 8 of one scale block each) to acc.
  __device__ __forceinline__ static void add_scaled(float (&acc)[4], const float (&part)[4], float scale_a,
                                                    float scale_b) {
    acc[0] = fmaf(part[0], scale_a, acc[0]);
    acc[1] = fmaf(part[1], scale_a, acc[1]);
    acc[2] = fmaf(part[2], scale_b, acc[2]);
    acc[3] = fmaf(part[3], scale_b, acc[3]);
  }

  // x_row: the staged pairs of this lane's token (column g of B; a copy of another token's when
  // the chunk has fewer, whose columns are never written).
  __device__ __forceinline__ void compute(int64_t s0, const uint32_t* x_row, float (&acc)[4]) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int u = 0; u < kLoadSteps; ++u) {
      const int64_t s = s0 + u;
      if (s >= steps) break;
      if constexpr (F == WeightFormat::Mxfp4) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          // Values 32 (4s + w) + 8t .. + 7 of both rows, block 4s + w.
          const uint4 xv = *reinterpret_cast<const uint4*>(x_row + (kStepValues * s + 32 * w + 8 * t) / 2);
          const uint32_t qa = word_of(wa[u], w), qb = word_of(wb[u], w);
          float part[4];
          const uint32_t a0[4] = {quant::mxfp4_tile_pair(qa, 0), quant::mxfp4_tile_pair(qb, 0),
                                  quant::mxfp4_tile_pair(qa, 1), quant::mxfp4_tile_pair(qb, 1)};
          mma_f16_fresh(part, a0, xv.x, xv.y);
          const uint32_t a1[4] = {quant::mxfp4_tile_pair(qa, 2), quant::mxfp4_tile_pair(qb, 2),
                                  quant::mxfp4_tile_pair(qa, 3), quant::mxfp4_tile_pair(qb, 3)};
          mma_f16(part, a1, xv.z, xv.w);
          add_scaled(acc, part, e8m0_byte_scale(sa[u], w), e8m0_byte_scale(sb[u], w));
        }
      } else {
        const int64_t c = 4 * s + t;
        uint4 xv[2];  // the lane's token's inputs of chunk c (16 values)
#pragma unroll
        for (int i = 0; i < 2; ++i) xv[i] = reinterpret_cast<const uint4*>(x_row + c * 8)[i];
        float part[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const uint32_t qa = word_of(wa[u], m), qb = word_of(wb[u], m);
          const uint32_t a[4] = {e4m3_pair(qa & 0xffffu), e4m3_pair(qb & 0xffffu), e4m3_pair(qa >> 16),
                                 e4m3_pair(qb >> 16)};
          if (m == 0) mma_f16_fresh(part, a, xv[0].x, xv[0].y);
          else mma_f16(part, a, word_of(xv[m / 2], 2 * (m % 2)), word_of(xv[m / 2], 2 * (m % 2) + 1));
        }
        add_scaled(acc, part, __uint_as_float(sa[u]), __uint_as_float(sb[u]));
      }
    }
  }

  // Loaded steps s0 .. s0 + kLoadSteps - 1 against `tiles` (<= kTiles) tiles of 8 staged tokens:
  // xs holds the tokens' values from s0 * kStepValues on, token j's at word j * stride. The
  // widened weights of a step serve every tile; acc[j] is C of the two rows x tile j's tokens.
  template <int kTiles>
  __device__ __forceinline__ void compute_tiles(int64_t s0, const uint32_t* xs, int stride, int tiles,
                                                float (&acc)[kTiles][4]) {
    const int t = threadIdx.x % 4, g = (threadIdx.x % 32) / 4;
#pragma unroll
    for (int u = 0; u < kLoadSteps; ++u) {
      if (s0 + u >= steps) break;
      if constexpr (F == WeightFormat::Mxfp4) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const uint32_t qa = word_of(wa[u], w), qb = word_of(wb[u], w);
          const uint32_t a0[4] = {quant::mxfp4_tile_pair(qa, 0), quant::mxfp4_tile_pair(qb, 0),
                                  quant::mxfp4_tile_pair(qa, 1), quant::mxfp4_tile_pair(qb, 1)};
          const uint32_t a1[4] = {quant::mxfp4_tile_pair(qa, 2), quant::mxfp4_tile_pair(qb, 2),
                                  quant::mxfp4_tile_pair(qa, 3), quant::mxfp4_tile_pair(qb, 3)};
          const float scale_a = e8m0_byte_scale(sa[u], w), scale_b = e8m0_byte_scale(sb[u], w);
#pragma unroll
          for (int j = 0; j < kTiles; ++j) {
            if (j >= tiles) break;
            const uint4 xv = *reinterpret_cast<const uint4*>(xs + (8 * j + g) * stride + (kStepValues * u + 32 * w + 8 * t) / 2);
            float part[4];
            mma_f16_fresh(part, a0, xv.x, xv.y);
            mma_f16(part, a1, xv.z, xv.w);
            add_scaled(acc[j], part, scale_a, scale_b);
          }
        }
      } else {
        uint32_t a[4][4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const uint32_t qa = word_of(wa[u], m), qb = word_of(wb[u], m);
          a[m][0] = e4m3_pair(qa & 0xffffu);
          a[m][1] = e4m3_pair(qb & 0xffffu);
          a[m][2] = e4m3_pair(qa >> 16);
          a[m][3] = e4m3_pair(qb >> 16);
        }
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          if (j >= tiles) break;
          const uint4* x_chunk = reinterpret_cast<const uint4*>(xs + (8 * j + g) * stride + (4 * u + t) * 8);
          const uint4 xv[2] = {x_chunk[0], x_chunk[1]};
          float part[4];
          mma_f16_fresh(part, a[0], xv[0].x, xv[0].y);
          mma_f16(part, a[1], xv[0].z, xv[0].w);
          mma_f16(part, a[2], xv[1].x, xv[1].y);
          mma_f16(part, a[3], xv[1].z, xv[1].w);
          add_scaled(acc[j], part, __uint_as_float(sa[u]), __uint_as_float(sb[u]));
        }
      }
    }
  }

  // The whole row pair against the staged inputs xs ([kTokens, dim] fp16 pairs, count valid).
  __device__ __forceinline__ void run(const uint32_t* xs, int64_t dim, int count, float (&acc)[4]) {
    const int g = (threadIdx.x % 32) / 4;
    const uint32_t* x_row = xs + min(g, count - 1) * dim / 2;
    for (int64_t s0 = 0; s0 < steps; s0 += kLoadSteps) {
      load(s0);
      compute(s0, x_row, acc);
    }
  }
};

// Where a row's codes start: MXFP4 in the tile layout, FP8 row after row.
template <WeightFormat F>
__device__ __forceinline__ const uint8_t* row_codes(const void* data, int64_t row, int64_t cols) {
  if constexpr (F == WeightFormat::Mxfp4) return static_cast<const uint8_t*>(data) + quant::mxfp4_tile_row_offset(row, cols);
  else return static_cast<const uint8_t*>(data) + row * cols;
}

// Where a row's scales start: MXFP4 scale words in the tile layout, FP8 row after row.
template <WeightFormat F>
__device__ __forceinline__ const void* row_scales(const void* scales, int64_t row, int64_t cols) {
  if constexpr (F == WeightFormat::Mxfp4)
    return static_cast<const uint32_t*>(scales) + quant::mxfp4_tile_scale_word(row, cols);
  else return static_cast<const float*>(scales) + row * ((cols + 127) / 128);
}

// Chunks of 8 tokens stage their inputs' whole rows and fill one mma tile; chunks of 64
// (prefill) share each loaded, widened weight step between 8 tiles, and as their rows are too
// long for shared memory whole they are staged kSlabSteps steps at a time, each row padded by
// 64 bytes (the two token rows that one 8-lane phase of a 16-byte load reads then fall in
// different banks).
constexpr int kSlabSteps = 4;

template <WeightFormat F, int kTokens, int kLoadSteps = kUnroll>
struct Chunks {
  static constexpr bool kSlabs = kTokens > 8;
  static constexpr int kTiles = kSlabs ? kTokens / 8 : 1;
  using Stream = RowPairStream<F, kTokens, kSlabs ? kSlabSteps : kLoadSteps>;
  static constexpr int kSlabValues = kSlabSteps * Stream::kStepValues;
  static constexpr int kSlabStride = kSlabValues / 2 + 16;  // 32-bit words a staged row
  static size_t shared_bytes(int64_t dim) {
    return kSlabs ? sizeof(uint32_t) * kTokens * kSlabStride : sizeof(uint16_t) * kTokens * dim;
  }
};

// A chunk of `count` tokens (rows input_row(j) of src, [*, dim] bf16) against the stream's row
// pair: acc[j] gets tile j's C, unscale[j] what undoes token j's staging. Warps without rows
// (has_rows false) only stage. Synchronises the block.
template <WeightFormat F, int kTokens, int kLoadSteps, typename RowOf>
__device__ __forceinline__ void chunk_products(typename Chunks<F, kTokens, kLoadSteps>::Stream& stream, bool has_rows,
                                               const uint16_t* src, int64_t dim, int count, RowOf input_row,
                                               uint32_t* xs, float* unscale, uint32_t* token_max,
                                               float (&acc)[Chunks<F, kTokens, kLoadSteps>::kTiles][4]) {
  using C = Chunks<F, kTokens, kLoadSteps>;
#pragma unroll
  for (int j = 0; j < C::kTiles; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  if constexpr (!C::kSlabs) {
    stage_fp16(src, dim, count, input_row, kWeightUnscale<F>, xs, unscale, token_max);
    if (has_rows) stream.run(xs, dim, count, acc[0]);
  } else {
    measure_rows(src, dim, count, input_row, kWeightUnscale<F>, unscale, token_max);
    const int tiles = (count + 7) / 8;
    for (int64_t s0 = 0; s0 < stream.steps; s0 += kSlabSteps) {
      if (has_rows) stream.load(s0);
      __syncthreads();  // the previous slab has been read
      const int64_t v0 = s0 * C::Stream::kStepValues;
      const int len = static_cast<int>(min(static_cast<int64_t>(C::kSlabValues), dim - v0));
      stage_values(src, dim, count, input_row, token_max, v0, len, C::kSlabStride, xs);
      __syncthreads();
      if (has_rows) stream.template compute_tiles<C::kTiles>(s0, xs, C::kSlabStride, tiles, acc);
    }
  }
}

// Block (tile, slot) of the grid (launch: row tiles along x) works for expert slot `slot`.
// Warp w of block (tile, slot) computes gate rows r0 .. r0 + 7 (mma rows g) with their up rows (mma
// rows g + 8), so a lane's C holds gate and up of one row for two tokens a tile: SwiGLU in
// registers.
template <WeightFormat F, int kTokens>
__global__ void __launch_bounds__(kThreads) gate_up_mma_kernel(const uint16_t* x, int64_t hidden, int64_t inter,
                                                               ExpertWeights experts, MoePlan plan, int top_k,
                                                               uint16_t* act) {
  chained_grid_prologue();
  using C = Chunks<F, kTokens>;
  extern __shared__ __align__(16) uint32_t xs[];  // staged fp16 pairs (C::shared_bytes)
  __shared__ float unscale[kTokens];
  __shared__ uint32_t token_max[kTokens];
  if (static_cast<int>(blockIdx.y) >= *plan.num_active) return;
  const int e = plan.active_experts[blockIdx.y];
  const int begin = plan.offsets[e], end = plan.offsets[e + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 8;
  const int64_t r = min(r0 + g, inter - 1);
  const int64_t gate_row = static_cast<int64_t>(e) * 2 * inter + r, up_row = gate_row + inter;
  typename C::Stream stream(row_codes<F>(experts.gate_up, gate_row, hidden), row_codes<F>(experts.gate_up, up_row, hidden),
                            row_scales<F>(experts.gate_up_scales, gate_row, hidden),
                            row_scales<F>(experts.gate_up_scales, up_row, hidden), hidden);
  for (int chunk = begin; chunk < end; chunk += kTokens) {
    const int count = min(kTokens, end - chunk);
    auto row_of = [&](int j) { return static_cast<int64_t>(plan.sorted_pairs[chunk + j] / top_k); };
    float acc[C::kTiles][4];
    chunk_products<F, kTokens, kUnroll>(stream, r0 < inter, x, hidden, count, row_of, xs, unscale, token_max, acc);
    if (r0 + g < inter) {
#pragma unroll
      for (int j = 0; j < C::kTiles; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int token = 8 * j + 2 * t + i;
          if (token < count) {
            const float gate = acc[j][i] * unscale[token], up = acc[j][2 + i] * unscale[token];
            act[static_cast<int64_t>(chunk + token) * inter + r0 + g] = float_to_bf16(silu_mul(gate, up));
          }
        }
    }
    __syncthreads();  // the next chunk restages xs and remakes unscale
  }
}

// The down kernel's launch bound (kMinBlocks blocks an SM; 0: none, and its 121 registers leave
// room for two) and steps in flight a lane. At 8-token chunks, three blocks an SM with 3 steps in
// flight (77 registers, no spills): an EP8 rank's batch-1 step has some 7 or 8 active experts x
// 48 row tiles, 336-384 blocks, which two blocks an SM (264 on 132 SMs) ran in two waves, the
// second mostly empty. On an H100, 8 gathered tokens on 32 experts: 75.4 -> 71.6 us for the pair
// (4 steps with 3 blocks 72.1, 2 with 4 74.6); the 5-layer EP8 rank's batch-1 step 1.996 / 1.990
// -> 1.976 / 1.977 ms, batch 2 to 64 even. Wide chunks keep two blocks and 6 steps.
template <int kTokens>
struct DownShape {
  static constexpr int kMinBlocks = kTokens == 8 ? 3 : 0;
  static constexpr int kLoadSteps = kTokens == 8 ? 3 : kUnroll;
};

// Warp w of block (tile, slot) computes down rows r0 .. r0 + 15.
template <WeightFormat F, int kTokens>
__global__ void __launch_bounds__(kThreads, DownShape<kTokens>::kMinBlocks)
    down_mma_kernel(int64_t hidden, int64_t inter, ExpertWeights experts, MoePlan plan, const uint16_t* act,
                    float* expert_out) {
  chained_grid_prologue();
  constexpr int kLoadSteps = DownShape<kTokens>::kLoadSteps;
  using C = Chunks<F, kTokens, kLoadSteps>;
  extern __shared__ __align__(16) uint32_t xs[];  // staged fp16 pairs (C::shared_bytes)
  __shared__ float unscale[kTokens];
  __shared__ uint32_t token_max[kTokens];
  if (static_cast<int>(blockIdx.y) >= *plan.num_active) return;
  const int e = plan.active_experts[blockIdx.y];
  const int begin = plan.offsets[e], end = plan.offsets[e + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 16;
  const int64_t row_a = static_cast<int64_t>(e) * hidden + min(r0 + g, hidden - 1);
  const int64_t row_b = static_cast<int64_t>(e) * hidden + min(r0 + 8 + g, hidden - 1);
  typename C::Stream stream(row_codes<F>(experts.down, row_a, inter), row_codes<F>(experts.down, row_b, inter),
                            row_scales<F>(experts.down_scales, row_a, inter),
                            row_scales<F>(experts.down_scales, row_b, inter), inter);
  for (int chunk = begin; chunk < end; chunk += kTokens) {
    const int count = min(kTokens, end - chunk);
    auto row_of = [&](int j) { return static_cast<int64_t>(chunk + j); };
    float acc[C::kTiles][4];
    chunk_products<F, kTokens, kLoadSteps>(stream, r0 < hidden, act, inter, count, row_of, xs, unscale, token_max, acc);
    if (r0 < hidden) {
#pragma unroll
      for (int j = 0; j < C::kTiles; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int token = 8 * j + 2 * t + i;
          if (token < count) {
            float* out = expert_out + static_cast<int64_t>(chunk + token) * hidden;
            if (r0 + g < hidden) out[r0 + g] = acc[j][i] * unscale[token];
            if (r0 + 8 + g < hidden) out[r0 + 8 + g] = acc[j][2 + i] * unscale[token];
          }
        }
    }
    __syncthreads();
  }
}

template <WeightFormat F, int kTokens>
void launch(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts, const MoePlan& plan,
            int top_k, int max_active, uint16_t* act, float* expert_out, cudaStream_t stream) {
  using C = Chunks<F, kTokens>;
  using Down = Chunks<F, kTokens, DownShape<kTokens>::kLoadSteps>;
  const size_t gate_up_shared = C::shared_bytes(hidden), down_shared = Down::shared_bytes(inter);
  check(cudaFuncSetAttribute(gate_up_mma_kernel<F, kTokens>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(gate_up_shared)),
        "gate_up_mma shared memory");
  check(cudaFuncSetAttribute(down_mma_kernel<F, kTokens>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(down_shared)),
        "down_mma shared memory");
  // Row tiles along x: blocks go out x-fastest, so the active experts' blocks (the first slots)
  // spread over the SMs before the idle slots' blocks, which return at once. With the slots
  // along x, an EP8 rank's 8-expert decode put its 256 working blocks among 1024 (micro-bench
  // at 2 tokens a rank: 169 -> 203 us with the old order).
  const dim3 gate_up_grid(static_cast<unsigned>((inter + 8 * kWarps - 1) / (8 * kWarps)), max_active);
  launch_chained("gate_up_mma launch", gate_up_mma_kernel<F, kTokens>, gate_up_grid, kThreads, gate_up_shared, stream,
                 x, hidden, inter, experts, plan, top_k, act);
  const dim3 down_grid(static_cast<unsigned>((hidden + 16 * kWarps - 1) / (16 * kWarps)), max_active);
  launch_chained("down_mma launch", down_mma_kernel<F, kTokens>, down_grid, kThreads, down_shared, stream, hidden,
                 inter, experts, plan, act, expert_out);
}

}  // namespace

bool moe_experts_mma_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter) {
  if (experts.format == WeightFormat::Mxfp4)
    return experts.mxfp4_tiled && quant::mxfp4_tiles_fit(hidden) && quant::mxfp4_tiles_fit(inter);
  if (experts.format == WeightFormat::Fp8Block) return hidden % 64 == 0 && inter % 64 == 0;
  return false;
}

void moe_experts_mma(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                     const MoePlan& plan, int num_experts, int top_k, int num_tokens, int max_active, uint16_t* act,
                     float* expert_out, cudaStream_t stream) {
  if (max_active <= 0) return;
  GLMS_CHECK(moe_experts_mma_supported(experts, hidden, inter), "moe_experts_mma: these experts need the GEMV kernels");
  // Chunks of 64 above kWidePairsPerExpert pairs per expert, else of 8. Even at batch 1 the
  // 8-wide tile: a chunk of 1 staged faster (about 3% at 8 pairs on 8 experts) but streams an
  // expert's weights again for its second token, and an EP8 rank's 8 to 24 pairs land on 32
  // experts (micro-bench, 21 pairs on 17 experts: 203 -> 153 us).
  const int64_t pairs = num_tokens * static_cast<int64_t>(top_k);
  const bool wide = pairs > int64_t{kWidePairsPerExpert} * num_experts;
  auto run = [&](auto format_tag) {
    constexpr WeightFormat F = decltype(format_tag)::value;
    if (wide) launch<F, 64>(x, hidden, inter, experts, plan, top_k, max_active, act, expert_out, stream);
    else launch<F, 8>(x, hidden, inter, experts, plan, top_k, max_active, act, expert_out, stream);
  };
  if (experts.format == WeightFormat::Mxfp4) run(std::integral_constant<WeightFormat, WeightFormat::Mxfp4>{});
  else run(std::integral_constant<WeightFormat, WeightFormat::Fp8Block>{});
}

}  // namespace glms::ops::cuda
