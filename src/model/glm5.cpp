#include "model/glm5.h"

#include <cmath>

#include "core/error.h"
#include "model/layers.h"

namespace glms::model {

Glm5Model::Glm5Model(ModelWeights weights) : weights_(std::move(weights)) {
  const io::ModelConfig& c = weights_.config;
  if (c.rope_type != "default")
    fail("rope_type '" + c.rope_type + "' is not supported yet (GLM-5 checkpoints use the default rope)");
  rope_.rope_dim = c.qk_rope_head_dim;
  const float theta = static_cast<float>(c.rope_theta);
  for (int i = 0; i < c.qk_rope_head_dim / 2; ++i)
    rope_.inv_freq.push_back(
        1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(c.qk_rope_head_dim)));
}

kv::CacheLayout Glm5Model::cache_layout(int block_size) const {
  const io::ModelConfig& c = weights_.config;
  kv::CacheLayout layout;
  layout.num_layers = c.num_hidden_layers;
  layout.latent_dim = c.kv_lora_rank;
  layout.rope_dim = c.qk_rope_head_dim;
  layout.index_dim = c.index_head_dim;
  layout.layer_has_index_keys.assign(c.indexer_full.begin(), c.indexer_full.end());
  layout.block_size = block_size;
  return layout;
}

std::vector<float> Glm5Model::forward(const ForwardBatch& batch, kv::PagedLatentCache& cache,
                                      ForwardTrace* trace) const {
  const io::ModelConfig& c = weights_.config;
  const int T = batch.num_tokens();
  const int64_t hidden = c.hidden_size;
  GLMS_CHECK(T > 0, "empty batch");
  for (int32_t id : batch.token_ids)
    if (id < 0 || id >= c.vocab_size)
      fail("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");

  std::vector<float> x(static_cast<size_t>(T * hidden));  // [T, hidden] residual stream
  for (int t = 0; t < T; ++t) weights_.embed_tokens.row_to_f32(batch.token_ids[t], x.data() + t * hidden);
  if (trace) trace->hidden_states.assign(1, x);

  const RopeAngles rope = rope_angles(rope_, batch);
  std::vector<float> normed(x.size()), block_out(x.size());  // [T, hidden]
  TokenSelection selection;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const DecoderLayerWeights& layer = weights_.layers[l];
    ops::rms_norm(x.data(), T, hidden, layer.input_norm.data(), c.rms_norm_eps, normed.data());
    mla_attention(c, layer.attention, l, rope, batch, normed.data(), cache, selection, block_out.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += block_out[i];
    ops::rms_norm(x.data(), T, hidden, layer.post_attention_norm.data(), c.rms_norm_eps, normed.data());
    if (layer.is_moe) moe_mlp(c, layer.moe, normed.data(), T, block_out.data());
    else dense_mlp(layer.mlp, normed.data(), T, block_out.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += block_out[i];
    if (trace) trace->hidden_states.push_back(x);
  }

  const int R = static_cast<int>(batch.logits_tokens.size());
  std::vector<float> last(static_cast<size_t>(R * hidden));  // [R, hidden] normed rows needing logits
  for (int r = 0; r < R; ++r) {
    const int t = batch.logits_tokens[r];
    ops::rms_norm(x.data() + t * hidden, 1, hidden, weights_.final_norm.data(), c.rms_norm_eps,
                  last.data() + r * hidden);
  }
  std::vector<float> logits(static_cast<size_t>(R) * c.vocab_size);  // [R, vocab]
  ops::linear(last.data(), R, weights_.lm_head, logits.data());
  if (trace) trace->last_hidden = std::move(x);
  return logits;
}

}  // namespace glms::model
