// The regex constraint: on a small vocabulary of one- and two-character tokens, every output a
// random walk over the allowed tokens ends with matches the expression (std::regex_match as the
// reference), the allowed sets at the start are the expression's first characters, and bad
// expressions are refused naming the position.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>

#include "allowed_tokens.h"
#include "core/error.h"
#include "structured/regex.h"

using namespace glms;

namespace {
structured::TokenTexts toy_texts() {
  std::vector<std::string> texts = {""};  // id 0: a special token
  for (char c : std::string("0123456789abcxyz-_. @")) texts.emplace_back(1, c);
  for (const char* two : {"12", "ab", "x.", "-a", "z@"}) texts.emplace_back(two);
  return structured::make_vocabulary(std::move(texts));
}
std::vector<int> allowed(const engine::TokenConstraint& c, int vocab) { return glms::testing::allowed_tokens(c, vocab); }
}  // namespace

TEST(Regex, RandomWalksOverAllowedTokensMatchTheExpression) {
  const auto texts = toy_texts();
  const int vocab = static_cast<int>(texts->vocab_size());
  for (const char* pattern : {"[0-9]{3}-[a-c]+", "(ab|xyz)*@?", "\\d+(\\.\\d{1,2})?", "[^0-9 ]{2,4}", "a(b|c)*z{0,2}",
                              "(?:x|y)+_[a-z]*", "^[abc]\\s[0-9]$"}) {
    const std::regex reference(pattern, std::regex::ECMAScript);
    std::mt19937 rng(1);
    int ended = 0;
    for (int walk = 0; walk < 300; ++walk) {
      auto c = structured::make_regex_constraint(pattern, texts);
      std::string out;
      for (int step = 0; step < 12; ++step) {
        const std::vector<int> options = allowed(*c, vocab);
        if (c->may_end() && (options.empty() || rng() % 4 == 0)) break;
        ASSERT_FALSE(options.empty()) << pattern << ": stuck after '" << out << "'";
        const int token = options[rng() % options.size()];
        out += texts->texts[token];
        c->accept(token);
      }
      if (!c->may_end()) continue;  // cut by the step limit before a match was complete
      ++ended;
      EXPECT_TRUE(std::regex_match(out, reference)) << pattern << ": '" << out << "'";
    }
    EXPECT_GT(ended, 50) << pattern;
  }
}

TEST(Regex, TheFirstTokensAreTheExpressionsFirstCharacters) {
  const auto texts = toy_texts();
  const int vocab = static_cast<int>(texts->vocab_size());
  auto c = structured::make_regex_constraint("[0-9]{3}-x", texts);
  std::vector<std::string> first;
  for (int t : allowed(*c, vocab)) first.push_back(texts->texts[t]);
  EXPECT_EQ(first, (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "12"}));
  EXPECT_FALSE(c->may_end());
}

TEST(Regex, GroupsNestedPastTheLimitAreRefused) {
  const int limit = structured::kMaxGrammarNesting;
  EXPECT_NO_THROW(structured::make_regex_constraint(std::string(limit, '(') + "a" + std::string(limit, ')'), toy_texts()));
  try {
    structured::make_regex_constraint(std::string(100000, '(') + "a" + std::string(100000, ')'), toy_texts());
    ADD_FAILURE() << "100000 levels were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nest deeper than 128"), std::string::npos);
  }
}

TEST(Regex, BadExpressionsAreRefusedWithThePosition) {
  for (const char* bad : {"(ab", "[a-", "a{3,1}", "*a", "a{999}", "a{4,44444444444444444444}", "\\q", "a)"}) {
    try {
      structured::make_regex_constraint(bad, toy_texts());
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("position"), std::string::npos) << e.what();
    }
  }
}
