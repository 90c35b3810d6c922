// config.json of a glm_moe_dsa checkpoint -> ModelConfig, with transformers 5.17's defaults and
// derivations (indexer_types from a pattern or freq/offset, mlp_layer_types from
// first_k_dense_replace, rope_parameters from legacy rope_theta).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace glms::io {

struct ModelConfig {
  std::string model_type = "glm_moe_dsa";
  int vocab_size = 154880;
  int hidden_size = 6144;
  int intermediate_size = 12288;      // dense MLP
  int moe_intermediate_size = 2048;   // each routed expert and (times n_shared_experts) the shared one
  int num_hidden_layers = 78;
  int num_attention_heads = 64;
  int num_key_value_heads = 64;
  int q_lora_rank = 2048;             // 0 when config has null (q_proj instead of q_a/q_b)
  int kv_lora_rank = 512;
  int qk_nope_head_dim = 192;
  int qk_rope_head_dim = 64;
  int v_head_dim = 256;
  int n_routed_experts = 256;
  int n_shared_experts = 1;
  int num_experts_per_tok = 8;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 2.5f;
  int index_topk = 2048;
  int index_n_heads = 32;
  int index_head_dim = 128;
  std::vector<bool> indexer_full;     // [num_hidden_layers]: true = "full", false = "shared"
  std::vector<bool> layer_is_moe;     // [num_hidden_layers]: mlp_layer_types == "sparse"
  float rms_norm_eps = 1e-5f;
  std::string hidden_act = "silu";
  bool attention_bias = false;
  std::string rope_type = "default";
  double rope_theta = 10000.0;
  double rope_factor = 1.0;           // rope_parameters.factor (non-default rope types)
  double rope_mscale_all_dim = 0.0;   // rope_parameters.mscale_all_dim (yarn attention scaling)
  int max_position_embeddings = 202752;
  int bos_token_id = 0;               // -1 when null
  int pad_token_id = -1;              // -1 when null
  std::vector<int> eos_token_ids = {1};
  bool tie_word_embeddings = false;
  int num_nextn_predict_layers = 0;   // MTP layers stored after the decoder layers
  std::string torch_dtype = "bfloat16";
  // Element type of MX-quantised (U8 + E8M0 scale) weight matrices, from AMD Quark's
  // quantization_config.global_quant_config.weight.dtype: "fp4", "fp6_e2m3" or "fp6_e3m2".
  std::string mx_weight_dtype = "fp4";

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int num_full_indexer_layers() const;
  // Keeps the first `num_layers` decoder layers (no change when num_layers <= 0 or >= the count).
  void keep_first_layers(int num_layers);
  // Softmax scale of the main attention (qk_head_dim^-0.5, times yarn mscale^2 when set).
  double attention_scale() const;
};

// Parses config.json text. `source` names the file in error messages. Throws glms::Error for
// malformed JSON, a wrong model_type, a field of the wrong type, or inconsistent sizes.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
// Reads DIR/config.json (or the file itself when `path` is a file).
ModelConfig load_model_config(const std::filesystem::path& path);

}  // namespace glms::io
