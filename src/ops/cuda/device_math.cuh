// Device helpers shared by the .cu files of ops/cuda: warp and block reductions, bf16
// conversions with the same rounding as core/dtype.h (round to nearest even, quiet NaN),
// order-preserving keys of floats, the rotary pair rotation and a counter-based random value.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace glms::ops::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the call synchronises the block twice.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float bf16_to_float(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }
// A value of fp32 or bf16 rows as fp32, for kernels templated on their rows' type.
__device__ __forceinline__ float load_as_float(const float* p) { return *p; }
__device__ __forceinline__ float load_as_float(const uint16_t* p) { return bf16_to_float(*p); }
// Four consecutive values the same way (p aligned to four values: 16 or 8 bytes).
__device__ __forceinline__ float4 load4_as_float(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4_as_float(const uint16_t* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                     __uint_as_float(v.y & 0xffff0000u));
}

__device__ __forceinline__ uint16_t float_to_bf16(float v) {
  uint32_t word = __float_as_uint(v);
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((word >> 16) | 0x40);
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}

// Two floats as a bf16 pair, `low` in the low half (a 4-byte store of two adjacent outputs),
// rounded to nearest even as float_to_bf16 rounds, in one conversion instruction.
__device__ __forceinline__ uint32_t pack_bf16_pair(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Eight consecutive floats (16-byte aligned) as eight bf16 values in one 16-byte chunk.
__device__ __forceinline__ uint4 bf16x8_of(const float* v) {
  const float4 lo = *reinterpret_cast<const float4*>(v), hi = *reinterpret_cast<const float4*>(v + 4);
  return make_uint4(pack_bf16_pair(lo.x, lo.y), pack_bf16_pair(lo.z, lo.w), pack_bf16_pair(hi.x, hi.y),
                    pack_bf16_pair(hi.z, hi.w));
}

// Order-preserving map of floats to unsigned keys (larger float, larger key, for non-NaN values);
// -0 counts as +0, as the comparisons do. The radix selects of top-k and sampling run over these.
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// An OCP MX E8M0 scale: 2^(code - 127); 255 is NaN.
__device__ __forceinline__ float e8m0_to_float(uint32_t code) {
  if (code == 0) return 0x1p-127f;
  if (code == 255) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(code << 23);
}

inline unsigned blocks_for(int64_t count, int threads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

// Rotates one interleaved pair (v[0], v[1]) by `angle`, as ops::rope_interleaved does.
// SwiGLU of one feature: silu(gate) * up, as every expert and MLP kernel computes it.
__device__ __forceinline__ float silu_mul(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

__device__ __forceinline__ void rotate_pair(float* v, float angle) {
  float s, c;
  sincosf(angle, &s, &c);
  const float a = v[0], b = v[1];
  v[0] = a * c - b * s;
  v[1] = b * c + a * s;
}

// splitmix64 of (seed, index): a counter-based generator, so any element is reproducible alone.
__device__ __forceinline__ float uniform_at(uint64_t seed, int64_t index) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(index) + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
}

}  // namespace glms::ops::cuda
