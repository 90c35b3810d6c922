// The sampler's weights exp((logit - max) / temperature), computed by the same float operations
// on the host (ops/cpu/sampling.cpp) and the device (ops/cuda/sampling.cu). The library
// exponentials of the two differ in the last bit now and then, and a last bit is enough to move
// top_p's boundary or a draw's landing token; with one function the weights, and with them the
// kept sets and the draws, agree bit for bit (up to the order of double-precision sums).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace glms::ops {

// Products and sums rounded one at a time: never contracted into fused multiply-adds (nvcc does
// that to plain expressions; the CPU library builds with -ffp-contract=off).
GLMS_HOST_DEVICE inline float exact_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
GLMS_HOST_DEVICE inline float exact_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
GLMS_HOST_DEVICE inline float float_of_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// exp(x) for x <= 0 (relative error about 1e-7): x = k ln 2 + r with |r| <= ln 2 / 2, exp(r) by
// its Taylor polynomial to degree 7, then an exact scaling by 2^k. 0 below -104 (and for NaN).
// Written without branches or library calls (k rounds to nearest even by adding and taking away
// 1.5 x 2^23, exact for |k| < 2^22), so that compilers vectorise the host's loops over a row.
GLMS_HOST_DEVICE inline float sampling_exp(float x) {
  const bool underflow = !(x > -104.0f);
  const float y = underflow ? 0.0f : x;
  const float k = exact_add(exact_add(exact_mul(y, 1.44269504f), 12582912.0f), -12582912.0f);
  // ln 2 in two parts: k x 0.693145752 (15 significant bits) is exact for |k| < 256.
  const float r = exact_add(exact_add(y, exact_mul(k, -0.693145752f)), exact_mul(k, -1.42860677e-6f));
  float p = 1.0f / 5040.0f;
  p = exact_add(exact_mul(p, r), 1.0f / 720.0f);
  p = exact_add(exact_mul(p, r), 1.0f / 120.0f);
  p = exact_add(exact_mul(p, r), 1.0f / 24.0f);
  p = exact_add(exact_mul(p, r), 1.0f / 6.0f);
  p = exact_add(exact_mul(p, r), 0.5f);
  p = exact_add(exact_mul(p, r), 1.0f);
  p = exact_add(exact_mul(p, r), 1.0f);
  const int e = static_cast<int>(k);  // -150 <= e <= 0
  // 2^e below the normal range (e < -125): scale in two steps, the last one rounding once.
  const bool subnormal = e < -125;
  p = exact_mul(p, subnormal ? float_of_bits(static_cast<uint32_t>(127 - 60) << 23) : 1.0f);
  const float scaled = exact_mul(p, float_of_bits(static_cast<uint32_t>((subnormal ? e + 60 : e) + 127) << 23));
  return underflow ? 0.0f : scaled;
}

}  // namespace glms::ops
