// CUDA ops against the CPU ops on random data over a sweep of shapes. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::random_values;
using glms::testing::relative_l2;
namespace cuda = glms::ops::cuda;

namespace {

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

template <typename T>
cuda::DeviceBuffer to_device(const std::vector<T>& host) {
  cuda::DeviceBuffer buffer(host.size() * sizeof(T));
  buffer.upload(host.data(), buffer.bytes());
  return buffer;
}

template <typename T>
std::vector<T> to_host(const cuda::DeviceBuffer& buffer) {
  std::vector<T> host(buffer.bytes() / sizeof(T));
  buffer.download(host.data(), buffer.bytes());
  return host;
}

// A device buffer of `count` floats filled with NaN, so unwritten outputs fail the comparison.
cuda::DeviceBuffer poisoned(size_t count) {
  return to_device(std::vector<float>(count, NAN));
}

}  // namespace

TEST_F(CudaOps, RmsNormMatchesCpu) {
  for (auto [n, dim] : {std::pair{1, 7}, {3, 257}, {17, 6144}, {64, 2048}}) {
    const auto x = random_values(n * dim, n + dim, 3.0f), w = random_values(dim, 7);
    std::vector<float> expected(n * dim);
    ops::rms_norm(x.data(), n, dim, w.data(), 1e-6f, expected.data());
    auto dx = to_device(x), dw = to_device(w), dy = poisoned(n * dim);
    cuda::rms_norm(dx.as<float>(), n, dim, dw.as<float>(), 1e-6f, dy.as<float>(), nullptr);
    EXPECT_LT(relative_l2(to_host<float>(dy), expected), 1e-6) << n << "x" << dim;
  }
}

TEST_F(CudaOps, SiluMulAndRopeMatchCpu) {
  const int n = 37, row = 3 * 80, rope_dim = 64, offset = 16;
  const auto gate = random_values(n * row, 1), up = random_values(n * row, 2);
  std::vector<float> expected(n * row);
  ops::silu_mul(gate.data(), up.data(), expected.data(), n * row);
  auto dg = to_device(gate), du = to_device(up), dout = poisoned(n * row);
  cuda::silu_mul(dg.as<float>(), du.as<float>(), dout.as<float>(), n * row, nullptr);
  EXPECT_LT(relative_l2(to_host<float>(dout), expected), 1e-6);

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
    ops::rope_interleaved(x.data() + t * row + offset, rope_dim, cos.data(), sin.data());
  }
  cuda::rope_interleaved(dx.as<float>(), n, row, offset, rope_dim, dpos.as<int32_t>(), dfreq.as<float>(), nullptr);
  EXPECT_LT(relative_l2(to_host<float>(dx), x), 1e-5);
}

TEST_F(CudaOps, Bf16LinearMatchesCpuWithinBf16Rounding) {
  cuda::Bf16Linear linear;
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
    linear.run(dx.as<uint16_t>(), n, dw.as<uint16_t>(), rows, cols, dy.as<float>(), nullptr);
    EXPECT_LT(relative_l2(to_host<float>(dy), expected), 1e-5) << n << "x" << rows << "x" << cols;
  }
}

TEST_F(CudaOps, ToBf16RoundsLikeTheCpu) {
  const auto x = random_values(1000, 9, 100.0f);
  auto dx = to_device(x);
  cuda::DeviceBuffer dy(x.size() * sizeof(uint16_t));
  cuda::to_bf16(dx.as<float>(), dy.as<uint16_t>(), static_cast<int64_t>(x.size()), nullptr);
  const auto y = to_host<uint16_t>(dy);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], f32_to_bf16(x[i])) << i;
}
