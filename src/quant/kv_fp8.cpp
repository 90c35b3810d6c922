#include "quant/kv_fp8.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "quant/formats.h"

namespace glms::quant {

namespace {

// values[0, count) to E4M3 codes of values / scale and back, scale = amax / 448.
void round_group_e4m3(float* values, int count) {
  float amax = 0.0f;
  for (int i = 0; i < count; ++i) amax = std::max(amax, std::fabs(values[i]));
  if (amax == 0.0f || !std::isfinite(amax)) return;
  const float scale = amax / minifloat_max(MiniFloat::E4M3);
  for (int i = 0; i < count; ++i)
    values[i] = minifloat_to_f32(MiniFloat::E4M3, f32_to_minifloat(MiniFloat::E4M3, values[i] / scale)) * scale;
}

}  // namespace

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
