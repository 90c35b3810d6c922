// The paged latent cache's rows on CUDA in their two storages: what writes a step's rows and
// fills a cache for benchmarks. The attention and indexer kernels read both (mla.h, indexer.h).
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace glms::ops::cuda {

// How a layer's rows are stored. kBf16: latent rows [num_slots, latent + rope] bf16 and indexer
// keys [num_slots, index_dim] bf16. kFp8 (--kv-cache-dtype fp8): the layout of quant/kv_fp8.h,
// latent rows of kv_fp8_row_bytes (E4M3 codes with a scale per 128, the rope key in bf16) and
// indexer keys as E4M3 codes with one scale each; the values are those quant::round_latent_row_fp8
// and round_index_key_fp8 give on the host, bit for bit from the same fp32 inputs.
enum class CacheStorage : uint8_t { kBf16, kFp8 };

// Per token, the normalised latent and the rotated rope key into the cache:
// row slot_mapping[t] = [rms_norm(kv[t, :latent]) * norm_weight, rope(kv[t, latent:])].
// kv: [n, latent + rope] fp32; cache: one layer's rows in `storage`.
void write_latent_cache(const float* kv, int64_t n, int latent_dim, int rope_dim, const float* norm_weight,
                        float eps, const int32_t* positions, const int64_t* slot_mapping, const float* inv_freq,
                        void* cache, CacheStorage storage, cudaStream_t stream);

// Per token, the indexer key: layer_norm(keys[t]) (weight, bias), RoPE on its first rope_dim
// values, written to key slot slot_mapping[t]. keys: [n, dim] fp32; key_cache: [num_slots, dim]
// bf16, or with key_scales ([num_slots] fp32) E4M3 codes (kFp8).
void write_indexer_keys(const float* keys, int64_t n, int dim, int rope_dim, const float* ln_weight,
                        const float* ln_bias, float eps, const int32_t* positions, const int64_t* slot_mapping,
                        const float* inv_freq, void* key_cache, float* key_scales, cudaStream_t stream);

// What follows the attention's first projections of a step, in one launch (a block per token and
// job) instead of three: q_a's RMSNorm into bf16, q_bf16[t] = bf16(rms_norm(q[t]) *
// q_norm_weight) (what residual_rms_norm's y_bf16 is for a row without a residual, its fp32 sum of
// squares taken in another order, so a value may round the other way), the latent row as
// write_latent_cache writes it and, where `keys` is given, the indexer key as write_indexer_keys
// writes it (the same device code for both). A decode step's layer is some 24 short kernels in a
// chain; two fewer links.
struct ProjectionRows {
  const float* q = nullptr;  // [n, q_dim] fp32
  int q_dim = 0;
  const float* q_norm_weight = nullptr;
  float q_eps = 0.0f;
  uint16_t* q_bf16 = nullptr;  // [n, q_dim]
  const float* kv = nullptr;   // [n, latent_dim + rope_dim] fp32
  int latent_dim = 0, rope_dim = 0;
  const float* kv_norm_weight = nullptr;
  float kv_eps = 0.0f;
  void* cache = nullptr;
  CacheStorage storage = CacheStorage::kBf16;
  const float* keys = nullptr;  // [n, key_dim] fp32; null: no indexer key
  int key_dim = 0;
  const float* key_ln_weight = nullptr;
  const float* key_ln_bias = nullptr;
  float key_eps = 0.0f;
  void* key_cache = nullptr;
  float* key_scales = nullptr;  // with FP8 keys
  const int32_t* positions = nullptr;
  const int64_t* slot_mapping = nullptr;
  const float* inv_freq = nullptr;
};
void write_projection_rows(const ProjectionRows& rows, int64_t n, cudaStream_t stream);

// Seeded random rows for benchmarks over long contexts: values uniform in [-1, 1] (as bf16, or
// as E4M3 codes with scale 1/448). key_scales: null for bf16 keys.
void fill_cache_random(void* cache, void* key_cache, float* key_scales, int64_t num_slots, int latent_dim,
                       int rope_dim, int index_dim, CacheStorage storage, uint64_t seed, cudaStream_t stream);

}  // namespace glms::ops::cuda
