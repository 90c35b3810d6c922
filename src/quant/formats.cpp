#include "quant/formats.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"

namespace glms::quant {

namespace {

struct Layout {
  int exponent_bits, mantissa_bits, bias;
  bool has_nan;  // E4M3 (FN): exponent and mantissa all ones is NaN; the others have none
};

Layout layout_of(MiniFloat format) {
  switch (format) {
    case MiniFloat::E2M1: return {2, 1, 1, false};
    case MiniFloat::E2M3: return {2, 3, 1, false};
    case MiniFloat::E3M2: return {3, 2, 3, false};
    case MiniFloat::E4M3: return {4, 3, 7, true};
  }
  fail("unknown minifloat format");
}

// Value of a non-negative magnitude code (sign bit excluded).
float magnitude_value(const Layout& l, uint32_t magnitude) {
  const uint32_t exponent = magnitude >> l.mantissa_bits, mantissa = magnitude & ((1u << l.mantissa_bits) - 1);
  const float fraction = static_cast<float>(mantissa) / static_cast<float>(1u << l.mantissa_bits);
  if (exponent == 0) return std::ldexp(fraction, 1 - l.bias);  // subnormal
  return std::ldexp(1.0f + fraction, static_cast<int>(exponent) - l.bias);
}

uint32_t largest_magnitude(const Layout& l) {
  const uint32_t all = (1u << (l.exponent_bits + l.mantissa_bits)) - 1;
  return l.has_nan ? all - 1 : all;
}

// The positive values of a format, ascending, indexed by magnitude code (monotonic in the code).
const std::vector<float>& positive_values(MiniFloat format) {
  static const std::array<std::vector<float>, 4> tables = [] {
    std::array<std::vector<float>, 4> all;
    for (int f = 0; f < 4; ++f) {
      const Layout l = layout_of(static_cast<MiniFloat>(f));
      for (uint32_t m = 0; m <= largest_magnitude(l); ++m) all[f].push_back(magnitude_value(l, m));
    }
    return all;
  }();
  return tables[static_cast<int>(format)];
}

}  // namespace

float minifloat_max(MiniFloat format) { return positive_values(format).back(); }

int minifloat_emax(MiniFloat format) {
  int exponent = 0;
  std::frexp(minifloat_max(format), &exponent);
  return exponent - 1;
}

float minifloat_to_f32(MiniFloat format, uint8_t code) {
  const Layout l = layout_of(format);
  const int bits = 1 + l.exponent_bits + l.mantissa_bits;
  const uint32_t magnitude = code & ((1u << (bits - 1)) - 1);
  const bool negative = (code >> (bits - 1)) & 1u;
  if (l.has_nan && magnitude == largest_magnitude(l) + 1) return std::numeric_limits<float>::quiet_NaN();
  const float value = magnitude_value(l, magnitude);
  return negative ? -value : value;
}

uint8_t f32_to_minifloat(MiniFloat format, float value) {
  const Layout l = layout_of(format);
  const int bits = 1 + l.exponent_bits + l.mantissa_bits;
  const uint8_t sign = static_cast<uint8_t>(std::signbit(value) ? 1u << (bits - 1) : 0u);
  if (std::isnan(value)) return l.has_nan ? static_cast<uint8_t>((1u << (bits - 1)) - 1) : static_cast<uint8_t>(largest_magnitude(l));
  const std::vector<float>& table = positive_values(format);
  const float magnitude = std::fabs(value);
  if (magnitude >= table.back()) return sign | static_cast<uint8_t>(table.size() - 1);  // saturate
  // First value >= magnitude; choose between it and the one below, ties to the even code.
  const size_t upper = std::lower_bound(table.begin(), table.end(), magnitude) - table.begin();
  if (upper == 0) return sign;
  const size_t lower = upper - 1;
  const float below = magnitude - table[lower], above = table[upper] - magnitude;
  const size_t pick = below < above ? lower : above < below ? upper : (lower % 2 == 0 ? lower : upper);
  return sign | static_cast<uint8_t>(pick);
}

float e8m0_to_f32(uint8_t code) {
  if (code == 255) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - 127);
}

uint8_t mx_block_scale(const float* values, size_t count, MiniFloat element) {
  float amax = 0.0f;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(values[i])) return 255;
    amax = std::max(amax, std::fabs(values[i]));
  }
  if (amax == 0.0f) return 0;
  int exponent = 0;
  std::frexp(amax, &exponent);  // amax = f * 2^exponent with f in [0.5, 1): floor(log2) = exponent - 1
  const int shared = exponent - 1 - minifloat_emax(element);
  return static_cast<uint8_t>(std::clamp(shared + 127, 0, 254));
}

void quantize_mxfp4(const float* values, size_t count, uint8_t* packed, uint8_t* scales) {
  GLMS_CHECK(count % kMxBlock == 0, "MXFP4 rows must be a multiple of 32 values");
  for (size_t block = 0; block < count / kMxBlock; ++block) {
    const float* in = values + block * kMxBlock;
    const uint8_t scale = mx_block_scale(in, kMxBlock, MiniFloat::E2M1);
    scales[block] = scale;
    const float inverse = scale == 255 ? 0.0f : 1.0f / e8m0_to_f32(scale);
    for (int i = 0; i < kMxBlock; i += 2) {
      const uint8_t low = f32_to_minifloat(MiniFloat::E2M1, in[i] * inverse);
      const uint8_t high = f32_to_minifloat(MiniFloat::E2M1, in[i + 1] * inverse);
      packed[(block * kMxBlock + i) / 2] = static_cast<uint8_t>(low | (high << 4));
    }
  }
}

namespace {
// Decoded values of every code, so that dequantisation in the matmul path is a table lookup.
template <MiniFloat format, int codes>
const std::array<float, codes>& decode_table() {
  static const std::array<float, codes> table = [] {
    std::array<float, codes> values{};
    for (int code = 0; code < codes; ++code) values[code] = minifloat_to_f32(format, static_cast<uint8_t>(code));
    return values;
  }();
  return table;
}
}  // namespace

void dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, size_t count, float* out) {
  GLMS_CHECK(count % kMxBlock == 0, "MXFP4 rows must be a multiple of 32 values");
  const auto& e2m1 = decode_table<MiniFloat::E2M1, 16>();
  for (size_t block = 0; block < count / kMxBlock; ++block) {
    const float scale = e8m0_to_f32(scales[block]);
    const uint8_t* bytes = packed + block * kMxBlock / 2;
    float* dst = out + block * kMxBlock;
    for (int i = 0; i < kMxBlock / 2; ++i) {
      dst[2 * i] = e2m1[bytes[i] & 0x0f] * scale;
      dst[2 * i + 1] = e2m1[bytes[i] >> 4] * scale;
    }
  }
}

void quantize_mxfp6(MiniFloat element, const float* values, size_t count, uint8_t* codes, uint8_t* scales) {
  GLMS_CHECK(element == MiniFloat::E2M3 || element == MiniFloat::E3M2, "MXFP6 elements are E2M3 or E3M2");
  GLMS_CHECK(count % kMxBlock == 0, "MXFP6 rows must be a multiple of 32 values");
  for (size_t block = 0; block < count / kMxBlock; ++block) {
    const float* in = values + block * kMxBlock;
    const uint8_t scale = mx_block_scale(in, kMxBlock, element);
    scales[block] = scale;
    const float inverse = scale == 255 ? 0.0f : 1.0f / e8m0_to_f32(scale);
    for (int i = 0; i < kMxBlock; ++i) codes[block * kMxBlock + i] = f32_to_minifloat(element, in[i] * inverse);
  }
}

void dequantize_mxfp6(MiniFloat element, const uint8_t* codes, const uint8_t* scales, size_t count, float* out) {
  for (size_t i = 0; i < count; ++i)
    out[i] = minifloat_to_f32(element, codes[i]) * e8m0_to_f32(scales[i / kMxBlock]);
}

void pack_mxfp6(const uint8_t* codes, size_t count, uint8_t* packed) {
  GLMS_CHECK(count % 4 == 0, "MXFP6 packs four values into three bytes");
  for (size_t i = 0; i < count / 4; ++i) {
    const uint32_t group = (codes[4 * i] & 0x3fu) | (codes[4 * i + 1] & 0x3fu) << 6 | (codes[4 * i + 2] & 0x3fu) << 12 |
                           (codes[4 * i + 3] & 0x3fu) << 18;
    packed[3 * i] = static_cast<uint8_t>(group);
    packed[3 * i + 1] = static_cast<uint8_t>(group >> 8);
    packed[3 * i + 2] = static_cast<uint8_t>(group >> 16);
  }
}

void unpack_mxfp6(const uint8_t* packed, size_t count, uint8_t* codes) {
  GLMS_CHECK(count % 4 == 0, "MXFP6 packs four values into three bytes");
  for (size_t i = 0; i < count / 4; ++i) {
    const uint32_t group = packed[3 * i] | packed[3 * i + 1] << 8 | packed[3 * i + 2] << 16;
    for (int k = 0; k < 4; ++k) codes[4 * i + k] = static_cast<uint8_t>((group >> (6 * k)) & 0x3fu);
  }
}

void dequantize_mxfp6_packed(MiniFloat element, const uint8_t* packed, const uint8_t* scales, size_t count, float* out) {
  GLMS_CHECK(count % kMxBlock == 0, "MXFP6 rows must be a multiple of 32 values");
  const auto& table = element == MiniFloat::E2M3 ? decode_table<MiniFloat::E2M3, 64>() : decode_table<MiniFloat::E3M2, 64>();
  for (size_t i = 0; i < count / 4; ++i) {
    const uint32_t group = packed[3 * i] | packed[3 * i + 1] << 8 | packed[3 * i + 2] << 16;
    const float scale = e8m0_to_f32(scales[4 * i / kMxBlock]);
    for (int k = 0; k < 4; ++k) out[4 * i + k] = table[(group >> (6 * k)) & 0x3fu] * scale;
  }
}

void quantize_fp8_block(const float* matrix, int64_t rows, int64_t cols, uint8_t* codes, float* scale_inv) {
  const int64_t block_rows = (rows + kFp8Block - 1) / kFp8Block, block_cols = (cols + kFp8Block - 1) / kFp8Block;
  const float fp8_max = minifloat_max(MiniFloat::E4M3);
  for (int64_t br = 0; br < block_rows; ++br)
    for (int64_t bc = 0; bc < block_cols; ++bc) {
      const int64_t r0 = br * kFp8Block, r1 = std::min(rows, r0 + kFp8Block);
      const int64_t c0 = bc * kFp8Block, c1 = std::min(cols, c0 + kFp8Block);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(matrix[r * cols + c]));
      const float scale = amax > 0.0f ? amax / fp8_max : 1.0f;
      scale_inv[br * block_cols + bc] = scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          codes[r * cols + c] = f32_to_minifloat(MiniFloat::E4M3, matrix[r * cols + c] / scale);
    }
}

void dequantize_fp8_block_row(const uint8_t* codes, const float* scale_inv, int64_t row, int64_t cols, float* out) {
  dequantize_fp8_block_columns(codes, scale_inv, row, cols, 0, cols, out);
}

void dequantize_fp8_block_columns(const uint8_t* codes, const float* scale_inv, int64_t row, int64_t cols,
                                  int64_t first_col, int64_t count, float* out) {
  const int64_t block_cols = (cols + kFp8Block - 1) / kFp8Block;
  // Checkpoints pack tensors back to back, so the F32 scales may sit at any byte offset: copy.
  const auto* scale_bytes = reinterpret_cast<const unsigned char*>(scale_inv + (row / kFp8Block) * block_cols);
  const uint8_t* in = codes + row * cols;
  const auto& e4m3 = decode_table<MiniFloat::E4M3, 256>();
  const int64_t last = first_col + count;
  for (int64_t block = first_col / kFp8Block; block * kFp8Block < last; ++block) {
    float scale;
    std::memcpy(&scale, scale_bytes + block * sizeof(float), sizeof(float));
    const int64_t begin = std::max(first_col, block * kFp8Block), end = std::min(last, (block + 1) * kFp8Block);
    for (int64_t c = begin; c < end; ++c) out[c - first_col] = e4m3[in[c]] * scale;
  }
}

}  // namespace glms::quant
