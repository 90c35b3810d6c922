// The tile layout of MXFP4 rows (quant/mxfp4_tiles.h) that the tensor-core expert kernels read:
// the round trip, and the pair extraction the kernels run (the same function) against the
// spec's E2M1 values on every code and on random rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/formats.h"
#include "quant/mxfp4_tiles.h"

using namespace glms;
using namespace glms::quant;

namespace {

std::vector<uint8_t> random_bytes(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(count);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

uint8_t code_at(const std::vector<uint8_t>& packed, int64_t v) { return (packed[v / 2] >> (4 * (v % 2))) & 0xf; }

}  // namespace

TEST(Mxfp4Tiles, TilingRoundTripsAndMovesEveryCode) {
  const int64_t rows = 48, cols = 384;
  const auto packed = random_bytes(rows * cols / 2, 1);
  std::vector<uint8_t> tiled(packed.size()), back(packed.size(), 0x5a);
  tile_mxfp4_rows(packed.data(), rows, cols, tiled.data());
  untile_mxfp4_rows(tiled.data(), rows, cols, back.data());
  EXPECT_EQ(back, packed);
  EXPECT_NE(tiled, packed);  // a layout, not a copy
  std::vector<uint8_t> in_place = packed;  // one buffer for both sides
  tile_mxfp4_rows(in_place.data(), rows, cols, in_place.data());
  EXPECT_EQ(in_place, tiled);
  untile_mxfp4_rows(in_place.data(), rows, cols, in_place.data());
  EXPECT_EQ(in_place, packed);
}

// Each pair the kernels extract is the two values the layout promises, times 2^-14 in fp16
// bits, for the values 32 (4s + w) + 8t + 2k and + 1 of word 4t + w of group s; on a few rows and
// on enough rows for the tiling to run on several threads.
void check_pairs(int64_t rows, int64_t cols, uint32_t seed) {
  const auto packed = random_bytes(rows * cols / 2, seed);
  std::vector<uint8_t> tiled(packed.size());
  tile_mxfp4_rows(packed.data(), rows, cols, tiled.data());
  int64_t checked = 0, wrong = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < cols / kMxfp4TileValues; ++s)
      for (int t = 0; t < 4; ++t)
        for (int w = 0; w < 4; ++w) {
          const uint8_t* bytes = tiled.data() + mxfp4_tile_row_offset(r, cols) + kMxfp4TileStepBytes * s + 16 * t + 4 * w;
          const uint32_t q = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
          for (int k = 0; k < 4; ++k) {
            const uint32_t pair = mxfp4_tile_pair(q, k);
            const int64_t v = r * cols + 128 * s + 32 * w + 8 * t + 2 * k;
            wrong += f16_to_f32(pair & 0xffff) * 0x1p14f != minifloat_to_f32(MiniFloat::E2M1, code_at(packed, v));
            wrong += f16_to_f32(pair >> 16) * 0x1p14f != minifloat_to_f32(MiniFloat::E2M1, code_at(packed, v + 1));
            checked += 2;
          }
        }
  EXPECT_EQ(checked, rows * cols);
  EXPECT_EQ(wrong, 0) << rows << " x " << cols;
  std::vector<uint8_t> back(packed.size());
  untile_mxfp4_rows(tiled.data(), rows, cols, back.data());
  EXPECT_EQ(back, packed) << rows << " x " << cols;
}

TEST(Mxfp4Tiles, PairsAreTheValuesTimesTwoToTheMinus14) {
  check_pairs(16, 256, 2);
  check_pairs(80, 8192, 3);  // 5120 groups: the threaded path
}

// All 16 codes in every one of a word's 8 places.
TEST(Mxfp4Tiles, EveryCodeInEveryPlace) {
  for (int code = 0; code < 16; ++code)
    for (int place = 0; place < 8; ++place) {
      std::vector<uint8_t> packed(16 * 64, 0);  // a fragment of 16 rows of 128
      packed[place / 2] = static_cast<uint8_t>(code << (4 * (place % 2)));  // value `place` of word 0
      std::vector<uint8_t> tiled(16 * 64);
      tile_mxfp4_rows(packed.data(), 16, 128, tiled.data());
      const uint32_t q = tiled[0] | (tiled[1] << 8) | (tiled[2] << 16) | (static_cast<uint32_t>(tiled[3]) << 24);
      for (int k = 0; k < 4; ++k)
        for (int h = 0; h < 2; ++h) {
          const uint32_t half = (mxfp4_tile_pair(q, k) >> (16 * h)) & 0xffff;
          const float want = 2 * k + h == place ? minifloat_to_f32(MiniFloat::E2M1, static_cast<uint8_t>(code)) : 0.0f;
          EXPECT_EQ(f16_to_f32(static_cast<uint16_t>(half)) * 0x1p14f, want) << "code " << code << " place " << place;
        }
    }
}

// The bf16 extraction the W4A16 kernels use gives the same values, times 2^-126, for every
// word (all 2^32 would take long; every code in every place and random words).
TEST(Mxfp4Tiles, Bf16PairsAreTheFp16PairsTimesTwoToTheMinus112) {
  std::mt19937 rng(7);
  std::vector<uint32_t> words;
  for (int place = 0; place < 8; ++place)
    for (uint32_t code = 0; code < 16; ++code) words.push_back(code << (4 * place));
  for (int i = 0; i < 100000; ++i) words.push_back(static_cast<uint32_t>(rng()));
  int64_t wrong = 0;
  for (const uint32_t q : words)
    for (int k = 0; k < 4; ++k)
      for (int h = 0; h < 2; ++h) {
        const float fp16 = f16_to_f32(static_cast<uint16_t>(mxfp4_tile_pair(q, k) >> (16 * h)));
        const float bf16 = bf16_to_f32(static_cast<uint16_t>(mxfp4_tile_pair_bf16(q, k) >> (16 * h)));
        wrong += bf16 * 0x1p112f != fp16 || std::signbit(bf16) != std::signbit(fp16);
      }
  EXPECT_EQ(wrong, 0);
}

TEST(Mxfp4Tiles, RejectsWidthsThatAreNotWhole128sAndPartFragments) {
  std::vector<uint8_t> packed(16 * 64), tiled(16 * 64);
  EXPECT_THROW(tile_mxfp4_rows(packed.data(), 16, 96, tiled.data()), Error);
  EXPECT_THROW(tile_mxfp4_rows(packed.data(), 8, 128, tiled.data()), Error);
  EXPECT_THROW(untile_mxfp4_rows(tiled.data(), 12, 128, packed.data()), Error);
}

// Where the groups go: group s of row r at mxfp4_tile_row_offset(r) + 1024 s, so that a
// fragment's 16 rows' group s are one contiguous kilobyte (each group carries a code of its own
// (row, group) to find it by).
TEST(Mxfp4Tiles, AFragmentsGroupsLieSideBySide) {
  const int64_t rows = 32, cols = 512, groups = cols / kMxfp4TileValues;
  std::vector<uint8_t> packed(rows * cols / 2, 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < groups; ++s) packed[r * cols / 2 + 64 * s] = static_cast<uint8_t>(r * groups + s);
  std::vector<uint8_t> tiled(packed.size());
  tile_mxfp4_rows(packed.data(), rows, cols, tiled.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < groups; ++s) {
      const int64_t offset = mxfp4_tile_row_offset(r, cols) + kMxfp4TileStepBytes * s;
      EXPECT_EQ(offset, r / 16 * 16 * cols / 2 + 1024 * s + 64 * (r % 16));
      const uint8_t* group = tiled.data() + offset;
      // The group's first code byte (values 0 and 1) is in tile word 0's pairs 0 of both halves.
      const uint32_t q = group[0] | (group[1] << 8) | (group[2] << 16) | (static_cast<uint32_t>(group[3]) << 24);
      const uint8_t code_byte = static_cast<uint8_t>(r * groups + s);
      for (int h = 0; h < 2; ++h) {
        const float got = f16_to_f32(static_cast<uint16_t>(mxfp4_tile_pair(q, 0) >> (16 * h))) * 0x1p14f;
        EXPECT_EQ(got, minifloat_to_f32(MiniFloat::E2M1, static_cast<uint8_t>((code_byte >> (4 * h)) & 0xf)))
            << "row " << r << " group " << s;
      }
    }
}

// The scales follow the codes: row r's scale word of group s (its blocks 4s .. 4s + 3) at word
// mxfp4_tile_scale_word(r) + 16 s, a fragment's 16 words of a group side by side; and back.
TEST(Mxfp4Tiles, ScaleWordsLieAsTheirGroups) {
  const int64_t rows = 48, cols = 384, groups = cols / kMxfp4TileValues;
  const auto scales = random_bytes(rows * cols / 32, 9);
  std::vector<uint8_t> tiled(scales.size()), back(scales.size()), in_place = scales;
  tile_mxfp4_scales(scales.data(), rows, cols, tiled.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < groups; ++s) {
      const int64_t word = mxfp4_tile_scale_word(r, cols) + kMxfp4TileScaleStepWords * s;
      EXPECT_EQ(word, r / 16 * 16 * groups + 16 * s + r % 16);
      for (int b = 0; b < 4; ++b)
        EXPECT_EQ(tiled[4 * word + b], scales[r * cols / 32 + 4 * s + b]) << "row " << r << " block " << 4 * s + b;
    }
  untile_mxfp4_scales(tiled.data(), rows, cols, back.data());
  EXPECT_EQ(back, scales);
  tile_mxfp4_scales(in_place.data(), rows, cols, in_place.data());
  EXPECT_EQ(in_place, tiled);
  EXPECT_THROW(tile_mxfp4_scales(in_place.data(), 40, cols, tiled.data()), Error);
}
