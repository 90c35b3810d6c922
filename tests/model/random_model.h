// Writes a small glm_moe_dsa checkpoint folder with seeded random bf16 weights, named exactly as
// transformers' save_pretrained names them, for tests that need a model but no fixture.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace glms::testing {

struct RandomModelSpec {
  int vocab_size = 97;
  int hidden_size = 40;
  int intermediate_size = 56;
  int moe_intermediate_size = 12;
  int num_hidden_layers = 4;
  int first_k_dense_replace = 1;
  int num_attention_heads = 3;
  int q_lora_rank = 24;
  int kv_lora_rank = 16;
  int qk_nope_head_dim = 10;
  int qk_rope_head_dim = 6;
  int v_head_dim = 9;
  int n_routed_experts = 8;
  int num_experts_per_tok = 3;
  int n_group = 2;
  int topk_group = 1;
  int index_n_heads = 4;
  int index_head_dim = 14;
  int index_topk = 9;
  std::string index_topk_pattern = "FSFS";  // per layer: F runs the indexer, S shares
  bool with_mtp = true;                      // store an MTP layer at index num_hidden_layers
  std::vector<int> eos_token_ids = {1, 2};
  float init_std = 0.08f;
  uint64_t seed = 1;
};

// Creates `dir` (config.json + model.safetensors). Returns `dir`.
std::filesystem::path write_random_model(const std::filesystem::path& dir, const RandomModelSpec& spec);

// A fresh temporary directory under the build tree, removed by the caller's TempDir.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name);
  ~TempDir();
};

}  // namespace glms::testing
