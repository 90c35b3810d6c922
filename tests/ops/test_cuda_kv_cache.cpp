// The CUDA cache writes against the CPU: a token's normalised latent and rotated rope key, and
// its indexer key, in bf16 and in the FP8 layout (whose bytes must decode, on the host, to the
// reference rounding of quant/kv_fp8.h), each written apart and by write_projection_rows (with
// q_a's norm beside them). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kv_cache.h"
#include "ops/ops.h"
#include "quant/formats.h"
#include "quant/kv_fp8.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::random_values;
using glms::testing::relative_l2;
using glms::testing::to_device;
using glms::testing::to_host;
namespace cuda = glms::ops::cuda;

namespace {

class CudaKvCache : public glms::testing::CudaTest {};

// n tokens' inputs and their expected rows on the CPU (fp32, before any storage rounding).
struct CacheWrite {
  int n, L, rd, dim;
  int q_dim;  // q_a's rows for write_projection_rows: four values a load at GLM-5's widths, else one
  std::vector<float> kv, norm, keys, ln_w, ln_b, q, q_norm, q_normed;
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  ops::RopeTable table;
  std::vector<float> rows, index_keys;  // [n, L + rd], [n, dim]

  CacheWrite(int n_, int L_, int rd_, int dim_) : n(n_), L(L_), rd(rd_), dim(dim_), q_dim(dim_ == 128 ? 96 : 30) {
    kv = random_values(n * (L + rd), 4, 2.0f), norm = random_values(L, 5), keys = random_values(n * dim, 6);
    ln_w = random_values(dim, 7), ln_b = random_values(dim, 8);
    q = random_values(n * q_dim, 9, 3.0f), q_norm = random_values(q_dim, 10), q_normed.resize(n * q_dim);
    ops::rms_norm(q.data(), n, q_dim, q_norm.data(), 1e-6f, q_normed.data());
    for (int t = 0; t < n; ++t) positions.push_back(100 * t + 3), slots.push_back(2 * t + 1);
    table.rope_dim = rd;
    for (int i = 0; i < rd / 2; ++i) table.inv_freq.push_back(1.0f / std::pow(8e6f, 2.0f * i / rd));
    std::vector<float> cos(rd / 2), sin(rd / 2);
    rows.resize(n * (L + rd)), index_keys.resize(n * dim);
    for (int t = 0; t < n; ++t) {
      float* row = rows.data() + t * (L + rd);
      float* key = index_keys.data() + t * dim;
      table.angles(positions[t], cos.data(), sin.data());
      ops::rms_norm(kv.data() + t * (L + rd), 1, L, norm.data(), 1e-6f, row);
      std::copy(kv.begin() + t * (L + rd) + L, kv.begin() + (t + 1) * (L + rd), row + L);
      ops::rope_interleaved(row + L, rd, cos.data(), sin.data());
      ops::layer_norm(keys.data() + t * dim, 1, dim, ln_w.data(), ln_b.data(), 1e-6f, key);
      ops::rope_interleaved(key, rd, cos.data(), sin.data());
    }
  }

  // Writes on the device into caches of 2n slots in `storage` (fused: by write_projection_rows,
  // q_a's rows into q_bf16); returns the raw bytes.
  std::pair<std::vector<uint8_t>, std::vector<uint8_t>> write(cuda::CacheStorage storage, bool fused = false,
                                                              std::vector<uint16_t>* q_bf16 = nullptr) const {
    const bool fp8 = storage == cuda::CacheStorage::kFp8;
    const int64_t slots_total = 2 * n;
    const int64_t row_bytes = fp8 ? quant::kv_fp8_row_bytes(L, rd) : 2 * (L + rd);
    const int64_t key_bytes = fp8 ? quant::kv_fp8_key_scales_offset(slots_total, dim) + 4 * slots_total
                                  : 2 * dim * slots_total;
    auto dkv = to_device(kv), dnorm = to_device(norm), dkeys = to_device(keys), dlw = to_device(ln_w),
         dlb = to_device(ln_b), dpos = to_device(positions), dslots = to_device(slots),
         dfreq = to_device(table.inv_freq);
    auto cache = to_device(std::vector<uint8_t>(slots_total * row_bytes, 0xff));
    auto key_cache = to_device(std::vector<uint8_t>(key_bytes, 0xff));
    float* scales = fp8 ? reinterpret_cast<float*>(key_cache.as<uint8_t>() +
                                                   quant::kv_fp8_key_scales_offset(slots_total, dim))
                        : nullptr;
    if (fused) {
      auto dq = to_device(q), dq_norm = to_device(q_norm);
      auto dq_bf16 = to_device(std::vector<uint16_t>(n * q_dim, 0xffff));
      cuda::ProjectionRows rows;
      rows.q = dq.as<float>(), rows.q_dim = q_dim, rows.q_norm_weight = dq_norm.as<float>(), rows.q_eps = 1e-6f;
      rows.q_bf16 = dq_bf16.as<uint16_t>();
      rows.kv = dkv.as<float>(), rows.latent_dim = L, rows.rope_dim = rd, rows.kv_norm_weight = dnorm.as<float>();
      rows.kv_eps = 1e-6f, rows.cache = cache.data(), rows.storage = storage;
      rows.keys = dkeys.as<float>(), rows.key_dim = dim, rows.key_ln_weight = dlw.as<float>();
      rows.key_ln_bias = dlb.as<float>(), rows.key_eps = 1e-6f, rows.key_cache = key_cache.data();
      rows.key_scales = scales;
      rows.positions = dpos.as<int32_t>(), rows.slot_mapping = dslots.as<int64_t>(), rows.inv_freq = dfreq.as<float>();
      cuda::write_projection_rows(rows, n, nullptr);
      *q_bf16 = to_host<uint16_t>(dq_bf16, n * q_dim);
    } else {
      cuda::write_latent_cache(dkv.as<float>(), n, L, rd, dnorm.as<float>(), 1e-6f, dpos.as<int32_t>(),
                               dslots.as<int64_t>(), dfreq.as<float>(), cache.data(), storage, nullptr);
      cuda::write_indexer_keys(dkeys.as<float>(), n, dim, rd, dlw.as<float>(), dlb.as<float>(), 1e-6f,
                               dpos.as<int32_t>(), dslots.as<int64_t>(), dfreq.as<float>(), key_cache.data(), scales,
                               nullptr);
    }
    return {to_host<uint8_t>(cache, slots_total * row_bytes), to_host<uint8_t>(key_cache, key_bytes)};
  }
};

// Codes of an FP8 group written on the device against the host's rounding of the CPU's values
// with the device's scale: equal, except where value / scale lies within 1e-4 of a rounding
// midpoint (the device normalised in another order, a last-bit difference). Scales within 1e-5.
void expect_group(const float* expected, const uint8_t* codes, float scale, int count, const char* what, int t) {
  float amax = 0;
  for (int i = 0; i < count; ++i) amax = std::max(amax, std::fabs(expected[i]));
  EXPECT_NEAR(scale, amax / 448.0f, amax / 448.0f * 1e-5) << what << ", token " << t;
  int ambiguous = 0;
  for (int i = 0; i < count; ++i) {
    const float x = expected[i] / scale;
    const uint8_t lo = quant::f32_to_minifloat(quant::MiniFloat::E4M3, x * (1 - 1e-4f)),
                  hi = quant::f32_to_minifloat(quant::MiniFloat::E4M3, x * (1 + 1e-4f));
    if (lo != hi) {
      ++ambiguous;
      EXPECT_TRUE(codes[i] == lo || codes[i] == hi) << what << ", token " << t << ", value " << i;
    } else {
      EXPECT_EQ(codes[i], lo) << what << ", token " << t << ", value " << i;
    }
  }
  EXPECT_LT(ambiguous, count / 16 + 2) << what << ", token " << t;
}

}  // namespace

TEST_F(CudaKvCache, Bf16WritesMatchCpu) {
  const CacheWrite w(9, 512, 64, 128);
  for (const bool fused : {false, true}) {
    std::vector<uint16_t> q_bf16;
    const auto [cache, keys] = w.write(cuda::CacheStorage::kBf16, fused, &q_bf16);
    const auto* rows = reinterpret_cast<const uint16_t*>(cache.data());
    const auto* key_rows = reinterpret_cast<const uint16_t*>(keys.data());
    for (int t = 0; t < w.n; ++t) {
      std::vector<float> row(w.L + w.rd), key(w.dim);
      for (int k = 0; k < w.L + w.rd; ++k) row[k] = bf16_to_f32(rows[w.slots[t] * (w.L + w.rd) + k]);
      for (int k = 0; k < w.dim; ++k) key[k] = bf16_to_f32(key_rows[w.slots[t] * w.dim + k]);
      EXPECT_LT(relative_l2(row.data(), w.rows.data() + t * (w.L + w.rd), w.L + w.rd), 4e-3) << t << " " << fused;
      EXPECT_LT(relative_l2(key.data(), w.index_keys.data() + t * w.dim, w.dim), 4e-3) << t << " " << fused;
    }
    if (!fused) continue;
    std::vector<float> q(q_bf16.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_to_f32(q_bf16[i]);
    EXPECT_LT(relative_l2(q.data(), w.q_normed.data(), q.size()), 4e-3) << "q_a's rows";
  }
}

TEST_F(CudaKvCache, Fp8WritesAreTheReferenceRounding) {
  for (auto [L, rd, dim] : {std::tuple{512, 64, 128}, {200, 8, 24}}) {  // GLM-5's widths; a partial group
    const CacheWrite w(9, L, rd, dim);
    for (const bool fused : {false, true}) {
      std::vector<uint16_t> q_bf16;
      const auto [cache, keys] = w.write(cuda::CacheStorage::kFp8, fused, &q_bf16);
      if (fused) {
        std::vector<float> q(q_bf16.size());
        for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_to_f32(q_bf16[i]);
        EXPECT_LT(relative_l2(q.data(), w.q_normed.data(), q.size()), 4e-3) << "q_a's rows, " << w.q_dim << " wide";
      }
      const int row_bytes = quant::kv_fp8_row_bytes(L, rd);
      const int64_t slots_total = 2 * w.n;
      for (int t = 0; t < w.n; ++t) {
        const uint8_t* row = cache.data() + w.slots[t] * row_bytes;
        const float* expected = w.rows.data() + t * (L + rd);
        for (int g = 0; g < quant::kv_fp8_groups(L); ++g) {
          float scale;
          std::memcpy(&scale, row + quant::kv_fp8_scales_offset(L) + 4 * g, 4);
          const int begin = g * 128;
          expect_group(expected + begin, row + begin, scale, std::min(128, L - begin), "latent group", t);
        }
        std::vector<float> decoded(L + rd);
        quant::decode_latent_row_fp8(row, L, rd, decoded.data());
        EXPECT_LT(relative_l2(decoded.data() + L, expected + L, rd), 4e-3) << "rope key, token " << t;  // bf16
        EXPECT_LT(relative_l2(decoded.data(), expected, L), 0.05) << "latent, token " << t;              // E4M3

        float key_scale;
        std::memcpy(&key_scale, keys.data() + quant::kv_fp8_key_scales_offset(slots_total, dim) + 4 * w.slots[t], 4);
        expect_group(w.index_keys.data() + t * dim, keys.data() + w.slots[t] * dim, key_scale, dim, "indexer key", t);
      }
    }
  }
}

TEST_F(CudaKvCache, Fp8ZeroRowsStayZero) {
  // A zero latent (norm weight 0) gives scale 0 and zero codes, never 0 / 0.
  CacheWrite w(2, 512, 64, 128);
  std::fill(w.norm.begin(), w.norm.end(), 0.0f);
  const auto [cache, keys] = w.write(cuda::CacheStorage::kFp8);
  const int row_bytes = quant::kv_fp8_row_bytes(512, 64);
  for (int t = 0; t < w.n; ++t) {
    std::vector<float> decoded(576);
    quant::decode_latent_row_fp8(cache.data() + w.slots[t] * row_bytes, 512, 64, decoded.data());
    EXPECT_TRUE(std::all_of(decoded.begin(), decoded.begin() + 512, [](float v) { return v == 0.0f; })) << t;
  }
}
