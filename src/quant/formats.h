// Low-precision weight formats, reference implementations following the OCP Microscaling
// (MX) v1.0 spec and the block-FP8 layout of the DeepSeek-V3 / GLM-5-FP8 checkpoints.
//   MXFP4: blocks of 32 E2M1 values (+-{0, 0.5, 1, 1.5, 2, 3, 4, 6}) sharing one E8M0
//          power-of-two scale: 4.25 bits per value. Two values per byte, the even-indexed one
//          in the low nibble (AMD Quark's packing).
//   MXFP6: blocks of 32 E2M3 (max 7.5) or E3M2 (max 28) values + E8M0 scale: 6.25 bits per
//          value; one code per byte in memory, four codes in three bytes in checkpoints.
//   FP8 block: E4M3 (max 448) with one fp32 scale per 128 x 128 block of the weight matrix,
//          stored as `weight_scale_inv` (the dequantisation multiplier).
// Quantisation rounds to nearest, ties to even, and saturates to the format's largest normal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace glms::quant {

// An element format: bit layout and the exponent of its largest normal value.
enum class MiniFloat : uint8_t { E2M1, E2M3, E3M2, E4M3 };

float minifloat_to_f32(MiniFloat format, uint8_t code);
// Nearest representable value's code (ties to the even code), saturating at the largest
// normal; NaN maps to the format's NaN where it has one (E4M3: 0x7f), else to +max.
uint8_t f32_to_minifloat(MiniFloat format, float value);
float minifloat_max(MiniFloat format);
int minifloat_emax(MiniFloat format);  // exponent of the largest normal: E2M1 2, E2M3 2, E3M2 4, E4M3 8

// E8M0 shared scales: 2^(code - 127); 255 is NaN.
inline constexpr int kMxBlock = 32;
float e8m0_to_f32(uint8_t code);

// Shared scale exponent of an MX block per the spec: floor(log2(max |x|)) - emax, clamped to
// E8M0's range; a block of zeros gets the smallest scale; a NaN or an infinity gives 255.
uint8_t mx_block_scale(const float* values, size_t count, MiniFloat element);

// MXFP4 over a row of `count` values (count a multiple of 32): `packed` gets count / 2 bytes,
// `scales` count / 32 E8M0 codes.
void quantize_mxfp4(const float* values, size_t count, uint8_t* packed, uint8_t* scales);
void dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, size_t count, float* out);

// MXFP6 (E2M3 or E3M2), one element code per byte.
void quantize_mxfp6(MiniFloat element, const float* values, size_t count, uint8_t* codes, uint8_t* scales);
void dequantize_mxfp6(MiniFloat element, const uint8_t* codes, const uint8_t* scales, size_t count, float* out);

// MXFP6 as glmserve's checkpoints store it: four 6-bit codes in 3 bytes, a little-endian 24-bit
// group with the first value in the low bits (count / 4 * 3 bytes per row), E8M0 scales as above.
void pack_mxfp6(const uint8_t* codes, size_t count, uint8_t* packed);
void unpack_mxfp6(const uint8_t* packed, size_t count, uint8_t* codes);
void dequantize_mxfp6_packed(MiniFloat element, const uint8_t* packed, const uint8_t* scales, size_t count, float* out);

// Block FP8 of a row-major [rows, cols] matrix: `codes` [rows, cols] E4M3 and `scale_inv`
// [ceil(rows/128), ceil(cols/128)] with scale_inv = max |block| / 448 (1 for an all-zero block).
inline constexpr int kFp8Block = 128;
void quantize_fp8_block(const float* matrix, int64_t rows, int64_t cols, uint8_t* codes, float* scale_inv);
// One row of a block-FP8 matrix back to fp32.
void dequantize_fp8_block_row(const uint8_t* codes, const float* scale_inv, int64_t row, int64_t cols, float* out);
// Columns [first_col, first_col + count) of that row: out[count].
void dequantize_fp8_block_columns(const uint8_t* codes, const float* scale_inv, int64_t row, int64_t cols,
                                  int64_t first_col, int64_t count, float* out);

}  // namespace glms::quant
