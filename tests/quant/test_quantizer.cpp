// glmserve quantize's library: which tensors are quantised, the layout written, that the
// result loads and runs, and the quality statistics on known inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/glm5.h"
#include "quant/checkpoint_quantizer.h"
#include "quant/formats.h"
#include "random_model.h"

using namespace glms;

namespace {
// Widths that MX blocks of 32 divide (most matrices get quantised).
glms::testing::RandomModelSpec small_spec() {
  glms::testing::RandomModelSpec spec;
  spec.hidden_size = 64;
  spec.moe_intermediate_size = 32;
  spec.intermediate_size = 64;
  return spec;
}
}  // namespace

TEST(Glob, StarsAndQuestionMarks) {
  EXPECT_TRUE(quant::glob_match("*embed_tokens*", "model.embed_tokens.weight"));
  EXPECT_TRUE(quant::glob_match("model.layers.4.*", "model.layers.4.eh_proj.weight"));
  EXPECT_FALSE(quant::glob_match("model.layers.4.*", "model.layers.40.mlp.gate.weight"));
  EXPECT_TRUE(quant::glob_match("*.mlp.gate.weight", "model.layers.3.mlp.gate.weight"));
  EXPECT_FALSE(quant::glob_match("*.mlp.gate.weight", "model.layers.3.mlp.gate_proj.weight"));
  EXPECT_TRUE(quant::glob_match("lm_hea?*", "lm_head.weight"));
  EXPECT_TRUE(quant::glob_match("*", ""));
  EXPECT_FALSE(quant::glob_match("a*b", "acbd"));
}

TEST(Quantizer, WritesQuarkMxfp4AndKeepsTheDefaultExclusions) {
  glms::testing::TempDir dir("quantizer");
  const auto source = glms::testing::write_random_model(dir.path / "bf16", small_spec());
  quant::QuantizeOptions options;
  options.format = "mxfp4";
  size_t last_done = 0;
  const quant::QuantizeReport report =
      quant::quantize_checkpoint(source, dir.path / "mxfp4", options, [&](size_t done, size_t, const std::string&) { last_done = done; });
  EXPECT_GT(report.quantized, 0);
  EXPECT_LT(report.bytes_out, report.bytes_in);
  const io::Checkpoint out = io::Checkpoint::open(dir.path / "mxfp4");
  EXPECT_EQ(last_done, io::Checkpoint::open(source).names().size());
  EXPECT_EQ(out.get("model.layers.1.mlp.experts.0.up_proj.weight").dtype, DType::U8);
  EXPECT_TRUE(out.contains("model.layers.1.mlp.experts.0.up_proj.weight_scale"));
  for (const char* kept : {"model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.gate.weight",
                           "model.layers.0.self_attn.indexer.weights_proj.weight", "model.layers.4.eh_proj.weight",
                           "model.layers.4.mlp.experts.0.up_proj.weight"})
    EXPECT_EQ(out.get(kept).dtype, DType::BF16) << kept;
  // q_a_proj has 64 inputs: quantised; kv_b_proj has 16 (not a multiple of 32): kept.
  EXPECT_EQ(out.get("model.layers.0.self_attn.q_a_proj.weight").dtype, DType::U8);
  EXPECT_EQ(out.get("model.layers.0.self_attn.kv_b_proj.weight").dtype, DType::BF16);
  std::ifstream config(dir.path / "mxfp4" / "config.json");
  const auto json = nlohmann::json::parse(config);
  EXPECT_EQ(json["quantization_config"]["quant_method"], "quark");

  const model::Glm5Model original(model::load_weights(source.string()));
  const model::Glm5Model quantised(model::load_weights((dir.path / "mxfp4").string()));
  EXPECT_EQ(quantised.weights().parameters, original.weights().parameters);
  EXPECT_THROW(quant::quantize_checkpoint(source, dir.path / "mxfp4", options), Error) << "refuses a non-empty output";
  options.format = "int3";
  EXPECT_THROW(quant::quantize_checkpoint(source, dir.path / "other", options), Error);
}

// MXFP6 checkpoints: four codes per 3 bytes, the element named in quantization_config; the
// loaded rows are exactly the reference quantiser's values and the model runs.
TEST(Quantizer, WritesMxfp6AndTheModelLoadsIt) {
  glms::testing::TempDir dir("quantizer_fp6");
  const auto source = glms::testing::write_random_model(dir.path / "bf16", small_spec());
  const std::string name = "model.layers.1.mlp.experts.0.up_proj.weight";
  const io::Checkpoint original = io::Checkpoint::open(source);
  const std::vector<float> values = io::read_f32(original.get(name));
  for (auto [format, element, dtype] : {std::tuple{"mxfp6", quant::MiniFloat::E2M3, "fp6_e2m3"},
                                        std::tuple{"mxfp6_e3m2", quant::MiniFloat::E3M2, "fp6_e3m2"}}) {
    quant::QuantizeOptions options;
    options.format = format;
    const auto out = dir.path / format;
    quant::quantize_checkpoint(source, out, options);
    const io::Checkpoint written = io::Checkpoint::open(out);
    const int64_t rows = original.get(name).shape[0], cols = original.get(name).shape[1];
    EXPECT_EQ(written.get(name).shape, (std::vector<int64_t>{rows, cols / 4 * 3}));
    std::ifstream config(out / "config.json");
    EXPECT_EQ(nlohmann::json::parse(config)["quantization_config"]["global_quant_config"]["weight"]["dtype"], dtype);

    const model::Glm5Model model(model::load_weights(out.string()));
    const ops::WeightView& w = model.weights().layers[1].moe.experts[0].up_proj;
    EXPECT_EQ(w.format, element == quant::MiniFloat::E2M3 ? ops::WeightFormat::Mxfp6E2M3 : ops::WeightFormat::Mxfp6E3M2);
    std::vector<uint8_t> codes(values.size()), scales(values.size() / 32);
    std::vector<float> want(values.size()), row(cols);
    quant::quantize_mxfp6(element, values.data(), values.size(), codes.data(), scales.data());
    quant::dequantize_mxfp6(element, codes.data(), scales.data(), values.size(), want.data());
    for (int64_t r = 0; r < rows; ++r) {
      w.row_to_f32(r, row.data());
      ASSERT_EQ(std::vector<float>(want.begin() + r * cols, want.begin() + (r + 1) * cols), row) << format << " row " << r;
    }
    EXPECT_EQ(model.weights().parameters, model::load_weights(source.string()).parameters);
    model::ForwardBatch batch;
    batch.add_sequence({1, 2, 3}, 0, {0}, 16, false);
    kv::PagedLatentCache cache(model.cache_layout(16), 1);
    for (float logit : model.forward(batch, cache)) ASSERT_TRUE(std::isfinite(logit));
  }
}

// Output larger than max_shard_bytes is cut into Hugging Face shards with an index; the
// sharded copy loads and computes exactly what the single-file copy does.
TEST(Quantizer, ShardsLargeOutputsWithAnIndex) {
  glms::testing::TempDir dir("quantizer_shards");
  const auto source = glms::testing::write_random_model(dir.path / "bf16", small_spec());
  quant::QuantizeOptions options;
  options.format = "mxfp4";
  const quant::QuantizeReport single = quant::quantize_checkpoint(source, dir.path / "single", options);
  EXPECT_EQ(single.shards, 1);
  EXPECT_TRUE(std::filesystem::exists(dir.path / "single" / "model.safetensors"));
  options.max_shard_bytes = 20000;
  const quant::QuantizeReport sharded = quant::quantize_checkpoint(source, dir.path / "sharded", options);
  EXPECT_GT(sharded.shards, 3);
  EXPECT_EQ(sharded.bytes_out, single.bytes_out);
  EXPECT_FALSE(std::filesystem::exists(dir.path / "sharded" / "model.safetensors"));
  std::ifstream index_file(dir.path / "sharded" / "model.safetensors.index.json");
  const auto index = nlohmann::json::parse(index_file);
  const std::string shard = index["weight_map"]["model.layers.1.mlp.experts.0.up_proj.weight"];
  EXPECT_EQ(index["weight_map"]["model.layers.1.mlp.experts.0.up_proj.weight_scale"], shard) << "scales beside their matrix";
  EXPECT_NE(shard.find("-of-"), std::string::npos);

  const model::Glm5Model a(model::load_weights((dir.path / "single").string()));
  const model::Glm5Model b(model::load_weights((dir.path / "sharded").string()));
  model::ForwardBatch batch;
  batch.add_sequence({4, 5, 6, 7}, 0, {0}, 16, false);
  kv::PagedLatentCache cache_a(a.cache_layout(16), 1), cache_b(b.cache_layout(16), 1);
  EXPECT_EQ(a.forward(batch, cache_a), b.forward(batch, cache_b));

  // A failure part-way (here: the progress callback) removes what was written, so the same
  // output folder can be used again.
  const auto again = dir.path / "again";
  EXPECT_THROW(quant::quantize_checkpoint(source, again, options,
                                          [](size_t done, size_t, const std::string&) {
                                            if (done == 20) fail("interrupted");
                                          }),
               Error);
  EXPECT_FALSE(std::filesystem::exists(again));
  EXPECT_EQ(quant::quantize_checkpoint(source, again, options).shards, sharded.shards);
}

TEST(Quality, StatisticsOnKnownLogits) {
  const float same[] = {1.0f, 2.0f, 3.0f, 1.0f, 2.0f, 3.0f};
  const float other[] = {3.0f, 2.0f, 1.0f, 1.0f, 2.0f, 3.0f};
  const int32_t next[] = {2, 0};
  quant::QualityStats identical, different;
  identical.add(same, same, 2, 3, next);
  EXPECT_NEAR(identical.mean_kl(), 0.0, 1e-12);
  EXPECT_EQ(identical.top1(), 1.0);
  EXPECT_NEAR(identical.perplexity_ref(), identical.perplexity_quant(), 1e-12);
  different.add(same, other, 2, 3, next);
  EXPECT_GT(different.mean_kl(), 0.1);
  EXPECT_EQ(different.top1(), 0.5);
  // Row 0: log p(2) under softmax(1,2,3) = -0.4076; row 1: log p(0) = -2.4076.
  EXPECT_NEAR(different.perplexity_ref(), std::exp((0.40761 + 2.40761) / 2), 1e-3);
}
