#include "quant/mxfp4_tiles.h"

#include <array>
#include <cstring>
#include <string>

#include "core/error.h"

namespace glms::quant {

namespace {

// A tile half from four codes (code k in bits 4k .. 4k + 3 of `codes`): code k's sign at bit
// 15 - k, its magnitude at bits 9 - 3k .. 11 - 3k; and the inverse. Both are bijections on 16
// bits, tabulated once (128 KiB each) so that a row is a table lookup per half word.
uint16_t half_of_codes(uint32_t codes) {
  uint32_t half = 0;
  for (int k = 0; k < 4; ++k) {
    const uint32_t code = (codes >> (4 * k)) & 0xf;
    half |= ((code >> 3) << (15 - k)) | ((code & 7) << (9 - 3 * k));
  }
  return static_cast<uint16_t>(half);
}

const std::array<uint16_t, 65536>& half_table() {
  static const auto table = [] {
    std::array<uint16_t, 65536> t{};
    for (uint32_t v = 0; v < t.size(); ++v) t[v] = half_of_codes(v);
    return t;
  }();
  return table;
}

const std::array<uint16_t, 65536>& codes_table() {
  static const auto table = [] {
    std::array<uint16_t, 65536> t{};
    const auto& halves = half_table();
    for (uint32_t v = 0; v < t.size(); ++v) t[halves[v]] = static_cast<uint16_t>(v);
    return t;
  }();
  return table;
}

// The nibbles 0, 2, 4, 6 of x side by side in 16 bits, and back.
uint32_t even_nibbles(uint32_t x) {
  x &= 0x0f0f0f0fu;
  x = (x | (x >> 4)) & 0x00ff00ffu;
  return (x | (x >> 8)) & 0xffffu;
}
uint32_t spread_nibbles(uint32_t x) {
  x = (x | (x << 8)) & 0x00ff00ffu;
  return (x | (x << 4)) & 0x0f0f0f0fu;
}

uint32_t load_word(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian hosts (x86-64, aarch64)
  return v;
}
void store_word(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

void check_cols(int64_t cols) {
  GLMS_CHECK(mxfp4_tiles_fit(cols), "MXFP4 tile layout: row width " + std::to_string(cols) +
                                               " is not a multiple of 128");
}

// Group g of a row: tile word 4t + w (at byte 16t + 4w) holds values 32w + 8t .. + 7 of the group,
// which are packed bytes 16w + 4t .. + 3.
constexpr int64_t tile_offset(int t, int w) { return 16 * t + 4 * w; }
constexpr int64_t packed_offset(int t, int w) { return 16 * w + 4 * t; }

}  // namespace

void tile_mxfp4_rows(const uint8_t* packed, int64_t rows, int64_t cols, uint8_t* tiled) {
  check_cols(cols);
  const auto& halves = half_table();
  const int64_t groups = rows * (cols / kMxfp4TileValues);  // 64 bytes each, rows back to back
#pragma omp parallel for schedule(static) if (groups > 4096)
  for (int64_t g = 0; g < groups; ++g) {
    uint32_t words[4][4];  // the whole group read before any of it is written: in place is fine
    for (int t = 0; t < 4; ++t)
      for (int w = 0; w < 4; ++w) {
        const uint32_t codes = load_word(packed + 64 * g + packed_offset(t, w));  // L0 .. L7, L0 lowest
        words[t][w] = halves[even_nibbles(codes)] | (static_cast<uint32_t>(halves[even_nibbles(codes >> 4)]) << 16);
      }
    for (int t = 0; t < 4; ++t)
      for (int w = 0; w < 4; ++w) store_word(tiled + 64 * g + tile_offset(t, w), words[t][w]);
  }
}

void untile_mxfp4_rows(const uint8_t* tiled, int64_t rows, int64_t cols, uint8_t* packed) {
  check_cols(cols);
  const auto& codes_of = codes_table();
  const int64_t groups = rows * (cols / kMxfp4TileValues);
#pragma omp parallel for schedule(static) if (groups > 4096)
  for (int64_t g = 0; g < groups; ++g) {
    uint32_t words[4][4];
    for (int t = 0; t < 4; ++t)
      for (int w = 0; w < 4; ++w) {
        const uint32_t bits = load_word(tiled + 64 * g + tile_offset(t, w));
        words[t][w] = spread_nibbles(codes_of[bits & 0xffff]) | (spread_nibbles(codes_of[bits >> 16]) << 4);
      }
    for (int t = 0; t < 4; ++t)
      for (int w = 0; w < 4; ++w) store_word(packed + 64 * g + packed_offset(t, w), words[t][w]);
  }
}

}  // namespace glms::quant
