// The FP8 KV cache's rounding (quant/kv_fp8.h): each latent group comes back as E4M3 codes times
// the group's amax / 448, the rope key as bf16, the indexer key with one scale; and its bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "quant/formats.h"
#include "quant/kv_fp8.h"

using namespace glms;
using namespace glms::quant;

namespace {

std::vector<float> random_row(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(n);
  for (int i = 0; i < n; ++i) row[i] = normal(rng) * std::ldexp(1.0f, (i / 128) * 5 - 8);  // groups far apart
  return row;
}

// Every value of `rounded` is an E4M3 value times amax(original group) / 448, the nearest one.
void expect_e4m3_group(const float* original, const float* rounded, int count) {
  float amax = 0.0f;
  for (int i = 0; i < count; ++i) amax = std::max(amax, std::fabs(original[i]));
  const float scale = amax / 448.0f;
  for (int i = 0; i < count; ++i) {
    const float want = minifloat_to_f32(MiniFloat::E4M3, f32_to_minifloat(MiniFloat::E4M3, original[i] / scale)) * scale;
    EXPECT_EQ(rounded[i], want) << "value " << i;
    EXPECT_LE(std::fabs(rounded[i] - original[i]), std::fabs(original[i]) / 16 + scale * 0x1p-9f) << "value " << i;
  }
}

}  // namespace

TEST(KvFp8, LatentGroupsTakeTheirOwnScaleAndTheRopeKeyBf16) {
  const int latent = 512, rope = 64;
  const auto original = random_row(latent + rope, 1);
  auto row = original;
  round_latent_row_fp8(row.data(), latent, rope);
  for (int g = 0; g < latent; g += 128) expect_e4m3_group(original.data() + g, row.data() + g, 128);
  for (int i = latent; i < latent + rope; ++i) EXPECT_EQ(row[i], bf16_to_f32(f32_to_bf16(original[i]))) << i;
  EXPECT_NE(row, original);  // rounding happened
  // A group's largest value survives (448 is E4M3's largest normal).
  for (int g = 0; g < latent; g += 128) {
    const auto big = std::max_element(original.begin() + g, original.begin() + g + 128,
                                      [](float a, float b) { return std::fabs(a) < std::fabs(b); });
    EXPECT_NEAR(row[big - original.begin()], *big, std::fabs(*big) * 1e-6f);
  }
}

TEST(KvFp8, ZeroGroupsAPartialGroupAndTheIndexerKey) {
  std::vector<float> row(200 + 8, 0.0f);  // latent 200: groups of 128 and 72; rope 8
  auto values = random_row(200, 2);
  std::copy(values.begin() + 128, values.end(), row.begin() + 128);  // the first group stays zeros
  const auto original = row;
  round_latent_row_fp8(row.data(), 200, 8);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(row[i], 0.0f);
  expect_e4m3_group(original.data() + 128, row.data() + 128, 72);

  const auto key_original = random_row(128, 3);
  auto key = key_original;
  round_index_key_fp8(key.data(), 128);
  expect_e4m3_group(key_original.data(), key.data(), 128);
}

TEST(KvFp8, BytesPerLayerAreGlm5s) {
  EXPECT_EQ(kv_fp8_bytes_per_layer(512, 64, 0), 512 + 4 * 4 + 128);  // 656 against 1152 in bf16
  EXPECT_EQ(kv_fp8_bytes_per_layer(512, 64, 128), 656 + 132);
  EXPECT_EQ(kv_fp8_bytes_per_layer(200, 8, 0), 200 + 8 + 16);
}

// The CUDA cache's bytes (encode) read back (decode) as exactly the reference rounding, at
// GLM-5's widths and at odd ones (a partial group, a latent width not a multiple of 4).
TEST(KvFp8, DeviceLayoutReadsBackAsTheReferenceRounding) {
  EXPECT_EQ(kv_fp8_row_bytes(512, 64), 656);
  EXPECT_EQ(kv_fp8_scales_offset(512), 512);
  EXPECT_EQ(kv_fp8_rope_offset(512), 528);
  for (auto [latent, rope] : {std::pair{512, 64}, {200, 8}, {18, 6}}) {
    std::vector<float> original = random_row(latent + rope, 4);
    if (latent > 128) std::fill(original.begin(), original.begin() + 128, 0.0f);  // a zero group
    std::vector<uint8_t> bytes(kv_fp8_row_bytes(latent, rope), 0xee);
    encode_latent_row_fp8(original.data(), latent, rope, bytes.data());
    std::vector<float> decoded(latent + rope), rounded = original;
    decode_latent_row_fp8(bytes.data(), latent, rope, decoded.data());
    round_latent_row_fp8(rounded.data(), latent, rope);
    EXPECT_EQ(decoded, rounded) << "latent " << latent << ", rope " << rope;
    EXPECT_EQ(bytes.size() % 16, 0u);
  }
  const auto key = random_row(128, 5);
  std::vector<uint8_t> codes(128);
  float scale = 0;
  encode_index_key_fp8(key.data(), 128, codes.data(), &scale);
  std::vector<float> decoded(128), rounded = key;
  decode_index_key_fp8(codes.data(), scale, 128, decoded.data());
  round_index_key_fp8(rounded.data(), 128);
  EXPECT_EQ(decoded, rounded);
}
