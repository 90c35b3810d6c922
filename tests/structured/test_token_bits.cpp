// The packed token masks the CUDA runner applies on the device (TokenConstraint::allowed_bits and
// next_token_bits) against the float masks the host applies: for every state of random walks
// over JSON and regex constraints, a bit is set exactly where mask() leaves the logit finite,
// may_end() says the same after either, bits past the vocabulary are clear, and the EOS ids are
// open exactly where the engine's float path gives them their logits back. Vocabularies are not
// multiples of 32 or 64, and the model's may be larger than the tokenizer's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "structured/json_schema.h"
#include "structured/regex.h"

using namespace glms;

namespace {

// 203 texts: a special token (id 0, no text), the printable ASCII characters, JSON-ish pairs and
// a few longer tokens.
structured::TokenTexts mixed_texts() {
  std::vector<std::string> texts = {""};
  for (char c = ' '; c <= '~'; ++c) texts.emplace_back(1, c);
  for (const char* t : {"{\"", "\":", "\"}", "true", "null", "false", "12", "\\n", ", ", "}}", "ab", "bc", "abc", "-a",
                        "x.", "\\u00e9", "\"a\"", "{ ", " }", "[1", "0.", ".5", "e+", "1e"})
    texts.emplace_back(t);
  for (int i = 0; texts.size() < 203; ++i) texts.push_back("w" + std::to_string(i));
  return structured::make_vocabulary(std::move(texts));
}

bool bit(const std::vector<uint32_t>& words, int t) { return (words[static_cast<size_t>(t) / 32] >> (t % 32)) & 1u; }

// Checks the constraint's bits against its float mask in its current state; returns the tokens
// the float mask leaves open.
std::vector<int> expect_bits_match_float_mask(const engine::TokenConstraint& c, int vocab, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> raw(static_cast<size_t>(vocab));
  for (float& v : raw) v = normal(rng);
  std::vector<float> logits = raw;
  c.mask(logits.data(), vocab);
  const bool may_end_after_mask = c.may_end();

  const int words = engine::TokenConstraint::mask_words(vocab);
  std::vector<uint32_t> bits(static_cast<size_t>(words), 0xdeadbeefu);  // every word must be written
  c.allowed_bits(bits.data(), vocab);
  EXPECT_EQ(c.may_end(), may_end_after_mask);
  std::vector<int> open;
  for (int t = 0; t < vocab; ++t) {
    const bool finite = std::isfinite(logits[t]);
    EXPECT_EQ(bit(bits, t), finite) << "token " << t;
    if (finite) {
      EXPECT_EQ(logits[t], raw[t]) << "mask() changed an allowed logit";
      open.push_back(t);
    }
  }
  for (int t = vocab; t < 32 * words; ++t) EXPECT_FALSE(bit(bits, t)) << "a bit past the vocabulary, " << t;

  // The engine's float path (Scheduler::draw_token): the EOS ids get their logits back when the
  // constraint may end. Id vocab - 2 is past the tokenizer's texts where the model's vocabulary
  // is larger.
  const std::vector<int32_t> eos = {0, vocab - 2};
  std::vector<float> engine_row = raw;
  c.mask(engine_row.data(), vocab);
  if (c.may_end())
    for (int32_t id : eos) engine_row[id] = raw[id];
  std::vector<uint32_t> next(static_cast<size_t>(words), 0xdeadbeefu);
  c.next_token_bits(next.data(), vocab, eos);
  for (int t = 0; t < vocab; ++t) EXPECT_EQ(bit(next, t), std::isfinite(engine_row[t])) << "next token " << t;
  return open;
}

}  // namespace

TEST(TokenBits, BitmasksEqualTheFloatMasksAlongRandomWalks) {
  const auto texts = mixed_texts();
  const int tokenizer_vocab = texts->vocab_size();
  ASSERT_EQ(tokenizer_vocab % 32, 11);
  int sparse_states = 0, dense_states = 0, single_states = 0, ended = 0;
  for (const int vocab : {tokenizer_vocab, tokenizer_vocab + 45}) {
    for (int form = 0; form < 4; ++form) {
      std::mt19937 rng(17 + form);
      for (int walk = 0; walk < 12; ++walk) {
        SCOPED_TRACE("vocab " + std::to_string(vocab) + ", form " + std::to_string(form) + ", walk " +
                     std::to_string(walk));
        auto c = form == 0   ? structured::make_json_object_constraint(texts)
                 : form == 1 ? structured::make_regex_constraint("[0-9]{3}-[a-c]+", texts)
                 : form == 2 ? structured::make_regex_constraint("(abc|x\\.)+ done", texts)
                             : structured::make_json_schema_constraint(nlohmann::ordered_json::parse(R"({
                                   "type": "object", "required": ["n", "s"],
                                   "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}})"),
                                                                       texts);
        for (int step = 0; step < 24; ++step) {
          const std::vector<int> open = expect_bits_match_float_mask(*c, vocab, rng);
          if (::testing::Test::HasFailure()) return;
          // The matcher keeps few allowed tokens as a list and many as a bitset: both are read.
          (static_cast<int>(open.size()) < tokenizer_vocab / 32 ? sparse_states : dense_states)++;
          single_states += open.size() == 1;
          if (open.empty() || (c->may_end() && rng() % 3 == 0)) {
            ended += c->may_end();
            break;
          }
          c->accept(open[rng() % open.size()]);
        }
      }
    }
  }
  EXPECT_GT(sparse_states, 20);
  EXPECT_GT(dense_states, 20);
  EXPECT_GT(single_states, 5);
  EXPECT_GT(ended, 10);
}

// A constraint that is stuck (no whole token continues it) may end, by bits as by floats.
TEST(TokenBits, AStuckConstraintMayEndByBitsToo) {
  const auto texts = mixed_texts();
  const int vocab = texts->vocab_size();
  auto c = structured::make_regex_constraint("ab", texts);
  const auto a = std::find(texts->texts.begin(), texts->texts.end(), "a");
  c->accept(static_cast<int32_t>(a - texts->texts.begin()));
  std::mt19937 rng(5);
  const std::vector<int> open = expect_bits_match_float_mask(*c, vocab, rng);
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(texts->texts[open[0]], "b");
  c->accept(open[0]);
  c->accept(open[0]);  // "abb": dead, nothing may follow
  expect_bits_match_float_mask(*c, vocab, rng);
  std::vector<uint32_t> bits(static_cast<size_t>(engine::TokenConstraint::mask_words(vocab)));
  c->allowed_bits(bits.data(), vocab);
  for (uint32_t w : bits) EXPECT_EQ(w, 0u);
  EXPECT_TRUE(c->may_end()) << "stuck: it ends rather than drawing from nothing";
}
