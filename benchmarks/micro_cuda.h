// What the standalone CUDA micro-benchmarks (benchmarks/cuda_*.cu, which link no glmserve
// library) share: a checked CUDA call, and the exit status 77 (skipped) where there is no GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace glms::benchmarks {

// Exits with 1 and "<what>: <CUDA error>" unless `status` is cudaSuccess.
inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// Whether a CUDA device is visible; says so on stderr when not (the caller returns 77).
inline bool has_cuda_device() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return true;
  std::fprintf(stderr, "no CUDA device\n");
  return false;
}

}  // namespace glms::benchmarks
