// The GLM-5 / GLM-5.2 causal LM (transformers' GlmMoeDsaForCausalLM) over the op API:
// embeddings -> decoder layers (MLA + DSA, dense MLP or MoE) -> final norm -> lm_head.
#pragma once

#include <vector>

#include "kv/latent_cache.h"
#include "model/batch.h"
#include "model/weights.h"

namespace glms::model {

// Optional per-step outputs for tests and tools.
struct ForwardTrace {
  // [num_layers + 1][num_tokens * hidden]: the embeddings, then each layer's output (before the
  // final norm, as transformers' hidden_states except that its last entry is normed).
  std::vector<std::vector<float>> hidden_states;
  // Last hidden state of every token before the final norm (what the MTP head consumes).
  std::vector<float> last_hidden;
};

class Glm5Model {
 public:
  explicit Glm5Model(ModelWeights weights);

  const io::ModelConfig& config() const { return weights_.config; }
  const ModelWeights& weights() const { return weights_; }
  // The cache this model needs, in blocks of `block_size` tokens.
  kv::CacheLayout cache_layout(int block_size) const;

  // One forward step over `batch`: writes the batch's cache rows and returns logits
  // [batch.logits_tokens.size(), vocab_size] in fp32.
  std::vector<float> forward(const ForwardBatch& batch, kv::PagedLatentCache& cache,
                             ForwardTrace* trace = nullptr) const;

 private:
  ModelWeights weights_;
  ops::RopeTable rope_;
};

}  // namespace glms::model
