// Elementwise CUDA kernels. Norms use one block per row with a block-wide reduction (rows are
// at most a few thousand values: hidden 6144, q_lora 2048); the rest are one thread per value.
#include <cuda_runtime.h>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace glms::ops::cuda {

namespace {

constexpr int kNormThreads = 256;

__global__ void rms_norm_kernel(const float* x, int64_t dim, const float* weight, float eps, float* y) {
  const float* row = x + blockIdx.x * dim;
  float* out = y + blockIdx.x * dim;
  float sum = 0.0f;
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) sum += row[k] * row[k];
  __shared__ float partial[kNormThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    sum = threadIdx.x < kNormThreads / 32 ? partial[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (threadIdx.x == 0) partial[0] = sum;
  }
  __syncthreads();
  const float inv = rsqrtf(partial[0] / static_cast<float>(dim) + eps);
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) out[k] = weight[k] * (row[k] * inv);
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t count) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

__global__ void rope_kernel(float* x, int64_t n, int64_t row_stride, int64_t offset, int half,
                            const int32_t* positions, const float* inv_freq) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * half) return;
  const int64_t t = i / half;
  const int pair = static_cast<int>(i % half);
  float* v = x + t * row_stride + offset + 2 * pair;
  float s, c;
  sincosf(inv_freq[pair] * static_cast<float>(positions[t]), &s, &c);
  const float a = v[0], b = v[1];
  v[0] = a * c - b * s;
  v[1] = b * c + a * s;
}

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t count) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  uint32_t word = __float_as_uint(x[i]);
  if ((word & 0x7fffffffu) > 0x7f800000u) {
    y[i] = static_cast<uint16_t>((word >> 16) | 0x40);
    return;
  }
  word += 0x7fffu + ((word >> 16) & 1u);
  y[i] = static_cast<uint16_t>(word >> 16);
}

unsigned blocks_for(int64_t count, int threads) { return static_cast<unsigned>((count + threads - 1) / threads); }

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

void check(int status, const char* what) {
  if (status != cudaSuccess)
    fail(std::string(what) + ": " + cudaGetErrorString(static_cast<cudaError_t>(status)));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) check(cudaMalloc(&data_, bytes), "cudaMalloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}
void DeviceBuffer::upload(const void* host, size_t bytes) {
  GLMS_CHECK(bytes <= bytes_, "upload larger than the buffer");
  check(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}
void DeviceBuffer::download(void* host, size_t bytes) const {
  GLMS_CHECK(bytes <= bytes_, "download larger than the buffer");
  check(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

void rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y, cudaStream_t stream) {
  if (n == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(n), kNormThreads, 0, stream>>>(x, dim, weight, eps, y);
  check(cudaGetLastError(), "rms_norm launch");
}

void silu_mul(const float* gate, const float* up, float* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  silu_mul_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(gate, up, out, count);
  check(cudaGetLastError(), "silu_mul launch");
}

void rope_interleaved(float* x, int64_t n, int64_t row_stride, int64_t offset, int rope_dim, const int32_t* positions,
                      const float* inv_freq, cudaStream_t stream) {
  const int half = rope_dim / 2;
  if (n == 0 || half == 0) return;
  rope_kernel<<<blocks_for(n * half, 256), 256, 0, stream>>>(x, n, row_stride, offset, half, positions, inv_freq);
  check(cudaGetLastError(), "rope launch");
}

void to_bf16(const float* x, uint16_t* y, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  to_bf16_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(x, y, count);
  check(cudaGetLastError(), "to_bf16 launch");
}

}  // namespace glms::ops::cuda
