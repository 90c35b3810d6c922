// The values an FP8 KV cache gives back (kv::CacheDtype::kFp8E4m3), the layout DeepSeek-V3.2's
// FP8 MLA cache uses and vLLM's fp8_ds_mla follows: a latent row's values in E4M3 with one fp32
// scale per 128 of them (amax / 448, so the largest lands on E4M3's largest normal), its rope key
// in bf16 (rotary products lose more in 3 mantissa bits than the latent does), and an indexer key
// in E4M3 with one scale for the row. Per layer that is latent + 4 * ceil(latent / 128) + 2 *
// rope bytes a token (656 for GLM-5 against 1152 in bf16), plus index_dim + 4 for an indexer key.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace glms::quant {

inline constexpr int kKvFp8GroupValues = 128;

// The FP8 cache's rows on CUDA, byte offsets within a latent row: [latent_dim] E4M3 codes, the
// groups' fp32 scales from the next multiple of 4, then the rope key in bf16, the row padded to
// 16 bytes (GLM-5: 512 + 16 + 128 = 656 bytes, 57% of its 1152 in bf16). A layer's indexer keys
// are [num_slots, index_dim] E4M3 codes followed by their [num_slots] fp32 scales.
GLMS_HOST_DEVICE constexpr int kv_fp8_groups(int latent_dim) {
  return (latent_dim + kKvFp8GroupValues - 1) / kKvFp8GroupValues;
}
GLMS_HOST_DEVICE constexpr int kv_fp8_scales_offset(int latent_dim) { return (latent_dim + 3) / 4 * 4; }
GLMS_HOST_DEVICE constexpr int kv_fp8_rope_offset(int latent_dim) {
  return kv_fp8_scales_offset(latent_dim) + 4 * kv_fp8_groups(latent_dim);
}
GLMS_HOST_DEVICE constexpr int kv_fp8_row_bytes(int latent_dim, int rope_dim) {
  return (kv_fp8_rope_offset(latent_dim) + 2 * rope_dim + 15) / 16 * 16;
}
// Where a layer's indexer key scales start: after the codes of every slot, 16-byte aligned.
GLMS_HOST_DEVICE constexpr int64_t kv_fp8_key_scales_offset(int64_t num_slots, int index_dim) {
  return (num_slots * index_dim + 15) / 16 * 16;
}

// In place: row[0, latent) to E4M3 x its group's scale and back, row[latent, latent + rope) to
// bf16 and back. A group of zeros stays zero.
void round_latent_row_fp8(float* row, int latent_dim, int rope_dim);
// In place: key[0, dim) to E4M3 x one scale for the row and back.
void round_index_key_fp8(float* key, int dim);

// The device layout's host twin, for finite rows: a [latent + rope] fp32 row into
// kv_fp8_row_bytes bytes and back, decode(encode(row)) == round_latent_row_fp8(row); an indexer
// key into `dim` codes and a scale, decode(encode(key)) == round_index_key_fp8(key). A zero group
// has scale 0 and zero codes.
void encode_latent_row_fp8(const float* row, int latent_dim, int rope_dim, uint8_t* out);
void decode_latent_row_fp8(const uint8_t* bytes, int latent_dim, int rope_dim, float* row);
void encode_index_key_fp8(const float* key, int dim, uint8_t* codes, float* scale);
void decode_index_key_fp8(const uint8_t* codes, float scale, int dim, float* key);

// Bytes a token's rows take in that layout on one layer (index_dim 0: no indexer key); on CUDA
// the latent row is padded as kv_fp8_row_bytes says (no padding at GLM-5's widths).
int64_t kv_fp8_bytes_per_layer(int latent_dim, int rope_dim, int index_dim);

}  // namespace glms::quant
