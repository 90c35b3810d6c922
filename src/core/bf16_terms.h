// An fp32 value as the sum of three bf16 values, for fp32-accurate products on bf16 tensor
// cores: with bf16 weights w, x . w = hi . w + mid . w + lo . w, each product exact in fp32 (8 x
// 8 significant bits), so three bf16 GEMMs summed in fp32 come close to one fp32 GEMM (within
// the tensor cores' fp32 sums). Host and device share the one definition (tested on the CPU).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace glms {

// fp32 bits to bf16, rounded to nearest even (core/dtype.h's f32_to_bf16, for host and device;
// finite inputs: the terms of a NaN or an infinity are not defined).
GLMS_HOST_DEVICE inline uint16_t bf16_term_bits(float value) {
  union {
    float f;
    uint32_t u;
  } bits{value};
  const uint32_t word = bits.u + 0x7fffu + ((bits.u >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}

GLMS_HOST_DEVICE inline float bf16_term_value(uint16_t term) {
  union {
    uint32_t u;
    float f;
  } bits{static_cast<uint32_t>(term) << 16};
  return bits.f;
}

// terms[0] + terms[1] + terms[2] == x exactly for finite x whose terms stay normal (|x| from about
// 2^-110 up): each remainder is exact in fp32 (it is under half a bf16 step of the term before),
// and the third has at most 8 significant bits left.
GLMS_HOST_DEVICE inline void bf16_terms(float x, uint16_t (&terms)[3]) {
  terms[0] = bf16_term_bits(x);
  const float rest = x - bf16_term_value(terms[0]);
  terms[1] = bf16_term_bits(rest);
  terms[2] = bf16_term_bits(rest - bf16_term_value(terms[1]));
}

}  // namespace glms
