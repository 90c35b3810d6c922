// The small-batch expert kernels: GEMVs over the active experts only. Block (slot, row tile)
// streams a tile of one expert's weight rows with 16-byte loads while the expert's tokens (at
// most kTokens at a time) sit in shared memory as bf16, so each weight byte is read once per
// step however many tokens chose the expert.
//
// Quantised weights are widened in registers, a 16-byte chunk per lane at a time, by bit moves
// rather than table lookups (a decode step is a handful of integer ops per value, which keeps
// the kernel near the memory bound): an E2M1 nibble or an E4M3 byte moved into the exponent and
// mantissa of a bf16 is the code's value times 2^-126 (E2M1) or 2^-120 (E4M3), subnormals
// included. The inputs are staged times 2^100 (exact in bf16) so that the fp32 products stay
// normal, and the block scale times 2^26 (2^20) folds into the widened weights. Quantised rows
// are short (a 6144-wide MXFP4 row is 3 KiB), so a warp streams more of them at once than bf16
// rows to keep enough loads in flight.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.h"
#include "quant/mxfp4_tiles.h"

namespace glms::ops::cuda {

namespace {

constexpr float kInputScale = 0x1p100f;  // staged inputs of quantised experts
constexpr float kMxfp4Unscale = 0x1p26f;  // 2^126 / 2^100
constexpr float kFp8Unscale = 0x1p20f;    // 2^120 / 2^100

// Values in one 16-byte chunk of a weight row.
template <WeightFormat F>
constexpr int kChunkValues = F == WeightFormat::Mxfp4 ? 32 : F == WeightFormat::Fp8Block ? 16 : 8;

template <WeightFormat F>
__host__ __device__ constexpr int64_t row_bytes(int64_t cols) {
  return F == WeightFormat::Mxfp4 ? cols / 2 : F == WeightFormat::Fp8Block ? cols : 2 * cols;
}

template <WeightFormat F>
__host__ __device__ constexpr int64_t row_scales(int64_t cols) {
  return F == WeightFormat::Mxfp4 ? cols / 32 : F == WeightFormat::Fp8Block ? (cols + 127) / 128 : 0;
}

// One weight row: its 16-byte chunks and its scales (E8M0 codes or fp32, by format).
struct WeightRow {
  const uint4* chunks;
  const void* scales;
};

template <WeightFormat F>
__device__ __forceinline__ WeightRow weight_row(const void* data, const void* scales, int64_t row, int64_t cols) {
  WeightRow w;
  w.chunks = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(data) + row * row_bytes<F>(cols));
  if constexpr (F == WeightFormat::Mxfp4) w.scales = static_cast<const uint8_t*>(scales) + row * row_scales<F>(cols);
  else if constexpr (F == WeightFormat::Fp8Block) w.scales = static_cast<const float*>(scales) + row * row_scales<F>(cols);
  else w.scales = nullptr;
  return w;
}

// The multiplier of chunk `c`'s partial sum (1 for bf16).
template <WeightFormat F>
__device__ __forceinline__ float chunk_scale(const WeightRow& w, int64_t c) {
  if constexpr (F == WeightFormat::Mxfp4) return e8m0_to_float(__ldg(static_cast<const uint8_t*>(w.scales) + c)) * kMxfp4Unscale;
  else if constexpr (F == WeightFormat::Fp8Block) return __ldg(static_cast<const float*>(w.scales) + (c >> 3)) * kFp8Unscale;
  else return 1.0f;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// 8 bf16 in a 16-byte word, widened.
__device__ __forceinline__ void unpack8(const uint4& v, float* out) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = word_of(v, i);
    out[2 * i] = __uint_as_float(word << 16);
    out[2 * i + 1] = __uint_as_float(word & 0xffff0000u);
  }
}

// Two bf16 in `pair` (low, high) widened into out[lo] and out[hi].
__device__ __forceinline__ void widen_pair(uint32_t pair, float& lo, float& hi) {
  lo = __uint_as_float(pair << 16);
  hi = __uint_as_float(pair & 0xffff0000u);
}

// Step `step` of a chunk: 8 weight values, in row order, times 2^-126 (E2M1) or 2^-120 (E4M3).
// MXFP4 word q holds values 0..7 (byte b: value 2b low nibble, 2b + 1 high). The nibbles at
// bits 12-15 and 28-31 (values 3 and 7) become a bf16 pair by keeping the sign bit and moving
// the three magnitude bits down by 6 to the exponent's low bits and the mantissa's top bit;
// shifting q left by 4, 8, 12 brings values 2/6, 1/5 and 0/4 there. E4M3 bytes 1 and 3 of a
// word likewise by moving the seven exponent-mantissa bits down by 4, then bytes 0 and 2.
__device__ __forceinline__ void decode_mxfp4_word(uint32_t q, float (&out)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = q << (4 * i);
    const uint32_t pair = (s & 0x80008000u) | ((s & 0x70007000u) >> 6);
    widen_pair(pair, out[3 - i], out[7 - i]);
  }
}

__device__ __forceinline__ void decode_fp8_words(uint32_t q0, uint32_t q1, float (&out)[8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t q = h == 0 ? q0 : q1;
    const uint32_t odd = (q & 0x80008000u) | ((q & 0x7f007f00u) >> 4);
    const uint32_t s = q << 8;
    const uint32_t even = (s & 0x80008000u) | ((s & 0x7f007f00u) >> 4);
    widen_pair(odd, out[4 * h + 1], out[4 * h + 3]);
    widen_pair(even, out[4 * h + 0], out[4 * h + 2]);
  }
}

template <WeightFormat F>
__device__ __forceinline__ void decode_step(const uint4& chunk, int step, float (&out)[8]) {
  if constexpr (F == WeightFormat::Mxfp4) decode_mxfp4_word(word_of(chunk, step), out);
  else if constexpr (F == WeightFormat::Fp8Block) decode_fp8_words(word_of(chunk, 2 * step), word_of(chunk, 2 * step + 1), out);
  else unpack8(chunk, out);
}

// Dot products of `kRows` weight rows (`dim` wide) with `count` <= kTokens input rows staged in
// shared memory (xs, [kTokens, dim] bf16): each warp lane-strides over the rows' 16-byte
// chunks, then the warp reduces. Quantised formats need dim % kChunkValues == 0; bf16 takes the
// vector path when dim % 8 == 0, else a scalar one.
template <int kTokens, int kRows, WeightFormat F, bool kVector>
__device__ __forceinline__ void warp_dots(const WeightRow (&rows)[kRows], const uint16_t* xs, int64_t dim, int count,
                                          float (&acc)[kRows][kTokens]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokens; ++j) acc[r][j] = 0.0f;
  if constexpr (kVector) {
    constexpr int kChunk = kChunkValues<F>, kSteps = kChunk / 8;
    for (int64_t c = lane; c < dim / kChunk; c += 32) {
      uint4 chunk[kRows];
      float scale[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        chunk[r] = __ldg(rows[r].chunks + c);
        scale[r] = chunk_scale<F>(rows[r], c);
      }
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        float w[kRows][8];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          decode_step<F>(chunk[r], step, w[r]);
          if constexpr (F != WeightFormat::Plain) {
#pragma unroll
            for (int i = 0; i < 8; ++i) w[r][i] *= scale[r];
          }
        }
#pragma unroll
        for (int j = 0; j < kTokens; ++j) {
          if (j >= count) break;
          float xv[8];
          unpack8(reinterpret_cast<const uint4*>(xs + j * dim + c * kChunk)[step], xv);
#pragma unroll
          for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r][j] += w[r][i] * xv[i];
        }
      }
    }
  } else {
    static_assert(F == WeightFormat::Plain, "quantised experts take the vector path only");
    for (int64_t k = lane; k < dim; k += 32) {
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        if (j >= count) break;
        const float xv = bf16_to_float(xs[j * dim + k]);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          acc[r][j] += bf16_to_float(reinterpret_cast<const uint16_t*>(rows[r].chunks)[k]) * xv;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokens; ++j) acc[r][j] = warp_sum(acc[r][j]);
}

constexpr int kExpertThreads = 256;
constexpr int kGateUpRowsPerWarp = 2;  // gate rows (each with its up row) a warp computes
// Gate/up row pairs a warp streams at once, and down rows: more for short quantised rows while
// one token is staged; with more tokens the registers of the accumulators limit occupancy.
template <WeightFormat F, int kTokens>
constexpr int kGateUpPairsAtOnce = F != WeightFormat::Plain && kTokens == 1 ? 2 : 1;
template <WeightFormat F, int kTokens>
constexpr int kDownRowsPerWarp = F != WeightFormat::Plain && kTokens == 1 ? 8 : 4;

// 8 bf16 times 2^100 (exact: a power of two well inside bf16's range).
__device__ __forceinline__ uint4 prescale8(const uint4& v) {
  float f[8];
  unpack8(v, f);
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    words[i] = float_to_bf16(f[2 * i] * kInputScale) | (static_cast<uint32_t>(float_to_bf16(f[2 * i + 1] * kInputScale)) << 16);
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// Stages rows `input_row(j)` of `src` ([*, dim] bf16) for j < count into xs (times 2^100 for
// quantised weights).
template <WeightFormat F, bool kVector, typename RowOf>
__device__ __forceinline__ void stage_rows(const uint16_t* src, int64_t dim, int count, RowOf input_row, uint16_t* xs) {
  if constexpr (kVector) {
    const int64_t vectors = dim / 8;
    for (int64_t i = threadIdx.x; i < count * vectors; i += blockDim.x) {
      const int j = static_cast<int>(i / vectors);
      const uint4 v = reinterpret_cast<const uint4*>(src + input_row(j) * dim)[i % vectors];
      reinterpret_cast<uint4*>(xs + j * dim)[i % vectors] = F == WeightFormat::Plain ? v : prescale8(v);
    }
  } else {
    for (int64_t i = threadIdx.x; i < count * dim; i += blockDim.x) {
      const int j = static_cast<int>(i / dim);
      xs[i] = src[input_row(j) * dim + i % dim];
    }
  }
}

template <int kTokens, WeightFormat F, bool kVector>
__global__ void __launch_bounds__(kExpertThreads) moe_gate_up_kernel(const uint16_t* x, int64_t hidden, int64_t inter,
                                                                     ExpertWeights experts, MoePlan plan, int top_k,
                                                                     uint16_t* act) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint16_t xs[];  // [kTokens, hidden]
  if (static_cast<int>(blockIdx.x) >= *plan.num_active) return;
  const int e = plan.active_experts[blockIdx.x];
  const int begin = plan.offsets[e], end = plan.offsets[e + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.y) * (kExpertThreads / 32) + warp) * kGateUpRowsPerWarp;
  const int64_t expert_row0 = static_cast<int64_t>(e) * 2 * inter;
  for (int chunk = begin; chunk < end; chunk += kTokens) {
    const int count = min(kTokens, end - chunk);
    __syncthreads();
    stage_rows<F, kVector>(x, hidden, count,
                           [&](int j) { return static_cast<int64_t>(plan.sorted_pairs[chunk + j] / top_k); }, xs);
    __syncthreads();
    constexpr int kPairs = kGateUpPairsAtOnce<F, kTokens>;
    for (int rr = 0; rr < kGateUpRowsPerWarp; rr += kPairs) {
      if (row0 + rr >= inter) break;
      WeightRow rows[2 * kPairs];  // gate rows, then their up rows
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        const int64_t r = min(row0 + rr + p, inter - 1);
        rows[p] = weight_row<F>(experts.gate_up, experts.gate_up_scales, expert_row0 + r, hidden);
        rows[kPairs + p] = weight_row<F>(experts.gate_up, experts.gate_up_scales, expert_row0 + inter + r, hidden);
      }
      float acc[2 * kPairs][kTokens];
      warp_dots<kTokens, 2 * kPairs, F, kVector>(rows, xs, hidden, count, acc);
      if (lane == 0)
        for (int p = 0; p < kPairs && row0 + rr + p < inter; ++p)
          for (int j = 0; j < count; ++j) {
            const float g = acc[p][j], u = acc[kPairs + p][j];
            act[static_cast<int64_t>(chunk + j) * inter + row0 + rr + p] = float_to_bf16(silu_mul(g, u));
          }
    }
  }
}

template <int kTokens, WeightFormat F, bool kVector>
__global__ void __launch_bounds__(kExpertThreads) moe_down_kernel(int64_t hidden, int64_t inter, ExpertWeights experts,
                                                                  MoePlan plan, const uint16_t* act, float* expert_out) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint16_t xs[];  // [kTokens, inter]
  if (static_cast<int>(blockIdx.x) >= *plan.num_active) return;
  const int e = plan.active_experts[blockIdx.x];
  const int begin = plan.offsets[e], end = plan.offsets[e + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kRows = kDownRowsPerWarp<F, kTokens>;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.y) * (kExpertThreads / 32) + warp) * kRows;
  const int64_t expert_row0 = static_cast<int64_t>(e) * hidden;
  for (int chunk = begin; chunk < end; chunk += kTokens) {
    const int count = min(kTokens, end - chunk);
    __syncthreads();
    stage_rows<F, kVector>(act, inter, count, [&](int j) { return static_cast<int64_t>(chunk + j); }, xs);
    __syncthreads();
    if (row0 >= hidden) continue;
    WeightRow rows[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      rows[r] = weight_row<F>(experts.down, experts.down_scales, expert_row0 + min(row0 + r, hidden - 1), inter);
    float acc[kRows][kTokens];
    warp_dots<kTokens, kRows, F, kVector>(rows, xs, inter, count, acc);
    if (lane == 0)
      for (int r = 0; r < kRows && row0 + r < hidden; ++r)
        for (int j = 0; j < count; ++j) expert_out[static_cast<int64_t>(chunk + j) * hidden + row0 + r] = acc[r][j];
  }
}

template <int kTokens, WeightFormat F, bool kVector>
void launch_experts(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts, const MoePlan& plan,
                    int top_k, int max_active, uint16_t* act, float* expert_out, cudaStream_t stream) {
  const size_t gate_up_shared = sizeof(uint16_t) * kTokens * hidden, down_shared = sizeof(uint16_t) * kTokens * inter;
  check(cudaFuncSetAttribute(moe_gate_up_kernel<kTokens, F, kVector>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(gate_up_shared)),
        "moe_gate_up shared memory");
  check(cudaFuncSetAttribute(moe_down_kernel<kTokens, F, kVector>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(down_shared)),
        "moe_down shared memory");
  const int64_t gate_up_rows_per_block = (kExpertThreads / 32) * kGateUpRowsPerWarp;
  const int64_t down_rows_per_block = (kExpertThreads / 32) * kDownRowsPerWarp<F, kTokens>;
  const dim3 gate_up_grid(max_active, static_cast<unsigned>((inter + gate_up_rows_per_block - 1) / gate_up_rows_per_block));
  launch_chained("moe_gate_up launch", moe_gate_up_kernel<kTokens, F, kVector>, gate_up_grid, kExpertThreads,
                 gate_up_shared, stream, x, hidden, inter, experts, plan, top_k, act);
  const dim3 down_grid(max_active, static_cast<unsigned>((hidden + down_rows_per_block - 1) / down_rows_per_block));
  launch_chained("moe_down launch", moe_down_kernel<kTokens, F, kVector>, down_grid, kExpertThreads, down_shared,
                 stream, hidden, inter, experts, plan, act, expert_out);
}

template <WeightFormat F, bool kVector>
void launch_by_tokens(int tokens, const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                      const MoePlan& plan, int top_k, int max_active, uint16_t* act, float* expert_out,
                      cudaStream_t stream) {
  if (tokens <= 1) launch_experts<1, F, kVector>(x, hidden, inter, experts, plan, top_k, max_active, act, expert_out, stream);
  else if (tokens <= 4) launch_experts<4, F, kVector>(x, hidden, inter, experts, plan, top_k, max_active, act, expert_out, stream);
  else launch_experts<8, F, kVector>(x, hidden, inter, experts, plan, top_k, max_active, act, expert_out, stream);
}

// Tile word q (quant/mxfp4_tiles.h) as its 8 values in row order, times 2^-14.
__device__ __forceinline__ void decode_mxfp4_tile_word(uint32_t q, float (&out)[8]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t bits = quant::mxfp4_tile_pair(q, k);
    const float2 pair = __half22float2(__halves2half2(__ushort_as_half(static_cast<uint16_t>(bits)),
                                                      __ushort_as_half(static_cast<uint16_t>(bits >> 16))));
    out[2 * k] = pair.x;
    out[2 * k + 1] = pair.y;
  }
}

// Eight values per thread (one 32-bit word of packed MXFP4, 8 bytes of FP8), written as 16
// bytes: row-major [rows, cols] of the stacked matrix's rows widened to bf16 (the decoded values
// times 2^126 or 2^120 are the codes' values, exactly, then the scale).
template <WeightFormat F>
__global__ void dequantize_kernel(const void* data, const void* scales, int64_t row0, int64_t rows, int64_t cols,
                                  uint16_t* out) {
  chained_grid_prologue();
  const int64_t groups_per_row = cols / 8;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * groups_per_row) return;
  const int64_t row = row0 + i / groups_per_row, group = i % groups_per_row;
  const int64_t first = 8 * group;  // the word's first value in the row
  float v[8], scale, unscale;
  if constexpr (F == WeightFormat::Mxfp4) {
    decode_mxfp4_word(__ldg(static_cast<const uint32_t*>(data) + row * groups_per_row + group), v);
    scale = e8m0_to_float(__ldg(static_cast<const uint8_t*>(scales) + row * (cols / 32) + group / 4));
    unscale = 0x1p126f;
  } else {
    const uint2 q = __ldg(static_cast<const uint2*>(data) + row * groups_per_row + group);
    decode_fp8_words(q.x, q.y, v);
    scale = __ldg(static_cast<const float*>(scales) + row * ((cols + 127) / 128) + group / 16);
    unscale = 0x1p120f;
  }
  uint32_t words[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    words[k] = float_to_bf16(v[2 * k] * unscale * scale) |
               (static_cast<uint32_t>(float_to_bf16(v[2 * k + 1] * unscale * scale)) << 16);
  reinterpret_cast<uint4*>(out + (row - row0) * cols + first)[0] = make_uint4(words[0], words[1], words[2], words[3]);
}

// Tiled MXFP4 rows row0 .. row0 + rows - 1 (row0 and rows multiples of 16: whole fragments of
// the tile layout) widened to bf16, row-major [rows, cols], exactly. A thread takes one row's
// 16-byte chunk t of group s: 32 values in four MX blocks, whose four scale codes are one 32-bit
// word. Threads go in (fragment, group, row, chunk) order, so a warp reads 512 contiguous bytes of
// codes (a fragment's group is one kilobyte) and writes 256 contiguous bytes of each of its rows.
__global__ void dequantize_mxfp4_tiles_kernel(const void* data, const void* scales, int64_t row0, int64_t rows,
                                              int64_t cols, uint16_t* out) {
  chained_grid_prologue();
  const int64_t groups = cols / quant::kMxfp4TileValues;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * groups * 4) return;
  const int t = static_cast<int>(i % 4);
  const int64_t in_fragment = i / 4 % quant::kMxfp4TileFragmentRows, s = i / 64 % groups, fragment = i / 64 / groups;
  const int64_t row = row0 + fragment * quant::kMxfp4TileFragmentRows + in_fragment;
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(data) +
                                                        quant::mxfp4_tile_row_offset(row, cols) +
                                                        quant::kMxfp4TileStepBytes * s + 16 * t));
  const uint32_t scale_codes = __ldg(static_cast<const uint32_t*>(scales) + quant::mxfp4_tile_scale_word(row, cols) +
                                     quant::kMxfp4TileScaleStepWords * s);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  uint16_t* row_out = out + (row - row0) * cols + quant::kMxfp4TileValues * s + 8 * t;
#pragma unroll
  for (int w = 0; w < 4; ++w) {  // word w: values 32 w + 8 t .. + 7 of the group, MX block w
    float v[8];
    decode_mxfp4_tile_word(words[w], v);
    const float scale = e8m0_to_float((scale_codes >> (8 * w)) & 0xffu);
    uint32_t packed[4];
    // The code's value first (x 2^14, exact), then the scale: 2^14 x a scale past 2^113 is not a float.
#pragma unroll
    for (int k = 0; k < 4; ++k)
      packed[k] = float_to_bf16(v[2 * k] * 0x1p14f * scale) |
                  (static_cast<uint32_t>(float_to_bf16(v[2 * k + 1] * 0x1p14f * scale)) << 16);
    *reinterpret_cast<uint4*>(row_out + 32 * w) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

}  // namespace

void moe_experts_small(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                       const MoePlan& plan, int num_experts, int top_k, int num_tokens, int max_active, uint16_t* act,
                       float* expert_out, cudaStream_t stream, bool allow_tensor_cores) {
  if (max_active <= 0) return;
  if (allow_tensor_cores && moe_experts_mma_supported(experts, hidden, inter)) {
    moe_experts_mma(x, hidden, inter, experts, plan, num_experts, top_k, num_tokens, max_active, act, expert_out, stream);
    return;
  }
  // Tokens staged at a time: from the pairs an expert gets on average, not the batch size.
  // Staging shared memory caps the blocks in flight a streaming GEMV needs, while an expert
  // with more pairs than staged re-reads its weights per chunk. Measured at GLM-5.2 width on
  // the H200 (bench-step): 1 below half a pair per expert (batch <= 16), 4 up to 4 pairs
  // (batch 32-128; 8 was slower at 64 and 128), else 8.
  const double pairs_per_expert = static_cast<double>(num_tokens) * top_k / (num_experts > 0 ? num_experts : 1);
  const int tokens = pairs_per_expert <= 0.5 ? 1 : pairs_per_expert <= 4.0 ? 4 : 8;
  auto run = [&](auto format_tag, auto vector_tag) {
    launch_by_tokens<decltype(format_tag)::value, decltype(vector_tag)::value>(
        tokens, x, hidden, inter, experts, plan, top_k, max_active, act, expert_out, stream);
  };
  using Plain = std::integral_constant<WeightFormat, WeightFormat::Plain>;
  using Mxfp4 = std::integral_constant<WeightFormat, WeightFormat::Mxfp4>;
  using Fp8 = std::integral_constant<WeightFormat, WeightFormat::Fp8Block>;
  switch (experts.format) {
    case WeightFormat::Plain:
      if (hidden % 8 == 0 && inter % 8 == 0) run(Plain{}, std::true_type{});
      else run(Plain{}, std::false_type{});
      return;
    case WeightFormat::Mxfp4:
      GLMS_CHECK(!experts.mxfp4_tiled, "moe_experts_small: tiled MXFP4 experts run on the tensor-core kernels only");
      GLMS_CHECK(hidden % 32 == 0 && inter % 32 == 0, "MXFP4 experts need hidden and moe_intermediate_size multiples of 32");
      run(Mxfp4{}, std::true_type{});
      return;
    case WeightFormat::Fp8Block:
      GLMS_CHECK(hidden % 16 == 0 && inter % 16 == 0, "FP8 experts need hidden and moe_intermediate_size multiples of 16");
      run(Fp8{}, std::true_type{});
      return;
    default:
      fail("moe_experts_small: MXFP6 experts are widened to bf16 on upload");
  }
}

void dequantize_experts(const ExpertWeights& experts, int first_expert, int count, int64_t hidden, int64_t inter,
                        uint16_t* gate_up_out, uint16_t* down_out, cudaStream_t stream) {
  GLMS_CHECK(experts.format != WeightFormat::Plain, "dequantize_experts: the experts are already bf16");
  GLMS_CHECK(hidden % 8 == 0 && inter % 8 == 0, "dequantize_experts: widths must be multiples of 8");
  if (count <= 0) return;
  // `values_per_thread`: 8 for dequantize_kernel, 32 for dequantize_mxfp4_tiles_kernel.
  auto launch = [&](auto kernel, int values_per_thread, const void* data, const void* scales, int64_t row0,
                    int64_t rows, int64_t cols, uint16_t* out) {
    launch_chained("dequantize_experts launch", kernel, blocks_for(rows * cols / values_per_thread, 256), 256, 0,
                   stream, data, scales, row0, rows, cols, out);
  };
  auto widen = [&](auto kernel, int values_per_thread) {
    // The experts' rows are consecutive rows of the stacked matrices.
    if (gate_up_out)
      launch(kernel, values_per_thread, experts.gate_up, experts.gate_up_scales, int64_t{first_expert} * 2 * inter,
             count * 2 * inter, hidden, gate_up_out);
    if (down_out)
      launch(kernel, values_per_thread, experts.down, experts.down_scales, int64_t{first_expert} * hidden,
             count * hidden, inter, down_out);
  };
  if (experts.format == WeightFormat::Mxfp4 && experts.mxfp4_tiled) {
    // Whole 16-row fragments: whole experts' rows are, hidden and inter being multiples of 128.
    GLMS_CHECK(hidden % quant::kMxfp4TileFragmentRows == 0 && inter % quant::kMxfp4TileFragmentRows == 0,
               "dequantize_experts: tiled MXFP4 rows in whole fragments");
    widen(dequantize_mxfp4_tiles_kernel, 32);
  } else if (experts.format == WeightFormat::Mxfp4) {
    widen(dequantize_kernel<WeightFormat::Mxfp4>, 8);
  } else {
    widen(dequantize_kernel<WeightFormat::Fp8Block>, 8);
  }
}

}  // namespace glms::ops::cuda
