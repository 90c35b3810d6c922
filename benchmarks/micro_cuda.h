// What the standalone CUDA micro-benchmarks (benchmarks/cuda_*.cu, which link no glmserve
// library) share: a checked CUDA call, the exit status 77 (skipped) where there is no GPU, device
// copies and the median of event-timed launches.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
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

// The median time in microseconds of `reps` event-timed calls of launch() after `warmups` untimed
// ones; before() runs ahead of each, outside the timing (e.g. zeroing an output the launch adds into).
template <class Launch, class Before>
double median_time_us(Launch&& launch, Before&& before, int reps = 20, int warmups = 2) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<float> times;
  for (int rep = 0; rep < warmups + reps; ++rep) {
    before();
    check(cudaEventRecord(start), "record");
    launch();
    check(cudaGetLastError(), "launch");
    check(cudaEventRecord(stop), "record");
    check(cudaEventSynchronize(stop), "timed launch");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (rep >= warmups) times.push_back(ms);
  }
  check(cudaEventDestroy(start), "event");
  check(cudaEventDestroy(stop), "event");
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] * 1e3;
}

}  // namespace glms::benchmarks
