// Dense SwiGLU MLP and the routed mixture of experts.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/layers.h"

namespace glms::model {

void dense_mlp(const MlpWeights& w, const float* x, int64_t n, float* out) {
  const int64_t inter = w.gate_proj.rows;
  std::vector<float> gate(static_cast<size_t>(n * inter)), up(gate.size());  // [n, inter]
  ops::linear(x, n, w.gate_proj, gate.data());
  ops::linear(x, n, w.up_proj, up.data());
  ops::silu_mul(gate.data(), up.data(), gate.data(), n * inter);
  ops::linear(gate.data(), n, w.down_proj, out);
}

void route_token(const io::ModelConfig& c, const float* router_logits, const float* correction_bias,
                 std::vector<int32_t>& experts, std::vector<float>& expert_weights) {
  const int E = c.n_routed_experts, groups = c.n_group, per_group = E / groups;
  std::vector<float> scores(E), choice(E);
  for (int e = 0; e < E; ++e) {
    scores[e] = 1.0f / (1.0f + std::exp(-router_logits[e]));
    choice[e] = scores[e] + correction_bias[e];
  }
  if (groups > 1) {
    // A group's score is the sum of its two best choice scores; only topk_group groups compete.
    std::vector<float> group_scores(groups);
    std::vector<int32_t> order;
    for (int g = 0; g < groups; ++g) {
      ops::top_k(choice.data() + g * per_group, per_group, 2, order);
      float sum = 0.0f;
      for (int32_t i : order) sum += choice[g * per_group + i];
      group_scores[g] = sum;
    }
    std::vector<int32_t> kept;
    ops::top_k(group_scores.data(), groups, c.topk_group, kept);
    std::vector<bool> keep(groups, false);
    for (int32_t g : kept) keep[g] = true;
    for (int e = 0; e < E; ++e)
      if (!keep[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();
  }
  ops::top_k(choice.data(), E, c.num_experts_per_tok, experts);
  expert_weights.resize(experts.size());
  float total = 0.0f;
  for (size_t i = 0; i < experts.size(); ++i) total += (expert_weights[i] = scores[experts[i]]);
  for (float& weight : expert_weights) {
    if (c.norm_topk_prob) weight /= total + 1e-20f;
    weight *= c.routed_scaling_factor;
  }
}

void moe_mlp(const io::ModelConfig& c, const MoeWeights& w, const float* x, int64_t n, float* out) {
  const int E = c.n_routed_experts;
  const int64_t hidden = c.hidden_size;
  std::vector<float> logits(static_cast<size_t>(n * E));  // [n, E] fp32 router logits
  ops::linear(x, n, w.router, logits.data());

  // Group the batch's tokens by expert so each expert's weights are read once per step.
  std::vector<std::vector<int32_t>> expert_tokens(E);
  std::vector<std::vector<float>> expert_token_weights(E);
  std::vector<int32_t> experts;
  std::vector<float> weights;
  for (int64_t t = 0; t < n; ++t) {
    route_token(c, logits.data() + t * E, w.correction_bias.data(), experts, weights);
    for (size_t i = 0; i < experts.size(); ++i) {
      expert_tokens[experts[i]].push_back(static_cast<int32_t>(t));
      expert_token_weights[experts[i]].push_back(weights[i]);
    }
  }

  dense_mlp(w.shared_expert, x, n, out);
  std::vector<float> gathered, result;
  for (int e = 0; e < E; ++e) {
    const auto& tokens = expert_tokens[e];
    if (tokens.empty()) continue;
    const int64_t count = static_cast<int64_t>(tokens.size());
    gathered.resize(static_cast<size_t>(count * hidden));
    result.resize(gathered.size());
    for (int64_t i = 0; i < count; ++i)
      std::copy(x + tokens[i] * hidden, x + (tokens[i] + 1) * hidden, gathered.data() + i * hidden);
    dense_mlp(w.experts[e], gathered.data(), count, result.data());
    for (int64_t i = 0; i < count; ++i) {
      const float weight = expert_token_weights[e][i];
      float* dst = out + tokens[i] * hidden;
      const float* src = result.data() + i * hidden;
      for (int64_t k = 0; k < hidden; ++k) dst[k] += weight * src[k];
    }
  }
}

}  // namespace glms::model
