// A checkpoint saved as several shards with model.safetensors.index.json (as Hugging Face saves
// large models) loads as the single file does: the golden fixture split in three gives the same
// logits bit for bit, and a tensor-parallel layout reads its slices from the shards.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/glm5.h"
#include "random_model.h"
#include "support/numerics.h"

using namespace glms;

namespace {

const std::filesystem::path kFixture = GLMS_SOURCE_DIR "/tests/golden/glm52-random";

// Writes `from`'s tensors into `shards` files of `dir`, with the index and config.json.
void write_sharded(const std::filesystem::path& from, const std::filesystem::path& dir, int shards) {
  const io::Checkpoint source = io::Checkpoint::open(from / "model.safetensors");
  const std::vector<std::string> names = source.names();
  nlohmann::json index = {{"metadata", {{"total_size", source.total_bytes()}}}, {"weight_map", nlohmann::json::object()}};
  std::filesystem::create_directories(dir);
  for (int s = 0; s < shards; ++s) {
    const std::string file = "model-" + std::to_string(s + 1) + "-of-" + std::to_string(shards) + ".safetensors";
    std::vector<io::TensorToWrite> tensors;
    for (size_t i = s; i < names.size(); i += shards) {  // interleaved: every shard holds some of each layer
      const io::TensorInfo& t = source.get(names[i]);
      tensors.push_back({t.name, t.dtype, t.shape, std::vector<std::byte>(t.data, t.data + t.nbytes)});
      index["weight_map"][t.name] = file;
    }
    io::write_safetensors(dir / file, tensors);
  }
  std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
  std::filesystem::copy_file(from / "config.json", dir / "config.json");
}

std::vector<float> prompt_logits(const model::Glm5Model& m, const std::vector<int32_t>& prompt) {
  const int block_size = 16, blocks = static_cast<int>(prompt.size()) / block_size + 1;
  kv::PagedLatentCache cache(m.cache_layout(block_size), blocks);
  std::vector<int32_t> table(blocks);
  for (int b = 0; b < blocks; ++b) table[b] = b;
  model::ForwardBatch batch;
  batch.add_sequence(prompt, 0, table, block_size, true);
  return m.forward(batch, cache);
}

}  // namespace

TEST(ShardedCheckpoint, ThreeShardsWithAnIndexLoadLikeTheSingleFile) {
  glms::testing::TempDir dir("sharded");
  write_sharded(kFixture, dir.path / "m", 3);
  ASSERT_FALSE(std::filesystem::exists(dir.path / "m" / "model.safetensors"));
  const model::Glm5Model single(model::load_weights(kFixture.string()));
  const model::Glm5Model sharded(model::load_weights((dir.path / "m").string()));
  EXPECT_EQ(sharded.weights().parameters, single.weights().parameters);
  ASSERT_EQ(sharded.weights().mtp.size(), single.weights().mtp.size());
  const auto prompt = glms::testing::random_tokens(60, single.config().vocab_size, 11);
  EXPECT_EQ(prompt_logits(sharded, prompt), prompt_logits(single, prompt));

  // A tensor-parallel rank's slices come from the shards as from the single file.
  model::LoadOptions rank;
  rank.shard.tp_size = 2;
  rank.shard.tp_rank = 1;
  const model::ModelWeights a = model::load_weights(kFixture.string(), rank);
  const model::ModelWeights b = model::load_weights((dir.path / "m").string(), rank);
  ASSERT_EQ(a.layers[1].attention.o_proj.cols, b.layers[1].attention.o_proj.cols);
  std::vector<float> row_a(a.layers[1].attention.o_proj.cols), row_b(row_a.size());
  for (int64_t r = 0; r < a.layers[1].attention.o_proj.rows; r += 7) {
    a.layers[1].attention.o_proj.row_to_f32(r, row_a.data());
    b.layers[1].attention.o_proj.row_to_f32(r, row_b.data());
    ASSERT_EQ(row_a, row_b) << "row " << r;
  }
  EXPECT_EQ(a.parameters, b.parameters);
  EXPECT_LT(a.parameters, single.weights().parameters);  // a rank holds part of the model
}
