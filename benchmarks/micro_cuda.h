// What the standalone CUDA micro-benchmarks (benchmarks/cuda_*.cu, which link no glmserve
// library) share: a checked CUDA call, and the exit status 77 (skipped) where there is no GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

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

// A device copy of `host`; the caller frees it with cudaFree.
template <class T>
T* to_device(const std::vector<T>& host) {
  T* device = nullptr;
  check(cudaMalloc(&device, host.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return device;
}

}  // namespace glms::benchmarks
