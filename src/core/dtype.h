// Element types of checkpoint tensors and their conversion to fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "core/host_device.h"

namespace glms {

enum class DType : uint8_t { BF16, F16, F32, F64, F8_E4M3, F8_E5M2, U8, I8, I16, I32, I64, BOOL };

// Size of one element in bytes.
size_t dtype_size(DType dtype);
// Name as safetensors spells it ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// Parses a safetensors dtype name; nullopt for names we do not know.
std::optional<DType> parse_dtype(std::string_view name);

// bf16 <-> fp32 bits, on the host and in CUDA kernels (core/host_device.h).
GLMS_HOST_DEVICE inline float bf16_to_f32(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

// Round-to-nearest-even, NaN kept quiet.
GLMS_HOST_DEVICE inline uint16_t f32_to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((word >> 16) | 0x40);
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);
// OCP FP8 E4M3 (FN variant: no infinities, 0x7f/0xff are NaN, max 448).
float fp8_e4m3_to_f32(uint8_t bits);
float fp8_e5m2_to_f32(uint8_t bits);

// Converts `count` elements of `dtype` at `src` to fp32 (floating types only).
void convert_to_f32(DType dtype, const void* src, float* dst, size_t count);

}  // namespace glms
