// The values an FP8 KV cache gives back (kv::CacheDtype::kFp8E4m3), the layout DeepSeek-V3.2's
// FP8 MLA cache uses and vLLM's fp8_ds_mla follows: a latent row's values in E4M3 with one fp32
// scale per 128 of them (amax / 448, so the largest lands on E4M3's largest normal), its rope key
// in bf16 (rotary products lose more in 3 mantissa bits than the latent does), and an indexer key
// in E4M3 with one scale for the row. Per layer that is latent + 4 * ceil(latent / 128) + 2 *
// rope bytes a token (656 for GLM-5 against 1152 in bf16), plus index_dim + 4 for an indexer key.
#pragma once

#include <cstdint>

namespace glms::quant {

inline constexpr int kKvFp8GroupValues = 128;

// In place: row[0, latent) to E4M3 x its group's scale and back, row[latent, latent + rope) to
// bf16 and back. A group of zeros stays zero.
void round_latent_row_fp8(float* row, int latent_dim, int rope_dim);
// In place: key[0, dim) to E4M3 x one scale for the row and back.
void round_index_key_fp8(float* key, int dim);

// Bytes a token's rows take in that layout on one layer (index_dim 0: no indexer key).
int64_t kv_fp8_bytes_per_layer(int latent_dim, int rope_dim, int index_dim);

}  // namespace glms::quant
