// Device helpers shared by the tensor-core expert kernels (moe_experts_mma.cu,
// moe_experts_stream.cu): mma.sync m16n8k16 with fp16 inputs and fp32 sums, the 32-bit words of
// a 16-byte load, E4M3 pairs widened by the hardware, E8M0 scales, and the power-of-two
// multiplier that stages a token's values as fp16.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

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

}  // namespace glms::ops::cuda
