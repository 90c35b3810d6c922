// GBNF grammars: random walks over allowed tokens end on strings the grammar's language holds
// (checked by a hand-written recogniser); repetition and nesting work; grammars the recogniser
// cannot follow (left recursion, undefined rules) and syntax errors are refused naming the rule
// or the line.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "allowed_tokens.h"
#include "core/error.h"
#include "structured/grammar.h"
#include "structured/recognizer.h"

using namespace glms;

namespace {

structured::TokenTexts toy_texts() {
  std::vector<std::string> texts = {""};
  for (char c : std::string("()[]ab01,+ \n")) texts.emplace_back(1, c);
  for (const char* t : {"((", "))", "()", "ab", "a,", "10"}) texts.emplace_back(t);
  return structured::make_vocabulary(std::move(texts));
}

// Balanced () and [] nested properly.
bool balanced(const std::string& s) {
  std::string stack;
  for (char c : s) {
    if (c == '(' || c == '[') stack.push_back(c);
    else if (c == ')' || c == ']') {
      if (stack.empty() || stack.back() != (c == ')' ? '(' : '[')) return false;
      stack.pop_back();
    } else {
      return false;
    }
  }
  return stack.empty();
}

std::vector<std::string> walk(const std::shared_ptr<const structured::Grammar>& g, int count, int max_steps) {
  const auto texts = toy_texts();
  std::mt19937 rng(5);
  std::vector<std::string> out;
  for (int w = 0; w < count; ++w) {
    auto c = structured::make_grammar_constraint(g, texts);
    std::string text;
    for (int step = 0; step < max_steps; ++step) {
      const std::vector<int> options = glms::testing::allowed_tokens(*c, texts->vocab_size());
      if (c->may_end() && (options.empty() || rng() % 3 == 0)) break;
      if (options.empty()) break;
      const int t = options[rng() % options.size()];
      text += texts->texts[static_cast<size_t>(t)];
      c->accept(t);
    }
    if (c->may_end()) out.push_back(text);
  }
  return out;
}

}  // namespace

TEST(Grammar, NestedBracketsStayBalanced) {
  const auto g = structured::parse_gbnf(R"G(
    # nested brackets, any depth
    root ::= group*
    group ::= "(" root ")"
            | "[" root "]"
  )G");
  int ended = 0;
  for (const std::string& s : walk(g, 300, 40)) {
    ++ended;
    EXPECT_TRUE(balanced(s)) << "'" << s << "'";
  }
  EXPECT_GT(ended, 100);
}

TEST(Grammar, ListsWithCountsAndClasses) {
  const auto g = structured::parse_gbnf(R"G(root ::= item ("," item){0,2} "\n"?
item ::= [ab]{1,3} | [0-1]+)G");
  const std::regex reference("([ab]{1,3}|[01]+)(,([ab]{1,3}|[01]+)){0,2}\n?");
  int ended = 0;
  for (const std::string& s : walk(g, 300, 30)) {
    ++ended;
    EXPECT_TRUE(std::regex_match(s, reference)) << "'" << s << "'";
  }
  EXPECT_GT(ended, 100);
}

TEST(Grammar, RefusesWhatItCannotFollowNamingTheRuleOrLine) {
  auto message = [](const char* text) {
    try {
      structured::parse_gbnf(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message("root ::= root \"a\" | \"a\"").find("'root' is left-recursive"), std::string::npos);
  EXPECT_NE(message("root ::= x* \"a\"\nx ::= \"b\"?").find("left-recursive"), std::string::npos);
  EXPECT_NE(message("root ::= thing").find("'thing' is used but not defined"), std::string::npos);
  EXPECT_NE(message("item ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"\n\nroot ::= [b-a]").find("line 3"), std::string::npos);
  EXPECT_NE(message("root ::= (\"a\"").find("unclosed '('"), std::string::npos);
}

// Groups nested 128 deep parse; deeper ones are refused by name instead of recursing until the
// stack overflows (the structured fuzzer's input: thousands of '(' in one rule).
TEST(Grammar, GroupsNestedPastTheLimitAreRefused) {
  auto nested = [](int depth) {
    return "root ::= " + std::string(depth, '(') + "\"a\"" + std::string(depth, ')') + "\n";
  };
  EXPECT_NO_THROW(structured::parse_gbnf(nested(structured::kMaxGrammarNesting)));
  for (int depth : {structured::kMaxGrammarNesting + 1, 100000}) {
    try {
      structured::parse_gbnf(nested(depth));
      ADD_FAILURE() << depth << " levels were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("nest deeper than 128"), std::string::npos) << e.what();
    }
  }
}

// Empty alternatives that reach the same point are followed once: a rule of two empty
// alternatives repeated 381 times (the structured fuzzer's input; 2^381 paths to the same stacks,
// which ran past any time limit inside one step) builds its states in a few thousand expansions.
TEST(Grammar, EmptyAlternativesReachingOnePointAreFollowedOnce) {
  structured::Recognizer r(structured::parse_gbnf("root ::= [a-z] root* item item{381}\nitem ::= (|)\n"));
  int32_t state = r.start();
  for (const char byte : std::string("abc")) state = r.step(state, static_cast<unsigned char>(byte));
  EXPECT_TRUE(r.accepting(state));
  EXPECT_EQ(r.step(state, '1'), structured::Recognizer::kDead);
  EXPECT_LT(r.work(), 100000u);
}

// A grammar whose every byte keeps thousands of parses alive (3000 items of one or two letters:
// after k letters any item from k / 2 to k may be the current one, and no state repeats) stops
// at the request's work bound with an error that says what to change, instead of costing tens
// of milliseconds a token for ever; a grammar of ordinary shape never comes near the bound. (The
// structured fuzzer's first such grammar, 810 optional items matching any text, cost that much
// through repeated empty paths, which are now followed once: the test above.)
TEST(Grammar, AGrammarThatKeepsThousandsOfParsesAliveStopsAtItsWorkBound) {
  std::vector<std::string> texts = {""};
  for (int c = 0x20; c < 0x7f; ++c) texts.emplace_back(1, static_cast<char>(c));
  for (const char* t : {"ab", "xyz", "hello", "  "}) texts.emplace_back(t);
  const auto vocab = structured::make_vocabulary(std::move(texts));
  const auto costly = structured::parse_gbnf("root ::= item{3000}\nitem ::= [a-z] | [a-z] [a-z]\n");
  auto c = structured::make_grammar_constraint(costly, vocab);
  int steps = 0;
  for (; steps < 100000 && c->failure().empty(); ++steps) {
    const std::vector<int> options = glms::testing::allowed_tokens(*c, vocab->vocab_size());
    if (options.empty()) break;
    c->accept(options[static_cast<size_t>(steps) % options.size()]);
  }
  ASSERT_FALSE(c->failure().empty()) << "no bound after " << steps << " tokens";
  EXPECT_NE(c->failure().find("costs too much to follow"), std::string::npos) << c->failure();
  EXPECT_GT(steps, 0);
  // Past the bound nothing more is allowed (the request ends) and nothing more is built.
  EXPECT_TRUE(glms::testing::allowed_tokens(*c, vocab->vocab_size()).empty());

  auto plain = structured::make_grammar_constraint(
      structured::parse_gbnf("root ::= (item \",\")* item\nitem ::= \"(\" [a-z]* \")\" | [0-9]+\n"), vocab);
  for (int step = 0; step < 2000; ++step) {
    const std::vector<int> options = glms::testing::allowed_tokens(*plain, vocab->vocab_size());
    ASSERT_FALSE(options.empty());
    plain->accept(options[static_cast<size_t>(step * 7) % options.size()]);
  }
  EXPECT_TRUE(plain->failure().empty());
}
