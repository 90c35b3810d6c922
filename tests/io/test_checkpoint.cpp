#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace glms::io {
namespace {

using testing::expect_error;
using testing::TempDir;
using testing::write_file;

void write_index(const std::filesystem::path& dir, const nlohmann::json& weight_map) {
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  write_file(dir / "model.safetensors.index.json", index.dump(2));
}

// Two shards: a.weight + a.bias in shard 1, b.weight in shard 2.
void write_sharded(const std::filesystem::path& dir) {
  write_safetensors(dir / "model-00001-of-00002.safetensors",
                    {tensor_f32("a.weight", {2, 2}, {1, 2, 3, 4}), tensor_f32("a.bias", {2}, {5, 6})});
  write_safetensors(dir / "model-00002-of-00002.safetensors",
                    {tensor_bf16("b.weight", {3}, {7, 8, 9})});
}

TEST(Checkpoint, ShardedIndex) {
  TempDir dir;
  write_sharded(dir.path());
  write_index(dir.path(), {{"a.weight", "model-00001-of-00002.safetensors"},
                           {"a.bias", "model-00001-of-00002.safetensors"},
                           {"b.weight", "model-00002-of-00002.safetensors"}});
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"a.bias", "a.weight", "b.weight"}));
  EXPECT_TRUE(ckpt.contains("b.weight"));
  EXPECT_FALSE(ckpt.contains("c"));
  EXPECT_EQ(ckpt.find("c"), nullptr);
  EXPECT_EQ(read_f32(ckpt.get("b.weight")), (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(ckpt.get("a.bias").file->filename(), "model-00001-of-00002.safetensors");
  EXPECT_EQ(ckpt.total_bytes(), 16u + 8u + 6u);
  EXPECT_EQ(ckpt.path(), dir.path());

  const Checkpoint via_index = Checkpoint::open(dir / "model.safetensors.index.json");
  EXPECT_EQ(via_index.names().size(), 3u);

  // Moving the checkpoint keeps tensor pointers valid.
  Checkpoint moved = Checkpoint::open(dir.path());
  const TensorInfo* before = &moved.get("a.weight");
  Checkpoint target = std::move(moved);
  EXPECT_EQ(&target.get("a.weight"), before);
  EXPECT_EQ(read_f32(target.get("a.weight")), (std::vector<float>{1, 2, 3, 4}));
}

TEST(Checkpoint, MissingShardIsNamed) {
  TempDir dir;
  write_sharded(dir.path());
  write_index(dir.path(), {{"a.weight", "model-00001-of-00002.safetensors"},
                           {"c.weight", "model-00003-of-00003.safetensors"}});
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"model.safetensors.index.json", "shard 'model-00003-of-00003.safetensors' is missing",
                "'c.weight'"});
}

TEST(Checkpoint, TensorMissingFromShardIsNamed) {
  TempDir dir;
  write_sharded(dir.path());
  write_index(dir.path(), {{"a.weight", "model-00001-of-00002.safetensors"},
                           {"b.weight", "model-00001-of-00002.safetensors"}});
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"model.safetensors.index.json", "tensor 'b.weight'",
                "mapped to shard 'model-00001-of-00002.safetensors'", "does not contain it"});
}

TEST(Checkpoint, DuplicateTensorAcrossShards) {
  TempDir dir;
  write_safetensors(dir / "x.safetensors", {tensor_f32("w", {1}, {1})});
  write_safetensors(dir / "y.safetensors", {tensor_f32("w", {1}, {2}), tensor_f32("v", {1}, {3})});
  expect_error([&] { Checkpoint::open(dir.path()); },
               {dir.path().string(), "tensor 'w' is in both", "x.safetensors", "y.safetensors"});
  write_index(dir.path(), {{"w", "x.safetensors"}, {"v", "y.safetensors"}});
  expect_error([&] { Checkpoint::open(dir.path()); }, {"tensor 'w' is in both"});
}

TEST(Checkpoint, BadIndexFiles) {
  TempDir dir;
  write_file(dir / "model.safetensors.index.json", "{not json");
  expect_error([&] { Checkpoint::open(dir.path()); }, {"model.safetensors.index.json", "not valid JSON"});
  write_file(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { Checkpoint::open(dir.path()); }, {"'weight_map'"});
  write_index(dir.path(), {{"w", 3}});
  expect_error([&] { Checkpoint::open(dir.path()); }, {"weight_map['w'] must be a shard file name"});
  write_index(dir.path(), {{"w", "../outside.safetensors"}});
  expect_error([&] { Checkpoint::open(dir.path()); }, {"shard name '../outside.safetensors'"});
  write_index(dir.path(), nlohmann::json::object());  // found by fuzz/fuzz_safetensors_index
  expect_error([&] { Checkpoint::open(dir.path()); }, {"lists no tensors"});
  // A shard name the file system refuses (longer than NAME_MAX) is a missing shard, not a crash.
  write_index(dir.path(), {{"w", std::string(300, 'x') + ".safetensors"}});
  expect_error([&] { Checkpoint::open(dir.path()); }, {"is missing"});
}

TEST(Checkpoint, SingleFileAndFolderFallbacks) {
  TempDir dir;
  const auto single = dir / "model.safetensors";
  write_safetensors(single, {tensor_f32("w", {1}, {1}), tensor_f32("layers.0.mlp.up_proj.weight", {1}, {2})});
  write_safetensors(dir / "extra.safetensors", {tensor_f32("ignored", {1}, {1})});
  // model.safetensors wins over other files in the folder.
  EXPECT_EQ(Checkpoint::open(dir.path()).names().size(), 2u);
  EXPECT_EQ(Checkpoint::open(single).names().size(), 2u);
  std::filesystem::remove(single);
  write_safetensors(dir / "a.safetensors", {tensor_f32("x", {1}, {1})});
  EXPECT_EQ(Checkpoint::open(dir.path()).names(), (std::vector<std::string>{"ignored", "x"}));
}

TEST(Checkpoint, OpenErrors) {
  TempDir dir;
  expect_error([&] { Checkpoint::open(dir.path()); },
               {dir.path().string(), "no model.safetensors.index.json, model.safetensors or *.safetensors"});
  expect_error([&] { Checkpoint::open(dir / "nope"); }, {"nope", "no such file or directory"});
  write_file(dir / "broken.safetensors", "xy");
  expect_error([&] { Checkpoint::open(dir.path()); }, {"broken.safetensors", "2 bytes"});
}

TEST(Checkpoint, GetMissingTensorSuggestsCloseName) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors",
                    {tensor_f32("model.layers.0.self_attn.q_a_proj.weight", {1}, {1}),
                     tensor_f32("model.norm.weight", {1}, {1})});
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  expect_error([&] { ckpt.get("model.layers.0.self_attn.q_a_proj.weigth"); },
               {"tensor 'model.layers.0.self_attn.q_a_proj.weigth' not found in checkpoint",
                dir.path().string(), "did you mean 'model.layers.0.self_attn.q_a_proj.weight'"});
  const std::string message = expect_error([&] { ckpt.get("lm_head.weight"); }, {"not found"});
  EXPECT_EQ(message.find("did you mean"), std::string::npos) << message;
}

}  // namespace
}  // namespace glms::io
