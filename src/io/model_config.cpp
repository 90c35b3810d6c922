#include "io/model_config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace glms::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A config with more layers than this is corrupt (GLM-5 has 78).
constexpr int kMaxLayers = 1 << 16;

std::string type_of(const json& value) {
  if (value.is_number_integer()) return "integer " + value.dump();
  if (value.is_number_float()) return "float " + value.dump();
  if (value.is_string()) {
    std::string text = value.dump();
    if (text.size() > 60) text = text.substr(0, 60) + "...\"";
    return "string " + text;
  }
  if (value.is_boolean()) return "boolean " + value.dump();
  return value.type_name();
}

// Reads typed fields of one JSON object; absent fields leave the output untouched.
class Fields {
 public:
  Fields(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const json* get(const std::string& key) const {
    auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return get(key) != nullptr; }
  bool has_value(const std::string& key) const {
    const json* v = get(key);
    return v && !v->is_null();
  }

  [[noreturn]] void fail_field(const std::string& key, const std::string& problem) const {
    fail(source_ + ": field '" + prefix_ + key + "' " + problem);
  }
  [[noreturn]] void wrong_type(const std::string& key, const std::string& expected,
                               const json& got) const {
    fail_field(key, "must be " + expected + ", got " + type_of(got));
  }

  static bool is_int32(const json& v) {
    if (v.is_number_unsigned()) return v.get<uint64_t>() <= static_cast<uint64_t>(INT_MAX);
    if (v.is_number_integer()) {
      const int64_t x = v.get<int64_t>();
      return x >= INT_MIN && x <= INT_MAX;
    }
    return false;
  }
  int to_int(const std::string& key, const json& v, const char* expected = "an integer") const {
    if (!v.is_number_integer()) wrong_type(key, expected, v);
    if (!is_int32(v)) fail_field(key, "= " + v.dump() + " is out of the 32-bit integer range");
    return static_cast<int>(v.get<int64_t>());
  }

  // `null_value`: what JSON null maps to; without it null is a type error.
  void read(const std::string& key, int* out, std::optional<int> null_value = std::nullopt) const {
    const json* v = get(key);
    if (!v) return;
    if (v->is_null() && null_value) *out = *null_value;
    else *out = to_int(key, *v, null_value ? "an integer or null" : "an integer");
  }
  void read(const std::string& key, bool* out) const {
    const json* v = get(key);
    if (!v) return;
    if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
    *out = v->get<bool>();
  }
  template <typename Float>
  void read_number(const std::string& key, Float* out) const {
    const json* v = get(key);
    if (!v) return;
    if (!v->is_number()) wrong_type(key, "a number", *v);
    const double value = v->get<double>();
    if (std::fabs(value) > static_cast<double>(std::numeric_limits<Float>::max()))
      fail_field(key, "= " + v->dump() + " is out of range");
    *out = static_cast<Float>(value);
  }
  void read(const std::string& key, std::string* out, bool allow_null = false) const {
    const json* v = get(key);
    if (!v || (allow_null && v->is_null())) return;
    if (!v->is_string()) wrong_type(key, allow_null ? "a string or null" : "a string", *v);
    *out = v->get<std::string>();
  }
  // A list of strings each one of `choices` (given as "a" / "b"), mapped to choice == `yes`.
  std::vector<bool> read_choice_list(const std::string& key, const char* yes, const char* no,
                                     int expected_length) const {
    const json& v = *get(key);
    const std::string expected = std::string("a list of \"") + yes + "\" / \"" + no + "\"";
    if (!v.is_array()) wrong_type(key, expected, v);
    if (static_cast<int64_t>(v.size()) != expected_length)
      fail_field(key, "has " + std::to_string(v.size()) + " entries but num_hidden_layers is " +
                          std::to_string(expected_length));
    std::vector<bool> out;
    for (size_t i = 0; i < v.size(); ++i) {
      const bool ok = v[i].is_string() && (v[i] == yes || v[i] == no);
      if (!ok)
        fail_field(key, "[" + std::to_string(i) + "] must be \"" + yes + "\" or \"" + no +
                            "\", got " + type_of(v[i]));
      out.push_back(v[i] == yes);
    }
    return out;
  }

  const std::string& source() const { return source_; }

 private:
  const json& object_;
  std::string source_;
  std::string prefix_;
};

void read_rope(const Fields& top, ModelConfig& c) {
  top.read_number("rope_theta", &c.rope_theta);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* v = top.get(key);
    if (!v || v->is_null()) continue;
    if (!v->is_object()) top.wrong_type(key, "an object or null", *v);
    Fields rope(*v, top.source(), std::string(key) + ".");
    rope.read("type", &c.rope_type);
    rope.read("rope_type", &c.rope_type);
    rope.read_number("rope_theta", &c.rope_theta);
    rope.read_number("factor", &c.rope_factor);
    rope.read_number("mscale_all_dim", &c.rope_mscale_all_dim);
    static const char* kKnown[] = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
    if (std::find(std::begin(kKnown), std::end(kKnown), c.rope_type) == std::end(kKnown))
      rope.fail_field("rope_type", "= '" + c.rope_type +
                                       "' is unknown (known: default, linear, dynamic, yarn, "
                                       "longrope, llama3)");
    if (!(c.rope_factor > 0)) rope.fail_field("factor", "must be positive");
  }
  if (!(c.rope_theta > 0)) top.fail_field("rope_theta", "must be positive");
}

void read_indexer_layers(const Fields& f, ModelConfig& c) {
  const int layers = c.num_hidden_layers;
  if (f.has_value("indexer_types")) {
    c.indexer_full = f.read_choice_list("indexer_types", "full", "shared", layers);
  } else if (f.has_value("index_topk_pattern")) {
    const json& pattern = *f.get("index_topk_pattern");
    if (pattern.is_string()) {
      const std::string text = pattern.get<std::string>();
      if (static_cast<int64_t>(text.size()) != layers)
        f.fail_field("index_topk_pattern", "has " + std::to_string(text.size()) +
                                               " characters but num_hidden_layers is " +
                                               std::to_string(layers));
      for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != 'F' && text[i] != 'S')
          f.fail_field("index_topk_pattern",
                       "[" + std::to_string(i) + "] must be 'F' (full) or 'S' (shared), got '" +
                           std::string(1, text[i]) + "'");
        c.indexer_full.push_back(text[i] == 'F');
      }
    } else if (pattern.is_array()) {
      c.indexer_full = f.read_choice_list("index_topk_pattern", "full", "shared", layers);
    } else {
      f.wrong_type("index_topk_pattern", "a string of 'F'/'S' or a list of \"full\"/\"shared\"",
                   pattern);
    }
  } else {
    int freq = 1, offset = 2;
    f.read("index_topk_freq", &freq, 1);
    f.read("index_skip_topk_offset", &offset, 2);
    freq = std::max(freq, 1);
    for (int i = 0; i < layers; ++i)
      c.indexer_full.push_back(std::max<int64_t>(int64_t{i} - offset + 1, 0) % freq == 0);
  }
  for (int i = 0; i < layers && !c.indexer_full[i]; ++i)
    fail(f.source() + ": indexer layer " + std::to_string(i) +
         " is \"shared\" but no earlier layer is \"full\" (a shared layer reuses the top-k of the "
         "previous full layer)");
}

void read_mlp_layers(const Fields& f, ModelConfig& c) {
  const int layers = c.num_hidden_layers;
  if (f.has_value("mlp_layer_types")) {
    c.layer_is_moe = f.read_choice_list("mlp_layer_types", "sparse", "dense", layers);
    return;
  }
  int first_dense = 3;
  f.read("first_k_dense_replace", &first_dense, 3);
  if (first_dense < 0) f.fail_field("first_k_dense_replace", "must be >= 0");
  for (int i = 0; i < layers; ++i) c.layer_is_moe.push_back(i >= first_dense);
}

void read_eos(const Fields& f, ModelConfig& c) {
  const json* v = f.get("eos_token_id");
  if (!v) return;
  c.eos_token_ids.clear();
  if (v->is_null()) return;
  const char* expected = "an integer, a list of integers or null";
  if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i)
      c.eos_token_ids.push_back(f.to_int("eos_token_id[" + std::to_string(i) + "]", (*v)[i], "an integer"));
  } else {
    c.eos_token_ids.push_back(f.to_int("eos_token_id", *v, expected));
  }
  for (int id : c.eos_token_ids)
    if (id < 0) f.fail_field("eos_token_id", "contains negative id " + std::to_string(id));
}

void validate(const Fields& f, const ModelConfig& c) {
  const std::pair<const char*, int> positive[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"kv_lora_rank", c.kv_lora_rank},
      {"qk_nope_head_dim", c.qk_nope_head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},
      {"v_head_dim", c.v_head_dim},
      {"n_routed_experts", c.n_routed_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"n_group", c.n_group},
      {"topk_group", c.topk_group},
      {"index_topk", c.index_topk},
      {"index_n_heads", c.index_n_heads},
      {"index_head_dim", c.index_head_dim},
      {"max_position_embeddings", c.max_position_embeddings},
  };
  for (const auto& [key, value] : positive)
    if (value <= 0) f.fail_field(key, "must be positive, got " + std::to_string(value));
  const std::pair<const char*, int> non_negative[] = {
      {"q_lora_rank", c.q_lora_rank},
      {"n_shared_experts", c.n_shared_experts},
      {"num_nextn_predict_layers", c.num_nextn_predict_layers},
  };
  for (const auto& [key, value] : non_negative)
    if (value < 0) f.fail_field(key, "must be >= 0, got " + std::to_string(value));

  if (c.n_routed_experts % c.n_group != 0)
    f.fail_field("n_routed_experts", "= " + std::to_string(c.n_routed_experts) +
                                         " must be divisible by n_group = " + std::to_string(c.n_group));
  if (c.topk_group > c.n_group)
    f.fail_field("topk_group", "= " + std::to_string(c.topk_group) + " must be <= n_group = " +
                                   std::to_string(c.n_group));
  const int reachable = c.topk_group * (c.n_routed_experts / c.n_group);
  if (c.num_experts_per_tok > reachable)
    f.fail_field("num_experts_per_tok",
                 "= " + std::to_string(c.num_experts_per_tok) + " exceeds the " +
                     std::to_string(reachable) + " experts in topk_group (" +
                     std::to_string(c.topk_group) + ") groups of " +
                     std::to_string(c.n_routed_experts / c.n_group));
  if (c.qk_rope_head_dim % 2 != 0)
    f.fail_field("qk_rope_head_dim", "= " + std::to_string(c.qk_rope_head_dim) + " must be even");
  if (c.qk_rope_head_dim > c.index_head_dim)
    f.fail_field("qk_rope_head_dim", "= " + std::to_string(c.qk_rope_head_dim) +
                                         " must be <= index_head_dim = " +
                                         std::to_string(c.index_head_dim));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail_field("num_attention_heads",
                 "= " + std::to_string(c.num_attention_heads) +
                     " must be divisible by num_key_value_heads = " +
                     std::to_string(c.num_key_value_heads));
  if (c.hidden_act != "silu")
    f.fail_field("hidden_act", "= '" + c.hidden_act + "' is not supported (only \"silu\")");
  if (!(c.rms_norm_eps > 0)) f.fail_field("rms_norm_eps", "must be positive");
  if (!std::isfinite(c.routed_scaling_factor) || c.routed_scaling_factor <= 0)
    f.fail_field("routed_scaling_factor", "must be positive");
}

}  // namespace

int ModelConfig::num_full_indexer_layers() const {
  return static_cast<int>(std::count(indexer_full.begin(), indexer_full.end(), true));
}

void ModelConfig::keep_first_layers(int num_layers) {
  if (num_layers <= 0 || num_layers >= num_hidden_layers) return;
  num_hidden_layers = num_layers;
  indexer_full.resize(num_layers);
  layer_is_moe.resize(num_layers);
}

double ModelConfig::attention_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope_type != "default" && rope_mscale_all_dim != 0.0 && rope_factor > 1.0) {
    const double m = 0.1 * rope_mscale_all_dim * std::log(rope_factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

// quantization_config.global_quant_config.weight.dtype (AMD Quark) when present.
void read_mx_weight_dtype(const json& root, const std::string& source, ModelConfig& c) {
  const auto q = root.find("quantization_config");
  if (q == root.end() || !q->is_object()) return;
  const auto global = q->find("global_quant_config");
  if (global == q->end() || !global->is_object()) return;
  const auto weight = global->find("weight");
  if (weight == global->end() || !weight->is_object()) return;
  const auto dtype = weight->find("dtype");
  if (dtype == weight->end()) return;
  if (!dtype->is_string() || (*dtype != "fp4" && *dtype != "fp6_e2m3" && *dtype != "fp6_e3m2"))
    fail(source + ": quantization_config.global_quant_config.weight.dtype = " + dtype->dump() +
         " is not supported (fp4, fp6_e2m3 or fp6_e3m2)");
  c.mx_weight_dtype = dtype->get<std::string>();
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    fail(source + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) fail(source + ": expected a JSON object, got " + std::string(root.type_name()));
  const Fields f(root, source);
  ModelConfig c;

  f.read("model_type", &c.model_type);
  if (c.model_type != "glm_moe_dsa" && c.model_type != "deepseek_v32")
    f.fail_field("model_type", "= '" + c.model_type +
                                   "' is not supported (expected \"glm_moe_dsa\" or "
                                   "\"deepseek_v32\"; deepseek_v3 has no sparse-attention "
                                   "indexer)");

  f.read("vocab_size", &c.vocab_size);
  f.read("hidden_size", &c.hidden_size);
  f.read("intermediate_size", &c.intermediate_size);
  f.read("moe_intermediate_size", &c.moe_intermediate_size);
  f.read("num_hidden_layers", &c.num_hidden_layers);
  f.read("num_attention_heads", &c.num_attention_heads);
  f.read("num_key_value_heads", &c.num_key_value_heads, c.num_attention_heads);
  f.read("q_lora_rank", &c.q_lora_rank, 0);
  f.read("kv_lora_rank", &c.kv_lora_rank);
  f.read("qk_nope_head_dim", &c.qk_nope_head_dim);
  f.read("qk_rope_head_dim", &c.qk_rope_head_dim);
  f.read("v_head_dim", &c.v_head_dim);
  if (f.has_value("qk_head_dim")) {
    int qk_head_dim = 0;
    f.read("qk_head_dim", &qk_head_dim);
    if (qk_head_dim != c.qk_head_dim())
      f.fail_field("qk_head_dim", "= " + std::to_string(qk_head_dim) +
                                      " must equal qk_nope_head_dim + qk_rope_head_dim = " +
                                      std::to_string(c.qk_head_dim()));
  }
  f.read("num_experts", &c.n_routed_experts);
  f.read("n_routed_experts", &c.n_routed_experts);
  if (f.has("num_experts") && f.has("n_routed_experts") &&
      *f.get("num_experts") != *f.get("n_routed_experts"))
    f.fail_field("num_experts", "disagrees with n_routed_experts (it is an alias)");
  f.read("n_shared_experts", &c.n_shared_experts, 0);
  f.read("num_experts_per_tok", &c.num_experts_per_tok);
  f.read("n_group", &c.n_group, 1);
  f.read("topk_group", &c.topk_group, 1);
  f.read("norm_topk_prob", &c.norm_topk_prob);
  f.read_number("routed_scaling_factor", &c.routed_scaling_factor);
  f.read("index_topk", &c.index_topk);
  f.read("index_n_heads", &c.index_n_heads);
  f.read("index_head_dim", &c.index_head_dim);
  f.read_number("rms_norm_eps", &c.rms_norm_eps);
  f.read("hidden_act", &c.hidden_act);
  f.read("attention_bias", &c.attention_bias);
  f.read("max_position_embeddings", &c.max_position_embeddings);
  f.read("bos_token_id", &c.bos_token_id, -1);
  f.read("pad_token_id", &c.pad_token_id, -1);
  read_eos(f, c);
  f.read("tie_word_embeddings", &c.tie_word_embeddings);
  f.read("num_nextn_predict_layers", &c.num_nextn_predict_layers, 0);
  f.read("torch_dtype", &c.torch_dtype, /*allow_null=*/true);
  f.read("dtype", &c.torch_dtype, /*allow_null=*/true);
  read_rope(f, c);
  read_mx_weight_dtype(root, source, c);

  if (c.num_hidden_layers <= 0 || c.num_hidden_layers > kMaxLayers)
    f.fail_field("num_hidden_layers", "= " + std::to_string(c.num_hidden_layers) +
                                          " must be in [1, " + std::to_string(kMaxLayers) + "]");
  read_indexer_layers(f, c);
  read_mlp_layers(f, c);
  validate(f, c);
  return c;
}

ModelConfig load_model_config(const fs::path& path) {
  std::error_code ec;
  const fs::path file = fs::is_directory(path, ec) ? path / "config.json" : path;
  if (!fs::exists(file, ec)) fail(file.string() + ": no such file (expected a config.json)");
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file.string() + ": cannot open for reading");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), file.string());
}

}  // namespace glms::io
