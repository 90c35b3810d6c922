// CUDA implementations of the op API's elementwise ops and the bf16 linear, over device
// buffers. All functions take device pointers, enqueue on `stream`, and check every CUDA call
// (a failure throws glms::Error naming the call). Parity with ops/cpu is tested in
// tests/ops/test_cuda_ops.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace glms::ops::cuda {

// Number of CUDA devices visible (0 when no driver or no GPU: callers skip).
int device_count();

// Throws glms::Error("<what>: <CUDA error string>") unless `status` is cudaSuccess.
void check(int status, const char* what);

// A device allocation (cudaMalloc), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// y[n, dim] = x * rsqrt(mean(x^2) + eps) * weight, one block per row; in-place allowed.
void rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y, cudaStream_t stream);
// out[i] = silu(gate[i]) * up[i].
void silu_mul(const float* gate, const float* up, float* out, int64_t count, cudaStream_t stream);
// Interleaved-pair RoPE on rows of `x` [n, row_stride]: the `rope_dim` values at column
// `offset` of row t rotate by positions[t] * inv_freq[i] (inv_freq on the device, [rope_dim/2]).
void rope_interleaved(float* x, int64_t n, int64_t row_stride, int64_t offset, int rope_dim, const int32_t* positions,
                      const float* inv_freq, cudaStream_t stream);
// fp32 -> bf16 (round to nearest even), for activations entering bf16 GEMMs.
void to_bf16(const float* x, uint16_t* y, int64_t count, cudaStream_t stream);

// y[n, rows] (fp32) = x[n, cols] (bf16) . w[rows, cols]^T (bf16), fp32 accumulation (cuBLAS).
class Bf16Linear {
 public:
  Bf16Linear();
  ~Bf16Linear();
  Bf16Linear(const Bf16Linear&) = delete;
  Bf16Linear& operator=(const Bf16Linear&) = delete;
  void run(const uint16_t* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols, float* y,
           cudaStream_t stream);

 private:
  void* handle_ = nullptr;  // cublasHandle_t
};

}  // namespace glms::ops::cuda
