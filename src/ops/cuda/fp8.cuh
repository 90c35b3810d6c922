// E4M3 conversions shared by the FP8 kernels (block-FP8 linear layers, the FP8 KV cache), and
// the reads of the FP8 cache's rows (layout: quant/kv_fp8.h). Rounding to E4M3 is to nearest
// even with saturation at 448, as quant::f32_to_minifloat does on the host.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "ops/cuda/device_math.cuh"
#include "quant/kv_fp8.h"

namespace glms::ops::cuda {

constexpr float kE4m3Max = 448.0f;

__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ float e4m3_to_float(uint8_t code) { return e4m3x2_to_float2(code).x; }

// value / scale as an E4M3 code (the same division and rounding as the host's reference).
__device__ __forceinline__ uint8_t e4m3_of(float value, float scale) {
  return __nv_cvt_float_to_fp8(__fdiv_rn(value, scale), __NV_SATFINITE, __NV_E4M3);
}

// The scale of a group whose largest magnitude is amax: amax / 448, or 0 for a zero group
// (whose codes are then written as 0).
__device__ __forceinline__ float e4m3_scale_of(float amax) { return amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 0.0f; }
// An FP8 GEMM's activation scale (quantize_fp8_rows and the kernels that write the same rows):
// amax / 448, or 1 for a block of zeros (whose codes are 0 whatever the scale).
__device__ __forceinline__ float activation_scale_of(float amax) {
  return amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 1.0f;
}
// The same for a block spread over kLanes aligned lanes of the warp, each holding the largest
// magnitude of its values in amax (every lane of the warp calls it): a quantize_fp8_rows warp's
// 32, or the quad of lanes that holds a row of a wgmma accumulator.
template <int kLanes>
__device__ __forceinline__ float activation_scale_over_lanes(float amax) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  return activation_scale_of(amax);
}

// Four codes (a 32-bit word, lowest byte first) times `scale` as two words of bf16 pairs.
__device__ __forceinline__ uint2 e4m3x4_to_bf16x4(uint32_t codes, float scale) {
  const float2 lo = e4m3x2_to_float2(codes), hi = e4m3x2_to_float2(codes >> 16);
  const __nv_bfloat162 a = __floats2bfloat162_rn(lo.x * scale, lo.y * scale);
  const __nv_bfloat162 b = __floats2bfloat162_rn(hi.x * scale, hi.y * scale);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

// Value k (< latent_dim + rope_dim) of an FP8 latent row, as fp32.
__device__ __forceinline__ float fp8_row_value(const uint8_t* row, int k, int latent_dim) {
  if (k < latent_dim) {
    const float scale = reinterpret_cast<const float*>(row + quant::kv_fp8_scales_offset(latent_dim))[k / quant::kKvFp8GroupValues];
    return e4m3_to_float(row[k]) * scale;
  }
  return bf16_to_float(reinterpret_cast<const uint16_t*>(row + quant::kv_fp8_rope_offset(latent_dim))[k - latent_dim]);
}

}  // namespace glms::ops::cuda
