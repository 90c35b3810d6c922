// MXFP4 rows in the tile layout of the tensor-core expert kernels (ops/cuda/moe_experts_mma.cu).
//
// Why a second layout: in a checkpoint's layout (two E2M1 codes a byte, 32 values a block) a
// 16-byte load is one MX block, so each mma's 16 k-values span four blocks and their four
// scales have to multiply the fp16 weights before the mma, and turning a code into the fp16 bits
// of its value takes five integer ops. In the tile layout the four lanes of an mma quad share a
// block at every mma, so one scale multiplies the fp32 partial sums of a block, and the codes
// sit where one or two shifts and one logic op put a pair of them in fp16 bits. Same bytes:
// 4.25 bits a value; the E8M0 scales stay [rows, cols / 32] as in the checkpoint.
//
// A row (cols a multiple of 128) is cut into 64-byte groups of 128 values; group s holds MX
// blocks 4s .. 4s + 3. The rows go in fragments of 16 (an mma fragment's rows): group s of the 16
// rows of a fragment lie side by side, 1 KB, then their group s + 1 (mxfp4_tile_row_offset). A
// warp that reads one group of each of its 16 rows then reads 1 KB in one piece: with the rows
// one after another, the same reads (16 pieces of 64 bytes, 3 KB apart) streamed from memory at
// 1.9-2.3 TB/s on the H200 against 3.2-4.1 for the contiguous kilobyte (a warp's reads alone,
// 224 to 1056 blocks of 8 warps). Inside a group, 32-bit word 4t + w (t, w < 4; little-endian) holds
// values 32 (4s + w) + 8t + i, i < 8 (call them L0..L7) as two 16-bit halves:
//   low half: L0, L2, L4, L6; high half: L1, L3, L5, L7. In each half the k-th of its codes
//   (k < 4) has its sign at bit 15 - k and its three magnitude bits at bits 9 - 3k .. 11 - 3k.
// Pair k of a word, (L_2k, L_2k+1), is then the two codes at bits 15 and 9..11 of each half:
// the fp16 bits of the codes' values times 2^-14 (e1 e0 in the exponent's low bits and m in
// the mantissa's top bit; 0.5 becomes the subnormal 2^-15), which mxfp4_tile_pair extracts.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace glms::quant {

inline constexpr int kMxfp4TileValues = 128;  // values in a 64-byte group
inline constexpr int kMxfp4TileFragmentRows = 16;  // rows whose groups are interleaved
inline constexpr int64_t kMxfp4TileStepBytes = kMxfp4TileFragmentRows * 64;  // group s to s + 1 of a row

// The E8M0 scales go the same way, a 32-bit word (the four block scales of a group) for a group:
// group s of row r's word at mxfp4_tile_scale_word(r) + 16 s, so a fragment's 16 words of a
// group are 64 contiguous bytes (row after row, a warp's 16 scale words a step were 16 sectors).
inline constexpr int64_t kMxfp4TileScaleStepWords = kMxfp4TileFragmentRows;

// Byte offset of row `row`'s group 0 in a tiled matrix of rows `cols` wide (cols a multiple of
// 128, rows a multiple of 16); its group s is kMxfp4TileStepBytes * s further.
GLMS_HOST_DEVICE constexpr int64_t mxfp4_tile_row_offset(int64_t row, int64_t cols) {
  return row / kMxfp4TileFragmentRows * kMxfp4TileFragmentRows * (cols / 2) + row % kMxfp4TileFragmentRows * 64;
}

// fp16 bits of pair k (< 4) of tile word q: (L_2k, L_2k+1) times 2^-14, low half first.
GLMS_HOST_DEVICE inline uint32_t mxfp4_tile_pair(uint32_t q, int k) {
  constexpr uint32_t kSign = 0x80008000u, kMagnitude = 0x0e000e00u;
  switch (k) {
    case 0: return q & (kSign | kMagnitude);
    case 1: return ((q << 1) & kSign) | ((q << 3) & kMagnitude);
    case 2: return ((q << 2) & kSign) | ((q << 6) & kMagnitude);
    default: return ((q << 3) & kSign) | ((q << 9) & kMagnitude);
  }
}

// bf16 bits of the same pair times 2^-126, low half first: mxfp4_tile_pair's fp16 sign stays
// and its exponent and mantissa bits move down 3 (an fp16 exponent field E read as bf16's is
// 2^-112 apart; 0.5 stays a subnormal, 0 stays 0). The W4A16 kernels multiply by 2^126 and the
// block scale in bf16, which is exact. One shift-and-select fewer than widening the fp16 bits.
GLMS_HOST_DEVICE inline uint32_t mxfp4_tile_pair_bf16(uint32_t q, int k) {
  constexpr uint32_t kSign = 0x80008000u, kMagnitude = 0x01c001c0u;
  switch (k) {
    case 0: return (q & kSign) | ((q >> 3) & kMagnitude);
    case 1: return ((q << 1) & kSign) | (q & kMagnitude);
    case 2: return ((q << 2) & kSign) | ((q << 3) & kMagnitude);
    default: return ((q << 3) & kSign) | ((q << 6) & kMagnitude);
  }
}

// Index of row `row`'s group-0 scale word in tiled scales of rows `cols` wide; its group s is
// kMxfp4TileScaleStepWords * s further.
GLMS_HOST_DEVICE constexpr int64_t mxfp4_tile_scale_word(int64_t row, int64_t cols) {
  return row / kMxfp4TileFragmentRows * kMxfp4TileFragmentRows * (cols / kMxfp4TileValues) +
         row % kMxfp4TileFragmentRows;
}

// Whether rows `cols` wide can take the tile layout (their matrices' rows then also need to be
// a multiple of 16: the model's are hidden_size and 2 moe_intermediate_size, multiples of 128
// where these are).
GLMS_HOST_DEVICE constexpr bool mxfp4_tiles_fit(int64_t cols) { return cols % kMxfp4TileValues == 0; }

// Rows of packed MXFP4 ([rows, cols / 2] bytes, two codes a byte, the even value in the low
// nibble) into the tile layout ([rows, cols / 2] bytes), and back. mxfp4_tiles_fit(cols), rows
// a multiple of 16. The two may be one buffer (a fragment at a time goes through a copy).
void tile_mxfp4_rows(const uint8_t* packed, int64_t rows, int64_t cols, uint8_t* tiled);
void untile_mxfp4_rows(const uint8_t* tiled, int64_t rows, int64_t cols, uint8_t* packed);
// The rows' E8M0 scales ([rows, cols / 32] bytes) into the tile layout's order, and back; same
// conditions, one buffer allowed.
void tile_mxfp4_scales(const uint8_t* scales, int64_t rows, int64_t cols, uint8_t* tiled);
void untile_mxfp4_scales(const uint8_t* tiled, int64_t rows, int64_t cols, uint8_t* scales);

}  // namespace glms::quant
