// The GLM-5 / GLM-5.2 causal LM (transformers' GlmMoeDsaForCausalLM) over the op API:
// embeddings -> decoder layers (MLA + DSA, dense MLP or MoE) -> final norm -> lm_head.
#pragma once

#include <limits>
#include <vector>

#include "kv/latent_cache.h"
#include "model/batch.h"
#include "model/weights.h"

namespace glms::model {

// Optional per-step outputs for tests and tools.
struct ForwardTrace {
  bool record_layers = true;  // fill hidden_states; false keeps only last_hidden
  // [num_layers + 1][num_tokens * hidden]: the embeddings, then each layer's output (before the
  // final norm, as transformers' hidden_states except that its last entry is normed).
  std::vector<std::vector<float>> hidden_states;
  // Last hidden state of every token before the final norm (what the MTP head consumes).
  std::vector<float> last_hidden;
  // The smallest expert-choice margin of the step's routed tokens over its MoE layers
  // (route_token's; +inf without MoE layers): a step with a margin near the activations' rounding
  // error may route otherwise on another backend.
  float min_route_margin = std::numeric_limits<float>::infinity();
};

// One rank's model: the whole model, or the shard its weights were loaded as, joined to its peers
// (model/shard.h) for the collectives between layers. Every peer runs the same steps together;
// an idle data-parallel rank runs empty batches so that it joins the MoE layers' collectives.
class Glm5Model {
 public:
  explicit Glm5Model(ModelWeights weights, Peers peers = {});

  const io::ModelConfig& config() const { return weights_.config; }
  const ModelWeights& weights() const { return weights_; }
  const ModelShard& shard() const { return weights_.shard; }
  // The cache this model needs, in blocks of `block_size` tokens.
  kv::CacheLayout cache_layout(int block_size) const;

  // One forward step over `batch`: writes the batch's cache rows and returns logits
  // [batch.logits_tokens.size(), vocab_size] in fp32.
  std::vector<float> forward(const ForwardBatch& batch, kv::PagedLatentCache& cache,
                             ForwardTrace* trace = nullptr) const;

  int num_mtp_layers() const { return static_cast<int>(weights_.mtp.size()); }
  // The one-layer cache an MTP draft layer attends over.
  kv::CacheLayout mtp_cache_layout(int block_size) const;
  // MTP draft layer `depth`: for each batch token (token_ids[t] = the token after position t,
  // positions as the main model's), x = eh_proj(cat(enorm(embed(token)), hnorm(h_prev[t]))),
  // then its decoder block over `mtp_cache`, shared_head.norm and shared_head.head. h_prev:
  // [num_tokens, hidden], the main model's (or previous draft's) hidden before the final norm.
  // Returns logits [batch.logits_tokens.size(), vocab] (drafts for position t + 2); `h_out`
  // receives the block's output [num_tokens, hidden] for chaining.
  std::vector<float> mtp_forward(int depth, const ForwardBatch& batch, const float* h_prev,
                                 kv::PagedLatentCache& mtp_cache, std::vector<float>* h_out = nullptr) const;

 private:
  ModelWeights weights_;
  Peers peers_;
  ops::RopeTable rope_;
};

}  // namespace glms::model
