// The blocks of one GLM-5 decoder layer, written over the op API. All activations are fp32
// [num_tokens, width] row-major; `batch` says where each token's context lives in the cache.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "kv/latent_cache.h"
#include "model/batch.h"
#include "model/shard.h"
#include "model/weights.h"

namespace glms::model {

// Per token, the context positions attention may read: the DSA top-k of a "full" layer, shared
// by the "shared" layers after it.
using TokenSelection = std::vector<std::vector<int32_t>>;

// Rotary cos/sin for each token of the batch: [num_tokens, rope_dim / 2] each.
struct RopeAngles {
  std::vector<float> cos, sin;
  int half = 0;
  const float* cos_of(int token) const { return cos.data() + static_cast<size_t>(token) * half; }
  const float* sin_of(int token) const { return sin.data() + static_cast<size_t>(token) * half; }
};
RopeAngles rope_angles(const ops::RopeTable& table, const ForwardBatch& batch);

// MLA with absorbed weights over the paged latent cache, with DSA sparse selection. Writes this
// step's latent/rope rows (and indexer keys on full layers) into the cache at the batch's slots,
// then attends with the weights' heads. On full layers `selection` is recomputed; on shared
// layers it is read. x: [num_tokens, hidden] (input-normed), out: [num_tokens, hidden] (this
// rank's heads' part of o_proj: the tensor-parallel peers' parts sum to the whole).
void mla_attention(const io::ModelConfig& config, const AttentionWeights& weights, int cache_layer,
                   const RopeAngles& rope, const ForwardBatch& batch, const float* x,
                   kv::PagedLatentCache& cache, TokenSelection& selection, float* out);

// SwiGLU MLP: out = down(silu(gate(x)) * up(x)). x: [n, hidden], out: [n, hidden].
void dense_mlp(const MlpWeights& weights, const float* x, int64_t n, float* out);

// Routed experts (sigmoid router + fp32 correction bias, group-limited top-k, normalised and
// scaled weights) plus the shared expert. x: [n, hidden], out: [n, hidden]. With data-parallel
// peers the routed experts run over every rank's tokens (dp_tokens[r] of rank r, all-gathered)
// and each rank gets its own tokens' sums back (reduce-scatter); `out` is this rank's
// tensor-parallel part (its experts' and its shared-expert slice's), which its tensor-parallel
// peers' parts complete. `min_route_margin`, if given, is lowered to the smallest route_token
// margin of the tokens routed.
void moe_mlp(const io::ModelConfig& config, const MoeWeights& weights, const Peers& peers,
             const std::vector<int32_t>& dp_tokens, const float* x, int64_t n, float* out,
             float* min_route_margin = nullptr);

// Expert choice for one token from its router logits [n_routed_experts]: indices and weights.
// `margin`, if given, receives how far the choice is from changing: the smallest gap between the
// last chosen and the first unchosen choice score (sigmoid + correction bias), over the experts
// and, with group-limited routing, over the groups' scores (+inf where nothing is left out). A
// margin near the activations' rounding error lets another backend choose otherwise.
void route_token(const io::ModelConfig& config, const float* router_logits, const float* correction_bias,
                 std::vector<int32_t>& experts, std::vector<float>& expert_weights, float* margin = nullptr);

}  // namespace glms::model
