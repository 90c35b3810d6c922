// The GLM-5 weights as views into a mapped checkpoint, named as the real checkpoints name
// them (model.layers.N.self_attn.q_a_proj.weight, ...mlp.experts.E.gate_proj.weight, ...).
// Matrices stay in their stored dtype; norm vectors and the router bias are widened to fp32.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/shard.h"
#include "ops/ops.h"

namespace glms::model {

using ops::WeightView;

struct IndexerWeights {
  WeightView wq_b;          // [index_n_heads * index_head_dim, q_lora_rank]
  WeightView wk;            // [index_head_dim, hidden]
  WeightView weights_proj;  // [index_n_heads, hidden]
  std::vector<float> k_norm_weight, k_norm_bias;  // [index_head_dim]
};

// `heads` are this rank's attention heads (all of them unless tensor parallel); q_a, kv_a and the
// indexer are whole on every rank.
struct AttentionWeights {
  int heads = 0;
  WeightView q_a_proj;            // [q_lora_rank, hidden]
  std::vector<float> q_a_norm;    // [q_lora_rank]
  WeightView q_b_proj;            // [heads * (qk_nope + qk_rope), q_lora_rank]
  WeightView kv_a_proj;           // [kv_lora_rank + qk_rope, hidden]
  std::vector<float> kv_a_norm;   // [kv_lora_rank]
  WeightView kv_b_proj;           // [heads * (qk_nope + v_head), kv_lora_rank]
  WeightView o_proj;              // [hidden, heads * v_head] (this rank's heads' columns)
  bool has_indexer = false;       // "full" layers run their own indexer
  IndexerWeights indexer;
};

// A SwiGLU MLP, or this rank's slice of its intermediate width.
struct MlpWeights {
  WeightView gate_proj, up_proj;  // [intermediate, hidden]
  WeightView down_proj;           // [hidden, intermediate]
};

struct MoeWeights {
  WeightView router;                       // [n_routed_experts, hidden] (all experts, every rank)
  std::vector<float> correction_bias;      // [n_routed_experts] fp32
  int first_expert = 0;                    // global id of experts[0]
  std::vector<MlpWeights> experts;         // this rank's routed experts (model/shard.h)
  MlpWeights shared_expert;                // intermediate = moe_inter * n_shared_experts (this rank's slice)
};

struct DecoderLayerWeights {
  std::vector<float> input_norm, post_attention_norm;  // [hidden]
  AttentionWeights attention;
  bool is_moe = false;
  MlpWeights mlp;   // dense layers
  MoeWeights moe;   // MoE layers
};

// The MTP draft layer stored at index num_hidden_layers.
struct MtpWeights {
  std::vector<float> enorm, hnorm;   // [hidden]
  WeightView eh_proj;                // [hidden, 2 * hidden]
  DecoderLayerWeights block;
  std::vector<float> shared_head_norm;  // [hidden]
  WeightView shared_head;               // [vocab, hidden]
  WeightView embed_tokens;              // own copy if stored, else the main model's
};

struct ModelWeights {
  io::ModelConfig config;
  ModelShard shard;                            // the part of the model these are (whole by default)
  std::shared_ptr<io::Checkpoint> checkpoint;  // owns the mapped storage
  WeightView embed_tokens;                     // [vocab, hidden]
  std::vector<DecoderLayerWeights> layers;
  std::vector<float> final_norm;               // [hidden]
  WeightView lm_head;                          // [vocab, hidden]
  std::vector<MtpWeights> mtp;                 // num_nextn_predict_layers entries when present

  int64_t parameters = 0;  // values of every weight this rank holds (MTP included)
};

struct LoadOptions {
  int num_layers = -1;     // keep the first N decoder layers (-1: all)
  bool load_mtp = true;    // load MTP layers when the config declares and the checkpoint has them
  ModelShard shard;        // the part of the model to take (views of only its tensors' bytes)
};

// Loads config.json + safetensors from `dir` (one file or a sharded index; mapped, so a rank
// touches only the bytes of the tensors and slices it takes). Throws glms::Error naming the
// missing tensor or the shape mismatch (expected vs found) and the checkpoint folder, or the
// part of the model a layout does not divide.
ModelWeights load_weights(const std::string& dir, const LoadOptions& options = {});

}  // namespace glms::model
