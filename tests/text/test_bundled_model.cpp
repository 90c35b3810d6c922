// The bundled tiny GLM-style model (models/glm5-tiny-code) ships golden ids made with HF
// `tokenizers` (tools/tiny_golden.py): its prompt text and greedy continuation with their ids.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "test_helpers.h"

namespace glms::text {
namespace {

namespace fs = std::filesystem;
using test::json;

// Reads an I64 tensor from a safetensors file whose header is `header` (data after 8 + n bytes).
std::vector<int32_t> read_i64_tensor(std::ifstream& file, uint64_t header_size, const json& header, const char* name) {
  const json& entry = header.at(name);
  EXPECT_EQ(entry.at("dtype"), "I64");
  const auto begin = entry.at("data_offsets")[0].get<uint64_t>();
  const auto end = entry.at("data_offsets")[1].get<uint64_t>();
  std::vector<int64_t> values((end - begin) / 8);
  file.seekg(static_cast<std::streamoff>(8 + header_size + begin));
  file.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(end - begin));
  return std::vector<int32_t>(values.begin(), values.end());
}

TEST(BundledModel, TinyGlmTokenizerMatchesHfGoldenIds) {
  const fs::path dir = fs::path(GLMS_SOURCE_DIR) / "models" / "glm5-tiny-code";
  if (!fs::exists(dir / "tokenizer.json") || !fs::exists(dir / "golden.safetensors")) {
    GTEST_SKIP() << "bundled tiny model not present";
  }
  std::ifstream file(dir / "golden.safetensors", std::ios::binary);
  uint64_t header_size = 0;
  file.read(reinterpret_cast<char*>(&header_size), 8);
  std::string header_text(header_size, '\0');
  file.read(header_text.data(), static_cast<std::streamsize>(header_size));
  const json header = json::parse(header_text);
  const std::string prompt_text = header.at("__metadata__").at("prompt_text");
  const std::string greedy_text = header.at("__metadata__").at("greedy_text");
  const std::vector<int32_t> prompt_ids = read_i64_tensor(file, header_size, header, "prompt_ids");
  const std::vector<int32_t> greedy_ids = read_i64_tensor(file, header_size, header, "greedy_ids");

  const Tokenizer tokenizer = Tokenizer::load(dir);
  EXPECT_EQ(tokenizer.encode(prompt_text), prompt_ids);
  EXPECT_EQ(tokenizer.decode(prompt_ids), prompt_text);
  EXPECT_EQ(tokenizer.decode(greedy_ids), greedy_text);
  EXPECT_EQ(tokenizer.eos_token_id(), tokenizer.token_to_id("<|endoftext|>"));
  EXPECT_TRUE(tokenizer.is_special(tokenizer.token_to_id("[gMASK]")));
}

// The length bound that lets the server refuse a huge prompt untokenized never exceeds the real
// count: over random text of every kind the bundled tokenizer sees, and over runs of one
// character (the longest tokens).
TEST(BundledModel, MinTokensForBytesIsALowerBound) {
  const Tokenizer tok = Tokenizer::load(fs::path(GLMS_SOURCE_DIR) / "models" / "glm5-tiny-code");
  std::mt19937 rng(5);
  const std::string alphabet = "abc XYZ_09\n\t    ()[]{}.,;:'\"=+-*/#";
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int length = 1 + static_cast<int>(rng() % 3000);
    for (int i = 0; i < length; ++i) text += alphabet[rng() % alphabet.size()];
    if (trial % 4 == 0) text += "def main():\n    return 0\n<|user|>[gMASK]<sop>";
    EXPECT_LE(tok.min_tokens_for_bytes(text.size()), tok.encode(text).size()) << trial;
  }
  for (const char c : std::string(" \na_#")) {
    const std::string run(20000, c);
    EXPECT_LE(tok.min_tokens_for_bytes(run.size()), tok.encode(run).size()) << int(c);
  }
  // 8 MB of one letter cannot fit 4096 tokens: the bound says so at once.
  EXPECT_GT(tok.min_tokens_for_bytes(8000000), 4096u);
}

}  // namespace
}  // namespace glms::text

