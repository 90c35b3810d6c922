// MLA attention with weight absorption, over the paged latent cache, and the DSA indexer.
//
// Per head h, kv_b_proj holds W_uk[h] [qk_nope, kv_lora] then W_uv[h] [v_head, kv_lora]. The
// score q_nope·(W_uk c) equals (W_uk^T q_nope)·c, and sum_t p_t W_uv c_t = W_uv (sum_t p_t c_t),
// so the cache holds only c (the normalised latent) and the rotated rope key, and attention runs
// in the kv_lora space.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/layers.h"
#include "quant/kv_fp8.h"

namespace glms::model {

namespace {

constexpr float kLatentNormEps = 1e-6f;  // q_a_layernorm / kv_a_layernorm use the RMSNorm default
constexpr float kIndexerNormEps = 1e-6f;

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t k = 0; k < n; ++k) sum += a[k] * b[k];
  return sum;
}

inline int64_t context_slot(const SequenceSlice& seq, int position, int block_size) {
  return static_cast<int64_t>(seq.block_table[position / block_size]) * block_size + position % block_size;
}

// Indexer keys for this step go to the cache; then each token picks its top-k context positions.
void run_indexer(const io::ModelConfig& c, const IndexerWeights& w, int layer, const RopeAngles& rope,
                 const ForwardBatch& batch, const float* x, const float* q_resid, kv::PagedLatentCache& cache,
                 TokenSelection& selection) {
  const int T = batch.num_tokens(), heads = c.index_n_heads, dim = c.index_head_dim, rd = c.qk_rope_head_dim;
  std::vector<float> queries(static_cast<size_t>(T) * heads * dim);  // [T, heads, dim]
  std::vector<float> keys(static_cast<size_t>(T) * dim);             // [T, dim]
  std::vector<float> head_weights(static_cast<size_t>(T) * heads);   // [T, heads]
  ops::linear(q_resid, T, w.wq_b, queries.data());
  ops::linear(x, T, w.wk, keys.data());
  ops::layer_norm(keys.data(), T, dim, w.k_norm_weight.data(), w.k_norm_bias.data(), kIndexerNormEps, keys.data());
  ops::linear(x, T, w.weights_proj, head_weights.data());
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(heads));
  for (float& v : head_weights) v *= head_scale;
  for (int t = 0; t < T; ++t) {
    float* key = keys.data() + static_cast<size_t>(t) * dim;
    ops::rope_interleaved(key, rd, rope.cos_of(t), rope.sin_of(t));
    float* cached = cache.index_key_row(layer, batch.slot_mapping[t]);
    std::copy(key, key + dim, cached);
    if (cache.layout().dtype == kv::CacheDtype::kFp8E4m3) quant::round_index_key_fp8(cached, dim);
    for (int h = 0; h < heads; ++h)
      ops::rope_interleaved(queries.data() + (static_cast<size_t>(t) * heads + h) * dim, rd, rope.cos_of(t),
                            rope.sin_of(t));
  }

  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const int block_size = cache.block_size();
  selection.assign(T, {});
  const int64_t max_context = batch.positions.empty() ? 0 : *std::max_element(batch.positions.begin(), batch.positions.end()) + 1;
#pragma omp parallel for schedule(dynamic, 1) if (max_context > c.index_topk && int64_t{T} * max_context * heads * dim > 200000)
  for (int t = 0; t < T; ++t) {
    const SequenceSlice& seq = batch.sequences[batch.token_sequence[t]];
    const int context = batch.positions[t] + 1;
    std::vector<int32_t>& chosen = selection[t];
    if (context <= c.index_topk) {  // every causal position is selected
      chosen.resize(context);
      for (int j = 0; j < context; ++j) chosen[j] = j;
      continue;
    }
    std::vector<float> scores(context);
    const float* q = queries.data() + static_cast<size_t>(t) * heads * dim;
    const float* hw = head_weights.data() + static_cast<size_t>(t) * heads;
    for (int j = 0; j < context; ++j) {
      const float* key = cache.index_key_row(layer, context_slot(seq, j, block_size));
      float score = 0.0f;
      for (int h = 0; h < heads; ++h) score += std::max(dot(q + h * dim, key, dim) * softmax_scale, 0.0f) * hw[h];
      scores[j] = score;
    }
    ops::top_k(scores.data(), context, c.index_topk, chosen);
  }
}

}  // namespace

RopeAngles rope_angles(const ops::RopeTable& table, const ForwardBatch& batch) {
  RopeAngles angles;
  angles.half = table.rope_dim / 2;
  angles.cos.resize(static_cast<size_t>(batch.num_tokens()) * angles.half);
  angles.sin.resize(angles.cos.size());
  for (int t = 0; t < batch.num_tokens(); ++t)
    table.angles(batch.positions[t], angles.cos.data() + static_cast<size_t>(t) * angles.half,
                 angles.sin.data() + static_cast<size_t>(t) * angles.half);
  return angles;
}

void mla_attention(const io::ModelConfig& c, const AttentionWeights& w, int layer, const RopeAngles& rope,
                   const ForwardBatch& batch, const float* x, kv::PagedLatentCache& cache,
                   TokenSelection& selection, float* out) {
  const int T = batch.num_tokens(), H = w.heads;  // this rank's heads
  const int nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim, vd = c.v_head_dim, L = c.kv_lora_rank;
  const int qd = nope + rd, row_size = L + rd;

  std::vector<float> q_resid(static_cast<size_t>(T) * c.q_lora_rank);  // [T, q_lora]
  std::vector<float> q(static_cast<size_t>(T) * H * qd);                 // [T, H, nope + rope]
  std::vector<float> kv(static_cast<size_t>(T) * row_size);              // [T, kv_lora + rope]
  ops::linear(x, T, w.q_a_proj, q_resid.data());
  ops::rms_norm(q_resid.data(), T, c.q_lora_rank, w.q_a_norm.data(), kLatentNormEps, q_resid.data());
  ops::linear(q_resid.data(), T, w.q_b_proj, q.data());
  ops::linear(x, T, w.kv_a_proj, kv.data());

  for (int t = 0; t < T; ++t) {
    float* row = cache.latent_row(layer, batch.slot_mapping[t]);
    const float* src = kv.data() + static_cast<size_t>(t) * row_size;
    ops::rms_norm(src, 1, L, w.kv_a_norm.data(), kLatentNormEps, row);
    std::copy(src + L, src + row_size, row + L);
    ops::rope_interleaved(row + L, rd, rope.cos_of(t), rope.sin_of(t));
    if (cache.layout().dtype == kv::CacheDtype::kFp8E4m3) quant::round_latent_row_fp8(row, L, row_size - L);
    for (int h = 0; h < H; ++h)
      ops::rope_interleaved(q.data() + (static_cast<size_t>(t) * H + h) * qd + nope, rd, rope.cos_of(t),
                            rope.sin_of(t));
  }

  if (w.has_indexer) {
    run_indexer(c, w.indexer, layer, rope, batch, x, q_resid.data(), cache, selection);
  } else {
    GLMS_CHECK(static_cast<int>(selection.size()) == T, "a shared indexer layer needs a previous full layer");
  }

  // Absorb W_uk into the queries: q_latent[t, h] = W_uk[h]^T q_nope[t, h].
  std::vector<float> q_latent(static_cast<size_t>(T) * H * L);  // [T, H, kv_lora]
#pragma omp parallel for schedule(static) if (int64_t{T} * H * nope * L > 100000)
  for (int h = 0; h < H; ++h) {
    const ops::WeightView w_uk = w.kv_b_proj.slice_rows(static_cast<int64_t>(h) * (nope + vd), nope);
    ops::linear_transposed(q.data() + static_cast<size_t>(h) * qd, T, w_uk, q_latent.data() + static_cast<size_t>(h) * L,
                           static_cast<int64_t>(H) * qd, static_cast<int64_t>(H) * L);
  }

  const float scale = static_cast<float>(c.attention_scale());
  const int block_size = cache.block_size();
  std::vector<float> o_latent(static_cast<size_t>(T) * H * L);  // [T, H, kv_lora]
  int64_t attended = 0;
  for (int t = 0; t < T; ++t) attended += static_cast<int64_t>(selection[t].size());
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (attended * H * row_size > 200000)
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      const SequenceSlice& seq = batch.sequences[batch.token_sequence[t]];
      const std::vector<int32_t>& chosen = selection[t];
      const float* ql = q_latent.data() + (static_cast<size_t>(t) * H + h) * L;
      const float* qr = q.data() + (static_cast<size_t>(t) * H + h) * qd + nope;
      std::vector<float> probs(chosen.size());
      float max_score = -INFINITY;
      for (size_t i = 0; i < chosen.size(); ++i) {
        const float* row = cache.latent_row(layer, context_slot(seq, chosen[i], block_size));
        probs[i] = (dot(ql, row, L) + dot(qr, row + L, rd)) * scale;
        max_score = std::max(max_score, probs[i]);
      }
      float total = 0.0f;
      for (float& p : probs) total += (p = std::exp(p - max_score));
      float* o = o_latent.data() + (static_cast<size_t>(t) * H + h) * L;
      std::fill(o, o + L, 0.0f);
      for (size_t i = 0; i < chosen.size(); ++i) {
        const float* row = cache.latent_row(layer, context_slot(seq, chosen[i], block_size));
        const float p = probs[i] / total;
#pragma omp simd
        for (int k = 0; k < L; ++k) o[k] += p * row[k];
      }
    }
  }

  // Un-absorb W_uv per head, then the output projection.
  std::vector<float> heads_out(static_cast<size_t>(T) * H * vd);  // [T, H * v_head]
  for (int h = 0; h < H; ++h) {
    const ops::WeightView w_uv = w.kv_b_proj.slice_rows(static_cast<int64_t>(h) * (nope + vd) + nope, vd);
    ops::linear(o_latent.data() + static_cast<size_t>(h) * L, T, w_uv, heads_out.data() + static_cast<size_t>(h) * vd,
                static_cast<int64_t>(H) * L, static_cast<int64_t>(H) * vd);
  }
  ops::linear(heads_out.data(), T, w.o_proj, out);
}

}  // namespace glms::model
