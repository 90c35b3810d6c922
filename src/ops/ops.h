// The op API the model is written over. Activations are fp32 row-major buffers with explicit
// sizes; weights are `WeightView`s over checkpoint storage in their stored dtype (bf16, f32,
// f16, fp8 e4m3), converted in registers. The CPU implementation lives in ops/cpu; a device
// backend implements the same functions over device buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"

namespace glms::ops {

// How a weight matrix is stored: plainly in `dtype`, or quantised with scales beside it.
enum class WeightFormat : uint8_t {
  Plain,     // [rows, cols] of dtype
  Fp8Block,  // [rows, cols] F8_E4M3 codes; scales: F32 [ceil(rows/128), ceil(cols/128)] (weight_scale_inv)
  Mxfp4,     // [rows, cols/2] U8, two E2M1 per byte (even index low); scales: U8 E8M0 [rows, cols/32]
  Mxfp6E2M3, // [rows, cols*3/4] U8, four 6-bit codes per 3 bytes (quant/formats.h); scales as Mxfp4
  Mxfp6E3M2,
};

// A row-major matrix [rows, cols] in checkpoint storage, possibly a block of rows and columns of
// a larger stored matrix (a tensor-parallel shard). Plain and Fp8Block: `data` points at the
// view's first element and `row_stride` elements separate its rows (the stored width); MX
// formats address rows from `first_row` and columns from `first_col` of the stored matrix,
// `stored_cols` wide, whose start `data` points at.
struct WeightView {
  DType dtype = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
  WeightFormat format = WeightFormat::Plain;
  const void* scales = nullptr;  // quantised formats: the scale tensor of the whole matrix
  int64_t first_row = 0;         // row of the whole matrix this view starts at (scale lookup)
  int64_t first_col = 0;         // column of the whole matrix this view starts at
  int64_t stored_cols = 0;       // columns of the whole stored matrix (0: cols)

  bool empty() const { return data == nullptr; }
  int64_t whole_cols() const { return stored_cols > 0 ? stored_cols : cols; }
  // Rows [first, first + count) as a view.
  WeightView slice_rows(int64_t first, int64_t count) const;
  // Columns [first, first + count) as a view. Quantised formats keep whole scale blocks: MX
  // slices start and end on 32-column blocks, block FP8 ones on 128-column blocks.
  WeightView slice_columns(int64_t first, int64_t count) const;
  // Row `row` converted to fp32 into `out` (cols values).
  void row_to_f32(int64_t row, float* out) const;
};

// y[n, w.rows] = x[n, w.cols] · w^T. `x_stride`/`y_stride` are the row strides in floats
// (0 means dense). Threads over output columns and tokens.
void linear(const float* x, int64_t n, const WeightView& w, float* y, int64_t x_stride = 0,
            int64_t y_stride = 0);

// y[n, w.cols] = x[n, w.rows] · w (the weight used transposed, e.g. absorbing kv_b's k part
// into the query). Single-threaded per call: callers parallelise over heads/tokens.
void linear_transposed(const float* x, int64_t n, const WeightView& w, float* y, int64_t x_stride = 0,
                       int64_t y_stride = 0);

// RMSNorm over rows: y = x * rsqrt(mean(x^2) + eps) * weight. In-place allowed.
void rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y,
              int64_t x_stride = 0, int64_t y_stride = 0);
// LayerNorm over rows with weight and bias. In-place allowed.
void layer_norm(const float* x, int64_t n, int64_t dim, const float* weight, const float* bias,
                float eps, float* y);

// Rotary tables for interleaved-pair RoPE: cos/sin [num_positions, rope_dim / 2], computed in
// fp32 as transformers does (inv_freq = 1 / theta^(2i/d), angle = inv_freq * position).
struct RopeTable {
  int rope_dim = 0;
  std::vector<float> inv_freq;  // [rope_dim / 2]
  void angles(int32_t position, float* cos_out, float* sin_out) const;
};
// Rotates interleaved pairs (x[2i], x[2i+1]) of `x` [rope_dim] by the position's angles.
void rope_interleaved(float* x, int rope_dim, const float* cos, const float* sin);

// out[i] = silu(gate[i]) * up[i] for `count` values.
void silu_mul(const float* gate, const float* up, float* out, int64_t count);

// Top-k of `scores` [count] by value (descending; ties broken by lower index first).
// Writes min(k, count) indices.
void top_k(const float* scores, int64_t count, int64_t k, std::vector<int32_t>& indices);

// Index of the largest of `count` values (lowest index on ties): greedy decoding's token.
int32_t argmax(const float* values, int64_t count);

// Next-token sampling over fp32 logits (vLLM's order): temperature, then top_k (the k largest
// logits, lower ids first among equal ones), top_p (the fewest most likely tokens, in logit then
// id order, whose probability reaches top_p), min_p (tokens under min_p x the most likely one's
// probability dropped).
struct SamplingFilter {
  float temperature = 1.0f;  // > 0 (greedy is argmax)
  int top_k = 0;             // 0 or negative: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
};
// The draw `canonical` (uniform in [0, 1)) picks the first kept token, in id order, whose
// cumulative weight reaches canonical x the kept tokens' total weight. ops::cuda::sample_rows
// follows the same rule, so one canonical draws the same token on both (but for rounding at a
// boundary).
int32_t sample_row(const float* logits, int vocab_size, const SamplingFilter& filter, double canonical);
// The filtered distribution, dense: probs[vocab_size] (zero where filtered out).
void sampling_probabilities(const float* logits, int vocab_size, const SamplingFilter& filter, float* probs);

// Number of OpenMP threads the CPU ops use.
int num_threads();

}  // namespace glms::ops
