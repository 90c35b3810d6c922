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

namespace glms::ops {

namespace {

inline float dot_f32(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t k = 0; k < n; ++k) sum += a[k] * b[k];
  return sum;
}

constexpr int64_t kRowBlock = 16;

}  // namespace

WeightView WeightView::slice_rows(int64_t first, int64_t count) const {
  GLMS_CHECK(first >= 0 && first + count <= rows, "slice_rows out of range");
  WeightView view = *this;
  view.data = static_cast<const std::byte*>(data) + first * row_stride * static_cast<int64_t>(dtype_size(dtype));
  view.rows = count;
  return view;
}

void WeightView::row_to_f32(int64_t row, float* out) const {
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
      for (int64_t i = 0; i < n; ++i) {
        const float* xi = x + i * x_stride;
        float* yi = y + i * y_stride;
        for (int64_t r = r0; r < r1; ++r) yi[r] = dot_f32(block.data() + (r - r0) * w.cols, xi, w.cols);
      }
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
