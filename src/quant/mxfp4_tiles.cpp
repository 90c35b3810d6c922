#include "quant/mxfp4_tiles.h"

#include "core/error.h"

namespace glms::quant {

namespace {

// Code of value v in a packed row.
uint8_t packed_code(const uint8_t* row, int64_t v) { return (row[v / 2] >> (4 * (v % 2))) & 0xf; }

// Bits of code `code` as the k-th code of a tile half (sign at 15 - k, magnitude at 9 - 3k).
uint32_t half_bits(uint8_t code, int k) {
  return (static_cast<uint32_t>(code >> 3) << (15 - k)) | (static_cast<uint32_t>(code & 7) << (9 - 3 * k));
}

uint8_t code_of_half(uint32_t half, int k) {
  return static_cast<uint8_t>((((half >> (15 - k)) & 1) << 3) | ((half >> (9 - 3 * k)) & 7));
}

// First value of tile word `word` (4t + w) of group `group`.
int64_t word_first_value(int64_t group, int word) {
  return kMxfp4TileValues * group + 32 * (word % 4) + 8 * (word / 4);
}

void check_cols(int64_t cols) {
  GLMS_CHECK(cols % kMxfp4TileValues == 0, "MXFP4 tile layout: row width " + std::to_string(cols) +
                                               " is not a multiple of 128");
}

}  // namespace

void tile_mxfp4_rows(const uint8_t* packed, int64_t rows, int64_t cols, uint8_t* tiled) {
  check_cols(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* in = packed + r * cols / 2;
    uint8_t* out = tiled + r * cols / 2;
    for (int64_t g = 0; g < cols / kMxfp4TileValues; ++g)
      for (int word = 0; word < 16; ++word) {
        const int64_t first = word_first_value(g, word);
        uint32_t bits = 0;
        for (int k = 0; k < 4; ++k)
          bits |= half_bits(packed_code(in, first + 2 * k), k) | (half_bits(packed_code(in, first + 2 * k + 1), k) << 16);
        for (int b = 0; b < 4; ++b) out[64 * g + 4 * word + b] = static_cast<uint8_t>(bits >> (8 * b));
      }
  }
}

void untile_mxfp4_rows(const uint8_t* tiled, int64_t rows, int64_t cols, uint8_t* packed) {
  check_cols(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* in = tiled + r * cols / 2;
    uint8_t* out = packed + r * cols / 2;
    for (int64_t g = 0; g < cols / kMxfp4TileValues; ++g)
      for (int word = 0; word < 16; ++word) {
        uint32_t bits = 0;
        for (int b = 0; b < 4; ++b) bits |= static_cast<uint32_t>(in[64 * g + 4 * word + b]) << (8 * b);
        const int64_t first = word_first_value(g, word);
        for (int k = 0; k < 4; ++k)
          for (int h = 0; h < 2; ++h) {
            const int64_t v = first + 2 * k + h;
            const uint8_t code = code_of_half(bits >> (16 * h), k);
            out[v / 2] = static_cast<uint8_t>((out[v / 2] & (0xf0 >> (4 * (v % 2)))) | (code << (4 * (v % 2))));
          }
      }
  }
}

}  // namespace glms::quant
