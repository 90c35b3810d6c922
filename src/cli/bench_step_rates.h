// The device's measured rates that bench-step states its figures against: device-to-device copy
// bandwidth, the bf16 GEMM rate of the model's cuBLAS call and the block-scaled FP8 GEMM rate.
// CUDA builds only.
#pragma once

#ifdef GLMS_HAVE_CUDA

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace glms::cli {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start);

// Device-to-device copy of `bytes`: (read + written) bytes per second.
double measure_copy_bandwidth(size_t bytes);

// bf16 GEMM n^3 through the same cuBLAS call the model uses: FLOP/s.
double measure_gemm_rate(int64_t n);

// Block-scaled FP8 GEMM n^3 through ops::cuda::Fp8Gemm (W8A8, cuBLASLt): FLOP/s of the GEMM
// alone and with the activations' quantisation (what a layer would pay), or an error where
// cuBLASLt declines block scaling on this device.
struct Fp8GemmRate {
  double gemm = 0.0, with_quantize = 0.0;
  std::string error;
};
Fp8GemmRate measure_fp8_gemm_rate(int64_t n);

}  // namespace glms::cli

#endif  // GLMS_HAVE_CUDA
