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

namespace {

// The smallest chosen score less the largest unchosen finite one (+inf where every finite score
// is chosen): how far `scores` are from choosing otherwise.
float choice_margin(const std::vector<float>& scores, const std::vector<bool>& chosen) {
  float lowest_chosen = std::numeric_limits<float>::infinity();
  float highest_left = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < scores.size(); ++i) {
    if (chosen[i]) lowest_chosen = std::min(lowest_chosen, scores[i]);
    else if (std::isfinite(scores[i])) highest_left = std::max(highest_left, scores[i]);
  }
  return std::isfinite(highest_left) ? lowest_chosen - highest_left : std::numeric_limits<float>::infinity();
}

}  // namespace

void route_token(const io::ModelConfig& c, const float* router_logits, const float* correction_bias,
                 std::vector<int32_t>& experts, std::vector<float>& expert_weights, float* margin) {
  if (margin) *margin = std::numeric_limits<float>::infinity();
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
    if (margin) *margin = std::min(*margin, choice_margin(group_scores, keep));
    for (int e = 0; e < E; ++e)
      if (!keep[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();
  }
  ops::top_k(choice.data(), E, c.num_experts_per_tok, experts);
  if (margin) {
    std::vector<bool> chosen(E, false);
    for (int32_t e : experts) chosen[e] = true;
    *margin = std::min(*margin, choice_margin(choice, chosen));
  }
  expert_weights.resize(experts.size());
  float total = 0.0f;
  for (size_t i = 0; i < experts.size(); ++i) total += (expert_weights[i] = scores[experts[i]]);
  for (float& weight : expert_weights) {
    if (c.norm_topk_prob) weight /= total + 1e-20f;
    weight *= c.routed_scaling_factor;
  }
}

namespace {

// Rows of every data-parallel rank's tokens, rank by rank: x [n, hidden] here, dp_tokens[r] rows
// from rank r (padded to the largest count for the collective). Returns [sum dp_tokens, hidden].
std::vector<float> gather_tokens(comm::Communicator& dp, const std::vector<int32_t>& dp_tokens, const float* x,
                                 int64_t n, int64_t hidden) {
  const int64_t padded = *std::max_element(dp_tokens.begin(), dp_tokens.end());
  std::vector<float> mine(static_cast<size_t>(padded * hidden), 0.0f), all(mine.size() * dp_tokens.size());
  std::copy(x, x + n * hidden, mine.begin());
  dp.all_gather(mine.data(), all.data(), mine.size(), comm::Element::F32);
  std::vector<float> tokens;
  for (size_t r = 0; r < dp_tokens.size(); ++r)
    tokens.insert(tokens.end(), all.begin() + r * padded * hidden, all.begin() + (r * padded + dp_tokens[r]) * hidden);
  return tokens;
}

// The inverse: routed [sum dp_tokens, hidden] partial sums of every rank's tokens, summed over
// the data-parallel peers; this rank's n rows land in out [n, hidden].
void scatter_sums(comm::Communicator& dp, const std::vector<int32_t>& dp_tokens, const std::vector<float>& routed,
                  int64_t n, int64_t hidden, float* out) {
  const int64_t padded = *std::max_element(dp_tokens.begin(), dp_tokens.end());
  std::vector<float> all(static_cast<size_t>(padded * hidden) * dp_tokens.size(), 0.0f), mine(padded * hidden);
  int64_t from = 0;
  for (size_t r = 0; r < dp_tokens.size(); ++r) {
    std::copy(routed.begin() + from * hidden, routed.begin() + (from + dp_tokens[r]) * hidden,
              all.begin() + r * padded * hidden);
    from += dp_tokens[r];
  }
  dp.reduce_scatter_sum(all.data(), mine.data(), mine.size(), comm::Element::F32);
  std::copy(mine.begin(), mine.begin() + n * hidden, out);
}

}  // namespace

void moe_mlp(const io::ModelConfig& c, const MoeWeights& w, const Peers& peers, const std::vector<int32_t>& dp_tokens,
             const float* x, int64_t n, float* out, float* min_route_margin) {
  const int E = c.n_routed_experts;
  const int64_t hidden = c.hidden_size;
  std::vector<float> gathered;
  const float* tokens = x;  // [count, hidden]: the tokens the routed experts run over
  int64_t count = n;
  if (peers.dp) {
    GLMS_CHECK(dp_tokens.size() == static_cast<size_t>(peers.dp->size()) && dp_tokens[peers.dp->rank()] == n,
               "a data-parallel MoE step needs every rank's token count (ForwardBatch::dp_peers)");
    gathered = gather_tokens(*peers.dp, dp_tokens, x, n, hidden);
    tokens = gathered.data();
    count = static_cast<int64_t>(gathered.size()) / hidden;
  }
  std::vector<float> logits(static_cast<size_t>(count * E));  // [count, E] fp32 router logits
  ops::linear(tokens, count, w.router, logits.data());

  // Group the tokens by this rank's experts so each expert's weights are read once per step.
  const int local = static_cast<int>(w.experts.size());
  std::vector<std::vector<int32_t>> expert_tokens(local);
  std::vector<std::vector<float>> expert_token_weights(local);
  std::vector<int32_t> experts;
  std::vector<float> weights;
  for (int64_t t = 0; t < count; ++t) {
    float margin = 0.0f;
    route_token(c, logits.data() + t * E, w.correction_bias.data(), experts, weights,
                min_route_margin ? &margin : nullptr);
    if (min_route_margin) *min_route_margin = std::min(*min_route_margin, margin);
    for (size_t i = 0; i < experts.size(); ++i) {
      const int e = experts[i] - w.first_expert;
      if (e < 0 || e >= local) continue;  // another rank's expert
      expert_tokens[e].push_back(static_cast<int32_t>(t));
      expert_token_weights[e].push_back(weights[i]);
    }
  }

  std::vector<float> routed(static_cast<size_t>(count * hidden), 0.0f);  // [count, hidden]
  std::vector<float> rows, result;
  for (int e = 0; e < local; ++e) {
    const auto& chosen = expert_tokens[e];
    if (chosen.empty()) continue;
    const int64_t m = static_cast<int64_t>(chosen.size());
    rows.resize(static_cast<size_t>(m * hidden));
    result.resize(rows.size());
    for (int64_t i = 0; i < m; ++i)
      std::copy(tokens + chosen[i] * hidden, tokens + (chosen[i] + 1) * hidden, rows.data() + i * hidden);
    dense_mlp(w.experts[e], rows.data(), m, result.data());
    for (int64_t i = 0; i < m; ++i) {
      const float weight = expert_token_weights[e][i];
      float* dst = routed.data() + chosen[i] * hidden;
      const float* src = result.data() + i * hidden;
      for (int64_t k = 0; k < hidden; ++k) dst[k] += weight * src[k];
    }
  }
  if (peers.dp) scatter_sums(*peers.dp, dp_tokens, routed, n, hidden, out);
  else std::copy(routed.begin(), routed.end(), out);

  std::vector<float> shared(static_cast<size_t>(n * hidden));
  dense_mlp(w.shared_expert, x, n, shared.data());
  for (size_t i = 0; i < shared.size(); ++i) out[i] += shared[i];
}

}  // namespace glms::model
