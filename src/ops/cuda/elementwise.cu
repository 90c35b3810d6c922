// Elementwise CUDA kernels. Norms use one block per row with a block-wide reduction (rows are
// at most a few thousand values: hidden 6144, q_lora 2048); the rest are one thread per value.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "core/bf16_terms.h"
#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/linear_fp8.h"

namespace glms::ops::cuda {

namespace {

constexpr int kNormThreads = 256;

__global__ void rope_kernel(float* x, int64_t rows, int heads, int64_t row_stride, int64_t offset, int half,
                            const int32_t* positions, const float* inv_freq) {
  chained_grid_prologue();
  GLMS_GRID_STRIDE_LOOP(i, rows * half) {
    const int64_t row = i / half;
    const int pair = static_cast<int>(i % half);
    rotate_pair(x + row * row_stride + offset + 2 * pair, inv_freq[pair] * static_cast<float>(positions[row / heads]));
  }
}

__global__ void gather_rows_kernel(const uint16_t* src, int64_t dim, const int32_t* rows, int divisor, uint16_t* out) {
  chained_grid_prologue();
  const uint16_t* from = src + static_cast<int64_t>(rows[blockIdx.x] / divisor) * dim;
  uint16_t* to = out + blockIdx.x * dim;
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) to[k] = from[k];
}

__global__ void embed_kernel(const uint16_t* table, const int32_t* ids, int64_t dim, float* x) {
  chained_grid_prologue();
  const uint16_t* src = table + static_cast<int64_t>(ids[blockIdx.x]) * dim;
  float* dst = x + blockIdx.x * dim;
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) dst[k] = bf16_to_float(src[k]);
}

// The bf16 terms of four values (core/bf16_terms.h) at float4 index q of planes holding `quads`
// float4s each: term 0 into plane0, terms 1 and 2 into low_planes ([2, 4 * quads]).
__device__ __forceinline__ void store_bf16_terms(float4 v, int64_t q, int64_t quads, uint16_t* plane0,
                                                 uint16_t* low_planes) {
  const float values[4] = {v.x, v.y, v.z, v.w};
  uint16_t split[4][3];
#pragma unroll
  for (int i = 0; i < 4; ++i) bf16_terms(values[i], split[i]);
  uint16_t* const planes[3] = {plane0, low_planes, low_planes + 4 * quads};
#pragma unroll
  for (int k = 0; k < 3; ++k)
    reinterpret_cast<uint2*>(planes[k])[q] = make_uint2(split[0][k] | static_cast<uint32_t>(split[1][k]) << 16,
                                                        split[2][k] | static_cast<uint32_t>(split[3][k]) << 16);
}

// Delta: the block output's rows, fp32 or bf16 (float or uint16_t), read as fp32.
template <typename Delta>
__global__ void residual_rms_norm_kernel(float* x, const Delta* delta, const float* addend, int64_t dim,
                                         const float* weight, float eps, float* y_f32, uint16_t* y_bf16,
                                         uint16_t* y_low_terms) {
  chained_grid_prologue();
  __shared__ float scratch[32];
  float* row = x + blockIdx.x * dim;
  float sum = 0.0f;
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) {
    float v = row[k];
    if (delta) {
      const float d = load_as_float(delta + blockIdx.x * dim + k);
      row[k] = v = v + (addend ? d + addend[blockIdx.x * dim + k] : d);
    }
    sum += v * v;
  }
  const float inv = rsqrtf(block_sum(sum, scratch) / static_cast<float>(dim) + eps);
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) {
    const float y = weight[k] * (row[k] * inv);
    const int64_t at = blockIdx.x * dim + k;
    if (y_f32) y_f32[at] = y;
    if (y_low_terms) {
      uint16_t split[3];
      bf16_terms(y, split);
      y_bf16[at] = split[0];
      y_low_terms[at] = split[1];
      y_low_terms[int64_t{gridDim.x} * dim + at] = split[2];
    } else if (y_bf16) {
      y_bf16[at] = float_to_bf16(y);
    }
  }
}

// Four bf16 values of a 128-column block whose other 124 are in the warp's other lanes as E4M3
// codes at `codes` with the block's scale at *scale (lane 0), as quantize_fp8_rows makes them
// from bf16 rows: scale = max |value| / 448 (1 for zeros), code = E4M3(value / scale).
__device__ __forceinline__ void store_e4m3_quad(uint32_t lo, uint32_t hi, uint8_t* codes, float* scale) {
  const float v[4] = {__uint_as_float(lo << 16), __uint_as_float(lo & 0xffff0000u), __uint_as_float(hi << 16),
                      __uint_as_float(hi & 0xffff0000u)};
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  const float s = activation_scale_over_lanes<32>(amax);
  *reinterpret_cast<uint32_t*>(codes) = static_cast<uint32_t>(e4m3_of(v[0], s)) |
                                        static_cast<uint32_t>(e4m3_of(v[1], s)) << 8 |
                                        static_cast<uint32_t>(e4m3_of(v[2], s)) << 16 |
                                        static_cast<uint32_t>(e4m3_of(v[3], s)) << 24;
  if (threadIdx.x % 32 == 0) *scale = s;
}

// The same over float4s held in registers: each thread loads its kVecs float4s of the row (and
// of delta and the weight) before using any, so that a lone decode row costs about one load
// latency instead of a chain of them, and the scaling pass reads no memory again. n: the rows.
// y_fp8.codes: y's bf16 rows also as E4M3 rows (Fp8Rows); a warp's float4s of one pass are one
// 128-column block (blockDim a multiple of 32, dim of 128), and the grid's blocks past n write
// the pad rows' zeros.
template <int kVecs, typename Delta>
__global__ void __launch_bounds__(1024)
    residual_rms_norm_vec_kernel(float* x, const Delta* delta, const float* addend, int64_t n, int64_t dim,
                                 const float* weight, float eps, float* y_f32, uint16_t* y_bf16,
                                 uint16_t* y_low_terms, Fp8Rows y_fp8) {
  chained_grid_prologue();
  __shared__ float scratch[32];
  const int64_t padded = gridDim.x;  // with y_fp8: fp8_padded_tokens(n) blocks
  if (blockIdx.x >= n) {  // a pad row of y_fp8
    for (int64_t k = threadIdx.x; k < dim / 4; k += blockDim.x)
      reinterpret_cast<uint32_t*>(y_fp8.codes + blockIdx.x * dim)[k] = 0;
    for (int64_t b = threadIdx.x; b < dim / kFp8ScaleBlock; b += blockDim.x)
      y_fp8.scales[b * padded + blockIdx.x] = 1.0f;
    return;
  }
  const int64_t vecs = dim / 4, offset = blockIdx.x * vecs;
  float4* row = reinterpret_cast<float4*>(x) + offset;
  const Delta* delta_row = delta ? delta + 4 * offset : nullptr;  // 4 values a vector
  const float4* addend_row = delta && addend ? reinterpret_cast<const float4*>(addend) + offset : nullptr;
  float4 v[kVecs], dv[kVecs], wv[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int64_t k = threadIdx.x + int64_t{i} * blockDim.x;
    if (k >= vecs) break;
    v[i] = row[k];
    if (delta_row) dv[i] = load4_as_float(delta_row + 4 * k);
    if (addend_row) {
      const float4 a = addend_row[k];
      dv[i] = make_float4(dv[i].x + a.x, dv[i].y + a.y, dv[i].z + a.z, dv[i].w + a.w);
    }
    wv[i] = __ldg(reinterpret_cast<const float4*>(weight) + k);
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int64_t k = threadIdx.x + int64_t{i} * blockDim.x;
    if (k >= vecs) break;
    if (delta_row) {
      v[i] = make_float4(v[i].x + dv[i].x, v[i].y + dv[i].y, v[i].z + dv[i].z, v[i].w + dv[i].w);
      row[k] = v[i];
    }
    sum += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  }
  const float inv = rsqrtf(block_sum(sum, scratch) / static_cast<float>(dim) + eps);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int64_t k = threadIdx.x + int64_t{i} * blockDim.x;
    if (k >= vecs) break;
    const float4 y = make_float4(wv[i].x * (v[i].x * inv), wv[i].y * (v[i].y * inv), wv[i].z * (v[i].z * inv),
                                 wv[i].w * (v[i].w * inv));
    if (y_f32) reinterpret_cast<float4*>(y_f32)[offset + k] = y;
    // Term 0 of the bf16 terms is y rounded to bf16, as y_bf16 is without them.
    const uint32_t lo = float_to_bf16(y.x) | (static_cast<uint32_t>(float_to_bf16(y.y)) << 16);
    const uint32_t hi = float_to_bf16(y.z) | (static_cast<uint32_t>(float_to_bf16(y.w)) << 16);
    if (y_low_terms) store_bf16_terms(y, offset + k, n * vecs, y_bf16, y_low_terms);
    else if (y_bf16) reinterpret_cast<uint2*>(y_bf16)[offset + k] = make_uint2(lo, hi);
    if (y_fp8.codes)
      store_e4m3_quad(lo, hi, y_fp8.codes + 4 * (offset + k), y_fp8.scales + k / 32 * padded + blockIdx.x);
  }
}

// A block per row. Each thread keeps the first of its strided values that is largest, then the
// block keeps the largest of those, lower index on equal values.
constexpr int kArgmaxThreads = 1024;
__device__ __forceinline__ void keep_better(float& best, int& best_index, float v, int index) {
  if (index >= 0 && (best_index < 0 || v > best || (v == best && index < best_index))) {
    best = v;
    best_index = index;
  }
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_rows_kernel(const float* x, int64_t cols, int32_t* out) {
  chained_grid_prologue();
  __shared__ float warp_best[32];
  __shared__ int warp_index[32];
  const float* row = x + blockIdx.x * cols;
  float best = -INFINITY;
  int best_index = -1;
#pragma unroll 8
  for (int64_t k = threadIdx.x; k < cols; k += kArgmaxThreads) {
    const float v = row[k];
    if (v == v && (best_index < 0 || v > best)) {  // NaN never compares
      best = v;
      best_index = static_cast<int>(k);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2)
    keep_better(best, best_index, __shfl_xor_sync(0xffffffffu, best, offset),
                __shfl_xor_sync(0xffffffffu, best_index, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best, warp_index[warp] = best_index;
  __syncthreads();
  if (warp == 0) {
    best = warp_best[lane];
    best_index = warp_index[lane];
    for (int offset = 16; offset > 0; offset /= 2)
      keep_better(best, best_index, __shfl_xor_sync(0xffffffffu, best, offset),
                  __shfl_xor_sync(0xffffffffu, best_index, offset));
    if (lane == 0) out[blockIdx.x] = best_index < 0 ? 0 : best_index;
  }
}

// out[t, j] = bf16(silu(gate_up[t, j]) * gate_up[t, inter + j]), gate_up fp32 or bf16; four
// columns a thread where inter allows (one division a column held it to 2.1 TB/s at prefill sizes).
// out_fp8.codes (inter a multiple of 128): out's rows also (out null: only) as E4M3 rows
// (Fp8Rows) of `rows` (fp8_padded_tokens(n); else n), the pad rows' zeros included; a warp's 32
// quads of a pass are one 128-column block of a row (the grid's threads a multiple of 32).
template <typename In>
__global__ void silu_mul_to_bf16_kernel(const In* gate_up, int64_t n, int64_t rows, int64_t inter, uint16_t* out,
                                        Fp8Rows out_fp8) {
  chained_grid_prologue();
  if (inter % 4 == 0) {
    const int64_t quads = inter / 4;
    GLMS_GRID_STRIDE_LOOP(q, rows * quads) {
      const int64_t t = q / quads, j = 4 * (q - t * quads);
      uint32_t lo = 0, hi = 0;  // a pad row's zeros
      if (t < n) {
        const float4 gate = load4_as_float(gate_up + t * 2 * inter + j);
        const float4 up = load4_as_float(gate_up + t * 2 * inter + inter + j);
        lo = pack_bf16_pair(silu_mul(gate.x, up.x), silu_mul(gate.y, up.y));
        hi = pack_bf16_pair(silu_mul(gate.z, up.z), silu_mul(gate.w, up.w));
        if (out) *reinterpret_cast<uint2*>(out + t * inter + j) = make_uint2(lo, hi);
      }
      if (out_fp8.codes)
        store_e4m3_quad(lo, hi, out_fp8.codes + t * inter + j, out_fp8.scales + j / kFp8ScaleBlock * rows + t);
    }
    return;
  }
  GLMS_GRID_STRIDE_LOOP(i, n * inter) {
    const int64_t t = i / inter, j = i % inter;
    out[i] = float_to_bf16(
        silu_mul(load_as_float(gate_up + t * 2 * inter + j), load_as_float(gate_up + t * 2 * inter + inter + j)));
  }
}

__global__ void fill_uniform_bf16_kernel(uint16_t* out, int64_t count, uint64_t seed, float scale) {
  chained_grid_prologue();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = float_to_bf16(scale * uniform_at(seed, i));
}

__global__ void fill_uniform_f32_kernel(float* out, int64_t count, uint64_t seed, float scale) {
  chained_grid_prologue();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = scale * uniform_at(seed, i);
}

__global__ void fill_uniform_e4m3_kernel(uint8_t* out, int64_t count, uint64_t seed) {
  chained_grid_prologue();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __nv_cvt_float_to_fp8(448.0f * uniform_at(seed, i), __NV_SATFINITE, __NV_E4M3);
}

__global__ void fill_random_bytes_kernel(uint8_t* out, int64_t count, uint64_t seed) {
  chained_grid_prologue();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = static_cast<uint8_t>(static_cast<int>((uniform_at(seed, i) + 1.0f) * 128.0f) & 0xff);
}

__global__ void fill_f32_kernel(float* out, int64_t count, float value) {
  chained_grid_prologue();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) out[i] = value;
}

__global__ void add_f32_kernel(const float* a, const float* b, float* out, int64_t count) {
  chained_grid_prologue();
  GLMS_GRID_STRIDE_LOOP(i, count) out[i] = a[i] + b[i];
}

struct SimulatedGatherArgs {
  SimulatedGatherPart parts[kMaxSimulatedGatherParts];
  int num_parts, slots, rank, num_experts;
};

// Grid (blocks over the largest part's 16-byte chunks, slot, part).
__global__ void simulated_all_gather_kernel(SimulatedGatherArgs a) {
  chained_grid_prologue();
  const SimulatedGatherPart& part = a.parts[blockIdx.z];
  const int slot = blockIdx.y;
  const int64_t words = part.bytes / 4, i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const auto* in = static_cast<const int32_t*>(part.send);
  int32_t* out = static_cast<int32_t*>(part.recv) + slot * words;
  if (part.shift_experts) {
    const int shift = (slot - a.rank + a.slots) % a.slots * (a.num_experts / a.slots);
    for (int64_t w = i; w < words; w += static_cast<int64_t>(gridDim.x) * blockDim.x)
      out[w] = in[w] < 0 ? in[w] : (in[w] + shift) % a.num_experts;
    return;
  }
  const bool vectors = words % 4 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vectors) {
    for (int64_t v = i; v < words / 4; v += static_cast<int64_t>(gridDim.x) * blockDim.x)
      reinterpret_cast<uint4*>(out)[v] = reinterpret_cast<const uint4*>(in)[v];
    return;
  }
  for (int64_t w = i; w < words; w += static_cast<int64_t>(gridDim.x) * blockDim.x) out[w] = in[w];
}

}  // namespace

void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

int current_device() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

int multiprocessor_count() {
  static const int count = [] {
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, current_device()), "cudaDeviceGetAttribute");
    return sms;
  }();
  return count;
}

void synchronize_stream(cudaStream_t stream) { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }

void simulated_all_gather(const SimulatedGatherPart* parts, int num_parts, int slots, int rank, int num_experts,
                          cudaStream_t stream) {
  GLMS_CHECK(num_parts >= 0 && num_parts <= kMaxSimulatedGatherParts, "simulated_all_gather: at most 4 parts");
  if (num_parts == 0 || slots <= 0) return;
  SimulatedGatherArgs args{};
  int64_t largest = 0;
  for (int p = 0; p < num_parts; ++p) {
    GLMS_CHECK(parts[p].bytes % 4 == 0, "simulated_all_gather: whole 4-byte words");
    GLMS_CHECK(!parts[p].shift_experts || num_experts > 0, "simulated_all_gather: expert ids need num_experts");
    args.parts[p] = parts[p];
    largest = std::max(largest, parts[p].bytes);
  }
  args.num_parts = num_parts;
  args.slots = slots;
  args.rank = rank;
  args.num_experts = num_experts;
  const int64_t chunks = std::max<int64_t>(1, largest / 16);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(chunks, 256), 1024));
  launch_chained("simulated_all_gather launch", simulated_all_gather_kernel, dim3(blocks, slots, num_parts), 256, 0,
                 stream, args);
}

namespace {

__global__ void widen_bf16_kernel(const uint16_t* x, int64_t count, float* out) {
  chained_grid_prologue();
  GLMS_GRID_STRIDE_LOOP(i, count) out[i] = bf16_to_float(x[i]);
}

__global__ void round_to_bf16_kernel(const float* x, int64_t count, uint16_t* out) {
  chained_grid_prologue();
  GLMS_GRID_STRIDE_LOOP(i, count) out[i] = float_to_bf16(x[i]);
}

}  // namespace

void widen_bf16(const uint16_t* x, int64_t count, float* out, cudaStream_t stream) {
  if (count <= 0) return;
  launch_chained("widen_bf16 launch", widen_bf16_kernel, elementwise_blocks(count, 256), 256, 0, stream, x, count,
                 out);
}

void round_to_bf16(const float* x, int64_t count, uint16_t* out, cudaStream_t stream) {
  if (count <= 0) return;
  launch_chained("round_to_bf16 launch", round_to_bf16_kernel, elementwise_blocks(count, 256), 256, 0, stream, x,
                 count, out);
}

void add_f32(const float* a, const float* b, float* out, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  launch_chained("add_f32 launch", add_f32_kernel, elementwise_blocks(count, 256), 256, 0, stream, a, b, out, count);
}

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
  if (bytes == 0) return;
  const cudaError_t status = cudaMalloc(&data_, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    int device = 0;
    cudaGetDevice(&device);
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    char what[200];
    std::snprintf(what, sizeof what, "GPU %d is out of memory: cudaMalloc of %.2f GiB with %.2f GiB free of %.2f GiB",
                  device, static_cast<double>(bytes) / kGiB, static_cast<double>(free) / kGiB,
                  static_cast<double>(total) / kGiB);
    fail(what);
  }
  check(status, "cudaMalloc");
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
DeviceBuffer zeroed_buffer(size_t bytes) {
  DeviceBuffer buffer(bytes);
  check(cudaMemset(buffer.data(), 0, bytes), "cudaMemset");
  // Non-blocking streams are not ordered after the default stream's memset: wait for it here.
  check(cudaStreamSynchronize(nullptr), "cudaMemset's synchronisation");
  return buffer;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  GLMS_CHECK(bytes <= bytes_, "upload larger than the buffer");
  check(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}
void DeviceBuffer::download(void* host, size_t bytes) const {
  GLMS_CHECK(bytes <= bytes_, "download larger than the buffer");
  check(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

void rope_rows(float* x, int64_t n, int heads, int64_t row_stride, int64_t offset, int rope_dim,
               const int32_t* positions, const float* inv_freq, cudaStream_t stream) {
  const int half = rope_dim / 2;
  const int64_t rows = n * heads;
  if (rows == 0 || half == 0) return;
  launch_chained("rope launch", rope_kernel, elementwise_blocks(rows * half, 256), 256, 0, stream, x, rows, heads,
                 row_stride, offset, half, positions, inv_freq);
}

void gather_rows(const uint16_t* src, int64_t dim, const int32_t* rows, int64_t n, int divisor, uint16_t* out,
                 cudaStream_t stream) {
  if (n == 0) return;
  launch_chained("gather_rows launch", gather_rows_kernel, static_cast<unsigned>(n), 256, 0, stream, src, dim, rows,
                 divisor, out);
}

void embed_rows(const uint16_t* table, const int32_t* ids, int64_t n, int64_t dim, float* x, cudaStream_t stream) {
  if (n == 0) return;
  launch_chained("embed_rows launch", embed_kernel, static_cast<unsigned>(n), 256, 0, stream, table, ids, dim, x);
}

namespace {

template <typename Delta>
void residual_rms_norm_of(float* x, const Delta* delta, int64_t n, int64_t dim, const float* weight, float eps,
                          float* y_f32, uint16_t* y_bf16, cudaStream_t stream, const float* addend,
                          uint16_t* y_low_terms, Fp8Rows y_fp8) {
  auto aligned = [](const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const int64_t vecs = dim / 4;
  if (dim % 4 == 0 && vecs <= 4 * 1024 && aligned(x, 16) && aligned(delta, 4 * sizeof(Delta)) &&
      aligned(addend, 16) && aligned(weight, 16) && aligned(y_f32, 16) && aligned(y_bf16, 8) &&
      aligned(y_low_terms, 8)) {
    const int per_thread = vecs <= 2 * 1024 ? 2 : 4;
    const int64_t threads_needed = (vecs + per_thread - 1) / per_thread;  // at most 1024
    const int threads = static_cast<int>((threads_needed + 31) / 32 * 32);
    const auto blocks = static_cast<unsigned>(y_fp8.codes ? fp8_padded_tokens(n) : n);
    if (per_thread == 2)
      launch_chained("residual_rms_norm_vec launch", residual_rms_norm_vec_kernel<2, Delta>, blocks, threads, 0, stream,
                     x, delta, addend, n, dim, weight, eps, y_f32, y_bf16, y_low_terms, y_fp8);
    else
      launch_chained("residual_rms_norm launch", residual_rms_norm_vec_kernel<4, Delta>, blocks, threads, 0, stream, x,
                     delta, addend, n, dim, weight, eps, y_f32, y_bf16, y_low_terms, y_fp8);
    return;
  }
  // A row's loads are independent: enough threads that each issues a handful (a lone decode
  // row of 6144 values is otherwise a long chain of dependent-latency loops on one SM).
  const int threads = static_cast<int>(std::clamp<int64_t>((dim / 8 + 31) / 32 * 32, kNormThreads, 1024));
  launch_chained("residual_rms_norm launch", residual_rms_norm_kernel<Delta>, static_cast<unsigned>(n), threads, 0,
                 stream, x, delta, addend, dim, weight, eps, y_f32, y_bf16, y_low_terms);
  // Rows the vector kernel does not take: their E4M3 rows from the bf16 ones.
  if (y_fp8.codes) quantize_fp8_rows(y_bf16, n, dim, y_fp8.codes, y_fp8.scales, stream);
}

}  // namespace

void residual_rms_norm(float* x, const float* delta, int64_t n, int64_t dim, const float* weight, float eps,
                       float* y_f32, uint16_t* y_bf16, cudaStream_t stream, const float* addend,
                       uint16_t* y_low_terms, const uint16_t* delta_bf16, Fp8Rows y_fp8) {
  GLMS_CHECK(y_low_terms == nullptr || y_bf16 != nullptr, "residual_rms_norm: the low terms come with y_bf16");
  GLMS_CHECK(!(delta && delta_bf16), "residual_rms_norm: one delta, fp32 or bf16");
  if (n == 0) return;
  GLMS_CHECK(y_fp8.codes == nullptr || (y_fp8.scales != nullptr && y_bf16 != nullptr && dim % kFp8ScaleBlock == 0),
             "residual_rms_norm: E4M3 rows come with y_bf16, scales and whole 128-column blocks");
  if (delta_bf16)
    residual_rms_norm_of(x, delta_bf16, n, dim, weight, eps, y_f32, y_bf16, stream, addend, y_low_terms, y_fp8);
  else
    residual_rms_norm_of(x, delta, n, dim, weight, eps, y_f32, y_bf16, stream, addend, y_low_terms, y_fp8);
}

namespace {
template <typename In>
void launch_silu_mul(const In* gate_up, int64_t n, int64_t inter, uint16_t* out, cudaStream_t stream,
                     Fp8Rows out_fp8) {
  if (n * inter == 0) return;
  GLMS_CHECK(out_fp8.codes == nullptr || (out_fp8.scales != nullptr && inter % kFp8ScaleBlock == 0),
             "silu_mul_to_bf16: E4M3 rows come with scales and whole 128-column blocks");
  GLMS_CHECK(out != nullptr || out_fp8.codes != nullptr, "silu_mul_to_bf16: no output");
  const int64_t rows = out_fp8.codes ? fp8_padded_tokens(n) : n;
  const int64_t items = inter % 4 == 0 ? rows * inter / 4 : n * inter;
  launch_chained("silu_mul_to_bf16 launch", silu_mul_to_bf16_kernel<In>, elementwise_blocks(items, 256), 256, 0,
                 stream, gate_up, n, rows, inter, out, out_fp8);
}
}  // namespace

void silu_mul_to_bf16(const float* gate_up, int64_t n, int64_t inter, uint16_t* out, cudaStream_t stream,
                      Fp8Rows out_fp8) {
  launch_silu_mul(gate_up, n, inter, out, stream, out_fp8);
}

void silu_mul_to_bf16(const uint16_t* gate_up, int64_t n, int64_t inter, uint16_t* out, cudaStream_t stream,
                      Fp8Rows out_fp8) {
  launch_silu_mul(gate_up, n, inter, out, stream, out_fp8);
}

namespace {
unsigned fill_blocks(int64_t count) { return static_cast<unsigned>(std::min<int64_t>(blocks_for(count, 256), 65536)); }
}  // namespace

void fill_uniform_bf16(uint16_t* out, int64_t count, uint64_t seed, float scale, cudaStream_t stream) {
  if (count == 0) return;
  launch_chained("fill_uniform_bf16 launch", fill_uniform_bf16_kernel, fill_blocks(count), 256, 0, stream, out, count,
                 seed, scale);
}

void fill_uniform_f32(float* out, int64_t count, uint64_t seed, float scale, cudaStream_t stream) {
  if (count == 0) return;
  launch_chained("fill_uniform_f32 launch", fill_uniform_f32_kernel, fill_blocks(count), 256, 0, stream, out, count,
                 seed, scale);
}

void fill_uniform_e4m3(uint8_t* out, int64_t count, uint64_t seed, cudaStream_t stream) {
  if (count == 0) return;
  launch_chained("fill_uniform_e4m3 launch", fill_uniform_e4m3_kernel, fill_blocks(count), 256, 0, stream, out, count,
                 seed);
}

void fill_random_bytes(uint8_t* out, int64_t count, uint64_t seed, cudaStream_t stream) {
  if (count == 0) return;
  launch_chained("fill_random_bytes launch", fill_random_bytes_kernel, fill_blocks(count), 256, 0, stream, out, count,
                 seed);
}

void fill_bytes(uint8_t* out, int64_t count, uint8_t value, cudaStream_t stream) {
  if (count == 0) return;
  check(cudaMemsetAsync(out, value, static_cast<size_t>(count), stream), "fill_bytes");
}

void fill_f32(float* out, int64_t count, float value, cudaStream_t stream) {
  if (count == 0) return;
  launch_chained("fill_f32 launch", fill_f32_kernel, blocks_for(count, 256), 256, 0, stream, out, count, value);
}

void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  GLMS_CHECK(cols > 0 && cols <= 0x7fffffff, "argmax_rows: 1 to 2^31 - 1 columns");
  launch_chained("argmax_rows launch", argmax_rows_kernel, static_cast<unsigned>(rows), kArgmaxThreads, 0, stream, x,
                 cols, out);
}

}  // namespace glms::ops::cuda
