// The choice constraint over a toy vocabulary: the tokens allowed at each point are exactly those
// whose text keeps the output a prefix of some choice, EOS only on a whole choice.
#include <gtest/gtest.h>

#include <cmath>

#include "allowed_tokens.h"
#include "core/error.h"
#include "structured/choice.h"

using namespace glms;

namespace {
// id: 0 "<eos>" (special: empty), 1 "y", 2 "es", 3 "yes", 4 "no", 5 " please", 6 "n", 7 "o", 8 "x"
structured::TokenTexts toy_texts() {
  return structured::make_vocabulary(
      std::vector<std::string>{"", "y", "es", "yes", "no", " please", "n", "o", "x"});
}
std::vector<int> allowed(const engine::TokenConstraint& c) { return glms::testing::allowed_tokens(c, 9); }
}  // namespace

TEST(Choice, TokensKeepTheOutputAPrefixOfAChoiceAndEosEndsAWholeOne) {
  auto c = structured::make_choice_constraint({"yes", "yes please", "no"}, toy_texts());
  EXPECT_EQ(allowed(*c), (std::vector<int>{1, 3, 4, 6}));  // y, yes, no, n
  EXPECT_FALSE(c->may_end());
  c->accept(1);  // "y"
  EXPECT_EQ(allowed(*c), (std::vector<int>{2}));  // es
  c->accept(2);  // "yes": whole, and "yes please" goes on
  EXPECT_TRUE(c->may_end());
  EXPECT_EQ(allowed(*c), (std::vector<int>{5}));
  c->accept(5);  // "yes please": whole, nothing follows
  EXPECT_TRUE(c->may_end());
  EXPECT_TRUE(allowed(*c).empty());
}

TEST(Choice, EveryPathSpellsAChoice) {
  // A random walk over the allowed tokens always ends on one of the choices.
  const std::vector<std::string> choices = {"yes", "yes please", "no"};
  const auto texts = toy_texts();
  for (int seed = 0; seed < 200; ++seed) {
    auto c = structured::make_choice_constraint(choices, texts);
    std::string out;
    for (int step = 0; step < 10; ++step) {
      const std::vector<int> options = allowed(*c);
      const bool end = c->may_end() && (options.empty() || (seed + step) % 3 == 0);
      if (end) break;
      ASSERT_FALSE(options.empty()) << out;
      const int token = options[static_cast<size_t>(seed * 7 + step) % options.size()];
      out += texts->texts[token];
      c->accept(token);
    }
    EXPECT_NE(std::find(choices.begin(), choices.end(), out), choices.end()) << out;
  }
}

TEST(Choice, BadChoicesAreRefused) {
  EXPECT_THROW(structured::make_choice_constraint({}, toy_texts()), Error);
  EXPECT_THROW(structured::make_choice_constraint({"a", ""}, toy_texts()), Error);
}
