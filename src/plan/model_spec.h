// What the planner needs to know about a model, from its config.json alone: parameter groups
// (model::Inventory, so weight bytes per format follow one rule everywhere), the attention kind
// (GLM-5 MLA + DSA indexer, DeepSeek MLA, or GQA), MoE shape and KV cache geometry.
//   glm_moe_dsa             -> io::parse_model_config + model::parameter_inventory
//   deepseek_v2/deepseek_v3 -> this file's parser, then model::parameter_inventory
//   llama/mistral/qwen2/qwen3 (dense GQA) -> this file's parser and inventory
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "io/model_config.h"
#include "model/inventory.h"

namespace glms::plan {

enum class AttentionKind { kMlaDsa, kMla, kGqa };
const char* attention_kind_name(AttentionKind kind);

struct ModelSpec {
  std::string model_type;
  AttentionKind attention = AttentionKind::kGqa;
  int layers = 0, hidden = 0, vocab = 0, heads = 0;
  bool tie_word_embeddings = false;
  // GQA
  int kv_heads = 0, head_dim = 0;
  // MLA (cache holds kv_lora + rope per token per layer)
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // DSA lightning indexer (GLM-5): keys of index_head_dim cached on the full layers
  int index_topk = 0, index_n_heads = 0, index_head_dim = 0, full_indexer_layers = 0;
  // MoE
  int moe_layers = 0, n_routed_experts = 0, experts_per_token = 0;
  int64_t expert_parameters = 0;  // one routed expert of one layer (gate, up, down)
  int mtp_layers = 0;

  // The parsed config of a glm_moe_dsa model (what glmserve serves: its device memory is known).
  std::optional<io::ModelConfig> glm;

  model::Inventory inventory;     // parameter groups, as model::parameter_inventory names them
  int64_t active_parameters = 0;  // per token: no embeddings, no MTP, top-k of the routed experts

  int64_t total_parameters() const { return inventory.total(); }
  int64_t mtp_parameters() const;
  int64_t weight_bytes(const std::string& format) const { return inventory.weight_bytes(format); }
  // Bytes of the parameter groups named `group` in `format` (0 when absent).
  int64_t group_bytes(const std::string& group, const std::string& format) const;
  // Bytes of one routed expert (one layer) in `format`.
  double expert_bytes(const std::string& format) const;
};

// The spec of a parsed glm_moe_dsa config (for instance one cut to fewer layers).
ModelSpec model_spec_of(const io::ModelConfig& config);

// Parses config.json text of any supported family; `source` names it in errors.
ModelSpec parse_model_spec(const std::string& json_text, const std::string& source);
// DIR/config.json, or the file itself.
ModelSpec load_model_spec(const std::filesystem::path& path);

}  // namespace glms::plan
