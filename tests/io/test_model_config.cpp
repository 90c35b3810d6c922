#include "io/model_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "io_test_util.h"

namespace glms::io {
namespace {

using nlohmann::json;
using testing::expect_error;

// config.json as transformers 5.17 saves a tiny GlmMoeDsaConfig.
const char* kTransformersTiny = R"({"architectures":["GlmMoeDsaForCausalLM"],"attention_bias":false,"attention_dropout":0.0,"bos_token_id":0,"dtype":"float32","eos_token_id":1,"first_k_dense_replace":1,"head_dim":4,"hidden_act":"silu","hidden_size":32,"index_head_dim":8,"index_n_heads":2,"index_topk":4,"indexer_types":["full","full","full"],"initializer_range":0.02,"intermediate_size":48,"kv_lora_rank":16,"layer_types":["deepseek_sparse_attention","deepseek_sparse_attention","deepseek_sparse_attention"],"max_position_embeddings":202752,"mlp_bias":false,"mlp_layer_types":["dense","sparse","sparse"],"model_type":"glm_moe_dsa","moe_intermediate_size":16,"n_group":2,"n_routed_experts":4,"n_shared_experts":1,"norm_topk_prob":true,"num_attention_heads":2,"num_experts_per_tok":2,"num_hidden_layers":3,"num_key_value_heads":2,"pad_token_id":null,"q_lora_rank":24,"qk_head_dim":12,"qk_nope_head_dim":8,"qk_rope_head_dim":4,"rms_norm_eps":1e-05,"rope_parameters":{"rope_theta":10000.0,"rope_type":"default"},"routed_scaling_factor":2.5,"tie_word_embeddings":false,"topk_group":1,"transformers_version":"5.17.0","use_cache":true,"v_head_dim":8,"vocab_size":64})";

// A GLM-5 style config (every layer runs the indexer).
json glm5_config() {
  return json::parse(R"({
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 0,
    "eos_token_id": [154820, 154827, 154829], "pad_token_id": 154820,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 6144,
    "index_head_dim": 128, "index_n_heads": 32, "index_topk": 2048,
    "intermediate_size": 12288, "kv_lora_rank": 512, "max_position_embeddings": 202752,
    "moe_intermediate_size": 2048, "n_group": 1, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": true, "num_attention_heads": 64, "num_experts_per_tok": 8,
    "num_hidden_layers": 78, "num_key_value_heads": 64, "num_nextn_predict_layers": 1,
    "q_lora_rank": 2048, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
    "rope_interleave": true, "rope_theta": 1000000, "rope_scaling": null,
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false,
    "topk_group": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1", "use_cache": true, "v_head_dim": 256, "vocab_size": 154880
  })");
}

// GLM-5.2: IndexShare every 4th layer after the first 3, 1M context.
json glm52_config() {
  json c = glm5_config();
  c["rope_theta"] = 8000000;
  c["max_position_embeddings"] = 1048576;
  c["index_topk_freq"] = 4;
  c["index_skip_topk_offset"] = 3;
  c["index_share_for_mtp_iteration"] = true;
  c["moe_router_dtype"] = "float32";
  return c;
}

ModelConfig parse(const json& j) { return parse_model_config(j.dump(), "test/config.json"); }

std::vector<int> full_layers(const ModelConfig& c) {
  std::vector<int> out;
  for (size_t i = 0; i < c.indexer_full.size(); ++i)
    if (c.indexer_full[i]) out.push_back(static_cast<int>(i));
  return out;
}

TEST(ModelConfig, TransformersTinyConfig) {
  const ModelConfig c = parse_model_config(kTransformersTiny, "tiny/config.json");
  EXPECT_EQ(c.model_type, "glm_moe_dsa");
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.q_lora_rank, 24);
  EXPECT_EQ(c.qk_head_dim(), 12);
  EXPECT_EQ(c.n_group, 2);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.n_routed_experts, 4);
  EXPECT_EQ(c.indexer_full, (std::vector<bool>{true, true, true}));
  EXPECT_EQ(c.layer_is_moe, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{1}));
  EXPECT_EQ(c.torch_dtype, "float32");
  EXPECT_EQ(c.rope_type, "default");
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / std::sqrt(12.0));
  EXPECT_EQ(c.num_full_indexer_layers(), 3);
}

TEST(ModelConfig, Glm5AllLayersFull) {
  const ModelConfig c = parse(glm5_config());
  EXPECT_EQ(c.num_full_indexer_layers(), 78);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{154820, 154827, 154829}));
  EXPECT_EQ(c.pad_token_id, 154820);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  ASSERT_EQ(c.layer_is_moe.size(), 78u);
  EXPECT_FALSE(c.layer_is_moe[2]);
  EXPECT_TRUE(c.layer_is_moe[3]);
  EXPECT_EQ(std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), true), 75);
}

TEST(ModelConfig, Glm52IndexShare) {
  const ModelConfig c = parse(glm52_config());
  EXPECT_DOUBLE_EQ(c.rope_theta, 8e6);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  // max(i - 3 + 1, 0) % 4 == 0: layers 0-2, then every 4th from 6.
  std::vector<int> expected = {0, 1, 2};
  for (int i = 6; i < 78; i += 4) expected.push_back(i);
  EXPECT_EQ(full_layers(c), expected);
  EXPECT_EQ(c.num_full_indexer_layers(), 21);
}

TEST(ModelConfig, DefaultOffsetWithFrequency) {
  json j = glm5_config();
  j["num_hidden_layers"] = 10;
  j["index_topk_freq"] = 3;  // offset defaults to 2: max(i - 1, 0) % 3 == 0
  EXPECT_EQ(full_layers(parse(j)), (std::vector<int>{0, 1, 4, 7}));
  j["index_topk_freq"] = 0;  // max(freq, 1)
  EXPECT_EQ(parse(j).num_full_indexer_layers(), 10);
  j["index_topk_freq"] = nullptr;
  EXPECT_EQ(parse(j).num_full_indexer_layers(), 10);
}

TEST(ModelConfig, ExplicitIndexerTypesAndPattern) {
  json j = glm5_config();
  j["num_hidden_layers"] = 4;
  j["index_topk_freq"] = 4;  // ignored: explicit lists win
  j["indexer_types"] = {"full", "shared", "full", "shared"};
  EXPECT_EQ(full_layers(parse(j)), (std::vector<int>{0, 2}));
  j.erase("indexer_types");
  j["index_topk_pattern"] = "FFSS";
  EXPECT_EQ(full_layers(parse(j)), (std::vector<int>{0, 1}));
  j["index_topk_pattern"] = {"full", "shared", "shared", "full"};
  EXPECT_EQ(full_layers(parse(j)), (std::vector<int>{0, 3}));

  j["index_topk_pattern"] = "SFFF";
  expect_error([&] { parse(j); }, {"test/config.json", "indexer layer 0 is \"shared\"", "full"});
  j["index_topk_pattern"] = "FFX";
  expect_error([&] { parse(j); }, {"index_topk_pattern", "3 characters", "num_hidden_layers is 4"});
  j["index_topk_pattern"] = "FFXS";
  expect_error([&] { parse(j); }, {"index_topk_pattern", "[2] must be 'F'", "'X'"});
  j["index_topk_pattern"] = 5;
  expect_error([&] { parse(j); }, {"index_topk_pattern", "must be a string", "integer 5"});
  j.erase("index_topk_pattern");
  j["indexer_types"] = {"full", "sparse", "full", "full"};
  expect_error([&] { parse(j); }, {"test/config.json", "'indexer_types'", "[1] must be \"full\" or \"shared\""});
  j["indexer_types"] = {"full"};
  expect_error([&] { parse(j); }, {"'indexer_types' has 1 entries but num_hidden_layers is 4"});
}

TEST(ModelConfig, MlpLayerTypes) {
  json j = glm5_config();
  j["num_hidden_layers"] = 4;
  j["mlp_layer_types"] = {"sparse", "dense", "sparse", "dense"};
  EXPECT_EQ(parse(j).layer_is_moe, (std::vector<bool>{true, false, true, false}));
  j.erase("mlp_layer_types");
  j["first_k_dense_replace"] = 10;
  EXPECT_EQ(parse(j).layer_is_moe, (std::vector<bool>(4, false)));
  j.erase("first_k_dense_replace");  // default 3
  EXPECT_EQ(parse(j).layer_is_moe, (std::vector<bool>{false, false, false, true}));
  j["mlp_layer_types"] = {"dense", "moe", "dense", "dense"};
  expect_error([&] { parse(j); }, {"'mlp_layer_types'", "[1] must be \"sparse\" or \"dense\""});
}

TEST(ModelConfig, ExpertGroups) {
  json j = glm5_config();
  j["n_group"] = 8;
  j["topk_group"] = 4;
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  j["n_group"] = 7;
  expect_error([&] { parse(j); }, {"test/config.json", "'n_routed_experts'", "divisible by n_group = 7"});
  j["n_group"] = 2;
  expect_error([&] { parse(j); }, {"'topk_group'", "must be <= n_group = 2"});
  j["n_group"] = 64;
  j["topk_group"] = 1;  // 4 experts reachable, 8 wanted
  expect_error([&] { parse(j); }, {"'num_experts_per_tok'", "exceeds the 4 experts"});
  j = glm5_config();
  j.erase("n_routed_experts");
  j["num_experts"] = 128;
  EXPECT_EQ(parse(j).n_routed_experts, 128);
  j["n_routed_experts"] = 64;
  expect_error([&] { parse(j); }, {"'num_experts'", "alias"});
}

TEST(ModelConfig, RopeParametersAndLegacy) {
  json j = glm5_config();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  EXPECT_DOUBLE_EQ(parse(j).rope_theta, 10000.0);
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 50000.0}, {"factor", 40.0},
                          {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_theta, 50000.0);
  EXPECT_DOUBLE_EQ(c.rope_factor, 40.0);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attention_scale(), m * m / std::sqrt(256.0), 1e-12);

  j = glm5_config();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"mscale_all_dim", 0.707}};
  c = parse(j);
  EXPECT_EQ(c.rope_type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rope_mscale_all_dim, 0.707);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 2e6}};
  c = parse(j);  // rope_parameters wins over legacy fields
  EXPECT_EQ(c.rope_type, "default");
  EXPECT_DOUBLE_EQ(c.rope_theta, 2e6);
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / 16.0);

  j["rope_parameters"] = {{"rope_type", "weird"}};
  expect_error([&] { parse(j); }, {"'rope_parameters.rope_type'", "'weird' is unknown"});
  j["rope_parameters"] = {{"rope_theta", "big"}};
  expect_error([&] { parse(j); }, {"'rope_parameters.rope_theta' must be a number", "string \"big\""});
  j["rope_parameters"] = 5;
  expect_error([&] { parse(j); }, {"'rope_parameters' must be an object or null"});
  j.erase("rope_parameters");
  j["rope_theta"] = -1;
  expect_error([&] { parse(j); }, {"'rope_theta' must be positive"});
}

TEST(ModelConfig, EosNullsAndDtype) {
  json j = glm5_config();
  j["eos_token_id"] = 7;
  EXPECT_EQ(parse(j).eos_token_ids, (std::vector<int>{7}));
  j["eos_token_id"] = nullptr;
  EXPECT_TRUE(parse(j).eos_token_ids.empty());
  j["eos_token_id"] = {1, "2"};
  expect_error([&] { parse(j); }, {"'eos_token_id[1]' must be an integer", "string \"2\""});
  j["eos_token_id"] = "2";
  expect_error([&] { parse(j); }, {"'eos_token_id' must be an integer, a list of integers or null"});
  j["eos_token_id"] = 2;
  j["q_lora_rank"] = nullptr;
  j["bos_token_id"] = nullptr;
  j["pad_token_id"] = nullptr;
  j["dtype"] = "float16";
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.torch_dtype, "float16");
}

TEST(ModelConfig, WrongTypesNameFieldTypeAndFile) {
  struct Case {
    const char* field;
    json value;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"hidden_size", "6144", {"'hidden_size' must be an integer", "string \"6144\""}},
      {"num_hidden_layers", 3.5, {"'num_hidden_layers' must be an integer", "float 3.5"}},
      {"vocab_size", true, {"'vocab_size' must be an integer", "boolean"}},
      {"tie_word_embeddings", json::array({1}), {"'tie_word_embeddings' must be a boolean", "array"}},
      {"norm_topk_prob", 1, {"'norm_topk_prob' must be a boolean", "integer 1"}},
      {"rms_norm_eps", "1e-5", {"'rms_norm_eps' must be a number"}},
      {"rms_norm_eps", 1e300, {"'rms_norm_eps' = 1e+300 is out of range"}},
      {"hidden_act", 3, {"'hidden_act' must be a string"}},
      {"hidden_act", "gelu", {"'hidden_act'", "'gelu' is not supported"}},
      {"kv_lora_rank", nullptr, {"'kv_lora_rank' must be an integer", "null"}},
      {"q_lora_rank", "x", {"'q_lora_rank' must be an integer or null"}},
      {"hidden_size", 1e12, {"'hidden_size' must be an integer", "float"}},
      {"hidden_size", 4294967296LL, {"'hidden_size'", "out of the 32-bit integer range"}},
      {"hidden_size", 0, {"'hidden_size' must be positive, got 0"}},
      {"n_shared_experts", -1, {"'n_shared_experts' must be >= 0"}},
      {"num_hidden_layers", 0, {"'num_hidden_layers'", "must be in [1, 65536]"}},
      {"qk_rope_head_dim", 63, {"'qk_rope_head_dim'", "must be even"}},
      {"qk_rope_head_dim", 256, {"'qk_rope_head_dim'", "<= index_head_dim = 128"}},
      {"num_key_value_heads", 48, {"'num_attention_heads'", "divisible by num_key_value_heads = 48"}},
      {"model_type", "deepseek_v3", {"'model_type'", "'deepseek_v3' is not supported"}},
      {"model_type", "llama", {"'model_type'", "'llama' is not supported"}},
      {"first_k_dense_replace", "3", {"'first_k_dense_replace' must be an integer"}},
      {"index_topk_freq", 2.0, {"'index_topk_freq' must be an integer or null", "float"}},
      {"qk_head_dim", 100, {"'qk_head_dim' = 100 must equal", "256"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    json j = glm5_config();
    j[c.field] = c.value;
    auto fragments = c.fragments;
    fragments.push_back("test/config.json: field ");
    expect_error([&] { parse(j); }, fragments);
  }
  expect_error([] { parse_model_config("{", "bad/config.json"); }, {"bad/config.json", "not valid JSON"});
  expect_error([] { parse_model_config("[]", "bad/config.json"); }, {"bad/config.json", "expected a JSON object"});
}

TEST(ModelConfig, DeepseekV32IsAccepted) {
  json j = glm5_config();
  j["model_type"] = "deepseek_v32";
  EXPECT_EQ(parse(j).model_type, "deepseek_v32");
}

TEST(ModelConfig, FuzzSeedCorpusParses) {
  const auto corpus = std::filesystem::path(GLMS_SOURCE_DIR) / "fuzz/corpus/model_config";
  int count = 0;
  // The named seeds (*.json) are real configs; what fuzzing added is replayed by
  // fuzz_replay.model_config, which only asks for a parse or a clear error.
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(load_model_config(entry.path()));
    ++count;
  }
  EXPECT_GE(count, 3);
}

TEST(ModelConfig, LoadFromFolderOrFile) {
  testing::TempDir dir;
  testing::write_file(dir / "config.json", kTransformersTiny);
  EXPECT_EQ(load_model_config(dir.path()).hidden_size, 32);
  EXPECT_EQ(load_model_config(dir / "config.json").vocab_size, 64);
  std::filesystem::remove(dir / "config.json");
  expect_error([&] { load_model_config(dir.path()); }, {(dir / "config.json").string(), "no such file"});
  testing::write_file(dir / "config.json", R"({"hidden_size": "x"})");
  expect_error([&] { load_model_config(dir.path()); }, {(dir / "config.json").string(), "'hidden_size'"});
}

}  // namespace
}  // namespace glms::io
