// Device buffers for the CUDA tests: host vectors up and down, and NaN-poisoned outputs so that
// anything a kernel fails to write fails the comparison; and the fixture that skips without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"

namespace glms::testing {

template <typename T>
ops::cuda::DeviceBuffer to_device(const std::vector<T>& host) {
  ops::cuda::DeviceBuffer buffer((host.empty() ? 1 : host.size()) * sizeof(T));
  if (!host.empty()) buffer.upload(host.data(), host.size() * sizeof(T));
  return buffer;
}

// The first `count` values of `buffer` (all of it by default).
template <typename T>
std::vector<T> to_host(const ops::cuda::DeviceBuffer& buffer, size_t count = static_cast<size_t>(-1)) {
  std::vector<T> host(count == static_cast<size_t>(-1) ? buffer.bytes() / sizeof(T) : count);
  buffer.download(host.data(), host.size() * sizeof(T));
  return host;
}

inline ops::cuda::DeviceBuffer poisoned(size_t count) { return to_device(std::vector<float>(count, NAN)); }
inline ops::cuda::DeviceBuffer poisoned_bf16(size_t count) { return to_device(std::vector<uint16_t>(count, 0xffff)); }

// The first `count` bf16 values of `buffer`, widened to float.
inline std::vector<float> bf16_to_host(const ops::cuda::DeviceBuffer& buffer, size_t count) {
  const auto bits = to_host<uint16_t>(buffer, count);
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_f32(bits[i]);
  return values;
}

// Base of every CUDA test fixture: the test skips cleanly where no GPU is visible.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ops::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

}  // namespace glms::testing
