// Dataset prompts through the bundled model's tokenizer: ShareGPT files filtered as vLLM filters
// them, JSON-lines prompts, the seed's shuffle, reuse of a short file, and an error naming the
// place for each malformed file.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "bench/dataset.h"
#include "core/error.h"

using namespace glms::bench;
using glms::text::Tokenizer;
using nlohmann::json;

namespace {

const Tokenizer& tiny() {
  static const Tokenizer tok = Tokenizer::load(GLMS_SOURCE_DIR "/models/glm5-tiny-code");
  return tok;
}

// Text of at least `tokens` tokens: numbered words, so that each text is its own.
std::string words(int tokens, const std::string& tag) {
  std::string text = tag;
  while (static_cast<int>(tiny().encode(text, false).size()) < tokens) text += " word" + std::to_string(text.size());
  return text;
}

std::string write_file(const std::string& name, const std::string& contents) {
  const auto dir = std::filesystem::path(GLMS_BINARY_DIR) / "tests" / "bench" / "datasets";
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream(path, std::ios::binary) << contents;
  return path.string();
}

json conversation(const std::string& prompt, const std::string& reply) {
  return {{"id", prompt.substr(0, 8)},
          {"conversations", json::array({{{"from", "human"}, {"value", prompt}}, {{"from", "gpt"}, {"value", reply}}})}};
}

// The error read_dataset_prompts throws, or "" where it throws none.
std::string error_of(const DatasetSpec& spec, size_t count = 1) {
  try {
    read_dataset_prompts(tiny(), spec, count);
  } catch (const glms::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Dataset, ShareGptKeepsWhatVllmsFilterKeeps) {
  const std::string a = words(12, "alpha"), b = words(40, "beta"), c = words(5, "gamma");
  const std::string reply = words(20, "reply");
  json doc = json::array({conversation(a, reply), conversation(b, words(6, "answer")), conversation(c, reply)});
  doc.push_back(conversation("hi", reply));                        // prompt under 4 tokens
  doc.push_back(conversation(words(30, "delta"), "ok"));           // reply under 4 tokens
  doc.push_back(conversation(words(1100, "epsilon"), reply));      // prompt over 1024
  doc.push_back(conversation(words(900, "zeta"), words(1200, "r")));  // both over 2048
  doc.push_back({{"id", "one-turn"}, {"conversations", json::array({{{"from", "human"}, {"value", a}}})}});
  DatasetSpec spec{"sharegpt", write_file("filter.json", doc.dump()), 0, 0, 7};
  size_t reused = 99;
  const auto prompts = read_dataset_prompts(tiny(), spec, 3, &reused);
  EXPECT_EQ(reused, 0u);
  ASSERT_EQ(prompts.size(), 3u);
  std::set<std::string> texts;
  for (const Prompt& p : prompts) {
    texts.insert(p.text);
    EXPECT_EQ(p.ids, tiny().encode(p.text, false));
    EXPECT_EQ(p.prefix_group, -1);
    const int expected_out = static_cast<int>(tiny().encode(p.text == b ? words(6, "answer") : reply, false).size());
    EXPECT_EQ(p.output_len, expected_out) << p.text;
  }
  EXPECT_EQ(texts, (std::set<std::string>{a, b, c}));

  // More requests than usable prompts: the three again, in the same order.
  const auto twice = read_dataset_prompts(tiny(), spec, 7, &reused);
  EXPECT_EQ(reused, 3u);
  ASSERT_EQ(twice.size(), 7u);
  for (size_t i = 0; i < twice.size(); ++i) EXPECT_EQ(twice[i].text, prompts[i % 3].text);

  // A fixed output length: short replies pass, every request asks for that many tokens; the
  // context length drops what does not fit.
  spec.output_len = 5;
  const auto fixed = read_dataset_prompts(tiny(), spec, 4, &reused);
  EXPECT_EQ(reused, 0u);
  for (const Prompt& p : fixed) EXPECT_EQ(p.output_len, 5);
  spec.context_len = 20;
  const auto fitting = read_dataset_prompts(tiny(), spec, 10, &reused);
  for (const Prompt& p : fitting) EXPECT_LE(p.ids.size() + 5, 20u) << p.text;
  EXPECT_EQ(reused, 2u);  // alpha (12) and gamma (5) fit 20 with 5 out; beta and delta do not
}

TEST(Dataset, TheSeedShufflesAndThreadsDoNot) {
  json doc = json::array();
  for (int i = 0; i < 40; ++i) doc.push_back(conversation(words(6, "prompt" + std::to_string(i)), words(6, "reply")));
  const std::string path = write_file("shuffle.json", doc.dump());
  auto texts = [&](uint64_t seed, unsigned threads) {
    std::vector<std::string> out;
    for (const Prompt& p : read_dataset_prompts(tiny(), {"sharegpt", path, 0, 0, seed}, 10, nullptr, threads))
      out.push_back(p.text);
    return out;
  };
  EXPECT_EQ(texts(1, 1), texts(1, 4));
  EXPECT_NE(texts(1, 2), texts(2, 2));
  const auto first = texts(3, 2);
  EXPECT_EQ(std::set<std::string>(first.begin(), first.end()).size(), 10u);  // no repeats within the file
}

TEST(Dataset, CustomPromptsAreJsonLines) {
  const std::string path = write_file("custom.jsonl", "{\"prompt\": \"def fibonacci(n):\"}\n\n"
                                                      "{\"prompt\": \"Write a haiku about caches.\", \"extra\": 1}\r\n");
  size_t reused = 99;
  const auto prompts = read_dataset_prompts(tiny(), {"custom", path, 0, 0, 0}, 2, &reused);
  EXPECT_EQ(reused, 0u);
  std::set<std::string> texts;
  for (const Prompt& p : prompts) {
    texts.insert(p.text);
    EXPECT_EQ(p.output_len, kCustomOutputLen);
    EXPECT_EQ(p.ids, tiny().encode(p.text, false));
  }
  EXPECT_EQ(texts, (std::set<std::string>{"def fibonacci(n):", "Write a haiku about caches."}));
  for (const Prompt& p : read_dataset_prompts(tiny(), {"custom", path, 7, 0, 0}, 2)) EXPECT_EQ(p.output_len, 7);
}

TEST(Dataset, MalformedFilesAreRefusedWithTheirPlace) {
  EXPECT_NE(error_of({"sharegpt", "/nonexistent/sharegpt.json", 0, 0, 0}).find("cannot open"), std::string::npos);
  EXPECT_NE(error_of({"sharegpt", write_file("bad.json", "[{\"conversations\": ["), 0, 0, 0}).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of({"sharegpt", write_file("object.json", "{}"), 0, 0, 0}).find("a JSON array"), std::string::npos);
  const std::string no_turns = error_of({"sharegpt", write_file("no_turns.json", "[{\"id\": 1}]"), 0, 0, 0});
  EXPECT_NE(no_turns.find("entry 0 has no \"conversations\" array"), std::string::npos) << no_turns;
  const std::string bad_turn =
      error_of({"sharegpt", write_file("bad_turn.json", "[{\"conversations\": [{\"value\": \"a\"}, 3]}]"), 0, 0, 0});
  EXPECT_NE(bad_turn.find("entry 0: conversation turn 1"), std::string::npos) << bad_turn;
  const std::string none = error_of({"sharegpt", write_file("short.json", json::array({conversation("hi", "yo")}).dump()),
                                     0, 0, 0});
  EXPECT_NE(none.find("none of its 1 conversations"), std::string::npos) << none;
  const std::string line = error_of({"custom", write_file("bad.jsonl", "{\"prompt\": \"a b c d\"}\n{\"text\": 1}\n"), 0, 0, 0});
  EXPECT_NE(line.find("bad.jsonl:2: expected a JSON object"), std::string::npos) << line;
  EXPECT_NE(error_of({"sonnet", write_file("x.txt", ""), 0, 0, 0}).find("expects one of random, sharegpt, custom"),
            std::string::npos);
}
