#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace glms {

void fail(const std::string& message) { throw Error(message); }

namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::BF16, "BF16", 2},   {DType::F16, "F16", 2},         {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},     {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::U8, "U8", 1},       {DType::I8, "I8", 1},           {DType::I16, "I16", 2},
    {DType::I32, "I32", 4},     {DType::I64, "I64", 8},         {DType::BOOL, "BOOL", 1},
};
}  // namespace

size_t dtype_size(DType dtype) { return kDTypes[static_cast<int>(dtype)].size; }
std::string_view dtype_name(DType dtype) { return kDTypes[static_cast<int>(dtype)].name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& info : kDTypes)
    if (info.name == name) return info.dtype;
  return std::nullopt;
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = (bits >> 15) & 1u, exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
  else magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  return sign ? -magnitude : magnitude;
}

uint16_t f32_to_f16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  const uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00u;
  if (magnitude >= 65520.0f) return sign | 0x7c00u;
  if (magnitude < std::ldexp(1.0f, -14)) {  // subnormal: multiples of 2^-24, nearest even
    const float scaled = magnitude * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  int exponent;
  const float fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent
  uint32_t mantissa = static_cast<uint32_t>(std::nearbyint((fraction * 2.0f - 1.0f) * 1024.0f));
  int biased = exponent - 1 + 15;
  if (mantissa == 1024) { mantissa = 0; ++biased; }
  if (biased >= 31) return sign | 0x7c00u;
  return sign | static_cast<uint16_t>((biased << 10) | mantissa);
}

float fp8_e4m3_to_f32(uint8_t bits) {
  const uint32_t sign = bits >> 7, exponent = (bits >> 3) & 0xfu, mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 15 && mantissa == 7) magnitude = NAN;
  else if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  else magnitude = std::ldexp(static_cast<float>(mantissa | 8u), static_cast<int>(exponent) - 10);
  return sign ? -magnitude : magnitude;
}

float fp8_e5m2_to_f32(uint8_t bits) {
  return f16_to_f32(static_cast<uint16_t>(bits) << 8);
}

void convert_to_f32(DType dtype, const void* src, float* dst, size_t count) {
  switch (dtype) {
    case DType::F32: std::memcpy(dst, src, count * sizeof(float)); return;
    case DType::BF16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(in[i]);
      return;
    }
    case DType::F16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = f16_to_f32(in[i]);
      return;
    }
    case DType::F64: {
      const auto* in = static_cast<const double*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(in[i]);
      return;
    }
    case DType::F8_E4M3: {
      const auto* in = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = fp8_e4m3_to_f32(in[i]);
      return;
    }
    case DType::F8_E5M2: {
      const auto* in = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = fp8_e5m2_to_f32(in[i]);
      return;
    }
    default:
      fail("cannot convert " + std::string(dtype_name(dtype)) + " to F32: not a floating type");
  }
}

}  // namespace glms
