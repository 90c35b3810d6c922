// The json_object constraint: random walks over the allowed tokens of a small JSON-ish
// vocabulary end, when they may, on text that nlohmann::json parses as an object; the first
// tokens can only open one; invalid continuations are masked.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "allowed_tokens.h"
#include "structured/json_schema.h"

using namespace glms;

namespace {
structured::TokenTexts json_texts() {
  std::vector<std::string> texts = {""};
  for (const char* t : {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "a", "b", "1", "0", "-", ".", "e", "\\", "n",
                        "{\"", "\":", "\"}", "true", "null", "false", "12", "\\n", "\\u00e9", "\"a\"", ", ", "}}", "x", "u", "l", "r", "s", "t", "f"})
    texts.emplace_back(t);
  return structured::make_vocabulary(std::move(texts));
}
std::vector<int> allowed(const engine::TokenConstraint& c, int vocab) { return glms::testing::allowed_tokens(c, vocab); }
}  // namespace

TEST(JsonObject, WalksEndOnObjectsThatParse) {
  const auto texts = json_texts();
  const int vocab = static_cast<int>(texts->vocab_size());
  std::mt19937 rng(3);
  int ended = 0;
  for (int walk = 0; walk < 400; ++walk) {
    auto c = structured::make_json_object_constraint(texts);
    std::string out;
    for (int step = 0; step < 80 && !c->may_end(); ++step) {
      const std::vector<int> options = allowed(*c, vocab);
      ASSERT_FALSE(options.empty()) << "stuck after '" << out << "'";
      // Prefer closing tokens as the walk grows, so that most walks end.
      int token = options[rng() % options.size()];
      if (step > 20)
        for (int t : options)
          if (texts->texts[t] == "}" || texts->texts[t] == "]" || texts->texts[t] == "\"" || texts->texts[t] == "1") token = t;
      out += texts->texts[token];
      c->accept(token);
    }
    if (!c->may_end()) continue;
    ++ended;
    const nlohmann::json parsed = nlohmann::json::parse(out, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << "'" << out << "'";
  }
  EXPECT_GT(ended, 100);  // 157 with this seed: enough walks reach a closed object
}

TEST(JsonObject, OnlyAnObjectMayStartAndBadContinuationsAreMasked) {
  const auto texts = json_texts();
  const int vocab = static_cast<int>(texts->vocab_size());
  auto c = structured::make_json_object_constraint(texts);
  std::vector<std::string> first;
  for (int t : allowed(*c, vocab)) first.push_back(texts->texts[t]);
  EXPECT_EQ(first, (std::vector<std::string>{"{", " ", "\n", "{\""}));
  for (const std::string& t : {std::string("{\""), std::string("a"), std::string("\":")}) {
    for (int id = 0; id < vocab; ++id)
      if (texts->texts[id] == t) c->accept(id);
  }
  // After {"a": a value is due: no ',' '}' or ':'.
  for (int t : allowed(*c, vocab)) {
    const std::string& s = texts->texts[t];
    EXPECT_TRUE(s != "," && s != "}" && s != ":" && s != "x") << s;
  }
  EXPECT_FALSE(c->may_end());
}
