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

// Seeded random rows for benchmarks over long contexts: values uniform in [-1, 1] (as bf16, or
// as E4M3 codes with scale 1/448). key_scales: null for bf16 keys.
void fill_cache_random(void* cache, void* key_cache, float* key_scales, int64_t num_slots, int latent_dim,
                       int rope_dim, int index_dim, CacheStorage storage, uint64_t seed, cudaStream_t stream);

}  // namespace glms::ops::cuda
