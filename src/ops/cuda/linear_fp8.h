// Block-scaled FP8 GEMMs through cuBLASLt, as the DeepSeek-V3 / GLM-5-FP8 checkpoints lay out
// their linear layers: weights [rows, cols] E4M3 with one fp32 scale per 128 x 128 block
// (`weight_scale_inv`), activations quantised at run time to E4M3 with one fp32 scale per token
// and 128 columns (W8A8, the recipe those checkpoints were trained and served with). Hopper
// tensor cores multiply the codes; cuBLASLt applies both scales and accumulates in fp32.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace glms::ops::cuda {

inline constexpr int64_t kFp8ScaleBlock = 128;

// cuBLASLt's block-scaled FP8 GEMM takes token counts that are multiples of 4 only (on the H200,
// cuBLASLt 13.1 has no algorithm for 1, 2, 3, 5 or 17 tokens), so activations and outputs are
// padded to fp8_padded_tokens(n) rows.
inline constexpr int64_t fp8_padded_tokens(int64_t n) { return (n + 3) / 4 * 4; }

// Activations to E4M3 for Fp8Gemm::linear: x [n, cols] fp32 to codes [np, cols] with np =
// fp8_padded_tokens(n) and, per token t and 128-column block b, scale = max |x| / 448 (1 for a
// block of zeros) with codes = E4M3(x / scale) rounded to nearest even, saturating; the pad
// tokens are zeros. The scales are stored block-major, scales[b * np + t] (the layout
// cuBLASLt's VEC128_32F scales take for the activation operand). cols a multiple of 128.
void quantize_fp8_rows(const float* x, int64_t n, int64_t cols, uint8_t* codes, float* scales, cudaStream_t stream);
// The same from bf16 rows (the model's GEMM inputs).
void quantize_fp8_rows(const uint16_t* x, int64_t n, int64_t cols, uint8_t* codes, float* scales,
                       cudaStream_t stream);

// Scales per row of 128 x 128 blocks in fp8_weight_scales_for_cublaslt's layout: the column
// blocks padded to a multiple of 4.
inline constexpr int64_t fp8_scale_row_stride(int64_t cols) { return ((cols + kFp8ScaleBlock - 1) / kFp8ScaleBlock + 3) / 4 * 4; }

// Decode-sized products with FP8 weights and bf16 activations (W8A16, no activation rounding):
// y[n, rows] (fp32, row stride ld_y) = x[n, cols] (bf16, dense rows) . dequant(w)^T, w [rows,
// cols] E4M3 row-major with 128 x 128 block scales in fp8_weight_scales_for_cublaslt's layout.
// n <= kFp8GemvMaxTokens, cols a multiple of 16. A pass over the weights' bytes, half of bf16's.
// At GLM-5.2 width (5 layers) on the H200 it took decode batch 1 from 2.27 to 2.12 ms against
// bf16 weights; taking batch 8 too it was slower than the quantise + cuBLASLt pair (7.49 against
// 6.63 ms: the per-token FMAs, not the bytes, bound it there), so 4
// (bench/results/cuda-fp8-linear-20261202.json).
inline constexpr int kFp8GemvMaxTokens = 4;
void gemv_fp8(const uint16_t* x, int64_t n, const uint8_t* w_codes, const float* w_scales, int64_t rows, int64_t cols,
              float* y, int64_t ld_y, cudaStream_t stream);

// A checkpoint's weight_scale_inv ([ceil(rows / 128), ceil(cols / 128)] row-major, as
// quant::quantize_fp8_block makes it) in the layout cuBLASLt's BLK128x128_32F scales take:
// each row of blocks padded to a multiple of 4 blocks (zeros). Host to host.
std::vector<float> fp8_weight_scales_for_cublaslt(const float* scale_inv, int64_t rows, int64_t cols);

class Fp8Gemm {
 public:
  Fp8Gemm();
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // y[n, rows] (fp32) = dequant(x)[n, cols] . dequant(w)[rows, cols]^T: x_codes and x_scales from
  // quantize_fp8_rows, w_codes [rows, cols] E4M3 row-major, w_scales from
  // fp8_weight_scales_for_cublaslt (all on the device). y holds fp8_padded_tokens(n) rows (the
  // pad tokens' are zeros). cols a multiple of 128, rows of 16.
  // With `accumulate`, y += the product instead (the pad tokens' rows add zeros).
  // Throws glms::Error where cuBLASLt has no algorithm for it (GPUs before Hopper, or a
  // cuBLASLt without block scaling).
  void linear(const uint8_t* x_codes, const float* x_scales, int64_t n, const uint8_t* w_codes,
              const float* w_scales, int64_t rows, int64_t cols, float* y, cudaStream_t stream,
              bool accumulate = false);
  // The same product with y[n, rows] in bf16, each fp32 sum rounded once (y holds
  // fp8_padded_tokens(n) rows). Only where has_bf16_output(n, rows, cols).
  void linear_to_bf16(const uint8_t* x_codes, const float* x_scales, int64_t n, const uint8_t* w_codes,
                      const float* w_scales, int64_t rows, int64_t cols, uint16_t* y, cudaStream_t stream);
  // Whether cuBLASLt has a block-scaled FP8 algorithm with bf16 outputs for this shape (asked once
  // a shape; false rather than an error where it has none).
  bool has_bf16_output(int64_t n, int64_t rows, int64_t cols);

 private:
  struct Plan;  // descriptors and the chosen algorithm of one (n, rows, cols, output type)
  Plan& plan(int64_t n, int64_t rows, int64_t cols, bool bf16_output);
  void run(Plan& p, const uint8_t* x_codes, const float* x_scales, const uint8_t* w_codes, const float* w_scales,
           void* y, float beta, cudaStream_t stream);

  void* handle_ = nullptr;     // cublasLtHandle_t
  void* workspace_ = nullptr;  // of our own, so that the GEMMs can be graph-captured
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, Plan*> plans_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, bool> bf16_output_;  // has_bf16_output's answers
};

}  // namespace glms::ops::cuda
