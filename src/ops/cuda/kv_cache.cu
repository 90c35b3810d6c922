// Writes of the paged cache's rows, one block per token: the norm needs the whole row, and an
// FP8 group's scale its 128 values, so a block holds the token's normalised row in shared memory
// (FP8) or writes each value as it is normalised (bf16).
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/kv_cache.h"
#include "ops/cuda/launch.cuh"
#include "quant/kv_fp8.h"

namespace glms::ops::cuda {

namespace {

// Largest magnitude over the block (as block_sum: blockDim.x a multiple of 32, every thread gets it).
__device__ __forceinline__ float block_amax(float v, float* scratch) {
  v = warp_max(fabsf(v));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_max(v);
}

// values[0, count) (shared memory) as E4M3 codes of their group's amax / 448 into codes, the
// groups' scales into scales. A warp a group of 128; the block synchronises once.
__device__ __forceinline__ void quantize_groups(const float* values, int count, uint8_t* codes, float* scales,
                                                float* group_scales) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int groups = quant::kv_fp8_groups(count);
  for (int g = warp; g < groups; g += warps) {
    const int begin = g * quant::kKvFp8GroupValues, end = min(count, begin + quant::kKvFp8GroupValues);
    float amax = 0.0f;
    for (int k = begin + lane; k < end; k += 32) amax = fmaxf(amax, fabsf(values[k]));
    const float scale = e4m3_scale_of(warp_max(amax));
    if (lane == 0) group_scales[g] = scales[g] = scale;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < count; k += blockDim.x) {
    const float scale = group_scales[k / quant::kKvFp8GroupValues];
    codes[k] = scale > 0.0f ? e4m3_of(values[k], scale) : 0;
  }
}

// Token t's row, by the whole block: RMSNorm of the latent, RoPE of the rope key, into the row
// in kStorage. scratch: [32]; shared (kFp8): [latent_dim] normalised values, then [groups] scales.
template <CacheStorage kStorage>
__device__ __forceinline__ void latent_row(const float* kv, int t, int latent_dim, int rope_dim,
                                           const float* norm_weight, float eps, const int32_t* positions,
                                           const int64_t* slot_mapping, const float* inv_freq, uint8_t* cache,
                                           float* scratch, float* shared) {
  const int row_size = latent_dim + rope_dim;
  const float* src = kv + static_cast<int64_t>(t) * row_size;
  const int64_t slot = slot_mapping[t];
  float sum = 0.0f;
  for (int k = threadIdx.x; k < latent_dim; k += blockDim.x) sum += src[k] * src[k];
  const float inv = rsqrtf(block_sum(sum, scratch) / static_cast<float>(latent_dim) + eps);
  uint16_t* rope_out;
  if constexpr (kStorage == CacheStorage::kBf16) {
    uint16_t* row = reinterpret_cast<uint16_t*>(cache) + slot * row_size;
    for (int k = threadIdx.x; k < latent_dim; k += blockDim.x) row[k] = float_to_bf16(norm_weight[k] * (src[k] * inv));
    rope_out = row + latent_dim;
  } else {
    uint8_t* row = cache + slot * quant::kv_fp8_row_bytes(latent_dim, rope_dim);
    for (int k = threadIdx.x; k < latent_dim; k += blockDim.x) shared[k] = norm_weight[k] * (src[k] * inv);
    __syncthreads();
    quantize_groups(shared, latent_dim, row, reinterpret_cast<float*>(row + quant::kv_fp8_scales_offset(latent_dim)),
                    shared + latent_dim);
    rope_out = reinterpret_cast<uint16_t*>(row + quant::kv_fp8_rope_offset(latent_dim));
  }
  const float position = static_cast<float>(positions[t]);
  for (int pair = threadIdx.x; pair < rope_dim / 2; pair += blockDim.x) {
    float v[2] = {src[latent_dim + 2 * pair], src[latent_dim + 2 * pair + 1]};
    rotate_pair(v, inv_freq[pair] * position);
    rope_out[2 * pair] = float_to_bf16(v[0]);
    rope_out[2 * pair + 1] = float_to_bf16(v[1]);
  }
}

// One block per token.
template <CacheStorage kStorage>
__global__ void write_latent_cache_kernel(const float* kv, int latent_dim, int rope_dim, const float* norm_weight,
                                          float eps, const int32_t* positions, const int64_t* slot_mapping,
                                          const float* inv_freq, uint8_t* cache) {
  chained_grid_prologue();
  __shared__ float scratch[32];
  extern __shared__ float shared[];
  latent_row<kStorage>(kv, static_cast<int>(blockIdx.x), latent_dim, rope_dim, norm_weight, eps, positions,
                       slot_mapping, inv_freq, cache, scratch, shared);
}

// Token t's indexer key, by the whole block: LayerNorm, RoPE on the first rope_dim values, into
// the key slot (bf16, or E4M3 codes with one scale when key_scales is given). scratch: [32];
// normed: [dim].
__device__ __forceinline__ void indexer_key_row(const float* keys, int t, int dim, int rope_dim, const float* ln_weight,
                                                const float* ln_bias, float eps, const int32_t* positions,
                                                const int64_t* slot_mapping, const float* inv_freq, void* key_cache,
                                                float* key_scales, float* scratch, float* normed) {
  const float* src = keys + static_cast<int64_t>(t) * dim;
  float sum = 0.0f;
  for (int k = threadIdx.x; k < dim; k += blockDim.x) sum += src[k];
  const float mean = block_sum(sum, scratch) / static_cast<float>(dim);
  float squares = 0.0f;
  for (int k = threadIdx.x; k < dim; k += blockDim.x) squares += (src[k] - mean) * (src[k] - mean);
  const float inv = rsqrtf(block_sum(squares, scratch) / static_cast<float>(dim) + eps);
  for (int k = threadIdx.x; k < dim; k += blockDim.x) normed[k] = (src[k] - mean) * inv * ln_weight[k] + ln_bias[k];
  __syncthreads();
  const float position = static_cast<float>(positions[t]);
  for (int pair = threadIdx.x; pair < rope_dim / 2; pair += blockDim.x)
    rotate_pair(normed + 2 * pair, inv_freq[pair] * position);
  __syncthreads();
  const int64_t slot = slot_mapping[t];
  if (key_scales == nullptr) {
    uint16_t* dst = static_cast<uint16_t*>(key_cache) + slot * dim;
    for (int k = threadIdx.x; k < dim; k += blockDim.x) dst[k] = float_to_bf16(normed[k]);
    return;
  }
  float amax = 0.0f;
  for (int k = threadIdx.x; k < dim; k += blockDim.x) amax = fmaxf(amax, fabsf(normed[k]));
  const float scale = e4m3_scale_of(block_amax(amax, scratch));
  uint8_t* dst = static_cast<uint8_t*>(key_cache) + slot * dim;
  for (int k = threadIdx.x; k < dim; k += blockDim.x) dst[k] = scale > 0.0f ? e4m3_of(normed[k], scale) : 0;
  if (threadIdx.x == 0) key_scales[slot] = scale;
}

// One block per token.
__global__ void write_indexer_keys_kernel(const float* keys, int dim, int rope_dim, const float* ln_weight,
                                          const float* ln_bias, float eps, const int32_t* positions,
                                          const int64_t* slot_mapping, const float* inv_freq, void* key_cache,
                                          float* key_scales) {
  chained_grid_prologue();
  __shared__ float scratch[32];
  extern __shared__ float normed[];
  indexer_key_row(keys, static_cast<int>(blockIdx.x), dim, rope_dim, ln_weight, ln_bias, eps, positions, slot_mapping,
                  inv_freq, key_cache, key_scales, scratch, normed);
}

// Token t's q_a row, by the whole block: out[t] = bf16(rms_norm(q[t]) * weight). Four values a
// load where the rows allow (q_a's 2048 on 512 threads: one load latency, as the
// residual_rms_norm kernels manage).
__device__ __forceinline__ void normed_row_bf16(const float* q, int t, int dim, const float* weight, float eps,
                                                uint16_t* out, float* scratch) {
  const float* src = q + static_cast<int64_t>(t) * dim;
  uint16_t* dst = out + static_cast<int64_t>(t) * dim;
  const bool by_four = dim % 4 == 0 && (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(weight)) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(dst) % 8 == 0;
  float sum = 0.0f;
  if (by_four) {
    for (int v = threadIdx.x; v < dim / 4; v += blockDim.x) {
      const float4 x = reinterpret_cast<const float4*>(src)[v];
      sum += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
    }
  } else {
    for (int k = threadIdx.x; k < dim; k += blockDim.x) sum += src[k] * src[k];
  }
  const float inv = rsqrtf(block_sum(sum, scratch) / static_cast<float>(dim) + eps);
  if (by_four) {
    for (int v = threadIdx.x; v < dim / 4; v += blockDim.x) {
      const float4 x = reinterpret_cast<const float4*>(src)[v];
      const float4 w = __ldg(reinterpret_cast<const float4*>(weight) + v);
      reinterpret_cast<uint2*>(dst)[v] =
          make_uint2(float_to_bf16(w.x * (x.x * inv)) | static_cast<uint32_t>(float_to_bf16(w.y * (x.y * inv))) << 16,
                     float_to_bf16(w.z * (x.z * inv)) | static_cast<uint32_t>(float_to_bf16(w.w * (x.w * inv))) << 16);
    }
    return;
  }
  for (int k = threadIdx.x; k < dim; k += blockDim.x) dst[k] = float_to_bf16(weight[k] * (src[k] * inv));
}

// Grid (token, job): job 0 the q_a row, 1 the latent row, 2 the indexer key.
template <CacheStorage kStorage>
__global__ void write_projection_rows_kernel(ProjectionRows r) {
  chained_grid_prologue();
  __shared__ float scratch[32];
  extern __shared__ float shared[];
  const int t = static_cast<int>(blockIdx.x);
  if (blockIdx.y == 0)
    normed_row_bf16(r.q, t, r.q_dim, r.q_norm_weight, r.q_eps, r.q_bf16, scratch);
  else if (blockIdx.y == 1)
    latent_row<kStorage>(r.kv, t, r.latent_dim, r.rope_dim, r.kv_norm_weight, r.kv_eps, r.positions, r.slot_mapping,
                         r.inv_freq, static_cast<uint8_t*>(r.cache), scratch, shared);
  else
    indexer_key_row(r.keys, t, r.key_dim, r.rope_dim, r.key_ln_weight, r.key_ln_bias, r.key_eps, r.positions,
                    r.slot_mapping, r.inv_freq, r.key_cache, r.key_scales, scratch, shared);
}

// A thread per (slot, byte-sized element) of FP8 rows: codes of uniform values in [-448, 448]
// with scale 1 / 448, the rope key uniform bf16.
__global__ void fill_fp8_rows_kernel(uint8_t* cache, int64_t num_slots, int latent_dim, int rope_dim, uint64_t seed) {
  chained_grid_prologue();
  const int row_bytes = quant::kv_fp8_row_bytes(latent_dim, rope_dim), groups = quant::kv_fp8_groups(latent_dim);
  const int per_row = latent_dim + groups + rope_dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < num_slots * per_row;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t slot = i / per_row;
    const int k = static_cast<int>(i % per_row);
    uint8_t* row = cache + slot * row_bytes;
    if (k < latent_dim)
      row[k] = e4m3_of(kE4m3Max * uniform_at(seed, i), 1.0f);
    else if (k < latent_dim + groups)
      reinterpret_cast<float*>(row + quant::kv_fp8_scales_offset(latent_dim))[k - latent_dim] = 1.0f / kE4m3Max;
    else
      reinterpret_cast<uint16_t*>(row + quant::kv_fp8_rope_offset(latent_dim))[k - latent_dim - groups] =
          float_to_bf16(uniform_at(seed, i));
  }
}

__global__ void fill_fp8_keys_kernel(uint8_t* codes, float* scales, int64_t num_slots, int dim, uint64_t seed) {
  chained_grid_prologue();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < num_slots * dim;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    codes[i] = e4m3_of(kE4m3Max * uniform_at(seed, i), 1.0f);
    if (i % dim == 0) scales[i / dim] = 1.0f / kE4m3Max;
  }
}

unsigned fill_grid(int64_t count) { return static_cast<unsigned>(std::clamp<int64_t>(blocks_for(count, 256), 1, 65536)); }

// A thread per latent value: one load latency per pass for a lone decode token.
int latent_threads(int latent_dim) { return std::clamp((latent_dim + 31) / 32 * 32, 128, 1024); }

}  // namespace

void write_latent_cache(const float* kv, int64_t n, int latent_dim, int rope_dim, const float* norm_weight,
                        float eps, const int32_t* positions, const int64_t* slot_mapping, const float* inv_freq,
                        void* cache, CacheStorage storage, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = latent_threads(latent_dim);
  auto* rows = static_cast<uint8_t*>(cache);
  if (storage == CacheStorage::kBf16) {
    launch_chained("write_latent_cache launch", write_latent_cache_kernel<CacheStorage::kBf16>,
                   static_cast<unsigned>(n), threads, 0, stream, kv, latent_dim, rope_dim, norm_weight, eps, positions,
                   slot_mapping, inv_freq, rows);
  } else {
    const size_t shared = sizeof(float) * (latent_dim + quant::kv_fp8_groups(latent_dim));
    launch_chained("write_latent_cache launch", write_latent_cache_kernel<CacheStorage::kFp8>, static_cast<unsigned>(n),
                   threads, shared, stream, kv, latent_dim, rope_dim, norm_weight, eps, positions, slot_mapping,
                   inv_freq, rows);
  }
}

void write_indexer_keys(const float* keys, int64_t n, int dim, int rope_dim, const float* ln_weight,
                        const float* ln_bias, float eps, const int32_t* positions, const int64_t* slot_mapping,
                        const float* inv_freq, void* key_cache, float* key_scales, cudaStream_t stream) {
  if (n == 0) return;
  launch_chained("write_indexer_keys launch", write_indexer_keys_kernel, static_cast<unsigned>(n), 128,
                 dim * sizeof(float), stream, keys, dim, rope_dim, ln_weight, ln_bias, eps, positions, slot_mapping,
                 inv_freq, key_cache, key_scales);
}

void write_projection_rows(const ProjectionRows& rows, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned jobs = rows.keys ? 3 : 2;
  const int threads = latent_threads(rows.latent_dim);
  size_t shared = rows.keys ? sizeof(float) * rows.key_dim : 0;
  if (rows.storage == CacheStorage::kFp8)
    shared = std::max(shared, sizeof(float) * (rows.latent_dim + quant::kv_fp8_groups(rows.latent_dim)));
  auto* kernel = rows.storage == CacheStorage::kBf16 ? write_projection_rows_kernel<CacheStorage::kBf16>
                                                     : write_projection_rows_kernel<CacheStorage::kFp8>;
  launch_chained("write_projection_rows launch", kernel, dim3(static_cast<unsigned>(n), jobs), threads, shared, stream,
                 rows);
}

void fill_cache_random(void* cache, void* key_cache, float* key_scales, int64_t num_slots, int latent_dim,
                       int rope_dim, int index_dim, CacheStorage storage, uint64_t seed, cudaStream_t stream) {
  if (num_slots == 0) return;
  if (storage == CacheStorage::kBf16) {
    fill_uniform_bf16(static_cast<uint16_t*>(cache), num_slots * (latent_dim + rope_dim), seed, 1.0f, stream);
    if (key_cache) fill_uniform_bf16(static_cast<uint16_t*>(key_cache), num_slots * index_dim, seed + 1, 1.0f, stream);
    return;
  }
  const int64_t row_elements = num_slots * (latent_dim + quant::kv_fp8_groups(latent_dim) + rope_dim);
  launch_chained("fill_fp8_rows launch", fill_fp8_rows_kernel, fill_grid(row_elements), 256, 0, stream,
                 static_cast<uint8_t*>(cache), num_slots, latent_dim, rope_dim, seed);
  if (key_cache) {
    launch_chained("fill_fp8_keys launch", fill_fp8_keys_kernel, fill_grid(num_slots * index_dim), 256, 0, stream,
                   static_cast<uint8_t*>(key_cache), key_scales, num_slots, index_dim, seed + 1);
  }
}

}  // namespace glms::ops::cuda
