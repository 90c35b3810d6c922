// Device helpers shared by the tensor-core expert kernels (moe_experts_mma.cu,
// moe_experts_stream.cu, moe_experts_wgmma_rs.cu): mma.sync m16n8k16 with fp16 inputs and fp32
// sums, the 32-bit words of a 16-byte load, E4M3 pairs widened by the hardware, E8M0 scales, the
// power-of-two multiplier that stages a token's values as fp16, and tiled MXFP4 codes widened
// into wgmma's A registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "quant/mxfp4_tiles.h"

namespace glms::ops::cuda {

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma_f16_fresh and mma_f16 without `volatile`, so that the compiler may interleave independent
// mmas with the other work of a step.
__device__ __forceinline__ void mma_f16_zero(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const float zero = 0.0f;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(zero));
}

__device__ __forceinline__ void mma_f16_add(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ void mma_f16_fresh(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const float zero = 0.0f;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(zero));
}

__device__ __forceinline__ uint32_t e4m3_pair(uint32_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// The E8M0 code in byte w of `codes` as an fp32 scale, 2^(code - 127) for codes 1..254 (the
// tile layout is only made for those: ExpertWeights::mxfp4_tiled).
__device__ __forceinline__ float e8m0_byte_scale(uint32_t codes, int w) {
  return __uint_as_float((w == 3 ? codes >> 1 : codes << (23 - 8 * w)) & 0x7f800000u);
}

// The multiplier that puts a token's largest magnitude (fp32 bits `max_bits`) in [2^13, 2^14).
__device__ __forceinline__ float token_multiplier(uint32_t max_bits) {
  if (max_bits == 0) return 1.0f;
  const int exponent = max(static_cast<int>(max_bits >> 23), 14);  // tiny maxima: 2^127 at most
  return __uint_as_float(static_cast<uint32_t>(267 - min(exponent, 254)) << 23);
}

// The largest magnitude of eight bf16 values (a 16-byte load).
__device__ __forceinline__ float bf16x8_max_abs(const uint4& v) {
  float largest = 0.0f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t word = word_of(v, w);
    largest = fmaxf(largest, fmaxf(fabsf(__uint_as_float(word << 16)), fabsf(__uint_as_float(word & 0xffff0000u))));
  }
  return largest;
}

// Eight bf16 values times `multiplier` (a power of two: token_multiplier) as four fp16 pairs.
__device__ __forceinline__ uint4 bf16x8_to_scaled_fp16(const uint4& v, float multiplier) {
  uint32_t pairs[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t word = word_of(v, w);
    const __half2 h = __floats2half2_rn(__uint_as_float(word << 16) * multiplier,
                                        __uint_as_float(word & 0xffff0000u) * multiplier);
    pairs[w] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// A 128-k step of two tiled MXFP4 weight rows a and b (quant/mxfp4_tiles.h): lane (g, t)'s
// 16-byte chunk t of each row's 64-byte group (code word w: MX block w) times the blocks' scales
// (scale words: byte w block w's E8M0 code), as the A registers of the step's eight wgmmas of
// 16 k: frag[first + 2 w + h][2 i + r] for row r (0: a, the fragment's row g; 1: b, row g + 8).
// The k order inside each 32-value block is the fragments' own (logical position 16 h + 8 i +
// 2 t + e holds value 8 t + 4 h + 2 i + e), so the B operand's rows are staged in that order
// (moe_stage_pairs_permuted). kOneMultiply (every scale code of the warp's step at most 128:
// scale <= 2, the usual case): one multiply by 2^(code - 1) (mxfp4_tile_pair_bf16's 2^-126
// folded in); otherwise two. A template argument, so that the caller branches once a step: a
// branch per pair cut the widening into blocks of a few instructions that ptxas could not
// interleave.
template <bool kOneMultiply, int kFrags>
__device__ __forceinline__ void widen_mxfp4_fragments(const uint4& codes_a, const uint4& codes_b, uint32_t scales_a,
                                                      uint32_t scales_b, uint32_t (&frag)[kFrags][4], int first) {
  constexpr uint32_t kTwoTo126 = 0x7e807e80u;
  const uint32_t biased_a = scales_a + 0x7e7e7e7eu, biased_b = scales_b + 0x7e7e7e7eu;  // bytes code + 126
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t qa = word_of(codes_a, w), qb = word_of(codes_b, w);
    // bf16 bits of the factor in both halves: byte w of the biased codes at bits 7 and 23.
    uint32_t fa, fb;
    if constexpr (kOneMultiply) {
      fa = __byte_perm(biased_a, 0, 0x4040 + 0x0101 * w) << 7;
      fb = __byte_perm(biased_b, 0, 0x4040 + 0x0101 * w) << 7;
    } else {
      fa = __byte_perm(scales_a, 0, 0x4040 + 0x0101 * w) << 7;
      fb = __byte_perm(scales_b, 0, 0x4040 + 0x0101 * w) << 7;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t va = quant::mxfp4_tile_pair_bf16(qa, 2 * h + i), vb = quant::mxfp4_tile_pair_bf16(qb, 2 * h + i);
        if constexpr (!kOneMultiply) va = bf16x2_mul(va, kTwoTo126), vb = bf16x2_mul(vb, kTwoTo126);
        frag[first + 2 * w + h][2 * i] = bf16x2_mul(va, fa);
        frag[first + 2 * w + h][2 * i + 1] = bf16x2_mul(vb, fb);
      }
  }
}

}  // namespace glms::ops::cuda
