#include "quant/kv_fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "quant/formats.h"

namespace glms::quant {

namespace {

float group_scale(const float* values, int count) {
  float amax = 0.0f;
  for (int i = 0; i < count; ++i) amax = std::max(amax, std::fabs(values[i]));
  return amax / minifloat_max(MiniFloat::E4M3);
}

// values[0, count) to E4M3 codes of values / scale and back, scale = amax / 448.
void round_group_e4m3(float* values, int count) {
  const float scale = group_scale(values, count);
  if (scale == 0.0f || !std::isfinite(scale)) return;
  for (int i = 0; i < count; ++i)
    values[i] = minifloat_to_f32(MiniFloat::E4M3, f32_to_minifloat(MiniFloat::E4M3, values[i] / scale)) * scale;
}

float encode_group(const float* values, int count, uint8_t* codes) {
  const float scale = group_scale(values, count);
  for (int i = 0; i < count; ++i) codes[i] = scale > 0.0f ? f32_to_minifloat(MiniFloat::E4M3, values[i] / scale) : 0;
  return scale;
}

}  // namespace

void encode_latent_row_fp8(const float* row, int latent_dim, int rope_dim, uint8_t* out) {
  std::fill(out, out + kv_fp8_row_bytes(latent_dim, rope_dim), uint8_t{0});
  for (int g = 0; g < kv_fp8_groups(latent_dim); ++g) {
    const int begin = g * kKvFp8GroupValues, count = std::min(kKvFp8GroupValues, latent_dim - begin);
    const float scale = encode_group(row + begin, count, out + begin);
    std::memcpy(out + kv_fp8_scales_offset(latent_dim) + 4 * g, &scale, 4);
  }
  for (int i = 0; i < rope_dim; ++i) {
    const uint16_t bits = f32_to_bf16(row[latent_dim + i]);
    std::memcpy(out + kv_fp8_rope_offset(latent_dim) + 2 * i, &bits, 2);
  }
}

void decode_latent_row_fp8(const uint8_t* bytes, int latent_dim, int rope_dim, float* row) {
  for (int i = 0; i < latent_dim; ++i) {
    float scale;
    std::memcpy(&scale, bytes + kv_fp8_scales_offset(latent_dim) + 4 * (i / kKvFp8GroupValues), 4);
    row[i] = minifloat_to_f32(MiniFloat::E4M3, bytes[i]) * scale;
  }
  for (int i = 0; i < rope_dim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes + kv_fp8_rope_offset(latent_dim) + 2 * i, 2);
    row[latent_dim + i] = bf16_to_f32(bits);
  }
}

void encode_index_key_fp8(const float* key, int dim, uint8_t* codes, float* scale) {
  *scale = encode_group(key, dim, codes);
}

void decode_index_key_fp8(const uint8_t* codes, float scale, int dim, float* key) {
  for (int i = 0; i < dim; ++i) key[i] = minifloat_to_f32(MiniFloat::E4M3, codes[i]) * scale;
}

void round_latent_row_fp8(float* row, int latent_dim, int rope_dim) {
  for (int g = 0; g < latent_dim; g += kKvFp8GroupValues)
    round_group_e4m3(row + g, std::min(kKvFp8GroupValues, latent_dim - g));
  for (int i = latent_dim; i < latent_dim + rope_dim; ++i) row[i] = bf16_to_f32(f32_to_bf16(row[i]));
}

void round_index_key_fp8(float* key, int dim) { round_group_e4m3(key, dim); }

int64_t kv_fp8_bytes_per_layer(int latent_dim, int rope_dim, int index_dim) {
  const int64_t groups = (latent_dim + kKvFp8GroupValues - 1) / kKvFp8GroupValues;
  return latent_dim + 4 * groups + 2 * int64_t{rope_dim} + (index_dim > 0 ? index_dim + 4 : 0);
}

}  // namespace glms::quant
