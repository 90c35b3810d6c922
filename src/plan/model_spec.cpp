#include "plan/model_spec.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/model_config.h"

namespace glms::plan {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Typed reads of config.json fields with a useful message on a wrong or missing value.
class Reader {
 public:
  Reader(const json& object, std::string source) : object_(object), source_(std::move(source)) {}

  bool has(const std::string& key) const {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }
  int positive(const std::string& key) const {
    if (!has(key)) fail(source_ + ": field '" + key + "' is missing");
    return checked(key);
  }
  int positive_or(const std::string& key, int fallback) const { return has(key) ? checked(key) : fallback; }
  int non_negative_or(const std::string& key, int fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30))
      fail(source_ + ": field '" + key + "' must be a non-negative integer, got " + v.dump());
    return v.get<int>();
  }
  bool flag_or(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_boolean()) fail(source_ + ": field '" + key + "' must be true or false, got " + v.dump());
    return v.get<bool>();
  }

 private:
  int checked(const std::string& key) const {
    const json& v = object_.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 30))
      fail(source_ + ": field '" + key + "' must be a positive integer, got " + v.dump());
    return v.get<int>();
  }
  const json& object_;
  std::string source_;
};

void fill_moe_summary(ModelSpec& spec, const io::ModelConfig& c) {
  spec.layers = c.num_hidden_layers;
  spec.hidden = c.hidden_size;
  spec.vocab = c.vocab_size;
  spec.heads = c.num_attention_heads;
  spec.tie_word_embeddings = c.tie_word_embeddings;
  spec.q_lora_rank = c.q_lora_rank;
  spec.kv_lora_rank = c.kv_lora_rank;
  spec.qk_nope_head_dim = c.qk_nope_head_dim;
  spec.qk_rope_head_dim = c.qk_rope_head_dim;
  spec.v_head_dim = c.v_head_dim;
  spec.n_routed_experts = c.n_routed_experts;
  spec.experts_per_token = c.num_experts_per_tok;
  spec.expert_parameters = 3 * int64_t{c.hidden_size} * c.moe_intermediate_size;
  spec.moe_layers = 0;
  for (bool moe : c.layer_is_moe) spec.moe_layers += moe ? 1 : 0;
  spec.mtp_layers = c.num_nextn_predict_layers;
}

}  // namespace

ModelSpec model_spec_of(const io::ModelConfig& c) {
  ModelSpec spec;
  spec.model_type = c.model_type;
  spec.attention = AttentionKind::kMlaDsa;
  fill_moe_summary(spec, c);
  spec.index_topk = c.index_topk;
  spec.index_n_heads = c.index_n_heads;
  spec.index_head_dim = c.index_head_dim;
  spec.full_indexer_layers = c.num_full_indexer_layers();
  spec.inventory = model::parameter_inventory(c);
  spec.active_parameters = spec.inventory.active_per_token(c);
  spec.glm = c;
  return spec;
}

namespace {

ModelSpec glm_spec(const std::string& text, const std::string& source) {
  return model_spec_of(io::parse_model_config(text, source));
}

// DeepSeek-V2/V3 style: MLA without an indexer. The layer arithmetic is GLM's without the
// indexer, so it goes through the same inventory with the indexer sized zero.
ModelSpec deepseek_spec(const json& j, const std::string& model_type, const std::string& source) {
  const Reader r(j, source);
  io::ModelConfig c;
  c.model_type = model_type;
  c.vocab_size = r.positive("vocab_size");
  c.hidden_size = r.positive("hidden_size");
  c.intermediate_size = r.positive("intermediate_size");
  c.moe_intermediate_size = r.positive("moe_intermediate_size");
  c.num_hidden_layers = r.positive("num_hidden_layers");
  c.num_attention_heads = r.positive("num_attention_heads");
  c.num_key_value_heads = r.positive_or("num_key_value_heads", c.num_attention_heads);
  c.q_lora_rank = r.non_negative_or("q_lora_rank", 0);  // null: one q_proj
  c.kv_lora_rank = r.positive("kv_lora_rank");
  c.qk_nope_head_dim = r.positive("qk_nope_head_dim");
  c.qk_rope_head_dim = r.positive("qk_rope_head_dim");
  c.v_head_dim = r.positive("v_head_dim");
  c.n_routed_experts = r.positive("n_routed_experts");
  c.n_shared_experts = r.non_negative_or("n_shared_experts", 0);
  c.num_experts_per_tok = r.positive("num_experts_per_tok");
  c.tie_word_embeddings = r.flag_or("tie_word_embeddings", false);
  c.num_nextn_predict_layers = r.non_negative_or("num_nextn_predict_layers", 0);
  c.index_n_heads = 0;
  c.index_head_dim = 0;
  c.index_topk = 0;
  const int first_dense = r.non_negative_or("first_k_dense_replace", 0);
  const int freq = r.positive_or("moe_layer_freq", 1);
  if (c.num_experts_per_tok > c.n_routed_experts)
    fail(source + ": num_experts_per_tok exceeds n_routed_experts");
  c.indexer_full.assign(c.num_hidden_layers, false);
  c.layer_is_moe.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) c.layer_is_moe[l] = l >= first_dense && l % freq == 0;

  ModelSpec spec;
  spec.model_type = model_type;
  spec.attention = AttentionKind::kMla;
  fill_moe_summary(spec, c);
  spec.inventory = model::parameter_inventory(c);
  spec.active_parameters = spec.inventory.active_per_token(c);
  if (c.q_lora_rank == 0) {
    const int64_t q_proj = int64_t{c.num_hidden_layers} * c.hidden_size * c.num_attention_heads * c.qk_head_dim();
    spec.inventory.groups.push_back({"q_proj", q_proj, true, false, false});
    spec.active_parameters += q_proj;
  }
  return spec;
}

// Dense decoder with grouped-query attention (llama, mistral, qwen2, qwen3).
ModelSpec gqa_spec(const json& j, const std::string& model_type, const std::string& source) {
  const Reader r(j, source);
  ModelSpec spec;
  spec.model_type = model_type;
  spec.attention = AttentionKind::kGqa;
  spec.hidden = r.positive("hidden_size");
  spec.layers = r.positive("num_hidden_layers");
  spec.heads = r.positive("num_attention_heads");
  spec.kv_heads = r.positive_or("num_key_value_heads", spec.heads);
  if (spec.hidden % spec.heads != 0 && !r.has("head_dim"))
    fail(source + ": hidden_size is not a multiple of num_attention_heads and head_dim is missing");
  spec.head_dim = r.positive_or("head_dim", spec.hidden / spec.heads);
  spec.vocab = r.positive("vocab_size");
  spec.tie_word_embeddings = r.flag_or("tie_word_embeddings", false);
  if (spec.heads % spec.kv_heads != 0)
    fail(source + ": num_attention_heads must be a multiple of num_key_value_heads");
  const int64_t h = spec.hidden, inter = r.positive("intermediate_size"), L = spec.layers;
  const int64_t q_width = int64_t{spec.heads} * spec.head_dim, kv_width = int64_t{spec.kv_heads} * spec.head_dim;
  const bool qkv_bias = model_type == "qwen2" || r.flag_or("attention_bias", false);
  const bool o_bias = model_type != "qwen2" && r.flag_or("attention_bias", false);
  const bool mlp_bias = r.flag_or("mlp_bias", false);
  const int64_t biases = L * ((qkv_bias ? q_width + 2 * kv_width : 0) + (o_bias ? h : 0) + (mlp_bias ? 2 * inter + h : 0));
  const int64_t norms = L * (2 * h + (model_type == "qwen3" ? 2 * spec.head_dim : 0)) + h;

  // Dense models quantise every decoder linear layer in the MX formats (quantizable_fp4 on
  // attention as well as the MLP); embeddings and lm_head stay bf16 as in every format.
  auto& groups = spec.inventory.groups;
  groups.push_back({"embed_tokens", int64_t{spec.vocab} * h, true, false, false});
  groups.push_back({"attention", L * (2 * h * q_width + 2 * h * kv_width), true, true, false});
  groups.push_back({"dense_mlp", L * 3 * h * inter, true, true, false});
  if (biases > 0) groups.push_back({"biases", biases, false, false, false});
  groups.push_back({"norms", norms, false, false, false});
  if (!spec.tie_word_embeddings) groups.push_back({"lm_head", int64_t{spec.vocab} * h, true, false, false});
  // Every parameter but the embedding lookup is used by every token (tied: the lm_head is it).
  spec.active_parameters = spec.inventory.total() - (spec.tie_word_embeddings ? 0 : int64_t{spec.vocab} * h);
  return spec;
}

}  // namespace

const char* attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kMlaDsa: return "MLA + DSA indexer";
    case AttentionKind::kMla: return "MLA";
    case AttentionKind::kGqa: return "GQA";
  }
  return "?";
}

int64_t ModelSpec::mtp_parameters() const {
  int64_t sum = 0;
  for (const auto& g : inventory.groups)
    if (g.in_mtp) sum += g.parameters;
  return sum;
}

int64_t ModelSpec::group_bytes(const std::string& group, const std::string& format) const {
  model::Inventory part;
  for (const auto& g : inventory.groups)
    if (g.name == group) part.groups.push_back(g);
  return part.groups.empty() ? 0 : part.weight_bytes(format);
}

double ModelSpec::expert_bytes(const std::string& format) const {
  model::Inventory one;
  one.groups.push_back({"routed_experts", expert_parameters, true, true, false});
  return static_cast<double>(one.weight_bytes(format));
}

ModelSpec parse_model_spec(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail(source + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail(source + ": config must be a JSON object");
  const auto type = j.find("model_type");
  if (type == j.end() || !type->is_string()) fail(source + ": field 'model_type' is missing");
  const std::string model_type = type->get<std::string>();
  if (model_type == "glm_moe_dsa") return glm_spec(json_text, source);
  if (model_type == "deepseek_v3" || model_type == "deepseek_v2") return deepseek_spec(j, model_type, source);
  if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2" || model_type == "qwen3")
    return gqa_spec(j, model_type, source);
  fail(source + ": model_type '" + model_type +
       "' is not supported by the planner (glm_moe_dsa, deepseek_v2, deepseek_v3, llama, mistral, qwen2, qwen3)");
}

ModelSpec load_model_spec(const fs::path& path) {
  const fs::path file = fs::is_directory(path) ? path / "config.json" : path;
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot read " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return parse_model_spec(text.str(), file.string());
}

}  // namespace glms::plan
