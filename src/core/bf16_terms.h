// An fp32 value as the sum of three bf16 values, for fp32-accurate products on bf16 tensor
// cores: with bf16 weights w, x . w = hi . w + mid . w + lo . w, each product exact in fp32 (8 x
// 8 significant bits), so three bf16 GEMMs summed in fp32 come close to one fp32 GEMM (within
// the tensor cores' fp32 sums). Host and device share the one definition (tested on the CPU).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/host_device.h"

namespace glms {

// terms[0] + terms[1] + terms[2] == x exactly for finite x whose terms stay normal (|x| from about
// 2^-110 up): each remainder is exact in fp32 (it is under half a bf16 step of the term before),
// and the third has at most 8 significant bits left.
GLMS_HOST_DEVICE inline void bf16_terms(float x, uint16_t (&terms)[3]) {
  terms[0] = f32_to_bf16(x);
  const float rest = x - bf16_to_f32(terms[0]);
  terms[1] = f32_to_bf16(rest);
  terms[2] = f32_to_bf16(rest - bf16_to_f32(terms[1]));
}

}  // namespace glms
