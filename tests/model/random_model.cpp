#include "random_model.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "io/safetensors.h"

namespace glms::testing {

namespace {

class TensorWriter {
 public:
  TensorWriter(uint64_t seed, float std) : rng_(seed), std_(std) {}

  void matrix(const std::string& name, int64_t rows, int64_t cols) {
    std::normal_distribution<float> normal(0.0f, std_);
    std::vector<float> values(static_cast<size_t>(rows * cols));
    for (float& v : values) v = normal(rng_);
    tensors_.push_back(io::tensor_bf16(name, {rows, cols}, values));
  }
  void norm(const std::string& name, int64_t size) {  // weights near 1, never exactly
    std::normal_distribution<float> normal(1.0f, 0.1f);
    std::vector<float> values(static_cast<size_t>(size));
    for (float& v : values) v = normal(rng_);
    tensors_.push_back(io::tensor_bf16(name, {size}, values));
  }
  void bias(const std::string& name, int64_t size, bool fp32) {
    std::uniform_real_distribution<float> uniform(0.0f, 0.5f);
    std::vector<float> values(static_cast<size_t>(size));
    for (float& v : values) v = uniform(rng_);
    tensors_.push_back(fp32 ? io::tensor_f32(name, {size}, values) : io::tensor_bf16(name, {size}, values));
  }
  std::vector<io::TensorToWrite>& tensors() { return tensors_; }

 private:
  std::mt19937_64 rng_;
  float std_;
  std::vector<io::TensorToWrite> tensors_;
};

void write_layer(TensorWriter& w, const RandomModelSpec& s, int layer, bool indexer, bool moe) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const int64_t h = s.hidden_size, heads = s.num_attention_heads;
  w.norm(p + "input_layernorm.weight", h);
  w.norm(p + "post_attention_layernorm.weight", h);
  const std::string a = p + "self_attn.";
  w.matrix(a + "q_a_proj.weight", s.q_lora_rank, h);
  w.norm(a + "q_a_layernorm.weight", s.q_lora_rank);
  w.matrix(a + "q_b_proj.weight", heads * (s.qk_nope_head_dim + s.qk_rope_head_dim), s.q_lora_rank);
  w.matrix(a + "kv_a_proj_with_mqa.weight", s.kv_lora_rank + s.qk_rope_head_dim, h);
  w.norm(a + "kv_a_layernorm.weight", s.kv_lora_rank);
  w.matrix(a + "kv_b_proj.weight", heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank);
  w.matrix(a + "o_proj.weight", h, heads * s.v_head_dim);
  if (indexer) {
    w.matrix(a + "indexer.wq_b.weight", int64_t{s.index_n_heads} * s.index_head_dim, s.q_lora_rank);
    w.matrix(a + "indexer.wk.weight", s.index_head_dim, h);
    w.matrix(a + "indexer.weights_proj.weight", s.index_n_heads, h);
    w.norm(a + "indexer.k_norm.weight", s.index_head_dim);
    w.bias(a + "indexer.k_norm.bias", s.index_head_dim, false);
  }
  const std::string m = p + "mlp.";
  auto mlp = [&](const std::string& prefix, int64_t inter) {
    w.matrix(prefix + "gate_proj.weight", inter, h);
    w.matrix(prefix + "up_proj.weight", inter, h);
    w.matrix(prefix + "down_proj.weight", h, inter);
  };
  if (!moe) {
    mlp(m, s.intermediate_size);
    return;
  }
  w.matrix(m + "gate.weight", s.n_routed_experts, h);
  w.bias(m + "gate.e_score_correction_bias", s.n_routed_experts, true);
  for (int e = 0; e < s.n_routed_experts; ++e) mlp(m + "experts." + std::to_string(e) + ".", s.moe_intermediate_size);
  mlp(m + "shared_experts.", s.moe_intermediate_size);
}

}  // namespace

std::filesystem::path write_random_model(const std::filesystem::path& dir, const RandomModelSpec& s) {
  std::filesystem::create_directories(dir);
  nlohmann::json config = {
      {"architectures", {"GlmMoeDsaForCausalLM"}}, {"model_type", "glm_moe_dsa"},
      {"vocab_size", s.vocab_size}, {"hidden_size", s.hidden_size}, {"intermediate_size", s.intermediate_size},
      {"moe_intermediate_size", s.moe_intermediate_size}, {"num_hidden_layers", s.num_hidden_layers},
      {"first_k_dense_replace", s.first_k_dense_replace}, {"num_attention_heads", s.num_attention_heads},
      {"num_key_value_heads", s.num_attention_heads}, {"q_lora_rank", s.q_lora_rank},
      {"kv_lora_rank", s.kv_lora_rank}, {"qk_nope_head_dim", s.qk_nope_head_dim},
      {"qk_rope_head_dim", s.qk_rope_head_dim}, {"v_head_dim", s.v_head_dim},
      {"n_routed_experts", s.n_routed_experts}, {"n_shared_experts", 1},
      {"num_experts_per_tok", s.num_experts_per_tok}, {"n_group", s.n_group}, {"topk_group", s.topk_group},
      {"norm_topk_prob", true}, {"routed_scaling_factor", 2.5}, {"index_topk", s.index_topk},
      {"index_n_heads", s.index_n_heads}, {"index_head_dim", s.index_head_dim},
      {"index_topk_pattern", s.index_topk_pattern}, {"rms_norm_eps", 1e-5}, {"hidden_act", "silu"},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
      {"max_position_embeddings", 4096}, {"bos_token_id", 0}, {"eos_token_id", s.eos_token_ids},
      {"tie_word_embeddings", false}, {"num_nextn_predict_layers", s.with_mtp ? 1 : 0},
      {"dtype", "bfloat16"}};
  std::ofstream(dir / "config.json") << config.dump(2);

  TensorWriter w(s.seed, s.init_std);
  w.matrix("model.embed_tokens.weight", s.vocab_size, s.hidden_size);
  for (int l = 0; l < s.num_hidden_layers; ++l)
    write_layer(w, s, l, s.index_topk_pattern[l] == 'F', l >= s.first_k_dense_replace);
  w.norm("model.norm.weight", s.hidden_size);
  w.matrix("lm_head.weight", s.vocab_size, s.hidden_size);
  if (s.with_mtp) {
    const std::string p = "model.layers." + std::to_string(s.num_hidden_layers) + ".";
    w.norm(p + "enorm.weight", s.hidden_size);
    w.norm(p + "hnorm.weight", s.hidden_size);
    w.matrix(p + "eh_proj.weight", s.hidden_size, 2 * s.hidden_size);
    write_layer(w, s, s.num_hidden_layers, true, true);
    w.norm(p + "shared_head.norm.weight", s.hidden_size);
    w.matrix(p + "shared_head.head.weight", s.vocab_size, s.hidden_size);
  }
  io::write_safetensors(dir / "model.safetensors", w.tensors());
  return dir;
}

TempDir::TempDir(const std::string& name) {
  path = std::filesystem::temp_directory_path() / ("glms-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

}  // namespace glms::testing
