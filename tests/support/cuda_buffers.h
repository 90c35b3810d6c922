// Device buffers for the CUDA tests: host vectors up and down, and NaN-poisoned outputs so that
// anything a kernel fails to write fails the comparison; and the fixture that skips without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

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

// Base of every CUDA test fixture: the test skips cleanly where no GPU is visible.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ops::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

}  // namespace glms::testing
