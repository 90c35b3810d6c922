// CPU matrix products over checkpoint weights. Weights stay in their stored dtype (zero-copy
// from the mmap'd checkpoint); a block of rows is widened to fp32 in a thread-local buffer and
// reused across every token of the batch, so prefill reads each weight once per call while
// decode (n small) streams the weights once, which is what bounds it. Every output element is
// the same fp32 dot product whatever n is, so a token's result never depends on its batch.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "quant/formats.h"

namespace glms::ops {

namespace {

// Every output element is computed the same way, whichever tile it falls in: 16 lane-wise
// partial sums over k in chunks of 16, summed lane 0..15 in order, plus the tail in order.
// That keeps a token's result independent of how many tokens share the call.
typedef float Vec16 __attribute__((vector_size(64)));

inline Vec16 load16(const float* p) {
  Vec16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float finish_sum(Vec16 lanes, float tail) {
  float sum = 0.0f;
  for (int l = 0; l < 16; ++l) sum += lanes[l];
  return sum + tail;
}

// out[t * out_stride + r] = w_r . x_t for R weight rows (stride `cols`) and T tokens.
template <int R, int T>
inline void dot_tile(const float* w, const float* x, int64_t x_stride, int64_t cols, float* out,
                     int64_t out_stride) {
  Vec16 acc[T][R] = {};
  const int64_t chunks = cols / 16 * 16;
  for (int64_t k = 0; k < chunks; k += 16) {
    Vec16 xs[T], ws[R];
    for (int t = 0; t < T; ++t) xs[t] = load16(x + t * x_stride + k);
    for (int r = 0; r < R; ++r) ws[r] = load16(w + r * cols + k);
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) acc[t][r] += ws[r] * xs[t];
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      float tail = 0.0f;
      for (int64_t k = chunks; k < cols; ++k) tail += w[r * cols + k] * x[t * x_stride + k];
      out[t * out_stride + r] = finish_sum(acc[t][r], tail);
    }
}

// y[i, r0 + r] for the `rows` converted rows in `block` and every token.
void block_times_tokens(const float* block, int64_t rows, int64_t cols, const float* x, int64_t n,
                        int64_t x_stride, float* y, int64_t y_stride) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) dot_tile<4, 4>(block + r * cols, x + i * x_stride, x_stride, cols, y + i * y_stride + r, y_stride);
    for (; r < rows; ++r) dot_tile<1, 4>(block + r * cols, x + i * x_stride, x_stride, cols, y + i * y_stride + r, y_stride);
  }
  for (; i < n; ++i) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) dot_tile<4, 1>(block + r * cols, x + i * x_stride, x_stride, cols, y + i * y_stride + r, y_stride);
    for (; r < rows; ++r) dot_tile<1, 1>(block + r * cols, x + i * x_stride, x_stride, cols, y + i * y_stride + r, y_stride);
  }
}

constexpr int64_t kRowBlock = 16;

}  // namespace

WeightView WeightView::slice_rows(int64_t first, int64_t count) const {
  GLMS_CHECK(first >= 0 && first + count <= rows, "slice_rows out of range");
  WeightView view = *this;
  view.rows = count;
  view.first_row = first_row + first;
  if (format == WeightFormat::Plain || format == WeightFormat::Fp8Block) {
    const int64_t element = format == WeightFormat::Plain ? static_cast<int64_t>(dtype_size(dtype)) : 1;
    view.data = static_cast<const std::byte*>(data) + first * row_stride * element;
  }
  return view;  // MX rows are addressed from first_row
}

WeightView WeightView::slice_columns(int64_t first, int64_t count) const {
  GLMS_CHECK(first >= 0 && count >= 0 && first + count <= cols, "slice_columns out of range");
  const int64_t block = format == WeightFormat::Plain      ? 1
                        : format == WeightFormat::Fp8Block ? quant::kFp8Block
                                                           : quant::kMxBlock;
  if (first % block != 0 || (count % block != 0 && first + count != cols))
    fail("a column slice of a quantised matrix must keep whole scale blocks of " + std::to_string(block) +
         " columns (columns " + std::to_string(first) + " to " + std::to_string(first + count) + " asked)");
  WeightView view = *this;
  view.stored_cols = whole_cols();
  view.cols = count;
  view.first_col = first_col + first;
  if (format == WeightFormat::Plain || format == WeightFormat::Fp8Block) {
    const int64_t element = format == WeightFormat::Plain ? static_cast<int64_t>(dtype_size(dtype)) : 1;
    view.data = static_cast<const std::byte*>(data) + first * element;
  }
  return view;  // MX columns are addressed from first_col
}

void WeightView::row_to_f32(int64_t row, float* out) const {
  switch (format) {
    case WeightFormat::Fp8Block: {
      // The dequantiser indexes the whole matrix: rebase the codes to its first row and column.
      const auto* codes = static_cast<const uint8_t*>(data) - first_row * row_stride - first_col;
      quant::dequantize_fp8_block_columns(codes, static_cast<const float*>(scales), first_row + row, row_stride,
                                          first_col, cols, out);
      return;
    }
    case WeightFormat::Mxfp4: {
      const int64_t absolute = first_row + row, stored = whole_cols();
      quant::dequantize_mxfp4(static_cast<const uint8_t*>(data) + absolute * (stored / 2) + first_col / 2,
                              static_cast<const uint8_t*>(scales) + absolute * (stored / quant::kMxBlock) +
                                  first_col / quant::kMxBlock,
                              static_cast<size_t>(cols), out);
      return;
    }
    case WeightFormat::Mxfp6E2M3:
    case WeightFormat::Mxfp6E3M2: {
      const int64_t absolute = first_row + row, stored = whole_cols();
      quant::dequantize_mxfp6_packed(format == WeightFormat::Mxfp6E2M3 ? quant::MiniFloat::E2M3 : quant::MiniFloat::E3M2,
                                     static_cast<const uint8_t*>(data) + absolute * (stored / 4 * 3) + first_col / 4 * 3,
                                     static_cast<const uint8_t*>(scales) + absolute * (stored / quant::kMxBlock) +
                                         first_col / quant::kMxBlock,
                                     static_cast<size_t>(cols), out);
      return;
    }
    case WeightFormat::Plain: break;
  }
  const auto* base = static_cast<const std::byte*>(data) + row * row_stride * static_cast<int64_t>(dtype_size(dtype));
  if (dtype == DType::BF16) {
    const auto* in = reinterpret_cast<const uint16_t*>(base);
#pragma omp simd
    for (int64_t k = 0; k < cols; ++k) out[k] = std::bit_cast<float>(static_cast<uint32_t>(in[k]) << 16);
    return;
  }
  convert_to_f32(dtype, base, out, static_cast<size_t>(cols));
}

int num_threads() { return omp_get_max_threads(); }

void linear(const float* x, int64_t n, const WeightView& w, float* y, int64_t x_stride, int64_t y_stride) {
  if (n <= 0 || w.rows == 0) return;
  if (x_stride == 0) x_stride = w.cols;
  if (y_stride == 0) y_stride = w.rows;
  const int64_t num_blocks = (w.rows + kRowBlock - 1) / kRowBlock;

#pragma omp parallel if (w.rows * w.cols * n > 65536)
  {
    std::vector<float> block(static_cast<size_t>(kRowBlock * w.cols));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t r0 = b * kRowBlock, r1 = std::min(w.rows, r0 + kRowBlock);
      for (int64_t r = r0; r < r1; ++r) w.row_to_f32(r, block.data() + (r - r0) * w.cols);
      block_times_tokens(block.data(), r1 - r0, w.cols, x, n, x_stride, y + r0, y_stride);
    }
  }
}

void linear_transposed(const float* x, int64_t n, const WeightView& w, float* y, int64_t x_stride,
                       int64_t y_stride) {
  if (x_stride == 0) x_stride = w.rows;
  if (y_stride == 0) y_stride = w.cols;
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t i = 0; i < n; ++i) std::fill(y + i * y_stride, y + i * y_stride + w.cols, 0.0f);
  for (int64_t r = 0; r < w.rows; ++r) {
    w.row_to_f32(r, row.data());
    for (int64_t i = 0; i < n; ++i) {
      const float scale = x[i * x_stride + r];
      float* yi = y + i * y_stride;
#pragma omp simd
      for (int64_t c = 0; c < w.cols; ++c) yi[c] += scale * row[c];
    }
  }
}

}  // namespace glms::ops
