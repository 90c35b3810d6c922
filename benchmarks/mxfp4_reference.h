// What the MXFP4 widening micro-benchmarks (cuda_fp8_widening.cu, cuda_fp8_wgmma_widening.cu)
// share on the host: their shape options, random MXFP4 expert rows in the checkpoint's layout and
// in the tile layout with bf16 tokens, the relative L2 of a kernel's sums against a double
// product, and their report (a line a case, and the cases as JSON).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "micro_options.h"
#include "quant/formats.h"
#include "quant/mxfp4_tiles.h"

namespace glms::benchmarks {

// The shape a widening benchmark runs: --experts, --rows, --cols, --tokens (a list), --json FILE.
struct Mxfp4Shape {
  int experts = 0;
  int64_t rows = 0, cols = 0;
  std::vector<int> token_counts;
  std::string json_path;
};

// The handlers of Mxfp4Shape's options (a benchmark adds its own to the map).
inline OptionHandlers mxfp4_shape_options(Mxfp4Shape& shape) {
  return {{"--experts", [&](const char* v) { shape.experts = std::atoi(v); }},
          {"--rows", [&](const char* v) { shape.rows = std::atoll(v); }},
          {"--cols", [&](const char* v) { shape.cols = std::atoll(v); }},
          {"--tokens", [&](const char* v) { shape.token_counts = parse_int_list(v); }},
          {"--json", [&](const char* v) { shape.json_path = v; }}};
}

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

// The problem's codes and scales in the tile layout of the expert kernels (quant/mxfp4_tiles.h).
inline std::vector<uint8_t> tiled_codes(const Mxfp4Problem& h) {
  std::vector<uint8_t> tiled(h.packed.size());
  quant::tile_mxfp4_rows(h.packed.data(), int64_t{h.experts} * h.rows, h.cols, tiled.data());
  return tiled;
}
inline std::vector<uint8_t> tiled_scales(const Mxfp4Problem& h) {
  std::vector<uint8_t> tiled(h.scale_bytes.size());
  quant::tile_mxfp4_scales(h.scale_bytes.data(), int64_t{h.experts} * h.rows, h.cols, tiled.data());
  return tiled;
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

// A widening benchmark's report: a line a case on stdout (mode, tokens, time, rate over `bytes`,
// relative L2), and the cases as {"experts", "rows", "cols", <extra fields>, "points": [...]} in
// shape.json_path when one is given.
class WideningReport {
 public:
  // `extra`: more fields of the JSON object, each `"name": value, ` (may be empty).
  WideningReport(const Mxfp4Shape& shape, double bytes, int mode_width, const std::string& extra = "")
      : path_(shape.json_path), bytes_(bytes), width_(mode_width) {
    json_ << "{\"experts\": " << shape.experts << ", \"rows\": " << shape.rows << ", \"cols\": " << shape.cols << ", "
          << extra << "\"points\": [";
    std::printf("%-*s %6s %9s %7s %10s\n", width_, "mode", "tokens", "us", "TB/s", "rel_l2");
  }
  void add(const std::string& mode, int tokens, double us, double relative_l2) {
    const double rate = bytes_ / (us * 1e-6) / 1e12;
    std::printf("%-*s %6d %9.1f %7.2f %10.3e\n", width_, mode.c_str(), tokens, us, rate, relative_l2);
    json_ << (points_++ ? "," : "") << "\n  {\"mode\": \"" << mode << "\", \"tokens\": " << tokens << ", \"us\": " << us
          << ", \"tb_per_s\": " << rate << ", \"relative_l2\": " << relative_l2 << "}";
  }
  void write() {
    json_ << "\n]}\n";
    if (!path_.empty()) std::ofstream(path_) << json_.str();
  }

 private:
  std::string path_;
  double bytes_;
  int width_, points_ = 0;
  std::ostringstream json_;
};

}  // namespace glms::benchmarks
