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

DatasetSpec spec_of(const std::string& name, const std::string& path, uint64_t seed = 0, int output_len = 0) {
  DatasetSpec spec;
  spec.name = name;
  spec.path = path;
  spec.seed = seed;
  spec.output_len = output_len;
  return spec;
}

// Text of exactly `tokens` tokens (its ids re-encode to themselves).
std::string exact_text(int tokens, uint64_t seed) { return tiny().decode(exact_ids(tiny(), {}, tokens, seed)); }

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
  doc.push_back(conversation(exact_text(3, 1), reply));             // prompt under 4 tokens
  doc.push_back(conversation(words(30, "delta"), "ok"));           // reply under 4 tokens
  doc.push_back(conversation(words(1100, "epsilon"), reply));      // prompt over 1024
  doc.push_back(conversation(words(900, "zeta"), words(1200, "r")));  // both over 2048
  doc.push_back({{"id", "one-turn"}, {"conversations", json::array({{{"from", "human"}, {"value", a}}})}});
  DatasetSpec spec = spec_of("sharegpt", write_file("filter.json", doc.dump()), 7);
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

  // A fixed output length: short replies pass, every request asks for that many tokens.
  spec.output_len = 5;
  const auto fixed = read_dataset_prompts(tiny(), spec, 4, &reused);
  EXPECT_EQ(reused, 0u);
  for (const Prompt& p : fixed) EXPECT_EQ(p.output_len, 5);
  // SGLang's filter: no 1024 / 2048 caps, the context length drops what does not fit.
  spec.sglang_filter = true;
  spec.context_len = 20;
  const auto fitting = read_dataset_prompts(tiny(), spec, 10, &reused);
  for (const Prompt& p : fitting) EXPECT_LE(p.ids.size() + 5, 20u) << p.text;
  EXPECT_EQ(reused, 3u);  // alpha (12), gamma (5) and the 3-token prompt fit 20 with 5 out; beta and delta do not
  spec.context_len = 0;
  read_dataset_prompts(tiny(), spec, 20, &reused);
  EXPECT_EQ(reused, 7u);  // all seven conversations of two turns, epsilon's 1100 and zeta's 2100 tokens too
}

TEST(Dataset, VllmsLimitsAreInclusive) {
  auto usable = [](int in, int out) {
    const json doc = json::array({conversation(exact_text(in, in), exact_text(out, out + 7))});
    try {
      read_dataset_prompts(tiny(), spec_of("sharegpt", write_file("limit.json", doc.dump())), 1);
      return true;
    } catch (const glms::Error&) {
      return false;
    }
  };
  EXPECT_FALSE(usable(3, 10));
  EXPECT_TRUE(usable(4, 10));
  EXPECT_FALSE(usable(10, 3));
  EXPECT_TRUE(usable(10, 4));
  EXPECT_TRUE(usable(1024, 10));
  EXPECT_FALSE(usable(1025, 10));
  EXPECT_TRUE(usable(1000, 1048));
  EXPECT_FALSE(usable(1000, 1049));
}

TEST(Dataset, TheSeedShufflesAndThreadsDoNot) {
  // 200 conversations, every third one's prompt too short: 100 prompts take more than one batch.
  json doc = json::array();
  for (int i = 0; i < 200; ++i)
    doc.push_back(conversation(i % 3 ? words(6, "prompt" + std::to_string(i)) : "hi", words(6, "reply")));
  const std::string path = write_file("shuffle.json", doc.dump());
  auto texts = [&](uint64_t seed, unsigned threads) {
    std::vector<std::string> out;
    for (const Prompt& p : read_dataset_prompts(tiny(), spec_of("sharegpt", path, seed), 100, nullptr, threads))
      out.push_back(p.text);
    return out;
  };
  const auto one_thread = texts(1, 1);
  EXPECT_EQ(one_thread, texts(1, 4));
  EXPECT_NE(one_thread, texts(2, 2));
  EXPECT_EQ(std::set<std::string>(one_thread.begin(), one_thread.end()).size(), 100u);  // no repeats, no "hi"
  EXPECT_EQ(std::count(one_thread.begin(), one_thread.end(), "hi"), 0);
}

TEST(Dataset, CustomPromptsAreJsonLines) {
  const std::string path = write_file("custom.jsonl", "{\"prompt\": \"def fibonacci(n):\"}\n\n"
                                                      "{\"prompt\": \"Write a haiku about caches.\", \"extra\": 1}\r\n");
  size_t reused = 99;
  const auto prompts = read_dataset_prompts(tiny(), spec_of("custom", path), 2, &reused);
  EXPECT_EQ(reused, 0u);
  std::set<std::string> texts;
  for (const Prompt& p : prompts) {
    texts.insert(p.text);
    EXPECT_EQ(p.output_len, kCustomOutputLen);
    EXPECT_EQ(p.ids, tiny().encode(p.text, false));
  }
  EXPECT_EQ(texts, (std::set<std::string>{"def fibonacci(n):", "Write a haiku about caches."}));
  for (const Prompt& p : read_dataset_prompts(tiny(), spec_of("custom", path, 0, 7), 2)) EXPECT_EQ(p.output_len, 7);
}

TEST(Dataset, MalformedFilesAreRefusedWithTheirPlace) {
  EXPECT_NE(error_of(spec_of("sharegpt", "/nonexistent/sharegpt.json")).find("cannot open"), std::string::npos);
  EXPECT_NE(error_of(spec_of("sharegpt", write_file("bad.json", "[{\"conversations\": ["))).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of(spec_of("sharegpt", write_file("object.json", "{}"))).find("a JSON array"), std::string::npos);
  const std::string no_turns = error_of(spec_of("sharegpt", write_file("no_turns.json", "[{\"id\": 1}]")));
  EXPECT_NE(no_turns.find("entry 0 has no \"conversations\" array"), std::string::npos) << no_turns;
  const std::string bad_turn =
      error_of(spec_of("sharegpt", write_file("bad_turn.json", "[{\"conversations\": [{\"value\": \"a\"}, 3]}]")));
  EXPECT_NE(bad_turn.find("entry 0: conversation turn 1"), std::string::npos) << bad_turn;
  const std::string none = error_of(spec_of("sharegpt", write_file("short.json", json::array({conversation("hi", "yo")}).dump())));
  EXPECT_NE(none.find("none of its 1 conversations passes the filter (vLLM's filter"), std::string::npos) << none;
  const std::string empty = error_of(spec_of("custom", write_file("empty.jsonl", "\n")));
  EXPECT_NE(empty.find("no prompt in the file"), std::string::npos) << empty;
  const std::string line = error_of(spec_of("custom", write_file("bad.jsonl", "{\"prompt\": \"a b c d\"}\n{\"text\": 1}\n")));
  EXPECT_NE(line.find("bad.jsonl:2: expected a JSON object"), std::string::npos) << line;
  EXPECT_NE(error_of(spec_of("sonnet", write_file("x.txt", ""))).find("expects one of random, sharegpt, custom"),
            std::string::npos);
}
