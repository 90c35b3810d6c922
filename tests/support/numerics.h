// Comparison helpers shared by the numeric tests: relative L2 error and seeded random data.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace glms::testing {

// ||a - b|| / ||b|| over n values, in double; infinite when `a` holds a NaN or an infinity,
// so that unwritten (NaN-poisoned) outputs always fail.
inline double relative_l2(const float* a, const float* b, size_t n) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

inline double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() != b.size() ? INFINITY : relative_l2(a.data(), b.data(), a.size());
}

// The reference of an fp32 product: y [n, rows] = x [n, cols] (rows ld_x apart, 0: cols) .
// w [rows, cols]^T, each sum in double, rounded to float once.
inline std::vector<float> double_product(const std::vector<float>& x, const std::vector<float>& w, int n, int rows,
                                         int cols, int64_t ld_x = 0) {
  if (ld_x == 0) ld_x = cols;
  std::vector<float> y(static_cast<size_t>(n) * rows);
  for (int t = 0; t < n; ++t)
    for (int r = 0; r < rows; ++r) {
      double sum = 0;
      for (int k = 0; k < cols; ++k) sum += double(x[t * ld_x + k]) * w[int64_t{r} * cols + k];
      y[static_cast<size_t>(t) * rows + r] = static_cast<float>(sum);
    }
  return y;
}

// `count` normal values with standard deviation `scale`, from `seed`.
inline std::vector<float> random_values(size_t count, uint64_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

// `count` token ids uniform in [0, vocab), from `seed`.
inline std::vector<int32_t> random_tokens(int count, int vocab, uint64_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> tokens(count);
  for (auto& t : tokens) t = dist(rng);
  return tokens;
}

}  // namespace glms::testing
