#include "model/glm5.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/layers.h"

namespace glms::model {

Glm5Model::Glm5Model(ModelWeights weights, Peers peers) : weights_(std::move(weights)), peers_(peers) {
  const io::ModelConfig& c = weights_.config;
  if (c.rope_type != "default")
    fail("rope_type '" + c.rope_type + "' is not supported yet (GLM-5 checkpoints use the default rope)");
  rope_.rope_dim = c.qk_rope_head_dim;
  const float theta = static_cast<float>(c.rope_theta);
  for (int i = 0; i < c.qk_rope_head_dim / 2; ++i)
    rope_.inv_freq.push_back(
        1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(c.qk_rope_head_dim)));
}

namespace {

// Sums a block's output [T, hidden] over the tensor-parallel peers (each holds part of the heads
// or of the MLP's width).
void sum_over_peers(comm::Communicator* tp, std::vector<float>& block_out) {
  if (tp) tp->all_reduce_sum(block_out.data(), block_out.size(), comm::Element::F32);
}

// One decoder layer on the residual stream x [T, hidden]: x += attention(norm(x)), then
// x += mlp(norm(x)). `normed` and `block_out` are scratch of x's size.
void decoder_layer(const io::ModelConfig& c, const Peers& peers, const DecoderLayerWeights& layer, int cache_layer,
                   const RopeAngles& rope, const ForwardBatch& batch, std::vector<float>& x,
                   kv::PagedLatentCache& cache, TokenSelection& selection, std::vector<float>& normed,
                   std::vector<float>& block_out, float* min_route_margin = nullptr) {
  const int T = batch.num_tokens();
  const int64_t hidden = c.hidden_size;
  ops::rms_norm(x.data(), T, hidden, layer.input_norm.data(), c.rms_norm_eps, normed.data());
  mla_attention(c, layer.attention, cache_layer, rope, batch, normed.data(), cache, selection, block_out.data());
  sum_over_peers(peers.tp, block_out);
  for (size_t i = 0; i < x.size(); ++i) x[i] += block_out[i];
  ops::rms_norm(x.data(), T, hidden, layer.post_attention_norm.data(), c.rms_norm_eps, normed.data());
  if (layer.is_moe)
    moe_mlp(c, layer.moe, peers, batch.dp_tokens(), normed.data(), T, block_out.data(), min_route_margin);
  else dense_mlp(layer.mlp, normed.data(), T, block_out.data());
  sum_over_peers(peers.tp, block_out);
  for (size_t i = 0; i < x.size(); ++i) x[i] += block_out[i];
}

// Logits [R, vocab] of the batch's logits tokens: norm each row of x, then the head.
std::vector<float> head_logits(const ForwardBatch& batch, const std::vector<float>& x, int64_t hidden,
                               const std::vector<float>& norm, float eps, const ops::WeightView& head) {
  const int R = static_cast<int>(batch.logits_tokens.size());
  std::vector<float> last(static_cast<size_t>(R * hidden));  // [R, hidden]
  for (int r = 0; r < R; ++r)
    ops::rms_norm(x.data() + batch.logits_tokens[r] * hidden, 1, hidden, norm.data(), eps, last.data() + r * hidden);
  std::vector<float> logits(static_cast<size_t>(R) * head.rows);  // [R, vocab]
  ops::linear(last.data(), R, head, logits.data());
  return logits;
}

kv::CacheLayout latent_cache_layout(const io::ModelConfig& c, std::vector<bool> layer_has_index_keys, int block_size) {
  kv::CacheLayout layout;
  layout.num_layers = static_cast<int>(layer_has_index_keys.size());
  layout.latent_dim = c.kv_lora_rank;
  layout.rope_dim = c.qk_rope_head_dim;
  layout.index_dim = c.index_head_dim;
  layout.layer_has_index_keys = std::move(layer_has_index_keys);
  layout.block_size = block_size;
  return layout;
}

}  // namespace

kv::CacheLayout Glm5Model::cache_layout(int block_size) const {
  const io::ModelConfig& c = weights_.config;
  return latent_cache_layout(c, std::vector<bool>(c.indexer_full.begin(), c.indexer_full.end()), block_size);
}

kv::CacheLayout Glm5Model::mtp_cache_layout(int block_size) const {
  return latent_cache_layout(weights_.config, {!weights_.mtp.empty() && weights_.mtp[0].block.attention.has_indexer},
                             block_size);
}

std::vector<float> Glm5Model::forward(const ForwardBatch& batch, kv::PagedLatentCache& cache,
                                      ForwardTrace* trace) const {
  const io::ModelConfig& c = weights_.config;
  const int T = batch.num_tokens();
  const int64_t hidden = c.hidden_size;
  GLMS_CHECK(T > 0 || peers_.dp, "empty batch");  // an idle data-parallel rank still joins the MoE layers
  for (int32_t id : batch.token_ids)
    if (id < 0 || id >= c.vocab_size)
      fail("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");

  std::vector<float> x(static_cast<size_t>(T * hidden));  // [T, hidden] residual stream
  for (int t = 0; t < T; ++t) weights_.embed_tokens.row_to_f32(batch.token_ids[t], x.data() + t * hidden);
  if (trace && trace->record_layers) trace->hidden_states.assign(1, x);
  if (trace) trace->min_route_margin = std::numeric_limits<float>::infinity();

  const RopeAngles rope = rope_angles(rope_, batch);
  std::vector<float> normed(x.size()), block_out(x.size());  // [T, hidden]
  TokenSelection selection;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    decoder_layer(c, peers_, weights_.layers[l], l, rope, batch, x, cache, selection, normed, block_out,
                  trace ? &trace->min_route_margin : nullptr);
    if (trace && trace->record_layers) trace->hidden_states.push_back(x);
  }
  std::vector<float> logits = head_logits(batch, x, hidden, weights_.final_norm, c.rms_norm_eps, weights_.lm_head);
  if (trace) trace->last_hidden = std::move(x);
  return logits;
}

std::vector<float> Glm5Model::mtp_forward(int depth, const ForwardBatch& batch, const float* h_prev,
                                          kv::PagedLatentCache& mtp_cache, std::vector<float>* h_out) const {
  const io::ModelConfig& c = weights_.config;
  if (depth < 0 || depth >= num_mtp_layers())
    fail("MTP layer " + std::to_string(depth) + " is not in this checkpoint (it has " +
         std::to_string(num_mtp_layers()) + ")");
  const MtpWeights& m = weights_.mtp[depth];
  if (!m.block.attention.has_indexer)
    fail("the MTP layer has no indexer weights: it cannot select its own top-k");
  const int T = batch.num_tokens();
  const int64_t hidden = c.hidden_size;

  // [T, 2 * hidden]: enorm(embedding of the next token) then hnorm(previous hidden).
  std::vector<float> joined(static_cast<size_t>(T) * 2 * hidden), row(static_cast<size_t>(hidden));
  for (int t = 0; t < T; ++t) {
    m.embed_tokens.row_to_f32(batch.token_ids[t], row.data());
    ops::rms_norm(row.data(), 1, hidden, m.enorm.data(), c.rms_norm_eps, joined.data() + t * 2 * hidden);
    ops::rms_norm(h_prev + t * hidden, 1, hidden, m.hnorm.data(), c.rms_norm_eps,
                  joined.data() + t * 2 * hidden + hidden);
  }
  std::vector<float> x(static_cast<size_t>(T * hidden));  // [T, hidden]
  ops::linear(joined.data(), T, m.eh_proj, x.data());

  const RopeAngles rope = rope_angles(rope_, batch);
  std::vector<float> normed(x.size()), block_out(x.size());
  TokenSelection selection;
  decoder_layer(c, peers_, m.block, 0, rope, batch, x, mtp_cache, selection, normed, block_out);
  std::vector<float> logits = head_logits(batch, x, hidden, m.shared_head_norm, c.rms_norm_eps, m.shared_head);
  if (h_out) *h_out = std::move(x);
  return logits;
}

}  // namespace glms::model
