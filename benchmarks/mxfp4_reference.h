// What the MXFP4 widening micro-benchmarks (cuda_fp8_widening.cu, cuda_fp8_wgmma_widening.cu)
// share on the host: random MXFP4 expert rows in the checkpoint's layout with bf16 tokens, and
// the relative L2 of a kernel's sums against a double product.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quant/formats.h"

namespace glms::benchmarks {

// [experts * rows, cols] MXFP4 codes in the checkpoint's layout (two codes a byte, the even
// value in the low nibble; E8M0 scales [experts * rows, cols / 32]) and [experts, tokens, cols]
// bf16 tokens.
struct Mxfp4Problem {
  int experts = 0;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> packed, scale_bytes;
  std::vector<uint16_t> x;
};

inline float bf16_value(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float v;
  std::memcpy(&v, &word, sizeof v);
  return v;
}

// Random codes and scales 2^-9 .. 2^-5 (E8M0 118 .. 122).
inline Mxfp4Problem random_mxfp4_rows(int experts, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  Mxfp4Problem h;
  h.experts = experts, h.rows = rows, h.cols = cols;
  h.packed.resize(int64_t{experts} * rows * cols / 2);
  h.scale_bytes.resize(int64_t{experts} * rows * cols / 32);
  for (auto& b : h.packed) b = static_cast<uint8_t>(rng());
  for (auto& s : h.scale_bytes) s = static_cast<uint8_t>(118 + rng() % 5);
  return h;
}

// Standard normal token values as bf16 (truncated), `tokens` a row an expert.
inline void random_tokens(Mxfp4Problem& h, int tokens, std::mt19937_64& rng) {
  h.x.resize(int64_t{h.experts} * tokens * h.cols);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : h.x) {
    const float f = normal(rng);
    uint32_t word;
    std::memcpy(&word, &f, 4);
    v = static_cast<uint16_t>(word >> 16);
  }
}

// The relative L2 of `out` ([experts, tokens, rows]) against a double product over `check_rows`
// rows of each expert, one in each of `check_rows` equal spans at an offset that differs from span
// to span (169 r mod the span), so that the rows fall to different lanes, fragments and tiles.
inline double relative_error(const Mxfp4Problem& h, const std::vector<float>& out, int tokens, int64_t check_rows) {
  double err = 0, ref = 0;
  for (int e = 0; e < h.experts; ++e)
    for (int64_t r = 0; r < check_rows; ++r) {
      const int64_t span = h.rows / check_rows, local = r * span + (169 * r) % span;
      const int64_t row = int64_t{e} * h.rows + local;
      for (int j = 0; j < tokens; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < h.cols; ++k) {
          const uint8_t byte = h.packed[row * h.cols / 2 + k / 2];
          const double w = quant::minifloat_to_f32(quant::MiniFloat::E2M1, k % 2 ? byte >> 4 : byte & 15) *
                           std::ldexp(1.0, h.scale_bytes[row * h.cols / 32 + k / 32] - 127);
          sum += w * bf16_value(h.x[(int64_t{e} * tokens + j) * h.cols + k]);
        }
        const double got = out[(int64_t{e} * tokens + j) * h.rows + local];
        err += (got - sum) * (got - sum);
        ref += sum * sum;
      }
    }
  return std::sqrt(err / ref);
}

}  // namespace glms::benchmarks
