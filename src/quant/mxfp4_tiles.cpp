#include "quant/mxfp4_tiles.h"

#include <array>
#include <cstring>
#include <string>
#include <vector>

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

void check_shape(int64_t rows, int64_t cols) {
  GLMS_CHECK(mxfp4_tiles_fit(cols), "MXFP4 tile layout: row width " + std::to_string(cols) +
                                               " is not a multiple of 128");
  GLMS_CHECK(rows % kMxfp4TileFragmentRows == 0,
             "MXFP4 tile layout: " + std::to_string(rows) + " rows are not a multiple of 16");
}

// Group g of a row: tile word 4t + w (at byte 16t + 4w) holds values 32w + 8t .. + 7 of the group,
// which are packed bytes 16w + 4t .. + 3.
constexpr int64_t tile_offset(int t, int w) { return 16 * t + 4 * w; }
constexpr int64_t packed_offset(int t, int w) { return 16 * w + 4 * t; }

// Fragment by fragment (16 rows of `groups` groups of `group_bytes` each), group s of row r
// moves between row order (position r * groups + s) and step order (s * 16 + r); move(in, out)
// writes one group, re-encoding it on the way. `from` and `to` may be one buffer.
template <typename Move>
void reorder_fragments(const uint8_t* from, int64_t rows, int64_t groups, int64_t group_bytes, uint8_t* to,
                       bool to_steps, Move move) {
  const int64_t fragment_bytes = kMxfp4TileFragmentRows * groups * group_bytes;
#pragma omp parallel if (rows * groups > 4096)
  {
    std::vector<uint8_t> copy(fragment_bytes);  // a thread's, one fragment at a time
#pragma omp for schedule(static)
    for (int64_t f = 0; f < rows / kMxfp4TileFragmentRows; ++f) {
      // The whole fragment read before any of it is written: in place is fine.
      std::memcpy(copy.data(), from + f * fragment_bytes, fragment_bytes);
      for (int64_t r = 0; r < kMxfp4TileFragmentRows; ++r)
        for (int64_t s = 0; s < groups; ++s) {
          const int64_t row_order = (r * groups + s) * group_bytes;
          const int64_t step_order = (s * kMxfp4TileFragmentRows + r) * group_bytes;
          move(copy.data() + (to_steps ? row_order : step_order), to + f * fragment_bytes + (to_steps ? step_order : row_order));
        }
    }
  }
}

// A 64-byte group of codes between the two layouts, each 32-bit word re-encoded by `word`.
template <typename Word>
void reorder_code_groups(const uint8_t* from, int64_t rows, int64_t cols, uint8_t* to, bool to_tiles, Word word) {
  reorder_fragments(from, rows, cols / kMxfp4TileValues, 64, to, to_tiles, [&](const uint8_t* in, uint8_t* out) {
    for (int t = 0; t < 4; ++t)
      for (int w = 0; w < 4; ++w) {
        const int64_t in_offset = to_tiles ? packed_offset(t, w) : tile_offset(t, w);
        const int64_t out_offset = to_tiles ? tile_offset(t, w) : packed_offset(t, w);
        store_word(out + out_offset, word(load_word(in + in_offset)));
      }
  });
}

void reorder_scale_words(const uint8_t* from, int64_t rows, int64_t cols, uint8_t* to, bool to_tiles) {
  reorder_fragments(from, rows, cols / kMxfp4TileValues, 4, to, to_tiles,
                    [](const uint8_t* in, uint8_t* out) { std::memcpy(out, in, 4); });
}

}  // namespace

void tile_mxfp4_scales(const uint8_t* scales, int64_t rows, int64_t cols, uint8_t* tiled) {
  check_shape(rows, cols);
  reorder_scale_words(scales, rows, cols, tiled, true);
}

void untile_mxfp4_scales(const uint8_t* tiled, int64_t rows, int64_t cols, uint8_t* scales) {
  check_shape(rows, cols);
  reorder_scale_words(tiled, rows, cols, scales, false);
}

void tile_mxfp4_rows(const uint8_t* packed, int64_t rows, int64_t cols, uint8_t* tiled) {
  check_shape(rows, cols);
  const auto& halves = half_table();
  reorder_code_groups(packed, rows, cols, tiled, true, [&](uint32_t codes) {  // L0 .. L7, L0 lowest
    return halves[even_nibbles(codes)] | (static_cast<uint32_t>(halves[even_nibbles(codes >> 4)]) << 16);
  });
}

void untile_mxfp4_rows(const uint8_t* tiled, int64_t rows, int64_t cols, uint8_t* packed) {
  check_shape(rows, cols);
  const auto& codes_of = codes_table();
  reorder_code_groups(tiled, rows, cols, packed, false, [&](uint32_t bits) {
    return spread_nibbles(codes_of[bits & 0xffff]) | (spread_nibbles(codes_of[bits >> 16]) << 4);
  });
}

}  // namespace glms::quant
