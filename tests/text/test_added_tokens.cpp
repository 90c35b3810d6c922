// Added tokens: matched in the raw text before normalization and pre-tokenization, longest
// match first, with single_word / lstrip / rstrip / normalized as Hugging Face applies them.
#include <gtest/gtest.h>

#include "test_helpers.h"

namespace glms::text {
namespace {

using test::added_token;
using test::json;
using test::tokens_of;
using Strings = std::vector<std::string>;

// Character-level model over a small alphabet (spaces are visible as " "), Fuse decoder.
Tokenizer load_with(const std::string& name, const std::vector<json>& added, json normalizer = nullptr) {
  json j = test::tokenizer_json(test::pieces_model({"abcxyz HELO<>/m_-\t"}), normalizer, nullptr, {{"type", "Fuse"}});
  for (const json& token : added) j["added_tokens"].push_back(token);
  return test::load_json(name, j);
}

TEST(AddedTokens, LongestMatchWinsAndTextIsSplitAroundThem) {
  const Tokenizer t = load_with("added_longest", {added_token(100, "<a>", true), added_token(101, "<a><b>", true),
                                                  added_token(102, "ab", false), added_token(103, "bc", false)});
  EXPECT_EQ(tokens_of(t, "x<a><b>y"), (Strings{"x", "<a><b>", "y"}));
  EXPECT_EQ(tokens_of(t, "<a><a>"), (Strings{"<a>", "<a>"}));
  EXPECT_EQ(tokens_of(t, "<a><b"), (Strings{"<a>", "<", "b"}));
  EXPECT_EQ(tokens_of(t, "abc"), (Strings{"ab", "c"}));  // leftmost first
  EXPECT_EQ(tokens_of(t, "xbc"), (Strings{"x", "bc"}));
  EXPECT_EQ(tokens_of(t, "<a>"), (Strings{"<a>"}));
  EXPECT_TRUE(t.encode("").empty());
}

TEST(AddedTokens, SingleWordOnlyMatchesWholeWords) {
  const Tokenizer t = load_with("added_single_word", {added_token(100, "<m>", false, /*single_word=*/true)});
  EXPECT_EQ(tokens_of(t, "<m> x<m> <m>y -<m>-"), (Strings{"<m>", " ", "x", "<", "m", ">", " ", "<", "m", ">", "y", " ",
                                                          "-", "<m>", "-"}));
  EXPECT_EQ(tokens_of(t, "_<m>"), (Strings{"_", "<", "m", ">"}));  // underscore is a word character
}

TEST(AddedTokens, LstripAndRstripSwallowWhitespace) {
  const Tokenizer l = load_with("added_lstrip", {added_token(100, "<m>", true, false, /*lstrip=*/true, false)});
  EXPECT_EQ(tokens_of(l, "a \t <m> b"), (Strings{"a", "<m>", " ", "b"}));
  const Tokenizer r = load_with("added_rstrip", {added_token(100, "<m>", true, false, false, /*rstrip=*/true)});
  EXPECT_EQ(tokens_of(r, "a <m> \t b"), (Strings{"a", " ", "<m>", "b"}));
  const Tokenizer both = load_with("added_both", {added_token(100, "<m>", true, false, true, true)});
  EXPECT_EQ(tokens_of(both, "a <m>\u3000<m> b"), (Strings{"a", "<m>", "<m>", "b"}));
  EXPECT_EQ(tokens_of(both, "  <m>  "), (Strings{"<m>"}));
}

TEST(AddedTokens, NormalizedTokensMatchTheNormalizedText) {
  const Tokenizer t = load_with("added_normalized",
                                {added_token(100, "hello", false, false, false, false, /*normalized=*/true),
                                 added_token(101, "HEY", false, false, false, false, /*normalized=*/false)},
                                {{"type", "Lowercase"}});
  EXPECT_EQ(tokens_of(t, "HELLO"), (Strings{"hello"}));
  EXPECT_EQ(tokens_of(t, "HEY"), (Strings{"HEY"}));  // raw match, before lowercasing
  EXPECT_EQ(tokens_of(t, "hey"), (Strings{"y"}));    // lowercase h and e are not in the vocabulary
}

TEST(AddedTokens, SpecialFlagControlsSkippingInDecode) {
  const Tokenizer t = load_with("added_decode", {added_token(100, "<s>", true), added_token(101, "<think>", false)});
  const std::vector<int32_t> ids = t.encode("<s>a<think>b");
  EXPECT_EQ(test::token_strings(t, ids), (Strings{"<s>", "a", "<think>", "b"}));
  EXPECT_EQ(t.decode(ids, false), "<s>a<think>b");
  EXPECT_EQ(t.decode(ids, true), "a<think>b");
  EXPECT_TRUE(t.is_special(100));
  EXPECT_FALSE(t.is_special(101));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_FALSE(t.is_special(100000));
  EXPECT_EQ(t.token_to_id("<think>"), 101);
  EXPECT_EQ(t.id_to_token(100), "<s>");
  EXPECT_EQ(t.id_to_token(99), "");
  EXPECT_EQ(t.token_to_id("nope"), -1);
  EXPECT_EQ(t.vocab_size(), 102u);
  EXPECT_EQ(t.decode(std::vector<int32_t>{100, 5000, -3, 101}), "<s><think>");  // unknown ids are skipped
}

TEST(AddedTokens, ByteLevelPrefixSpaceAppliesToEverySection) {
  json j = test::tokenizer_json(test::pieces_model({"Ġa", "Ġb", "a"}, true), nullptr,
                                {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}},
                                {{"type", "ByteLevel"}});
  j["added_tokens"].push_back(added_token(1000, "<sep>", true));
  const Tokenizer t = test::load_json("added_bytelevel", j);
  EXPECT_EQ(tokens_of(t, "a<sep>b"), (Strings{"Ġa", "<sep>", "Ġb"}));
}

}  // namespace
}  // namespace glms::text
