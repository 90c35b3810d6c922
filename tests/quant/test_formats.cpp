// The MX and block-FP8 formats against the OCP Microscaling spec's definitions: value tables,
// round-to-nearest-even, saturation, shared scales, special values, and round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "quant/formats.h"
#include "support/numerics.h"

using namespace glms;
using namespace glms::quant;

TEST(MiniFloat, E2M1ValuesAreTheSpecsGrid) {
  const float expected[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int code = 0; code < 8; ++code) {
    EXPECT_EQ(minifloat_to_f32(MiniFloat::E2M1, code), expected[code]) << code;
    EXPECT_EQ(minifloat_to_f32(MiniFloat::E2M1, code | 8), -expected[code]) << code;
  }
  EXPECT_EQ(minifloat_max(MiniFloat::E2M1), 6.0f);
  EXPECT_EQ(minifloat_max(MiniFloat::E2M3), 7.5f);
  EXPECT_EQ(minifloat_max(MiniFloat::E3M2), 28.0f);
  EXPECT_EQ(minifloat_max(MiniFloat::E4M3), 448.0f);
  EXPECT_EQ(minifloat_emax(MiniFloat::E2M1), 2);
  EXPECT_EQ(minifloat_emax(MiniFloat::E2M3), 2);
  EXPECT_EQ(minifloat_emax(MiniFloat::E3M2), 4);
  EXPECT_EQ(minifloat_emax(MiniFloat::E4M3), 8);
}

TEST(MiniFloat, E4M3AgreesWithTheCoreDecoderAndRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const float value = minifloat_to_f32(MiniFloat::E4M3, static_cast<uint8_t>(code));
    const float core = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(core)) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    EXPECT_EQ(value, core) << code;
    EXPECT_EQ(f32_to_minifloat(MiniFloat::E4M3, value), code) << code;
  }
  EXPECT_EQ(f32_to_minifloat(MiniFloat::E4M3, NAN) & 0x7f, 0x7f);
}

TEST(MiniFloat, SixBitFormatsRoundTrip) {
  for (MiniFloat f : {MiniFloat::E2M3, MiniFloat::E3M2})
    for (int code = 0; code < 64; ++code)
      EXPECT_EQ(f32_to_minifloat(f, minifloat_to_f32(f, static_cast<uint8_t>(code))), code) << code;
}

TEST(MiniFloat, RoundsToNearestEvenAndSaturates) {
  auto e2m1 = [](float v) { return minifloat_to_f32(MiniFloat::E2M1, f32_to_minifloat(MiniFloat::E2M1, v)); };
  EXPECT_EQ(e2m1(1.25f), 1.0f);   // halfway between codes 2 and 3: even code 2
  EXPECT_EQ(e2m1(1.75f), 2.0f);   // between codes 3 and 4: even code 4
  EXPECT_EQ(e2m1(5.0f), 4.0f);    // between codes 6 and 7: even code 6
  EXPECT_EQ(e2m1(0.25f), 0.0f);   // between 0 and 0.5
  EXPECT_EQ(e2m1(0.26f), 0.5f);
  EXPECT_EQ(e2m1(2.4f), 2.0f);
  EXPECT_EQ(e2m1(100.0f), 6.0f);  // saturation, not infinity
  EXPECT_EQ(e2m1(-1e30f), -6.0f);
  EXPECT_EQ(e2m1(INFINITY), 6.0f);
  EXPECT_TRUE(std::signbit(e2m1(-0.0f)));
}

TEST(Mx, SharedScaleFollowsTheSpec) {
  float block[32] = {};
  EXPECT_EQ(mx_block_scale(block, 32, MiniFloat::E2M1), 0);  // all zeros: smallest scale
  block[5] = 6.0f;   // floor(log2 6) - 2 = 0
  EXPECT_EQ(mx_block_scale(block, 32, MiniFloat::E2M1), 127);
  block[5] = -7.9f;  // floor(log2 7.9) = 2 -> 0
  EXPECT_EQ(mx_block_scale(block, 32, MiniFloat::E2M1), 127);
  block[5] = 8.0f;   // 3 - 2 = 1
  EXPECT_EQ(mx_block_scale(block, 32, MiniFloat::E2M1), 128);
  block[5] = 0.01f;  // floor(log2 0.01) = -7 -> -9
  EXPECT_EQ(mx_block_scale(block, 32, MiniFloat::E2M1), 118);
  EXPECT_EQ(mx_block_scale(block, 32, MiniFloat::E3M2), 116);  // emax 4
  block[7] = NAN;
  EXPECT_EQ(mx_block_scale(block, 32, MiniFloat::E2M1), 255);
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
}

TEST(Mx, Fp4QuantisationPicksTheNearestScaledGridValue) {
  const auto values = glms::testing::random_values(32 * 64, 5, 0.7f);
  std::vector<uint8_t> packed(values.size() / 2), scales(values.size() / 32);
  quantize_mxfp4(values.data(), values.size(), packed.data(), scales.data());
  std::vector<float> back(values.size());
  dequantize_mxfp4(packed.data(), scales.data(), values.size(), back.data());
  const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (size_t i = 0; i < values.size(); ++i) {
    const float scale = e8m0_to_f32(scales[i / 32]);
    float best = 0.0f;  // brute force: the nearest of +-grid * scale
    for (float g : grid)
      for (float s : {g, -g})
        if (std::fabs(s * scale - values[i]) < std::fabs(best - values[i])) best = s * scale;
    if (best == 0.0f) EXPECT_EQ(back[i], 0.0f) << i;  // +0 or -0
    else EXPECT_FLOAT_EQ(back[i], best) << i;
  }
  // 4.25 bits per value: about 10% relative error on gaussian data.
  EXPECT_LT(glms::testing::relative_l2(back, values), 0.15);
}

TEST(Mx, Fp6IsFinerThanFp4AndSpecialBlocksSurvive) {
  auto values = glms::testing::random_values(32 * 64, 6, 2.0f);
  std::vector<uint8_t> codes(values.size()), scales(values.size() / 32);
  std::vector<float> back(values.size());
  for (MiniFloat element : {MiniFloat::E2M3, MiniFloat::E3M2}) {
    quantize_mxfp6(element, values.data(), values.size(), codes.data(), scales.data());
    dequantize_mxfp6(element, codes.data(), scales.data(), values.size(), back.data());
    EXPECT_LT(glms::testing::relative_l2(back, values), element == MiniFloat::E2M3 ? 0.04 : 0.07);
  }
  std::fill(values.begin(), values.begin() + 32, 0.0f);
  values[40] = NAN;
  std::vector<uint8_t> packed(values.size() / 2);
  quantize_mxfp4(values.data(), values.size(), packed.data(), scales.data());
  dequantize_mxfp4(packed.data(), scales.data(), values.size(), back.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(back[i], 0.0f);
  for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(back[i])) << "a NaN makes the whole block NaN";
}

TEST(Mx, Fp6PacksFourCodesIntoThreeBytes) {
  // Codes 0..63 in order: the 24-bit groups hold them low value first.
  std::vector<uint8_t> codes(64), unpacked(64), packed(48);
  for (int i = 0; i < 64; ++i) codes[i] = static_cast<uint8_t>(i);
  pack_mxfp6(codes.data(), codes.size(), packed.data());
  EXPECT_EQ(packed[0], 0x40);  // 0 | 1 << 6
  EXPECT_EQ(packed[1], 0x20);  // (1 >> 2) | 2 << 4
  EXPECT_EQ(packed[2], 0x0c);  // (2 >> 4) | 3 << 2
  unpack_mxfp6(packed.data(), packed.size() / 3 * 4, unpacked.data());
  EXPECT_EQ(unpacked, codes);
  // Packed dequantisation equals the per-byte reference for both elements.
  const auto values = glms::testing::random_values(32 * 8, 9, 3.0f);
  std::vector<uint8_t> element_codes(values.size()), scales(values.size() / 32), bytes(values.size() / 4 * 3);
  std::vector<float> reference(values.size()), from_packed(values.size());
  for (MiniFloat element : {MiniFloat::E2M3, MiniFloat::E3M2}) {
    quantize_mxfp6(element, values.data(), values.size(), element_codes.data(), scales.data());
    pack_mxfp6(element_codes.data(), element_codes.size(), bytes.data());
    dequantize_mxfp6(element, element_codes.data(), scales.data(), values.size(), reference.data());
    dequantize_mxfp6_packed(element, bytes.data(), scales.data(), values.size(), from_packed.data());
    EXPECT_EQ(from_packed, reference);
  }
}

TEST(Fp8Block, ScalesPerBlockAndPartialBlocks) {
  const int64_t rows = 200, cols = 300;  // partial blocks on both axes
  auto matrix = glms::testing::random_values(rows * cols, 7, 0.02f);
  for (int64_t c = 0; c < 128; ++c) matrix[130 * cols + c] *= 50.0f;  // one block much larger
  std::vector<uint8_t> codes(rows * cols);
  std::vector<float> scale_inv(2 * 3);
  quantize_fp8_block(matrix.data(), rows, cols, codes.data(), scale_inv.data());
  EXPECT_GT(scale_inv[1 * 3 + 0], 10 * scale_inv[0]);
  std::vector<float> back(rows * cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_fp8_block_row(codes.data(), scale_inv.data(), r, cols, back.data() + r * cols);
  EXPECT_LT(glms::testing::relative_l2(back, matrix), 0.04);
  // Each block's largest magnitude lands exactly on +-448 x its scale.
  float amax = 0.0f;
  int64_t at = 0;
  for (int64_t r = 0; r < 128; ++r)
    for (int64_t c = 0; c < 128; ++c)
      if (std::fabs(matrix[r * cols + c]) > amax) amax = std::fabs(matrix[at = r * cols + c]);
  EXPECT_FLOAT_EQ(std::fabs(back[at]), 448.0f * scale_inv[0]);
}
