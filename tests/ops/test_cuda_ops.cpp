// CUDA ops against the CPU ops on random data over a sweep of shapes. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "core/bf16_terms.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/linear_fp8.h"
#include "ops/ops.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::double_product;
using glms::testing::poisoned;
using glms::testing::poisoned_bf16;
using glms::testing::random_values;
using glms::testing::to_device;
using glms::testing::to_host;
using glms::testing::relative_l2;
namespace cuda = glms::ops::cuda;

namespace {

class CudaOps : public glms::testing::CudaTest {};

}  // namespace

namespace {

std::vector<uint16_t> to_bf16_host(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

std::vector<float> widen(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

}  // namespace

// Rows held in registers (dims divisible by 4 up to 16384, two or four float4s a thread) and the
// strided fallback (odd or longer rows).
TEST_F(CudaOps, RmsNormWithoutResidualMatchesCpu) {
  for (auto [n, dim] : {std::pair{1, 7}, {3, 257}, {17, 6144}, {64, 2048}, {2, 4}, {2, 12288}, {1, 20000}}) {
    const auto x = random_values(n * dim, n + dim, 3.0f), w = random_values(dim, 7);
    std::vector<float> expected(n * dim);
    ops::rms_norm(x.data(), n, dim, w.data(), 1e-6f, expected.data());
    auto dx = to_device(x), dw = to_device(w), dy = poisoned(n * dim);
    cuda::residual_rms_norm(dx.as<float>(), nullptr, n, dim, dw.as<float>(), 1e-6f, dy.as<float>(), nullptr, nullptr);
    EXPECT_LT(relative_l2(to_host<float>(dy), expected), 1e-6) << n << "x" << dim;
  }
}

TEST_F(CudaOps, SiluMulAndRopeMatchCpu) {
  const int n = 37, heads = 3, head_stride = 80, row = heads * head_stride, rope_dim = 64, offset = 16;
  // Gate and up side by side per token, as the fused gate||up GEMM writes them; four columns a
  // thread where inter is a multiple of 4, one otherwise.
  for (const int inter : {101, 128}) {
    const auto gate_up = random_values(n * 2 * inter, 1, 2.0f);
    std::vector<float> expected(n * inter);
    for (int t = 0; t < n; ++t)
      ops::silu_mul(gate_up.data() + t * 2 * inter, gate_up.data() + t * 2 * inter + inter,
                    expected.data() + t * inter, inter);
    auto dgu = to_device(gate_up);
    cuda::DeviceBuffer dout(n * inter * sizeof(uint16_t));
    cuda::silu_mul_to_bf16(dgu.as<float>(), n, inter, dout.as<uint16_t>(), nullptr);
    EXPECT_LT(relative_l2(widen(to_host<uint16_t>(dout)), expected), 4e-3) << "inter " << inter;
    // From bf16 gate and up values: bit for bit the fp32 pass over the same values widened.
    const auto gate_up16 = to_bf16_host(gate_up);
    auto dgu16 = to_device(gate_up16), dgu_widened = to_device(widen(gate_up16));
    cuda::DeviceBuffer dout16(n * inter * sizeof(uint16_t)), dout_widened(n * inter * sizeof(uint16_t));
    cuda::silu_mul_to_bf16(dgu16.as<uint16_t>(), n, inter, dout16.as<uint16_t>(), nullptr);
    cuda::silu_mul_to_bf16(dgu_widened.as<float>(), n, inter, dout_widened.as<uint16_t>(), nullptr);
    EXPECT_EQ(to_host<uint16_t>(dout16), to_host<uint16_t>(dout_widened)) << "inter " << inter;
  }

  ops::RopeTable table;
  table.rope_dim = rope_dim;
  for (int i = 0; i < rope_dim / 2; ++i)
    table.inv_freq.push_back(1.0f / std::pow(8e6f, 2.0f * i / rope_dim));
  auto x = random_values(n * row, 3);
  std::vector<int32_t> positions(n);
  for (int t = 0; t < n; ++t) positions[t] = 1000 * t + 7;
  auto dx = to_device(x), dpos = to_device(positions), dfreq = to_device(table.inv_freq);
  std::vector<float> cos(rope_dim / 2), sin(rope_dim / 2);
  for (int t = 0; t < n; ++t) {
    table.angles(positions[t], cos.data(), sin.data());
    for (int h = 0; h < heads; ++h)
      ops::rope_interleaved(x.data() + t * row + h * head_stride + offset, rope_dim, cos.data(), sin.data());
  }
  cuda::rope_rows(dx.as<float>(), n, heads, head_stride, offset, rope_dim, dpos.as<int32_t>(), dfreq.as<float>(),
                  nullptr);
  EXPECT_LT(relative_l2(to_host<float>(dx), x), 1e-5);
}

TEST_F(CudaOps, Bf16LinearMatchesCpuWithinBf16Rounding) {
  cuda::Gemm gemm;
  for (auto [n, rows, cols] : {std::tuple{1, 7, 5}, {3, 257, 129}, {64, 2048, 6144}, {128, 6144, 2048}}) {
    const auto x = random_values(n * cols, n, 1.0f), w = random_values(rows * cols, rows, 0.05f);
    std::vector<uint16_t> x16(x.size()), w16(w.size());
    for (size_t i = 0; i < x.size(); ++i) x16[i] = f32_to_bf16(x[i]);
    for (size_t i = 0; i < w.size(); ++i) w16[i] = f32_to_bf16(w[i]);
    // The CPU reference on the same bf16 operands, in fp32.
    std::vector<float> x_rounded(x.size());
    for (size_t i = 0; i < x.size(); ++i) x_rounded[i] = bf16_to_f32(x16[i]);
    std::vector<float> expected(n * rows);
    ops::linear(x_rounded.data(), n, ops::WeightView{DType::BF16, w16.data(), rows, cols, cols}, expected.data());
    auto dx = to_device(x16), dw = to_device(w16), dy = poisoned(n * rows);
    gemm.linear(dx.as<uint16_t>(), n, dw.as<uint16_t>(), rows, cols, dy.as<float>(), nullptr);
    EXPECT_LT(relative_l2(to_host<float>(dy), expected), 1e-5) << n << "x" << rows << "x" << cols;
    // The same product with a bf16 output (cuBLAS may sum in another order, so within its rounding).
    auto dy16 = to_device(std::vector<uint16_t>(n * rows, 0xffff));  // NaN until written
    gemm.linear_to_bf16(dx.as<uint16_t>(), n, dw.as<uint16_t>(), rows, cols, dy16.as<uint16_t>(), nullptr);
    EXPECT_LT(relative_l2(widen(to_host<uint16_t>(dy16)), expected), 4e-3) << n << "x" << rows << "x" << cols;
    // Added into rows already there (the residual stream), in fp32.
    const auto base = random_values(n * rows, 7 + n, 0.5f);
    auto dsum = to_device(base);
    gemm.linear_accumulate(dx.as<uint16_t>(), n, dw.as<uint16_t>(), rows, cols, dsum.as<float>(), nullptr);
    std::vector<float> expected_sum(base);
    for (size_t i = 0; i < base.size(); ++i) expected_sum[i] += expected[i];
    EXPECT_LT(relative_l2(to_host<float>(dsum), expected_sum), 1e-5) << n << "x" << rows << "x" << cols;
  }
}

// The small-batch GEMV (1-4 tokens) against the CPU, at GLM-5.2's narrow and wide shapes, odd
// row counts, and strided inputs and outputs (as the model's slices use them); through Gemm
// with the GEMV switched on, and the shapes it declines fall back to cuBLAS.
TEST_F(CudaOps, SmallBatchGemvMatchesCpu) {
  cuda::Gemm gemm;
  gemm.set_small_batch_gemv(cuda::kGemvMaxTokens);
  for (auto [n, rows, cols] : {std::tuple{1, 32, 6144}, {1, 576, 6144}, {2, 33, 2048}, {3, 6144, 16384},
                               {4, 128, 6144}, {4, 7, 40}, {2, 9, 12}}) {
    const int64_t ld_x = cols + 8, ld_y = rows + 3;  // strided rows (ld_x keeps 16-byte alignment)
    const auto x = random_values(n * ld_x, n + 1, 1.0f), w = random_values(int64_t{rows} * cols, rows + 2, 0.05f);
    std::vector<uint16_t> x16(x.size()), w16(w.size());
    for (size_t i = 0; i < x.size(); ++i) x16[i] = f32_to_bf16(x[i]);
    for (size_t i = 0; i < w.size(); ++i) w16[i] = f32_to_bf16(w[i]);
    std::vector<float> x_rounded(x.size());
    for (size_t i = 0; i < x.size(); ++i) x_rounded[i] = bf16_to_f32(x16[i]);
    std::vector<float> expected(n * rows);
    ops::linear(x_rounded.data(), n, ops::WeightView{DType::BF16, w16.data(), rows, cols, cols}, expected.data(), ld_x);
    auto dx = to_device(x16), dw = to_device(w16), dy = poisoned(n * ld_y);
    gemm.linear(dx.as<uint16_t>(), n, dw.as<uint16_t>(), rows, cols, dy.as<float>(), nullptr, ld_x, ld_y);
    const auto got_strided = to_host<float>(dy);
    std::vector<float> got(n * rows);
    for (int t = 0; t < n; ++t)
      std::copy_n(got_strided.begin() + t * ld_y, rows, got.begin() + t * rows);
    EXPECT_LT(relative_l2(got, expected), 1e-5) << n << "x" << rows << "x" << cols;
    EXPECT_EQ(cuda::gemv_bf16_fits(dx.as<uint16_t>(), n, ld_x, dw.as<uint16_t>(), cols), cols % 8 == 0);
  }
}

// The attention's input projections as one grouped GEMV (GLM-5.2's q_a, kv_a, indexer wk and
// head weights over the same x), the fp32 GEMV the router uses, and the GEMM fallbacks of both.
TEST_F(CudaOps, GroupedAndFp32GemvMatchCpu) {
  const int cols = 6144;
  const std::vector<int> rows = {2048, 576, 128, 32};
  std::vector<std::vector<uint16_t>> w16(rows.size());
  std::vector<cuda::DeviceBuffer> dw;
  for (size_t m = 0; m < rows.size(); ++m) {
    const auto w = random_values(int64_t{rows[m]} * cols, 30 + m, 0.05f);
    for (float v : w) w16[m].push_back(f32_to_bf16(v));
    dw.push_back(to_device(w16[m]));
  }
  for (int gemv_tokens : {cuda::kGemvMaxTokens, 0}) {
    cuda::Gemm gemm;
    gemm.set_small_batch_gemv(gemv_tokens);
    for (int n : {1, 2, 4}) {
      const auto x = random_values(int64_t{n} * cols, 40 + n, 1.0f);
      std::vector<uint16_t> x16;
      std::vector<float> x_rounded;
      for (float v : x) x16.push_back(f32_to_bf16(v)), x_rounded.push_back(bf16_to_f32(x16.back()));
      auto dx = to_device(x16);
      std::vector<cuda::DeviceBuffer> dy;
      std::vector<cuda::GemvOutput> outputs;
      for (size_t m = 0; m < rows.size(); ++m) {
        dy.push_back(poisoned(int64_t{n} * rows[m]));
        outputs.push_back({dw[m].as<uint16_t>(), rows[m], dy.back().as<float>()});
      }
      gemm.linear_group(dx.as<uint16_t>(), n, cols, outputs.data(), static_cast<int>(outputs.size()), nullptr);
      for (size_t m = 0; m < rows.size(); ++m) {
        std::vector<float> expected(int64_t{n} * rows[m]);
        ops::linear(x_rounded.data(), n, ops::WeightView{DType::BF16, w16[m].data(), rows[m], cols, cols},
                    expected.data());
        EXPECT_LT(relative_l2(to_host<float>(dy[m]), expected), 1e-5)
            << "matrix " << m << ", " << n << " tokens, GEMV up to " << gemv_tokens;
      }
      // fp32: the router's 256 x 6144.
      const auto w32 = random_values(int64_t{256} * cols, 50, 0.05f);
      auto dw32 = to_device(w32), dx32 = to_device(x), dy32 = poisoned(int64_t{n} * 256);
      gemm.linear_f32(dx32.as<float>(), n, dw32.as<float>(), 256, cols, dy32.as<float>(), nullptr);
      EXPECT_LT(relative_l2(to_host<float>(dy32), double_product(x, w32, n, 256, cols)), 1e-5) << "fp32, " << n << " tokens";
    }
  }
}

// fp32 rows against bf16 weights (a decode step's router of 1-2 tokens, GLM-5's router weights
// being bf16 values): as accurate as the fp32 GEMV over the widened weights, against a double
// product, for the router's 256 x 6144 (a block a row), a matrix of four-row blocks, rows that
// leave a part-filled block, and x rows longer than their data.
TEST_F(CudaOps, Fp32GemvOverBf16WeightsMatchesADoubleProduct) {
  struct Case {
    int rows, cols, ld_x;
  };
  for (const Case& c : {Case{256, 6144, 6144}, Case{2054, 1024, 1032}, Case{17, 776, 780}}) {
    const auto w16 = to_bf16_host(random_values(int64_t{c.rows} * c.cols, 70 + c.rows, 0.05f));
    const auto w32 = widen(w16);
    auto dw16 = to_device(w16), dw32 = to_device(w32);
    for (const int n : {1, 2, 3, 4}) {
      const auto x = random_values(int64_t{n} * c.ld_x, 80 + n, 2.0f);
      auto dx = to_device(x);
      ASSERT_TRUE(cuda::gemv_f32_bf16_fits(dx.as<float>(), n, c.ld_x, dw16.as<uint16_t>(), c.cols));
      auto dy = poisoned(int64_t{n} * c.rows), dy_f32 = poisoned(int64_t{n} * c.rows);
      cuda::gemv_f32_bf16(dx.as<float>(), n, c.ld_x, dw16.as<uint16_t>(), c.rows, c.cols, dy.as<float>(), c.rows,
                          nullptr);
      cuda::gemv_f32(dx.as<float>(), n, c.ld_x, dw32.as<float>(), c.rows, c.cols, dy_f32.as<float>(), c.rows, nullptr);
      const std::vector<float> expected = double_product(x, w32, n, c.rows, c.cols, c.ld_x);
      const double error = relative_l2(to_host<float>(dy), expected);
      const double f32_error = relative_l2(to_host<float>(dy_f32), expected);
      EXPECT_LT(error, 1e-6) << c.rows << " x " << c.cols << ", " << n << " tokens, fp32 GEMV's error " << f32_error;
      EXPECT_LT(error, 3 * f32_error + 1e-7) << c.rows << " x " << c.cols << ", " << n << " tokens";
    }
  }
  // Rows of a whole number of 16-byte chunks only, at 16-byte aligned x.
  cuda::DeviceBuffer dx(sizeof(float) * 64), dw(sizeof(uint16_t) * 64);
  EXPECT_FALSE(cuda::gemv_f32_bf16_fits(dx.as<float>(), 1, 12, dw.as<uint16_t>(), 12));
  EXPECT_FALSE(cuda::gemv_f32_bf16_fits(dx.as<float>() + 1, 1, 16, dw.as<uint16_t>(), 16));
  EXPECT_FALSE(cuda::gemv_f32_bf16_fits(dx.as<float>(), 5, 16, dw.as<uint16_t>(), 16));
  EXPECT_TRUE(cuda::gemv_f32_bf16_fits(dx.as<float>(), 4, 16, dw.as<uint16_t>(), 16));
}

// The prefill router's scores on the bf16 tensor cores: the three GEMMs over the bf16 terms of
// fp32 rows (core/bf16_terms.h, term 0 apart from terms 1 and 2 as the norm writes them;
// ResidualRmsNormWritesTheBf16TermsOfItsOutput checks the device's terms) give the fp32 product
// of the widened bf16 weights to a few 1e-6 (the H200: 2.1e-6 against the fp32 GEMM's 3.6e-7, as
// the tensor cores' fp32 sums truncate; one bf16 term alone would be near 2e-3).
TEST_F(CudaOps, Fp32ProductFromBf16TermsMatchesTheFp32Gemm) {
  const int cols = 6144, rows = 256;
  const auto w16 = to_bf16_host(random_values(int64_t{rows} * cols, 61, 0.05f));
  const auto w32 = widen(w16);
  auto dw16 = to_device(w16), dw32 = to_device(w32);
  cuda::Gemm gemm;
  for (const int n : {256, 301}) {
    const auto x = random_values(int64_t{n} * cols, 62 + n, 2.0f);
    const int64_t count = int64_t{n} * cols;
    std::vector<uint16_t> term0(count), low(2 * count);
    for (int64_t i = 0; i < count; ++i) {
      uint16_t split[3];
      bf16_terms(x[i], split);
      term0[i] = split[0], low[i] = split[1], low[count + i] = split[2];
    }
    auto dx = to_device(x), d0 = to_device(term0), dlow = to_device(low);
    auto dy_terms = poisoned(int64_t{n} * rows), dy_f32 = poisoned(int64_t{n} * rows);
    gemm.linear_f32_terms(d0.as<uint16_t>(), dlow.as<uint16_t>(), n, dw16.as<uint16_t>(), rows, cols,
                          dy_terms.as<float>(), nullptr);
    gemm.linear_f32(dx.as<float>(), n, dw32.as<float>(), rows, cols, dy_f32.as<float>(), nullptr);
    const std::vector<float> expected = double_product(x, w32, n, rows, cols);
    const double terms_error = relative_l2(to_host<float>(dy_terms), expected);
    const double f32_error = relative_l2(to_host<float>(dy_f32), expected);
    EXPECT_LT(terms_error, 5e-6) << n << " tokens, fp32 GEMM's error " << f32_error;
    EXPECT_LT(f32_error, 1e-6) << n << " tokens";
  }
}

// The tensor-core skinny GEMM (5 to 128 tokens) against the CPU: one matrix and the attention's
// group of four over the same x, row counts that leave part-filled tiles, strided x and y, both
// tile shapes, k split over clusters of 2 to 8 blocks and not split at all; its fixed-order sums
// give the same bits on a second run.
TEST_F(CudaOps, SkinnyGemmMatchesCpu) {
  struct Case {
    int n;
    std::vector<int> rows;
    int cols;
    int extra_ld;  // x and y rows this much longer than their data
  };
  const std::vector<Case> cases = {{5, {2048, 576, 128, 32}, 6144, 0},  {17, {1000}, 4096, 8},
                                   {33, {2048, 576, 128, 32}, 6144, 0}, {64, {6144}, 2048, 0},
                                   {100, {333}, 1024, 16},              {128, {20000}, 256, 0},
                                   {64, {16384, 4096}, 2048, 8},        {8, {6144}, 16384, 0},
                                   {120, {2048, 576, 128, 32}, 6144, 0}};
  cuda::Gemm gemm;
  gemm.set_small_batch_gemv(cuda::kGemvMaxTokens);
  gemm.set_skinny_gemm(cuda::kSkinnyMaxTokens, cuda::kSkinnyMaxTokens);
  for (const Case& c : cases) {
    const int64_t ld_x = c.cols + c.extra_ld;
    const auto x = random_values(c.n * ld_x, 60 + c.n, 1.0f);
    std::vector<uint16_t> x16 = to_bf16_host(x);
    const std::vector<float> x_rounded = widen(x16);
    auto dx = to_device(x16);
    std::vector<std::vector<uint16_t>> w16;
    std::vector<cuda::DeviceBuffer> dw, dy;
    std::vector<cuda::GemvOutput> outputs;
    for (size_t m = 0; m < c.rows.size(); ++m) {
      w16.push_back(to_bf16_host(random_values(int64_t{c.rows[m]} * c.cols, 70 + m, 0.05f)));
      dw.push_back(to_device(w16.back()));
      const int64_t ld_y = c.rows[m] + c.extra_ld / 4;
      dy.push_back(poisoned(c.n * ld_y));
      outputs.push_back({dw.back().as<uint16_t>(), c.rows[m], dy.back().as<float>(), ld_y});
    }
    ASSERT_TRUE(cuda::linear_skinny_fits(dx.as<uint16_t>(), c.n, ld_x, c.cols, outputs.data(),
                                         static_cast<int>(outputs.size())));
    std::vector<std::vector<float>> first;
    for (int run = 0; run < 2; ++run) {
      if (outputs.size() == 1)
        gemm.linear(dx.as<uint16_t>(), c.n, outputs[0].w, c.rows[0], c.cols, outputs[0].y, nullptr, ld_x,
                    outputs[0].ld_y);
      else if (c.extra_ld == 0)
        gemm.linear_group(dx.as<uint16_t>(), c.n, c.cols, outputs.data(), static_cast<int>(outputs.size()), nullptr);
      else
        cuda::linear_skinny(dx.as<uint16_t>(), c.n, ld_x, c.cols, outputs.data(), static_cast<int>(outputs.size()),
                            nullptr);
      for (size_t m = 0; m < c.rows.size(); ++m) {
        const auto got_strided = to_host<float>(dy[m]);
        std::vector<float> got(int64_t{c.n} * c.rows[m]);
        for (int t = 0; t < c.n; ++t)
          std::copy_n(got_strided.begin() + t * outputs[m].ld_y, c.rows[m], got.begin() + int64_t{t} * c.rows[m]);
        if (run == 0) {
          std::vector<float> expected(got.size());
          ops::linear(x_rounded.data(), c.n, ops::WeightView{DType::BF16, w16[m].data(), c.rows[m], c.cols, c.cols},
                      expected.data(), ld_x);
          EXPECT_LT(relative_l2(got, expected), 1e-5) << c.n << " tokens, matrix " << m << " of " << c.rows[m] << "x"
                                                       << c.cols;
          first.push_back(got);
        } else {
          EXPECT_EQ(std::memcmp(got.data(), first[m].data(), got.size() * sizeof(float)), 0)
              << "a second run differs: " << c.n << " tokens, matrix " << m;
        }
      }
    }
  }
  // Shapes it declines: k not a multiple of 64, more than 128 tokens, an unaligned x, more row
  // tiles than it takes (lm_head's).
  cuda::DeviceBuffer dx(sizeof(uint16_t) * 256 * 200), dw(sizeof(uint16_t) * 64 * 200);
  const cuda::GemvOutput output{dw.as<uint16_t>(), 64, nullptr, 0}, vocab{dw.as<uint16_t>(), 154880, nullptr, 0};
  EXPECT_FALSE(cuda::linear_skinny_fits(dx.as<uint16_t>(), 8, 200, 200, &output, 1));
  EXPECT_FALSE(cuda::linear_skinny_fits(dx.as<uint16_t>(), 129, 192, 192, &output, 1));
  EXPECT_FALSE(cuda::linear_skinny_fits(dx.as<uint16_t>() + 1, 8, 192, 192, &output, 1));
  EXPECT_FALSE(cuda::linear_skinny_fits(dx.as<uint16_t>(), 8, 192, 192, &vocab, 1));
  EXPECT_TRUE(cuda::linear_skinny_fits(dx.as<uint16_t>(), 8, 192, 192, &output, 1));
}

// A MoE layer's experts over their grouped rows as one cuBLAS grouped GEMM: products of
// different token counts and weights, against the CPU; a second, larger group regrows the
// staging buffers.
TEST_F(CudaOps, GroupedGemmMatchesCpu) {
  const int rows = 96, cols = 72;
  cuda::Gemm gemm;
  for (const std::vector<int>& counts : {std::vector<int>{1, 7, 33}, std::vector<int>{128, 2, 5, 64, 9, 1}}) {
    std::vector<std::vector<uint16_t>> x16, w16;
    std::vector<std::vector<float>> expected;
    std::vector<cuda::DeviceBuffer> dx, dw, dy;
    std::vector<cuda::GroupedProduct> products;
    for (size_t i = 0; i < counts.size(); ++i) {
      const int n = counts[i];
      const auto x = random_values(int64_t{n} * cols, 60 + i, 1.0f), w = random_values(int64_t{rows} * cols, 70 + i, 0.1f);
      x16.emplace_back(), w16.emplace_back();
      std::vector<float> x_rounded;
      for (float v : x) x16.back().push_back(f32_to_bf16(v)), x_rounded.push_back(bf16_to_f32(x16.back().back()));
      for (float v : w) w16.back().push_back(f32_to_bf16(v));
      expected.emplace_back(int64_t{n} * rows);
      ops::linear(x_rounded.data(), n, ops::WeightView{DType::BF16, w16.back().data(), rows, cols, cols},
                  expected.back().data());
      dx.push_back(to_device(x16.back()));
      dw.push_back(to_device(w16.back()));
      dy.push_back(poisoned(int64_t{n} * rows));
      products.push_back({dx.back().as<uint16_t>(), n, dw.back().as<uint16_t>(), dy.back().as<float>()});
    }
    gemm.linear_grouped(products.data(), static_cast<int>(products.size()), rows, cols, nullptr);
    for (size_t i = 0; i < counts.size(); ++i)
      EXPECT_LT(relative_l2(to_host<float>(dy[i]), expected[i]), 1e-5) << "product " << i << " of " << counts.size();
  }
}

TEST_F(CudaOps, ResidualRmsNormAddsThenNormalises) {
  for (auto [n, dim] : {std::pair{1, 40}, {5, 6144}, {3, 12288}, {2, 18}}) {
    auto x = random_values(n * dim, 1, 2.0f);
    const auto delta = random_values(n * dim, 2), w = random_values(dim, 3);
    auto dx = to_device(x), dd = to_device(delta), dw = to_device(w), dy = poisoned(n * dim);
    cuda::DeviceBuffer dy16(n * dim * sizeof(uint16_t));
    cuda::residual_rms_norm(dx.as<float>(), dd.as<float>(), n, dim, dw.as<float>(), 1e-5f, dy.as<float>(),
                            dy16.as<uint16_t>(), nullptr);
    for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
    std::vector<float> expected(x.size());
    ops::rms_norm(x.data(), n, dim, w.data(), 1e-5f, expected.data());
    EXPECT_LT(relative_l2(to_host<float>(dx), x), 1e-7);
    EXPECT_LT(relative_l2(to_host<float>(dy), expected), 1e-6);
    EXPECT_LT(relative_l2(widen(to_host<uint16_t>(dy16)), expected), 4e-3);
  }
}

// A block output left in two parts (a data-parallel rank's routed sums and its shared expert's):
// x += delta + addend, bit for bit as adding their sum (add_f32) then normalising, on the vector
// (dim % 4 == 0) and scalar paths; and with the delta as bf16 rows (the routed sums of a bf16
// reduce-scatter), bit for bit as the same with those values widened.
TEST_F(CudaOps, ResidualRmsNormAddsBothPartsOfAPendingOutput) {
  for (auto [n, dim] : {std::pair{1, 6144}, {3, 40}, {2, 18}}) {
    const auto x = random_values(n * dim, 4, 2.0f), delta = random_values(n * dim, 5);
    const auto addend = random_values(n * dim, 6), w = random_values(dim, 7);
    auto dd = to_device(delta), da = to_device(addend), dw = to_device(w);
    // Two steps: the sum, then the norm adding it.
    auto dx_two = to_device(x), dy_two = poisoned(n * dim), dsum = poisoned(n * dim);
    cuda::add_f32(dd.as<float>(), da.as<float>(), dsum.as<float>(), int64_t{n} * dim, nullptr);
    cuda::residual_rms_norm(dx_two.as<float>(), dsum.as<float>(), n, dim, dw.as<float>(), 1e-5f, dy_two.as<float>(),
                            nullptr, nullptr);
    // One step.
    auto dx_one = to_device(x), dy_one = poisoned(n * dim);
    cuda::residual_rms_norm(dx_one.as<float>(), dd.as<float>(), n, dim, dw.as<float>(), 1e-5f, dy_one.as<float>(),
                            nullptr, nullptr, da.as<float>());
    EXPECT_EQ(to_host<float>(dx_one), to_host<float>(dx_two)) << n << " x " << dim;
    EXPECT_EQ(to_host<float>(dy_one), to_host<float>(dy_two)) << n << " x " << dim;

    const std::vector<uint16_t> delta16 = to_bf16_host(delta);
    auto dd16 = to_device(delta16), dd_widened = to_device(widen(delta16));
    auto dx_widened = to_device(x), dy_widened = poisoned(n * dim), dx16 = to_device(x), dy16 = poisoned(n * dim);
    cuda::residual_rms_norm(dx_widened.as<float>(), dd_widened.as<float>(), n, dim, dw.as<float>(), 1e-5f,
                            dy_widened.as<float>(), nullptr, nullptr, da.as<float>());
    cuda::residual_rms_norm(dx16.as<float>(), nullptr, n, dim, dw.as<float>(), 1e-5f, dy16.as<float>(), nullptr,
                            nullptr, da.as<float>(), nullptr, dd16.as<uint16_t>());
    EXPECT_EQ(to_host<float>(dx16), to_host<float>(dx_widened)) << n << " x " << dim << ", bf16 delta";
    EXPECT_EQ(to_host<float>(dy16), to_host<float>(dy_widened)) << n << " x " << dim << ", bf16 delta";
  }
}

// The post-attention norm of a long step writes the router's input as bf16 terms: term 0 in
// y_bf16, terms 1 and 2 in their own planes, each the bits core/bf16_terms.h gives the fp32 output
// the same norm writes (vector and scalar paths), with x updated as without them.
TEST_F(CudaOps, ResidualRmsNormWritesTheBf16TermsOfItsOutput) {
  for (auto [n, dim] : {std::pair{3, 6144}, {2, 40}, {2, 18}}) {
    auto x = random_values(n * dim, 8, 2.0f);
    for (int64_t i = 0; i < n * dim; i += 5) x[i] *= 1e-4f;  // small outputs keep three live terms
    const auto delta = random_values(n * dim, 9), w = random_values(dim, 10);
    auto dd = to_device(delta), dw = to_device(w);
    auto dx_f32 = to_device(x), dy = poisoned(n * dim);
    cuda::residual_rms_norm(dx_f32.as<float>(), dd.as<float>(), n, dim, dw.as<float>(), 1e-5f, dy.as<float>(),
                            nullptr, nullptr);
    auto dx_terms = to_device(x);
    cuda::DeviceBuffer term0(sizeof(uint16_t) * n * dim), low(sizeof(uint16_t) * 2 * n * dim);
    cuda::residual_rms_norm(dx_terms.as<float>(), dd.as<float>(), n, dim, dw.as<float>(), 1e-5f, nullptr,
                            term0.as<uint16_t>(), nullptr, nullptr, low.as<uint16_t>());
    EXPECT_EQ(to_host<float>(dx_terms), to_host<float>(dx_f32)) << n << " x " << dim;
    const auto y = to_host<float>(dy);
    const auto got0 = to_host<uint16_t>(term0), got_low = to_host<uint16_t>(low);
    for (int64_t i = 0; i < n * dim; ++i) {
      uint16_t expected[3];
      bf16_terms(y[i], expected);
      ASSERT_EQ(got0[i], expected[0]) << n << " x " << dim << ", value " << i;
      ASSERT_EQ(got_low[i], expected[1]) << n << " x " << dim << ", value " << i;
      ASSERT_EQ(got_low[n * dim + i], expected[2]) << n << " x " << dim << ", value " << i;
    }
  }
}

// With y_fp8 the norm writes its bf16 output also as E4M3 rows: the codes and scales
// quantize_fp8_rows makes from that bf16 output, bit for bit, the pad rows' included; x and the
// bf16 rows as without them. Row counts that leave 1 to 3 pad rows and none; the delta none,
// fp32, fp32 with an addend, or bf16; with and without the bf16 terms; widths of one 128-column
// block, of a warp's several, of four float4s a thread (12288) and one past the vector kernel's
// (its fallback quantises after the norm).
TEST_F(CudaOps, ResidualRmsNormWritesE4m3RowsAsQuantizeFp8RowsDoes) {
  enum class Delta { kNone, kF32, kF32WithAddend, kBf16 };
  struct Case {
    int n, dim;
    Delta delta;
    bool terms;
  };
  for (const Case c : {Case{5, 6144, Delta::kF32, true}, Case{3, 6144, Delta::kNone, false},
                       Case{2, 2048, Delta::kF32WithAddend, false}, Case{7, 384, Delta::kBf16, false},
                       Case{4, 128, Delta::kF32, true}, Case{3, 12288, Delta::kBf16, true},
                       Case{6, 16512, Delta::kF32WithAddend, false}}) {
    const int64_t count = int64_t{c.n} * c.dim, np = cuda::fp8_padded_tokens(c.n);
    auto x = random_values(count, 30 + c.n, 2.0f);
    for (int64_t i = 0; i < count; i += 7) x[i] *= 1e-3f;  // blocks of unlike magnitudes
    const auto delta = random_values(count, 31), addend = random_values(count, 33), w = random_values(c.dim, 32);
    std::vector<uint16_t> delta16(delta.size());
    for (size_t i = 0; i < delta.size(); ++i) delta16[i] = f32_to_bf16(delta[i]);
    auto dd = to_device(delta), dd16 = to_device(delta16), da = to_device(addend), dw = to_device(w);
    const bool f32 = c.delta == Delta::kF32 || c.delta == Delta::kF32WithAddend;
    const float* d = f32 ? dd.as<float>() : nullptr;
    const float* a = c.delta == Delta::kF32WithAddend ? da.as<float>() : nullptr;
    const uint16_t* d16 = c.delta == Delta::kBf16 ? dd16.as<uint16_t>() : nullptr;
    auto dx_plain = to_device(x), dx_fp8 = to_device(x);
    auto dy_plain = poisoned_bf16(count), dy_fp8 = poisoned_bf16(count);
    cuda::DeviceBuffer low(sizeof(uint16_t) * 2 * count);
    uint16_t* terms = c.terms ? low.as<uint16_t>() : nullptr;
    cuda::residual_rms_norm(dx_plain.as<float>(), d, c.n, c.dim, dw.as<float>(), 1e-5f, nullptr, dy_plain.as<uint16_t>(),
                            nullptr, a, terms, d16);
    auto codes = to_device(std::vector<uint8_t>(np * c.dim, 0x7f)), scales = poisoned(np * c.dim / 128);
    cuda::residual_rms_norm(dx_fp8.as<float>(), d, c.n, c.dim, dw.as<float>(), 1e-5f, nullptr, dy_fp8.as<uint16_t>(),
                            nullptr, a, terms, d16, {codes.as<uint8_t>(), scales.as<float>()});
    const std::string what = std::to_string(c.n) + " x " + std::to_string(c.dim);
    EXPECT_EQ(to_host<float>(dx_fp8), to_host<float>(dx_plain)) << what;
    EXPECT_EQ(to_host<uint16_t>(dy_fp8), to_host<uint16_t>(dy_plain)) << what;
    auto expected_codes = to_device(std::vector<uint8_t>(np * c.dim, 0x7f)), expected_scales = poisoned(np * c.dim / 128);
    cuda::quantize_fp8_rows(dy_plain.as<uint16_t>(), c.n, c.dim, expected_codes.as<uint8_t>(),
                            expected_scales.as<float>(), nullptr);
    EXPECT_EQ(to_host<uint8_t>(codes), to_host<uint8_t>(expected_codes)) << what;
    const auto got = to_host<float>(scales), expected = to_host<float>(expected_scales);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], expected[i]) << what << ", scale " << i << " (block " << i / np << ", row " << i % np << ")";
  }
}

// SwiGLU's E4M3 rows (silu_mul_to_bf16 with out_fp8) are quantize_fp8_rows of its bf16 output,
// bit for bit, the pad rows' included, from fp32 and bf16 gate/up values, with the bf16 output
// as without them or without it.
TEST_F(CudaOps, SiluMulWritesE4m3RowsAsQuantizeFp8RowsDoes) {
  for (auto [n, inter] : {std::pair{5, 2048}, std::pair{8, 128}, std::pair{1, 384}, std::pair{300, 256}}) {
    const int64_t np = cuda::fp8_padded_tokens(n);
    auto gate_up = random_values(int64_t{n} * 2 * inter, 40 + n, 3.0f);
    for (int64_t i = 0; i < int64_t{n} * 2 * inter; i += 11) gate_up[i] *= 1e-3f;
    auto d32 = to_device(gate_up), d16 = to_device(to_bf16_host(gate_up));
    for (const bool bf16_in : {false, true}) {
      auto plain = poisoned_bf16(int64_t{n} * inter), with_fp8 = poisoned_bf16(int64_t{n} * inter);
      auto codes = to_device(std::vector<uint8_t>(np * inter, 0x7f)), scales = poisoned(np * inter / 128);
      auto expected_codes = to_device(std::vector<uint8_t>(np * inter, 0x7f));
      auto expected_scales = poisoned(np * inter / 128);
      const cuda::Fp8Rows fp8{codes.as<uint8_t>(), scales.as<float>()};
      auto only_codes = to_device(std::vector<uint8_t>(np * inter, 0x7f)), only_scales = poisoned(np * inter / 128);
      const cuda::Fp8Rows only_fp8{only_codes.as<uint8_t>(), only_scales.as<float>()};
      if (bf16_in) {
        cuda::silu_mul_to_bf16(d16.as<uint16_t>(), n, inter, plain.as<uint16_t>(), nullptr);
        cuda::silu_mul_to_bf16(d16.as<uint16_t>(), n, inter, with_fp8.as<uint16_t>(), nullptr, fp8);
        cuda::silu_mul_to_bf16(d16.as<uint16_t>(), n, inter, nullptr, nullptr, only_fp8);
      } else {
        cuda::silu_mul_to_bf16(d32.as<float>(), n, inter, plain.as<uint16_t>(), nullptr);
        cuda::silu_mul_to_bf16(d32.as<float>(), n, inter, with_fp8.as<uint16_t>(), nullptr, fp8);
        cuda::silu_mul_to_bf16(d32.as<float>(), n, inter, nullptr, nullptr, only_fp8);
      }
      cuda::quantize_fp8_rows(plain.as<uint16_t>(), n, inter, expected_codes.as<uint8_t>(),
                              expected_scales.as<float>(), nullptr);
      const std::string what = std::to_string(n) + " x " + std::to_string(inter) + (bf16_in ? ", bf16" : ", fp32");
      EXPECT_EQ(to_host<uint16_t>(with_fp8), to_host<uint16_t>(plain)) << what;
      EXPECT_EQ(to_host<uint8_t>(codes), to_host<uint8_t>(expected_codes)) << what;
      EXPECT_EQ(to_host<float>(scales), to_host<float>(expected_scales)) << what;
      EXPECT_EQ(to_host<uint8_t>(only_codes), to_host<uint8_t>(expected_codes)) << what << ", the E4M3 rows only";
      EXPECT_EQ(to_host<float>(only_scales), to_host<float>(expected_scales)) << what << ", the E4M3 rows only";
    }
  }
}

namespace {

// batched_to_bf16 of the same product: bf16(alpha * y) of batched's fp32 y, bit for bit where
// both run the small-batch GEMV (the same sums), within bf16 rounding where cuBLAS may pick
// different kernels for the two outputs.
void expect_bf16_product(const std::vector<float>& y, const std::vector<uint16_t>& y16, float alpha, bool same_sums,
                         const std::string& what) {
  ASSERT_EQ(y.size(), y16.size());
  std::vector<float> scaled(y.size());
  for (size_t i = 0; i < y.size(); ++i) scaled[i] = y[i] * alpha;
  if (same_sums) {
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y16[i], f32_to_bf16(scaled[i])) << what << " at " << i;
  } else {
    EXPECT_LT(relative_l2(widen(y16), scaled), 4e-3) << what;
  }
}

}  // namespace

// Absorption's shapes: per head, y[T, L] = x[T, nope] . W[nope, L] and back y[T, vd] = o[T, L] . W_uv^T,
// through cuBLAS and through the small-batch GEMV (1 to 4 tokens), odd sizes and GLM-5.2's; and
// each again with a bf16 output (batched_to_bf16, scaled for the absorption as the model does).
TEST_F(CudaOps, BatchedGemmMatchesPerHeadLoops) {
  struct Shape {
    int H, nope, vd, L, qd;
  };
  for (const Shape shape : {Shape{3, 24, 16, 40, 30}, Shape{64, 192, 256, 512, 256}}) {
    const auto [H, nope, vd, L, qd] = shape;
    const auto kv_b = to_bf16_host(random_values(int64_t{H} * (nope + vd) * L, 2, 0.1f));
    auto dw = to_device(kv_b);
    for (int gemv_tokens : {0, cuda::kGemvMaxTokens})
      for (int T : {1, 2, 3, 5}) {
        cuda::Gemm gemm;
        gemm.set_small_batch_gemv(gemv_tokens);
        const auto q = to_bf16_host(random_values(T * H * qd, 1));
        auto dq = to_device(q), dy = poisoned(T * H * L);
        gemm.batched(dq.as<uint16_t>(), T, H * qd, qd, dw.as<uint16_t>(), nope, L, L, (nope + vd) * L, true,
                     dy.as<float>(), H * L, L, H, nullptr);
        std::vector<float> expected(T * H * L, 0.0f);
        for (int t = 0; t < T; ++t)
          for (int h = 0; h < H; ++h)
            for (int j = 0; j < L; ++j) {
              double sum = 0;
              for (int k = 0; k < nope; ++k)
                sum += double(bf16_to_f32(q[(t * H + h) * qd + k])) * bf16_to_f32(kv_b[(int64_t{h} * (nope + vd) + k) * L + j]);
              expected[(t * H + h) * L + j] = static_cast<float>(sum);
            }
        EXPECT_LT(relative_l2(to_host<float>(dy), expected), 1e-5) << "absorb H=" << H << " T=" << T << " gemv " << gemv_tokens;
        const bool same_sums = T <= gemv_tokens;
        const float scale = 0.0625f * 1.3f;
        cuda::DeviceBuffer dy16(sizeof(uint16_t) * T * H * L);
        cuda::memset_async(dy16.data(), 0xff, dy16.bytes(), nullptr);
        gemm.batched_to_bf16(dq.as<uint16_t>(), T, H * qd, qd, dw.as<uint16_t>(), nope, L, L, (nope + vd) * L, true,
                             dy16.as<uint16_t>(), H * L, L, H, nullptr, scale);
        expect_bf16_product(to_host<float>(dy), to_host<uint16_t>(dy16), scale, same_sums,
                            "absorb to bf16 H=" + std::to_string(H) + " T=" + std::to_string(T));

        const auto o = to_bf16_host(random_values(T * H * L, 3));
        auto dout = to_device(o), dz = poisoned(T * H * vd);
        gemm.batched(dout.as<uint16_t>(), T, H * L, L, dw.as<uint16_t>() + nope * L, vd, L, L, (nope + vd) * L, false,
                     dz.as<float>(), H * vd, vd, H, nullptr);
        std::vector<float> expected_z(T * H * vd);
        for (int t = 0; t < T; ++t)
          for (int h = 0; h < H; ++h)
            for (int j = 0; j < vd; ++j) {
              double sum = 0;
              for (int k = 0; k < L; ++k)
                sum += double(bf16_to_f32(o[(t * H + h) * L + k])) *
                       bf16_to_f32(kv_b[(int64_t{h} * (nope + vd) + nope + j) * L + k]);
              expected_z[(t * H + h) * vd + j] = static_cast<float>(sum);
            }
        EXPECT_LT(relative_l2(to_host<float>(dz), expected_z), 1e-5) << "un-absorb H=" << H << " T=" << T << " gemv " << gemv_tokens;
        cuda::DeviceBuffer dz16(sizeof(uint16_t) * T * H * vd);
        cuda::memset_async(dz16.data(), 0xff, dz16.bytes(), nullptr);
        gemm.batched_to_bf16(dout.as<uint16_t>(), T, H * L, L, dw.as<uint16_t>() + nope * L, vd, L, L, (nope + vd) * L,
                             false, dz16.as<uint16_t>(), H * vd, vd, H, nullptr);
        expect_bf16_product(to_host<float>(dz), to_host<uint16_t>(dz16), 1.0f, same_sums,
                            "un-absorb to bf16 H=" + std::to_string(H) + " T=" + std::to_string(T));
      }
  }
}
