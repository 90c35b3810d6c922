// Decoders on hand-made tokenizer.json files, and the incremental detokenizer on them.
#include <gtest/gtest.h>

#include <random>

#include "test_helpers.h"
#include "text/detokenizer.h"
#include "text/utf8.h"

namespace glms::text {
namespace {

using test::json;
using Strings = std::vector<std::string>;

// A tokenizer whose vocabulary is exactly `tokens` (ids in order) and the given decoder.
Tokenizer with_decoder(const std::string& name, const Strings& tokens, json decoder) {
  json vocab = json::object();
  for (const std::string& t : tokens) vocab[t] = vocab.size();
  return test::load_json(name, test::tokenizer_json({{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}},
                                                    nullptr, nullptr, decoder));
}

std::string decode_tokens(const Tokenizer& t, const Strings& tokens, bool skip = false) {
  std::vector<int32_t> ids;
  for (const std::string& s : tokens) ids.push_back(t.token_to_id(s));
  return t.decode(ids, skip);
}

Strings byte_tokens() {
  Strings out;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    out.emplace_back(name);
  }
  return out;
}

TEST(Decoders, ByteLevel) {
  Strings vocab = {"Hello", "Ġworld", "<|end|>", "<｜tool▁sep｜>"};
  for (char c : std::string("\xE4\xBD\xA0")) vocab.push_back(test::byte_level(std::string(1, c)));
  const Tokenizer t = with_decoder("dec_bytelevel", vocab, {{"type", "ByteLevel"}});
  EXPECT_EQ(decode_tokens(t, {"Hello", "Ġworld"}), "Hello world");
  EXPECT_EQ(decode_tokens(t, {"ä", "½", "ł"}), "你");
  EXPECT_EQ(decode_tokens(t, {"ä", "½"}), "\xEF\xBF\xBD");          // unfinished character
  EXPECT_EQ(decode_tokens(t, {"ä", "Hello"}), "\xEF\xBF\xBDHello");  // ill-formed
  EXPECT_EQ(decode_tokens(t, {"<|end|>", "<｜tool▁sep｜>"}), "<|end|><｜tool▁sep｜>");  // raw bytes when unmapped
}

TEST(Decoders, ByteFallbackFuseStripReplaceSequence) {
  Strings vocab = byte_tokens();
  for (const char* t : {"▁hello", "▁world", "a", " a ", "  b  "}) vocab.emplace_back(t);
  const Tokenizer fallback = with_decoder("dec_fallback", vocab, {{"type", "ByteFallback"}});
  EXPECT_EQ(decode_tokens(fallback, {"<0xE4>", "<0xBD>", "<0xA0>", "a"}), "你a");
  EXPECT_EQ(decode_tokens(fallback, {"<0xE4>", "<0xBD>", "a"}), "\xEF\xBF\xBD\xEF\xBF\xBD" "a");  // one U+FFFD per byte
  EXPECT_EQ(decode_tokens(fallback, {"a", "<0x41>"}), "aA");

  const Tokenizer strip = with_decoder("dec_strip", vocab, {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}});
  EXPECT_EQ(decode_tokens(strip, {" a ", "  b  "}), "a b ");

  const Tokenizer replace = with_decoder("dec_replace", vocab,
                                         {{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}});
  EXPECT_EQ(decode_tokens(replace, {"▁hello", "▁world"}), " hello world");

  const Tokenizer fuse = with_decoder("dec_fuse", vocab, {{"type", "Fuse"}});
  EXPECT_EQ(decode_tokens(fuse, {"▁hello", "a"}), "▁helloa");

  const json llama = {{"type", "Sequence"},
                      {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                                                {{"type", "ByteFallback"}},
                                                {{"type", "Fuse"}},
                                                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  const Tokenizer sequence = with_decoder("dec_llama", vocab, llama);
  EXPECT_EQ(decode_tokens(sequence, {"▁hello", "<0xE4>", "<0xBD>", "<0xA0>", "▁world"}), "hello你 world");
}

TEST(Decoders, MetaspaceAndNoDecoder) {
  const Strings vocab = {"▁hello", "▁world", "a▁b"};
  const Tokenizer always = with_decoder("dec_meta", vocab, {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}});
  EXPECT_EQ(decode_tokens(always, {"▁hello", "▁world"}), "hello world");
  const Tokenizer never = with_decoder("dec_meta_never", vocab, {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "never"}});
  EXPECT_EQ(decode_tokens(never, {"▁hello", "▁world"}), " hello world");
  const Tokenizer none = with_decoder("dec_none", vocab, nullptr);
  EXPECT_EQ(decode_tokens(none, {"▁hello", "a▁b"}), "▁hello a▁b");
}

// Streams `ids` through the detokenizer; checks every piece and the total against decode().
void expect_streaming(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special = false) {
  IncrementalDetokenizer detokenizer(t, {.skip_special_tokens = skip_special});
  std::string total;
  for (int32_t id : ids) {
    const std::string piece = detokenizer.feed(id);
    ASSERT_TRUE(utf8::is_valid(piece));
    total += piece;
  }
  total += detokenizer.flush();
  EXPECT_EQ(total, t.decode(ids, skip_special));
}

TEST(IncrementalDetokenizer, HoldsBackSplitCharactersUntilComplete) {
  Strings vocab = {"Hello", "Ġworld"};
  const std::string emoji = "👩🏽‍💻";
  for (int b = 0; b < 256; ++b) vocab.push_back(test::byte_level(std::string(1, static_cast<char>(b))));
  const Tokenizer t = with_decoder("detok_bytelevel", vocab, {{"type", "ByteLevel"}});
  IncrementalDetokenizer detokenizer(t);
  EXPECT_EQ(detokenizer.feed(t.token_to_id("Hello")), "Hello");
  const std::string ni = "\xE4\xBD\xA0";
  EXPECT_EQ(detokenizer.feed(t.token_to_id(test::byte_level(ni.substr(0, 1)))), "");
  EXPECT_EQ(detokenizer.feed(t.token_to_id(test::byte_level(ni.substr(1, 1)))), "");
  EXPECT_EQ(detokenizer.feed(t.token_to_id(test::byte_level(ni.substr(2, 1)))), ni);
  std::string streamed;
  for (char c : emoji) streamed += detokenizer.feed(t.token_to_id(test::byte_level(std::string(1, c))));
  EXPECT_EQ(streamed, emoji);
  EXPECT_EQ(detokenizer.feed(t.token_to_id(test::byte_level("\xF0"))), "");
  EXPECT_EQ(detokenizer.flush(), "\xEF\xBF\xBD");  // an unfinished character ends as U+FFFD
  EXPECT_EQ(detokenizer.feed(t.token_to_id("Ġworld")), " world");
}

TEST(IncrementalDetokenizer, RandomStreamsMatchDecodeForEachDecoderKind) {
  Strings vocab = byte_tokens();
  for (int b = 0; b < 256; ++b) vocab.push_back(test::byte_level(std::string(1, static_cast<char>(b))));
  for (const char* t : {"▁", "▁hello", "hello▁", "a", "▁▁", "你", "😀"}) vocab.emplace_back(t);
  const std::vector<std::pair<const char*, json>> decoders = {
      {"detok_rand_bytelevel", {{"type", "ByteLevel"}}},
      {"detok_rand_fallback", {{"type", "ByteFallback"}}},
      {"detok_rand_meta", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}}},
      {"detok_rand_none", nullptr},
      {"detok_rand_llama",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}},
                                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
  };
  std::mt19937 rng(7);
  for (const auto& [name, decoder] : decoders) {
    json j = test::tokenizer_json(json::object(), nullptr, nullptr, decoder);
    json v = json::object();
    for (const std::string& t : vocab) v[t] = v.size();
    j["model"] = {{"type", "BPE"}, {"vocab", v}, {"merges", json::array()}};
    j["added_tokens"].push_back(test::added_token(static_cast<int>(v.size()), "<|special|>", true));
    const Tokenizer t = test::load_json(name, j);
    std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(t.vocab_size()) - 1);
    for (int stream = 0; stream < 200; ++stream) {
      std::vector<int32_t> ids(static_cast<size_t>(1 + stream % 40));
      for (int32_t& id : ids) id = any(rng);
      SCOPED_TRACE(name);
      expect_streaming(t, ids, stream % 3 == 0);
    }
  }
}

}  // namespace
}  // namespace glms::text
