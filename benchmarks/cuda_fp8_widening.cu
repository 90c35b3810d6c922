// Whether MXFP4 expert weights widened to FP8 for the FP8 tensor cores would stream faster at a
// decode step's sizes than widened to fp16 as the mma expert kernels do now. Measured for a
// batch-1 EP8 rank's gate/up shape: --experts active experts of --rows x --cols MXFP4 rows, each
// against a chunk of --tokens tokens (an 8-token mma tile), fp32 sums out. Both kernels have the
// mma expert kernels' frame (moe_experts_mma.cu's 8-token chunks: 256 threads, a warp's 16 rows
// in the tile layout's fragments, 6 steps of 16 bytes a row a lane in flight, the chunk's tokens
// staged whole in shared memory, one E8M0 scale an MX block multiplying each block's fresh mma
// sums); they differ in the widening and the mma:
//   fp16:  the tile layout of quant/mxfp4_tiles.h; a word's eight codes become four fp16 pairs
//          (mxfp4_tile_pair, about 12 instructions), two mma.m16n8k16 a block; tokens as fp16.
//   fp8xN: the same words with each byte holding two codes as E5M2 bits (value x 2^-14): the
//          even value at bits 7 and 1-3, so `word & 0x8e8e8e8e` is four E5M2 values, the odd one
//          at bits 0 and 4-6, two shifts away: five instructions a word. One mma.m16n8k32
//          (E5M2 x E4M3) a block for each of N E4M3 terms of the tokens (their sum is the token
//          value: two terms carry about 8 significant bits, three about 12).
// The outputs of both are checked against a double product on the host. Prints one line a case;
// --json FILE writes them.
// Usage: cuda_fp8_widening [--experts 7] [--rows 4096] [--cols 6144] [--tokens 1,2,8] [--json FILE]
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "micro_cuda.h"
#include "micro_options.h"
#include "mxfp4_reference.h"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/moe_fragments.cuh"
#include "quant/mxfp4_tiles.h"

namespace {

using glms::benchmarks::check;
using glms::ops::cuda::bf16x8_max_abs;
using glms::ops::cuda::bf16x8_to_scaled_fp16;
using glms::ops::cuda::e4m3_of;
using glms::ops::cuda::e4m3_to_float;
using glms::ops::cuda::e8m0_byte_scale;
using glms::ops::cuda::mma_f16;
using glms::ops::cuda::mma_f16_fresh;
using glms::ops::cuda::token_multiplier;
using glms::ops::cuda::word_of;
namespace quant = glms::quant;

constexpr int kThreads = 256, kWarps = kThreads / 32, kSteps = 6, kTileTokens = 8;
constexpr int64_t kStepStride = quant::kMxfp4TileStepBytes / 16;  // 16-byte chunks from step s to s + 1
constexpr int kFp16 = 0;  // a mode: 0, or the FP8 terms (2, 3)

struct Problem {
  const uint8_t* codes;    // [experts * rows, cols / 2] tiled
  const uint32_t* scales;  // tiled scale words
  const uint16_t* x;       // [experts, tokens, cols] bf16
  float* out;              // [experts, tokens, rows]
  int64_t rows, cols;
  int tokens;
};

__device__ __forceinline__ void mma_e5m2_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The even and odd codes of an FP8-layout word as four E5M2 values each (byte i: value 2i, 2i + 1).
__device__ __forceinline__ uint32_t even_e5m2(uint32_t q) { return q & 0x8e8e8e8eu; }
__device__ __forceinline__ uint32_t odd_e5m2(uint32_t q) { return ((q >> 3) & 0x0e0e0e0eu) | ((q << 7) & 0x80808080u); }

// The multiplier that puts a token's largest magnitude in [2^7, 2^8) (E4M3 reaches 448).
__device__ __forceinline__ float fp8_token_multiplier(uint32_t max_bits) {
  if (max_bits == 0) return 1.0f;
  const int exponent = max(static_cast<int>(max_bits >> 23), 8);
  return __uint_as_float(static_cast<uint32_t>(261 - min(exponent, 254)) << 23);
}

// The chunk's tokens into shared memory: fp16 pairs in row order (kFp16), or kTerms E4M3 planes
// [term][token][cols] with each 8 values of a block as evens then odds (the lanes' B registers).
template <int kMode>
__device__ void stage(const Problem& p, const uint16_t* x, uint8_t* xs, float* unscale, uint32_t* token_max) {
  const int64_t groups = p.cols / 8;
  if (threadIdx.x < p.tokens) token_max[threadIdx.x] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < p.tokens * groups; i += blockDim.x)
    atomicMax(&token_max[i / groups], __float_as_uint(bf16x8_max_abs(reinterpret_cast<const uint4*>(x)[i])));
  __syncthreads();
  for (int64_t i = threadIdx.x; i < p.tokens * groups; i += blockDim.x) {
    const int j = static_cast<int>(i / groups);
    const uint4 v = reinterpret_cast<const uint4*>(x)[i];
    if constexpr (kMode == kFp16) {
      reinterpret_cast<uint4*>(xs)[i] = bf16x8_to_scaled_fp16(v, token_multiplier(token_max[j]));
    } else {
      const float m = fp8_token_multiplier(token_max[j]);
      float rest[8];
      for (int e = 0; e < 8; ++e) {
        const uint32_t word = word_of(v, e / 2);
        rest[e] = __uint_as_float(e % 2 ? word & 0xffff0000u : word << 16) * m;
      }
      for (int term = 0; term < kMode; ++term) {
        uint8_t bytes[8];
        for (int e = 0; e < 8; ++e) {
          const uint8_t code = e4m3_of(rest[e], 1.0f);  // rounded to nearest, saturated
          bytes[e % 2 * 4 + e / 2] = code;                // evens, then odds
          rest[e] -= e4m3_to_float(code);
        }
        uint2 packed;
        packed.x = bytes[0] | bytes[1] << 8 | bytes[2] << 16 | static_cast<uint32_t>(bytes[3]) << 24;
        packed.y = bytes[4] | bytes[5] << 8 | bytes[6] << 16 | static_cast<uint32_t>(bytes[7]) << 24;
        reinterpret_cast<uint2*>(xs + (int64_t{term} * p.tokens) * p.cols)[i] = packed;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < p.tokens) {
    const float m = kMode == kFp16 ? token_multiplier(token_max[threadIdx.x]) : fp8_token_multiplier(token_max[threadIdx.x]);
    unscale[threadIdx.x] = 16384.0f / m;  // both widenings make value x 2^-14
  }
  __syncthreads();
}

// One MX block (word w of a step) of rows a and b against lane (g, t)'s token: acc += scaled sums.
template <int kMode>
__device__ __forceinline__ void block_product(uint32_t qa, uint32_t qb, float scale_a, float scale_b, const uint8_t* xs,
                                              int64_t value, const Problem& p, int token, float (&acc)[4]) {
  const int t = threadIdx.x % 4;
  float part[4];
  if constexpr (kMode == kFp16) {
    const uint4 xv = *reinterpret_cast<const uint4*>(xs + 2 * (token * p.cols + value + 8 * t));
    const uint32_t a0[4] = {quant::mxfp4_tile_pair(qa, 0), quant::mxfp4_tile_pair(qb, 0), quant::mxfp4_tile_pair(qa, 1),
                            quant::mxfp4_tile_pair(qb, 1)};
    mma_f16_fresh(part, a0, xv.x, xv.y);
    const uint32_t a1[4] = {quant::mxfp4_tile_pair(qa, 2), quant::mxfp4_tile_pair(qb, 2), quant::mxfp4_tile_pair(qa, 3),
                            quant::mxfp4_tile_pair(qb, 3)};
    mma_f16(part, a1, xv.z, xv.w);
  } else {
    const uint32_t a[4] = {even_e5m2(qa), even_e5m2(qb), odd_e5m2(qa), odd_e5m2(qb)};
    for (int i = 0; i < 4; ++i) part[i] = 0.0f;
#pragma unroll
    for (int term = kMode - 1; term >= 0; --term) {  // the smallest term first
      const uint2 b = *reinterpret_cast<const uint2*>(xs + (int64_t{term} * p.tokens + token) * p.cols + value + 8 * t);
      mma_e5m2_e4m3(part, a, b.x, b.y);
    }
  }
  acc[0] = fmaf(part[0], scale_a, acc[0]);
  acc[1] = fmaf(part[1], scale_a, acc[1]);
  acc[2] = fmaf(part[2], scale_b, acc[2]);
  acc[3] = fmaf(part[3], scale_b, acc[3]);
}

template <int kMode>
__global__ void __launch_bounds__(kThreads, 2) rows_kernel(Problem p) {
  extern __shared__ __align__(16) uint8_t xs[];
  __shared__ float unscale[kTileTokens];
  __shared__ uint32_t token_max[kTileTokens];
  const int e = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  stage<kMode>(p, p.x + int64_t{e} * p.tokens * p.cols, xs, unscale, token_max);
  const int64_t r0 = (int64_t{blockIdx.x} * kWarps + warp) * 16;
  const int64_t row_a = int64_t{e} * p.rows + r0 + g, row_b = row_a + 8;
  const uint4* chunks_a = reinterpret_cast<const uint4*>(p.codes + quant::mxfp4_tile_row_offset(row_a, p.cols));
  const uint4* chunks_b = reinterpret_cast<const uint4*>(p.codes + quant::mxfp4_tile_row_offset(row_b, p.cols));
  const uint32_t* scales_a = p.scales + quant::mxfp4_tile_scale_word(row_a, p.cols);
  const uint32_t* scales_b = p.scales + quant::mxfp4_tile_scale_word(row_b, p.cols);
  const int token = min(g, p.tokens - 1);
  const int64_t steps = p.cols / 128;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t s0 = 0; s0 < steps; s0 += kSteps) {
    uint4 wa[kSteps], wb[kSteps];
    uint32_t sa[kSteps], sb[kSteps];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int64_t s = s0 + u;
      if (s < steps) {
        wa[u] = __ldg(chunks_a + kStepStride * s + t);
        wb[u] = __ldg(chunks_b + kStepStride * s + t);
        sa[u] = __ldg(scales_a + quant::kMxfp4TileScaleStepWords * s);
        sb[u] = __ldg(scales_b + quant::kMxfp4TileScaleStepWords * s);
      }
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int64_t s = s0 + u;
      if (s >= steps) break;
#pragma unroll
      for (int w = 0; w < 4; ++w)
        block_product<kMode>(word_of(wa[u], w), word_of(wb[u], w), e8m0_byte_scale(sa[u], w),
                             e8m0_byte_scale(sb[u], w), xs, 128 * s + 32 * w, p, token, acc);
    }
  }
  for (int i = 0; i < 2; ++i) {
    const int j = 2 * t + i;
    if (j >= p.tokens) continue;
    float* out = p.out + (int64_t{e} * p.tokens + j) * p.rows;
    out[r0 + g] = acc[i] * unscale[j];
    out[r0 + 8 + g] = acc[2 + i] * unscale[j];
  }
}

// A tiled word of the fp16 layout (quant/mxfp4_tiles.h) in the FP8 layout above: its codes
// L0..L7, then byte i = L_2i's sign at bit 7 and magnitude at 1-3, L_2i+1's at 0 and 4-6.
uint32_t fp8_layout_word(uint32_t word) {
  uint32_t out = 0;
  for (int i = 0; i < 8; ++i) {
    const uint32_t half = (i % 2 ? word >> 16 : word) & 0xffffu;
    const int k = i / 2;
    const uint32_t sign = (half >> (15 - k)) & 1u, magnitude = (half >> (9 - 3 * k)) & 7u;
    const int byte = i / 2;
    out |= (i % 2 == 0 ? sign << 7 | magnitude << 1 : sign | magnitude << 4) << (8 * byte);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  namespace bm = glms::benchmarks;
  bm::Mxfp4Shape shape{7, 4096, 6144, {1, 2, 8}, ""};
  if (!bm::parse_options(argc, argv, bm::mxfp4_shape_options(shape))) return 2;
  if (!bm::has_cuda_device()) return 77;
  const int experts = shape.experts;
  const int64_t rows = shape.rows, cols = shape.cols, all_rows = int64_t{experts} * rows;
  std::mt19937_64 rng(7);
  bm::Mxfp4Problem h = bm::random_mxfp4_rows(experts, rows, cols, rng);
  const std::vector<uint8_t> tiled = bm::tiled_codes(h), tiled_scales = bm::tiled_scales(h);
  std::vector<uint8_t> tiled_fp8(tiled.size());
  for (size_t i = 0; i < tiled.size(); i += 4) {
    uint32_t word;
    std::memcpy(&word, &tiled[i], 4);
    word = fp8_layout_word(word);
    std::memcpy(&tiled_fp8[i], &word, 4);
  }
  uint8_t* codes_fp16 = bm::to_device(tiled);
  uint8_t* codes_fp8 = bm::to_device(tiled_fp8);
  const uint32_t* scales = reinterpret_cast<const uint32_t*>(bm::to_device(tiled_scales));
  bm::WideningReport report(shape, static_cast<double>(tiled.size() + tiled_scales.size()), 7);
  for (const int tokens : shape.token_counts) {
    bm::random_tokens(h, tokens, rng);
    uint16_t* x = bm::to_device(h.x);
    float* out = nullptr;
    check(cudaMalloc(&out, sizeof(float) * all_rows * tokens), "cudaMalloc");
    for (const int mode : {kFp16, 2, 3}) {
      Problem p{mode == kFp16 ? codes_fp16 : codes_fp8, scales, x, out, rows, cols, tokens};
      const size_t shared = static_cast<size_t>(tokens) * cols * (mode == kFp16 ? 2 : mode);
      auto kernel = mode == kFp16 ? rows_kernel<kFp16> : mode == 2 ? rows_kernel<2> : rows_kernel<3>;
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)),
            "shared memory");
      const dim3 grid(static_cast<unsigned>(rows / (16 * kWarps)), static_cast<unsigned>(experts));
      const double us = bm::median_time_us([&] { kernel<<<grid, kThreads, shared>>>(p); }, [] {});
      std::vector<float> host_out(all_rows * tokens);
      check(cudaMemcpy(host_out.data(), out, host_out.size() * sizeof(float), cudaMemcpyDeviceToHost), "download");
      report.add(mode == kFp16 ? "fp16" : "fp8x" + std::to_string(mode), tokens, us,
                 bm::relative_error(h, host_out, tokens, 16));
    }
    check(cudaFree(x), "cudaFree");
    check(cudaFree(out), "cudaFree");
  }
  report.write();
  return 0;
}
