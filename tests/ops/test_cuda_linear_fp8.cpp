// Block-scaled FP8 GEMMs (ops/cuda/linear_fp8.h) against host references on random data: the
// activation quantiser against quant's E4M3 rounding, code for code; the cuBLASLt product
// against a double-precision product of the same dequantised operands, at GLM-5 shapes and odd
// token counts; the activation quantisation's own error; and the un-absorption that writes an FP8
// o_proj's E4M3 rows (ops/cuda/mla.h). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/linear_fp8.h"
#include "ops/cuda/mla.h"
#include "quant/formats.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::poisoned;
using glms::testing::random_values;
using glms::testing::relative_l2;
using glms::testing::to_device;
using glms::testing::to_host;
namespace cuda = glms::ops::cuda;

namespace {

class CudaLinearFp8 : public glms::testing::CudaTest {};

// Random activations whose 128-column blocks differ in magnitude (1e-3 to 1e2), with one block
// of zeros, so that each block's scale matters.
std::vector<float> activations(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b = 0; b < cols / cuda::kFp8ScaleBlock; ++b) {
      const float magnitude = (t == 0 && b == 1) ? 0.0f : std::pow(10.0f, exponent(rng));
      for (int64_t k = 0; k < cuda::kFp8ScaleBlock; ++k) x[t * cols + b * cuda::kFp8ScaleBlock + k] = magnitude * normal(rng);
    }
  return x;
}

struct QuantisedActivations {
  std::vector<uint8_t> codes;  // [np, cols], np = fp8_padded_tokens(n)
  std::vector<float> scales;   // [cols / 128, np]
};

QuantisedActivations quantise_on_device(const std::vector<float>& x, int64_t n, int64_t cols,
                                        cuda::DeviceBuffer& d_codes, cuda::DeviceBuffer& d_scales) {
  auto d_x = to_device(x);
  const int64_t np = cuda::fp8_padded_tokens(n);
  d_codes = poisoned(static_cast<size_t>(np * cols) / sizeof(float));
  d_scales = poisoned(static_cast<size_t>(np * cols / cuda::kFp8ScaleBlock));
  cuda::quantize_fp8_rows(d_x.as<float>(), n, cols, d_codes.as<uint8_t>(), d_scales.as<float>(), nullptr);
  return {to_host<uint8_t>(d_codes), to_host<float>(d_scales)};
}

// A [rows, cols] weight in block FP8 as a checkpoint stores it, and its values back in fp32.
struct Fp8Weight {
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv;  // [ceil(rows / 128), ceil(cols / 128)]
  std::vector<float> values;     // dequantised [rows, cols]
};
Fp8Weight fp8_weight(const std::vector<float>& w, int64_t rows, int64_t cols) {
  Fp8Weight q;
  q.codes.resize(w.size());
  q.scale_inv.resize(static_cast<size_t>(((rows + 127) / 128) * ((cols + 127) / 128)));
  quant::quantize_fp8_block(w.data(), rows, cols, q.codes.data(), q.scale_inv.data());
  q.values.resize(w.size());
  for (int64_t r = 0; r < rows; ++r)
    quant::dequantize_fp8_block_row(q.codes.data(), q.scale_inv.data(), r, cols, q.values.data() + r * cols);
  return q;
}

TEST_F(CudaLinearFp8, QuantizeRowsRoundsLikeTheHost) {
  const int64_t n = 5, cols = 384;
  const auto x = activations(n, cols, 7);
  cuda::DeviceBuffer d_codes, d_scales;
  const auto q = quantise_on_device(x, n, cols, d_codes, d_scales);
  const int64_t np = cuda::fp8_padded_tokens(n);
  ASSERT_EQ(np, 8);
  for (int64_t t = 0; t < np; ++t)  // the pad tokens are zeros: codes 0, scale 1
    for (int64_t b = 0; b < cols / cuda::kFp8ScaleBlock; ++b) {
      float amax = 0.0f;
      for (int64_t k = 0; k < cuda::kFp8ScaleBlock && t < n; ++k) amax = std::max(amax, std::fabs(x[t * cols + b * 128 + k]));
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      ASSERT_EQ(q.scales[b * np + t], scale) << "token " << t << " block " << b;
      for (int64_t k = 0; k < cuda::kFp8ScaleBlock; ++k) {
        const int64_t i = t * cols + b * 128 + k;
        const uint8_t expected = t < n ? quant::f32_to_minifloat(quant::MiniFloat::E4M3, x[i] / scale) : 0;
        ASSERT_EQ(q.codes[i], expected) << "value " << i;
      }
    }
}

TEST_F(CudaLinearFp8, BlockScaledGemmMatchesTheDequantisedProduct) {
  cuda::Fp8Gemm gemm;
  // (tokens, rows, cols): GLM-5's q_a (6144 -> 1536) and o_proj-like widths, odd token counts, a
  // row count off the 128-row blocks.
  for (auto [n, rows, cols] : {std::tuple<int64_t, int64_t, int64_t>{1, 1536, 6144}, {3, 272, 384}, {64, 512, 1024},
                               {130, 128, 256}}) {
    std::mt19937 rng(static_cast<uint32_t>(n * 31 + rows));
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (float& v : w) v = normal(rng);
    const Fp8Weight fp8 = fp8_weight(w, rows, cols);
    const std::vector<uint8_t>& w_codes = fp8.codes;
    const std::vector<float>& scale_inv = fp8.scale_inv;
    const std::vector<float>& w_back = fp8.values;

    const auto x = activations(n, cols, static_cast<uint32_t>(rows));
    cuda::DeviceBuffer d_x_codes, d_x_scales;
    const auto q = quantise_on_device(x, n, cols, d_x_codes, d_x_scales);
    auto d_w = to_device(w_codes), d_w_scales = to_device(cuda::fp8_weight_scales_for_cublaslt(scale_inv.data(), rows, cols));
    const int64_t np = cuda::fp8_padded_tokens(n);
    auto d_y = poisoned(static_cast<size_t>(np * rows));
    gemm.linear(d_x_codes.as<uint8_t>(), d_x_scales.as<float>(), n, d_w.as<uint8_t>(), d_w_scales.as<float>(), rows,
                cols, d_y.as<float>(), nullptr);
    auto y = to_host<float>(d_y);
    for (int64_t i = n * rows; i < np * rows; ++i) ASSERT_EQ(y[i], 0.0f) << "pad token output " << i;
    y.resize(static_cast<size_t>(n * rows));

    // The same product over the dequantised operands in double, and over the unquantised
    // activations (what the host path computes with the checkpoint's FP8 weights).
    std::vector<float> exact(y.size()), unquantised_x(y.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double sum = 0.0, plain = 0.0;
        for (int64_t k = 0; k < cols; ++k) {
          const double scale = q.scales[(k / 128) * np + t];
          const double xq = quant::minifloat_to_f32(quant::MiniFloat::E4M3, q.codes[t * cols + k]) * scale;
          sum += xq * w_back[r * cols + k];
          plain += static_cast<double>(x[t * cols + k]) * w_back[r * cols + k];
        }
        exact[t * rows + r] = static_cast<float>(sum);
        unquantised_x[t * rows + r] = static_cast<float>(plain);
      }
    // Hopper's FP8 tensor cores keep about 14 bits of the running sum (DeepSeek-V3's report);
    // measured 1.2e-4 on the H200 at these shapes. A wrong scale layout is off by O(1).
    EXPECT_LT(relative_l2(y, exact), 5e-4) << n << " x " << rows << " x " << cols;
    // E4M3 keeps 3 mantissa bits: a value rounds by up to 1/16 of itself, about 3.6% RMS.
    EXPECT_LT(relative_l2(y, unquantised_x), 0.05) << n << " x " << rows << " x " << cols;

    // Added into rows already there (a block output into the residual stream): base + y, with the
    // pad tokens' rows left as they were.
    std::vector<float> base(static_cast<size_t>(np * rows));
    for (float& v : base) v = normal(rng) * 10.0f;
    auto d_sum = to_device(base);
    gemm.linear(d_x_codes.as<uint8_t>(), d_x_scales.as<float>(), n, d_w.as<uint8_t>(), d_w_scales.as<float>(), rows,
                cols, d_sum.as<float>(), nullptr, /*accumulate=*/true);
    auto sum = to_host<float>(d_sum);
    for (int64_t i = n * rows; i < np * rows; ++i) ASSERT_EQ(sum[i], base[i]) << "pad token row " << i;
    std::vector<float> expected_sum(y.size());
    for (size_t i = 0; i < y.size(); ++i) expected_sum[i] = base[i] + exact[i];
    sum.resize(y.size());
    EXPECT_LT(relative_l2(sum, expected_sum), 5e-4) << n << " x " << rows << " x " << cols << ", accumulated";

    // bf16 outputs (q and the MLPs' gate/up of a long FP8 prefill): the fp32 product rounded once,
    // so within bf16's half ulp (2^-9 relative) of it value by value, beside the sums' own error.
    if (gemm.has_bf16_output(n, rows, cols)) {
      auto d_bf16 = glms::testing::poisoned_bf16(static_cast<size_t>(np * rows));
      gemm.linear_to_bf16(d_x_codes.as<uint8_t>(), d_x_scales.as<float>(), n, d_w.as<uint8_t>(), d_w_scales.as<float>(),
                          rows, cols, d_bf16.as<uint16_t>(), nullptr);
      const auto y_bf16 = glms::testing::bf16_to_host(d_bf16, static_cast<size_t>(n * rows));
      EXPECT_LT(relative_l2(y_bf16, exact), 5e-4 + 4e-3) << n << " x " << rows << " x " << cols << ", bf16 outputs";
      int far = 0;
      for (size_t i = 0; i < y.size(); ++i)
        if (std::fabs(y_bf16[i] - y[i]) > std::ldexp(std::fabs(y[i]), -8) + 1e-30f) ++far;
      EXPECT_LE(far, static_cast<int>(y.size() / 100)) << "bf16 outputs more than an ulp from the fp32 ones";
    } else {
      std::printf("%ld x %ld x %ld: no block-scaled FP8 algorithm with bf16 outputs\n", static_cast<long>(n),
                  static_cast<long>(rows), static_cast<long>(cols));
    }
  }
}

TEST_F(CudaLinearFp8, QuantizingBf16RowsEqualsQuantizingTheirFp32Values) {
  const int64_t n = 7, cols = 256;
  auto x = activations(n, cols, 11);
  std::vector<uint16_t> x_bf16(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x_bf16[i] = f32_to_bf16(x[i]);
    x[i] = bf16_to_f32(x_bf16[i]);
  }
  cuda::DeviceBuffer d_codes, d_scales;
  const auto from_f32 = quantise_on_device(x, n, cols, d_codes, d_scales);
  auto d_x = to_device(x_bf16);
  const int64_t np = cuda::fp8_padded_tokens(n);
  auto codes = poisoned(static_cast<size_t>(np * cols) / sizeof(float));
  auto scales = poisoned(static_cast<size_t>(np * cols / cuda::kFp8ScaleBlock));
  cuda::quantize_fp8_rows(d_x.as<uint16_t>(), n, cols, codes.as<uint8_t>(), scales.as<float>(), nullptr);
  EXPECT_EQ(to_host<uint8_t>(codes), from_f32.codes);
  EXPECT_EQ(to_host<float>(scales), from_f32.scales);
}

TEST_F(CudaLinearFp8, Fp8GemvMatchesTheDequantisedProductWithBf16Inputs) {
  // (rows, cols): q_a-like, a row count off the 4-row blocks and the 128-row scale blocks, and a
  // width off the 128-column blocks (its last block partial).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{2048, 6144}, {301, 384}, {130, 208}}) {
    std::mt19937 rng(static_cast<uint32_t>(rows + cols));
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < w.size(); ++i) w[i] = normal(rng) * (i % 997 == 0 ? 40.0f : 1.0f);  // some outliers
    const Fp8Weight fp8 = fp8_weight(w, rows, cols);
    const std::vector<float>& w_back = fp8.values;
    auto d_w = to_device(fp8.codes),
         d_scales = to_device(cuda::fp8_weight_scales_for_cublaslt(fp8.scale_inv.data(), rows, cols));
    for (int64_t n = 1; n <= cuda::kFp8GemvMaxTokens; ++n) {
      std::vector<uint16_t> x(static_cast<size_t>(n * cols));
      for (uint16_t& v : x) v = f32_to_bf16(normal(rng) * 20.0f);
      auto d_x = to_device(x);
      const int64_t ld_y = rows + 3;  // a strided output
      auto d_y = poisoned(static_cast<size_t>(n * ld_y));
      cuda::gemv_fp8(d_x.as<uint16_t>(), n, d_w.as<uint8_t>(), d_scales.as<float>(), rows, cols, d_y.as<float>(), ld_y,
                     nullptr);
      const auto y_all = to_host<float>(d_y);
      std::vector<float> y, exact;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double sum = 0.0;
          for (int64_t k = 0; k < cols; ++k) sum += double(bf16_to_f32(x[t * cols + k])) * w_back[r * cols + k];
          exact.push_back(static_cast<float>(sum));
          y.push_back(y_all[t * ld_y + r]);
        }
      // fp32 sums of exact products: only the summation order differs.
      EXPECT_LT(relative_l2(y, exact), 1e-5) << n << " x " << rows << " x " << cols;
    }
  }
}

}  // namespace

// mla_unabsorb_fp8 against the heads' bf16 rows of a double product, quantised by
// quantize_fp8_rows: the scales equal to bf16 rounding and the codes the same but where the fp32
// sums round to another bf16 than the double ones (a code one E4M3 step off at most); the pad
// rows zeros with scale 1. Row counts of one, part-filled tiles and several tiles, one head to
// GLM-5's 64 (259 tokens of 64 heads: 192 tiles, more than an H100's or H200's SMs, so that
// blocks take several, the ring running on from one to the next); the value rows as kv_b_proj
// holds them (nope rows before each head's values).
TEST_F(CudaLinearFp8, MlaUnabsorbWritesTheHeadsAsE4m3Rows) {
  constexpr int kLatent = 512, kValue = 256, kNope = 192, kHeadRows = kNope + kValue;
  ASSERT_TRUE(cuda::mla_unabsorb_fp8_supported(kLatent, kValue));
  EXPECT_FALSE(cuda::mla_unabsorb_fp8_supported(256, kValue));
  for (auto [T, H] : {std::pair{1, 64}, std::pair{5, 3}, std::pair{130, 2}, std::pair{259, 64}, std::pair{1000, 16}}) {
    const int64_t np = cuda::fp8_padded_tokens(T), cols = int64_t{H} * kValue;
    std::vector<uint16_t> o(int64_t{T} * H * kLatent), kv_b(int64_t{H} * kHeadRows * kLatent);
    const auto o_values = random_values(static_cast<int64_t>(o.size()), 70 + T, 1.0f);
    const auto w_values = random_values(static_cast<int64_t>(kv_b.size()), 71 + H, 0.05f);
    for (size_t i = 0; i < o.size(); ++i) o[i] = f32_to_bf16(o_values[i] * (i % 97 == 0 ? 30.0f : 1.0f));
    for (size_t i = 0; i < kv_b.size(); ++i) kv_b[i] = f32_to_bf16(w_values[i]);
    std::vector<uint16_t> heads(int64_t{T} * cols);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int v = 0; v < kValue; ++v) {
          const uint16_t* x = o.data() + (int64_t{t} * H + h) * kLatent;
          const uint16_t* w = kv_b.data() + (int64_t{h} * kHeadRows + kNope + v) * kLatent;
          double sum = 0.0;
          for (int k = 0; k < kLatent; ++k) sum += double(bf16_to_f32(x[k])) * bf16_to_f32(w[k]);
          heads[int64_t{t} * cols + int64_t{h} * kValue + v] = f32_to_bf16(static_cast<float>(sum));
        }
    auto d_heads = to_device(heads);
    auto expected_codes = to_device(std::vector<uint8_t>(np * cols, 0x7f)), expected_scales = poisoned(np * cols / 128);
    cuda::quantize_fp8_rows(d_heads.as<uint16_t>(), T, cols, expected_codes.as<uint8_t>(), expected_scales.as<float>(),
                            nullptr);
    auto d_o = to_device(o), d_kv_b = to_device(kv_b);
    auto codes = to_device(std::vector<uint8_t>(np * cols, 0x7f)), scales = poisoned(np * cols / 128);
    cuda::mla_unabsorb_fp8(d_o.as<uint16_t>(), T, H, d_kv_b.as<uint16_t>() + kNope * kLatent, kHeadRows,
                           {codes.as<uint8_t>(), scales.as<float>()}, nullptr);
    const auto got_codes = to_host<uint8_t>(codes), want_codes = to_host<uint8_t>(expected_codes);
    const auto got_scales = to_host<float>(scales), want_scales = to_host<float>(expected_scales);
    const std::string what = std::to_string(T) + " tokens, " + std::to_string(H) + " heads";
    for (int64_t b = 0; b < cols / 128; ++b)
      for (int64_t t = 0; t < np; ++t) {
        const float got = got_scales[b * np + t], want = want_scales[b * np + t];
        ASSERT_LE(std::fabs(got - want), 8e-3f * want) << what << ", block " << b << ", row " << t;
      }
    std::vector<float> got_values(np * cols), want_values(np * cols);
    int64_t differ = 0;
    for (int64_t t = 0; t < np; ++t)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = t * cols + c, block = (c / 128) * np + t;
        got_values[i] = quant::minifloat_to_f32(quant::MiniFloat::E4M3, got_codes[i]) * got_scales[block];
        want_values[i] = quant::minifloat_to_f32(quant::MiniFloat::E4M3, want_codes[i]) * want_scales[block];
        differ += got_codes[i] != want_codes[i];
        if (t >= T) {
          ASSERT_EQ(got_codes[i], 0) << what << ": pad row " << t;
        }
      }
    EXPECT_LE(differ, np * cols / 200) << what;
    EXPECT_LT(relative_l2(got_values, want_values), 1e-2) << what << ", " << differ << " codes differ";
  }
}
