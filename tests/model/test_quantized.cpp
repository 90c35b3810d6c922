// Quantised checkpoints (MXFP4 experts as AMD Quark exports them, block-FP8 attention as the
// GLM-5-FP8 checkpoints store it) compute exactly what the same model with the dequantised
// values stored in F32 computes: the dequantisation in the matmul path is exact.
#include <gtest/gtest.h>

#include <cstring>

#include "io/safetensors.h"
#include "model/glm5.h"
#include "quant/formats.h"
#include "random_model.h"
#include "support/numerics.h"

using namespace glms;

namespace {

bool is_expert_matrix(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }
bool is_fp8_matrix(const std::string& name) {
  return name.find("self_attn.q_b_proj.weight") != std::string::npos ||
         name.find("self_attn.o_proj.weight") != std::string::npos;
}

template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// Writes `quantised` (MXFP4 experts, FP8-block attention) and `dequantised` (the same values in
// F32) versions of the checkpoint in `source`.
void write_quantised_pair(const std::filesystem::path& source, const std::filesystem::path& quantised,
                          const std::filesystem::path& dequantised) {
  const io::Checkpoint checkpoint = io::Checkpoint::open(source);
  std::vector<io::TensorToWrite> q, d;
  for (const std::string& name : checkpoint.names()) {
    const io::TensorInfo& info = checkpoint.get(name);
    const bool matrix = info.shape.size() == 2;
    if (matrix && (is_expert_matrix(name) || is_fp8_matrix(name))) {
      const int64_t rows = info.shape[0], cols = info.shape[1];
      const std::vector<float> values = io::read_f32(info);
      std::vector<float> back(values.size());
      if (is_expert_matrix(name)) {
        std::vector<uint8_t> packed(values.size() / 2), scales(values.size() / 32);
        for (int64_t r = 0; r < rows; ++r)
          quant::quantize_mxfp4(values.data() + r * cols, cols, packed.data() + r * cols / 2,
                                scales.data() + r * cols / 32);
        quant::dequantize_mxfp4(packed.data(), scales.data(), values.size(), back.data());
        q.push_back({name, DType::U8, {rows, cols / 2}, bytes_of(packed)});
        q.push_back({name + "_scale", DType::U8, {rows, cols / 32}, bytes_of(scales)});
      } else {
        std::vector<uint8_t> codes(values.size());
        std::vector<float> scale_inv(((rows + 127) / 128) * ((cols + 127) / 128));
        quant::quantize_fp8_block(values.data(), rows, cols, codes.data(), scale_inv.data());
        for (int64_t r = 0; r < rows; ++r)
          quant::dequantize_fp8_block_row(codes.data(), scale_inv.data(), r, cols, back.data() + r * cols);
        q.push_back({name, DType::F8_E4M3, {rows, cols}, bytes_of(codes)});
        q.push_back(io::tensor_f32(name + "_scale_inv", {(rows + 127) / 128, (cols + 127) / 128}, scale_inv));
      }
      d.push_back(io::tensor_f32(name, {rows, cols}, back));
      continue;
    }
    std::vector<std::byte> raw(info.nbytes);
    std::memcpy(raw.data(), info.data, info.nbytes);
    q.push_back({name, info.dtype, info.shape, raw});
    d.push_back({name, info.dtype, info.shape, raw});
  }
  for (const auto& dir : {quantised, dequantised}) {
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(source / "config.json", dir / "config.json");
  }
  io::write_safetensors(quantised / "model.safetensors", q);
  io::write_safetensors(dequantised / "model.safetensors", d);
}

}  // namespace

TEST(Quantised, Mxfp4ExpertsAndFp8AttentionEqualTheirDequantisedValues) {
  glms::testing::TempDir dir("quantised");
  glms::testing::RandomModelSpec spec;
  spec.hidden_size = 64;              // MXFP4 rows need inputs in multiples of 32
  spec.moe_intermediate_size = 32;
  spec.q_lora_rank = 40;
  const auto source = glms::testing::write_random_model(dir.path / "bf16", spec);
  write_quantised_pair(source, dir.path / "quantised", dir.path / "dequantised");

  const model::Glm5Model quantised(model::load_weights((dir.path / "quantised").string()));
  const model::Glm5Model dequantised(model::load_weights((dir.path / "dequantised").string()));
  const model::Glm5Model original(model::load_weights(source.string()));
  EXPECT_EQ(quantised.weights().layers[1].moe.experts[0].gate_proj.format, ops::WeightFormat::Mxfp4);
  EXPECT_EQ(quantised.weights().layers[0].attention.o_proj.format, ops::WeightFormat::Fp8Block);
  EXPECT_EQ(quantised.weights().parameters, original.weights().parameters);

  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % spec.vocab_size);
  auto run = [&](const model::Glm5Model& m) {
    kv::PagedLatentCache cache(m.cache_layout(8), 8);
    model::ForwardBatch batch;
    batch.add_sequence(prompt, 0, {0, 1, 2, 3, 4, 5, 6, 7}, 8, true);
    return m.forward(batch, cache);
  };
  const auto q = run(quantised), d = run(dequantised), o = run(original);
  EXPECT_LT(glms::testing::relative_l2(q, d), 1e-6) << "dequantisation in the matmul path must be exact";
  const double quantisation_error = glms::testing::relative_l2(q, o);
  EXPECT_GT(quantisation_error, 1e-4) << "the quantised weights must differ from bf16";
  EXPECT_LT(quantisation_error, 0.5);
}
