#include "cli/bench_step_rates.h"

#ifdef GLMS_HAVE_CUDA

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/linear_fp8.h"

namespace glms::cli {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double measure_copy_bandwidth(size_t bytes) {
  namespace cuda = ops::cuda;
  cuda::DeviceBuffer a(bytes), b(bytes);
  cuda::Stream stream;
  cuda::memset_async(a.data(), 1, bytes, stream.get());
  cuda::copy_device_async(b.data(), a.data(), bytes, stream.get());
  stream.synchronize();
  const int reps = 10;
  const auto start = Clock::now();
  for (int i = 0; i < reps; ++i) cuda::copy_device_async(b.data(), a.data(), bytes, stream.get());
  stream.synchronize();
  return 2.0 * static_cast<double>(bytes) * reps / seconds_since(start);
}

double measure_gemm_rate(int64_t n) {
  namespace cuda = ops::cuda;
  cuda::DeviceBuffer x(sizeof(uint16_t) * n * n), w(sizeof(uint16_t) * n * n), y(sizeof(float) * n * n);
  cuda::Stream stream;
  cuda::fill_uniform_bf16(x.as<uint16_t>(), n * n, 1, 1.0f, stream.get());
  cuda::fill_uniform_bf16(w.as<uint16_t>(), n * n, 2, 1.0f, stream.get());
  cuda::Gemm gemm;
  gemm.linear(x.as<uint16_t>(), n, w.as<uint16_t>(), n, n, y.as<float>(), stream.get());
  stream.synchronize();
  const int reps = 10;
  const auto start = Clock::now();
  for (int i = 0; i < reps; ++i) gemm.linear(x.as<uint16_t>(), n, w.as<uint16_t>(), n, n, y.as<float>(), stream.get());
  stream.synchronize();
  return 2.0 * double(n) * n * n * reps / seconds_since(start);
}

Fp8GemmRate measure_fp8_gemm_rate(int64_t n) {
  namespace cuda = ops::cuda;
  const int64_t blocks = n / cuda::kFp8ScaleBlock, padded = (blocks + 3) / 4 * 4;
  const int64_t tokens = cuda::fp8_padded_tokens(n);  // rows of the quantised activations and of y
  cuda::DeviceBuffer x(sizeof(float) * n * n), x_codes(tokens * n), x_scales(sizeof(float) * tokens * blocks),
      w(n * n), w_scales(sizeof(float) * blocks * padded), y(sizeof(float) * tokens * n);
  cuda::Stream stream;
  cuda::fill_uniform_f32(x.as<float>(), n * n, 1, 1.0f, stream.get());
  cuda::fill_uniform_e4m3(w.as<uint8_t>(), n * n, 2, stream.get());
  cuda::fill_f32(w_scales.as<float>(), blocks * padded, 1.0f / 448.0f, stream.get());
  Fp8GemmRate rate;
  try {
    cuda::Fp8Gemm gemm;
    auto quantize = [&] { cuda::quantize_fp8_rows(x.as<float>(), n, n, x_codes.as<uint8_t>(), x_scales.as<float>(), stream.get()); };
    auto multiply = [&] {
      gemm.linear(x_codes.as<uint8_t>(), x_scales.as<float>(), n, w.as<uint8_t>(), w_scales.as<float>(), n, n,
                  y.as<float>(), stream.get());
    };
    quantize();
    multiply();
    stream.synchronize();
    const int reps = 10;
    auto start = Clock::now();
    for (int i = 0; i < reps; ++i) multiply();
    stream.synchronize();
    rate.gemm = 2.0 * double(n) * n * n * reps / seconds_since(start);
    start = Clock::now();
    for (int i = 0; i < reps; ++i) {
      quantize();
      multiply();
    }
    stream.synchronize();
    rate.with_quantize = 2.0 * double(n) * n * n * reps / seconds_since(start);
  } catch (const Error& e) {
    rate.error = e.what();
  }
  return rate;
}

}  // namespace glms::cli

#endif  // GLMS_HAVE_CUDA
