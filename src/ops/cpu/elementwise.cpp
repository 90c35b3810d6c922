// Norms, rotary embedding, activation and top-k on fp32 rows.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/ops.h"

namespace glms::ops {

void rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y,
              int64_t x_stride, int64_t y_stride) {
  if (x_stride == 0) x_stride = dim;
  if (y_stride == 0) y_stride = dim;
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * x_stride;
    float* yi = y + i * y_stride;
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t k = 0; k < dim; ++k) sum_sq += xi[k] * xi[k];
    const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
#pragma omp simd
    for (int64_t k = 0; k < dim; ++k) yi[k] = weight[k] * (xi[k] * inv);
  }
}

void layer_norm(const float* x, int64_t n, int64_t dim, const float* weight, const float* bias, float eps,
                float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * dim;
    float* yi = y + i * dim;
    float mean = 0.0f;
    for (int64_t k = 0; k < dim; ++k) mean += xi[k];
    mean /= static_cast<float>(dim);
    float var = 0.0f;
    for (int64_t k = 0; k < dim; ++k) var += (xi[k] - mean) * (xi[k] - mean);
    var /= static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t k = 0; k < dim; ++k) yi[k] = (xi[k] - mean) * inv * weight[k] + bias[k];
  }
}

void RopeTable::angles(int32_t position, float* cos_out, float* sin_out) const {
  const float pos = static_cast<float>(position);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float angle = inv_freq[i] * pos;
    cos_out[i] = std::cos(angle);
    sin_out[i] = std::sin(angle);
  }
}

void rope_interleaved(float* x, int rope_dim, const float* cos, const float* sin) {
  for (int i = 0; i < rope_dim / 2; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * cos[i] - b * sin[i];
    x[2 * i + 1] = b * cos[i] + a * sin[i];
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void top_k(const float* scores, int64_t count, int64_t k, std::vector<int32_t>& indices) {
  k = std::min(k, count);
  indices.resize(static_cast<size_t>(count));
  std::iota(indices.begin(), indices.end(), 0);
  auto better = [scores](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  if (k < count) std::nth_element(indices.begin(), indices.begin() + k, indices.end(), better);
  indices.resize(static_cast<size_t>(k));
  std::sort(indices.begin(), indices.end(), better);
}

int32_t argmax(const float* values, int64_t count) {
  int64_t best = 0;
  for (int64_t i = 1; i < count; ++i)
    if (values[i] > values[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace glms::ops
