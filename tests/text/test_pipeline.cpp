// Normalizers, pre-tokenizers, model options, post-processors and load errors, each checked
// through encode() on a small hand-made tokenizer.json.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>

#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "test_helpers.h"
#include "text/normalizer.h"
#include "text/utf8.h"

namespace glms::text {
namespace {

using test::json;
using test::pieces_model;
using test::tokenizer_json;
using test::tokens_of;
using Strings = std::vector<std::string>;

json split(json pattern, const char* behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

Strings split_pieces(const char* behavior, bool invert, const std::string& text) {
  const Strings vocab = {"a", "b", "c", "-", "--", "a-", "b-", "-b", "-c"};
  const Tokenizer t = test::load_json(std::string("split_") + behavior + (invert ? "_inv" : ""),
                                      tokenizer_json(pieces_model(vocab), nullptr, split({{"String", "-"}}, behavior, invert)));
  return tokens_of(t, text);
}

TEST(PreTokenizers, SplitBehaviors) {
  EXPECT_EQ(split_pieces("Isolated", false, "a-b--c"), (Strings{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(split_pieces("Removed", false, "a-b--c"), (Strings{"a", "b", "c"}));
  EXPECT_EQ(split_pieces("MergedWithPrevious", false, "a-b--c"), (Strings{"a-", "b-", "-", "c"}));
  EXPECT_EQ(split_pieces("MergedWithNext", false, "a-b--c"), (Strings{"a", "-b", "-", "-c"}));
  EXPECT_EQ(split_pieces("Contiguous", false, "a-b--c"), (Strings{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(split_pieces("Removed", true, "a-b--c"), (Strings{"-", "-", "-"}));
  EXPECT_EQ(split_pieces("Isolated", false, "--"), (Strings{"-", "-"}));
}

TEST(PreTokenizers, SplitRegexWithUnicodeClassesAndLookahead) {
  const Strings vocab = {"ab", "12", "cd", "345", "  ", " x", "Ünï", " ", "x"};
  const json pattern = {{"Regex", R"(\p{L}+|\p{N}+|\s+(?!\S)|\s*\S)"}};
  const Tokenizer t = test::load_json("split_regex", tokenizer_json(pieces_model(vocab), nullptr, split(pattern, "Isolated")));
  EXPECT_EQ(tokens_of(t, "ab12cd345   x"), (Strings{"ab", "12", "cd", "345", "  ", " x"}));
  EXPECT_EQ(tokens_of(t, "Ünï"), (Strings{"Ünï"}));
}

TEST(PreTokenizers, ByteLevelPrefixSpaceAndRegex) {
  const Strings vocab = {"Hello", "ĠHello", "Ġworld", "HelloĠworld", "ĠHelloĠworld", "!!"};
  auto load = [&](const char* name, bool prefix, bool regex) {
    const json pre = {{"type", "ByteLevel"}, {"add_prefix_space", prefix}, {"trim_offsets", true}, {"use_regex", regex}};
    return test::load_json(name, tokenizer_json(pieces_model(vocab, true), nullptr, pre, {{"type", "ByteLevel"}}));
  };
  EXPECT_EQ(tokens_of(load("bl_tt", true, true), "Hello world!!"), (Strings{"ĠHello", "Ġworld", "!!"}));
  EXPECT_EQ(tokens_of(load("bl_ft", false, true), "Hello world"), (Strings{"Hello", "Ġworld"}));
  EXPECT_EQ(tokens_of(load("bl_ff", false, false), "Hello world"), (Strings{"HelloĠworld"}));
  EXPECT_EQ(tokens_of(load("bl_tf", true, false), "Hello world"), (Strings{"ĠHelloĠworld"}));
  const Tokenizer t = load("bl_bytes", false, true);
  EXPECT_EQ(tokens_of(t, "\xC3\xA9"), (Strings{"Ã", "©"}));  // é is two byte characters
  EXPECT_EQ(t.decode(t.encode("Hello world!! \xC3\xA9")), "Hello world!! \xC3\xA9");
}

TEST(PreTokenizers, Digits) {
  const Strings vocab = {"a", "123", "b"};
  auto load = [&](const char* name, bool individual) {
    return test::load_json(name, tokenizer_json(pieces_model(vocab), nullptr,
                                                {{"type", "Digits"}, {"individual_digits", individual}}));
  };
  EXPECT_EQ(tokens_of(load("digits_each", true), "a123b"), (Strings{"a", "1", "2", "3", "b"}));
  EXPECT_EQ(tokens_of(load("digits_runs", false), "a123b"), (Strings{"a", "123", "b"}));
}

TEST(PreTokenizers, MetaspacePrependSchemes) {
  const Strings vocab = {"▁hi", "▁", "▁there", "there", "<x>"};
  auto load = [&](const char* name, const char* scheme) {
    json j = tokenizer_json(pieces_model(vocab), nullptr,
                            {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", true}},
                            {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", true}});
    j["added_tokens"].push_back(test::added_token(100, "<x>", true));
    return test::load_json(name, j);
  };
  const Tokenizer always = load("meta_always", "always");
  const Tokenizer first = load("meta_first", "first");
  const Tokenizer never = load("meta_never", "never");
  EXPECT_EQ(tokens_of(always, "hi there"), (Strings{"▁hi", "▁there"}));
  EXPECT_EQ(tokens_of(always, "hi <x>there"), (Strings{"▁hi", "▁", "<x>", "▁there"}));
  EXPECT_EQ(tokens_of(first, "hi <x>there"), (Strings{"▁hi", "▁", "<x>", "there"}));
  EXPECT_EQ(tokens_of(never, "hi there"), (Strings{"h", "i", "▁there"}));
  EXPECT_EQ(always.decode(always.encode("hi there")), "hi there");
  EXPECT_EQ(never.decode(never.encode("hi there")), "hi there");
}

TEST(PreTokenizers, WhitespaceAndSequence) {
  const Strings vocab = {"Hello", ",", "world", "!", "12", "3"};
  const Tokenizer ws = test::load_json("whitespace", tokenizer_json(pieces_model(vocab), nullptr, {{"type", "Whitespace"}}));
  EXPECT_EQ(tokens_of(ws, "Hello,  world!"), (Strings{"Hello", ",", "world", "!"}));
  const json sequence = {{"type", "Sequence"},
                         {"pretokenizers", json::array({{{"type", "WhitespaceSplit"}},
                                                        split({{"Regex", R"(\d{1,2})"}}, "Isolated")})}};
  const Tokenizer seq = test::load_json("sequence", tokenizer_json(pieces_model(vocab), nullptr, sequence));
  EXPECT_EQ(tokens_of(seq, " Hello  123 "), (Strings{"Hello", "12", "3"}));
}

// The exact GLM-5 pre-tokenizer: Split (GLM regex, Isolated) + ByteLevel without prefix space
// or regex, ByteLevel decoder, special tokens, [gMASK]<sop> template.
TEST(PreTokenizers, GlmStylePipeline) {
  const std::string glm_regex =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const Strings pieces = {"Ċ", "I", "'M", "Ġ", "123", "45", "ĠOK", "!!ĊĊ", "Ġx", "y", "ä½łå¥½"};
  json j = tokenizer_json(
      pieces_model(pieces, true), nullptr,
      {{"type", "Sequence"},
       {"pretokenizers", json::array({split({{"Regex", glm_regex}}, "Isolated"),
                                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}},
      {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}});
  const Strings specials = {"[gMASK]", "<sop>", "<|user|>", "<|assistant|>"};
  for (size_t i = 0; i < specials.size(); ++i) j["added_tokens"].push_back(test::added_token(1000 + static_cast<int>(i), specials[i], true));
  j["added_tokens"].push_back(test::added_token(1010, "<think>", false, false, false, false, false));
  j["added_tokens"].push_back(test::added_token(1011, "</think>", false, false, false, false, false));
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors", json::array({{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
                                  {{"type", "TemplateProcessing"},
                                   {"single", json::array({{{"SpecialToken", {{"id", "[gMASK]"}, {"type_id", 0}}}},
                                                           {{"SpecialToken", {{"id", "<sop>"}, {"type_id", 0}}}},
                                                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                                   {"pair", json::array()},
                                   {"special_tokens", {{"[gMASK]", {{"id", "[gMASK]"}, {"ids", {1000}}, {"tokens", {"[gMASK]"}}}},
                                                       {"<sop>", {{"id", "<sop>"}, {"ids", {1001}}, {"tokens", {"<sop>"}}}}}}}})}};
  const Tokenizer t = test::load_json("glm_style", j);
  const std::string text = "[gMASK]<sop><|user|>\nI'M 12345 OK!!\n\n  x<think>y</think>你好";
  EXPECT_EQ(tokens_of(t, text), (Strings{"[gMASK]", "<sop>", "<|user|>", "Ċ", "I", "'M", "Ġ", "123", "45", "ĠOK",
                                         "!!ĊĊ", "Ġ", "Ġx", "<think>", "y", "</think>", "ä½łå¥½"}));
  EXPECT_EQ(t.decode(t.encode(text)), text);
  EXPECT_EQ(t.decode(t.encode(text), true), "\nI'M 12345 OK!!\n\n  x<think>y</think>你好");
  const std::vector<int32_t> with_special = t.encode("y", true);
  EXPECT_EQ(with_special, (std::vector<int32_t>{1000, 1001, t.token_to_id("y")}));
  EXPECT_TRUE(t.is_special(1000));
  EXPECT_FALSE(t.is_special(1010));
  EXPECT_EQ(t.vocab_size(), 1012u);
}

Strings normalized(const char* name, json normalizer, const std::string& text, const Strings& vocab) {
  return tokens_of(test::load_json(name, tokenizer_json(pieces_model(vocab), normalizer)), text);
}

TEST(Normalizers, UnicodeForms) {
  EXPECT_EQ(normalized("nfc", {{"type", "NFC"}}, "e\xCC\x81", {"\xC3\xA9"}), (Strings{"\xC3\xA9"}));
  EXPECT_EQ(normalized("nfd", {{"type", "NFD"}}, "\xC3\xA9", {"e\xCC\x81"}), (Strings{"e\xCC\x81"}));
  EXPECT_EQ(normalized("nfkc", {{"type", "NFKC"}}, "\xEF\xAC\x81\xE2\x91\xA0", {"fi1"}), (Strings{"fi1"}));
  EXPECT_EQ(normalized("nfkd", {{"type", "NFKD"}}, "\xEF\xAC\x81", {"fi"}), (Strings{"fi"}));
}

// The normalizer skips utf8proc for text made of characters it judges inert; check that
// judgement against utf8proc itself for every code point, alone and after likely partners.
TEST(Normalizers, FastPathAgreesWithUtf8procForEveryCodePoint) {
  const char* partners[] = {"a", "e", "A", "\u1100", "\uAC00", "\u0BC6", "\u0B47", "\u09C7", "\u0DD9", "\u1B05", "\u0CC6",
                            "\u0D46", "\u1025", "\u3046", "\u304B"};
  for (const UnicodeForm form : {UnicodeForm::NFC, UnicodeForm::NFKC, UnicodeForm::NFD}) {
    const UnicodeNormalizer normalizer(form);
    for (char32_t cp = 0x80; cp < 0xE01F0; ++cp) {
      if ((cp >= 0xD800 && cp <= 0xDFFF) || (cp >= 0x32000 && cp < 0xE0000)) continue;  // surrogates, unassigned
      std::string alone;
      utf8::append(alone, cp);
      for (const char* partner : partners) {
        const std::string text = std::string(partner) + alone;
        std::string fast = text;
        normalizer.normalize(fast);
        utf8proc_uint8_t* full = nullptr;
        int options = UTF8PROC_STABLE | (form == UnicodeForm::NFD ? UTF8PROC_DECOMPOSE : UTF8PROC_COMPOSE);
        if (form == UnicodeForm::NFKC) options |= UTF8PROC_COMPAT;
        const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                                    &full, static_cast<utf8proc_option_t>(options));
        ASSERT_GE(n, 0);
        const std::string expected(reinterpret_cast<const char*>(full), static_cast<size_t>(n));
        std::free(full);
        ASSERT_EQ(fast, expected) << "U+" << std::hex << static_cast<uint32_t>(cp) << " after " << partner;
      }
    }
  }
}

// Random mixes of starters, combining marks, jamo and compatibility characters: normalizing
// piecewise must give what utf8proc gives for the whole string.
TEST(Normalizers, PiecewiseNormalizationMatchesWholeString) {
  const std::vector<char32_t> pool = {'a', 'e', 'o', 'A', ' ', 0xE9, 0x301, 0x323, 0x302, 0x308, 0x1100, 0x1161, 0x11A8, 0xAC00,
                                      0xAC01, 0x4E2D, 0x3046, 0x3099, 0xFB01, 0x2460, 0x212B, 0x0BC6, 0x0BBE, 0x1F600, 0x0915, 0x093C};
  std::mt19937 rng(3);
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  for (const UnicodeForm form : {UnicodeForm::NFC, UnicodeForm::NFKC, UnicodeForm::NFD, UnicodeForm::NFKD}) {
    const UnicodeNormalizer normalizer(form);
    for (int round = 0; round < 2000; ++round) {
      std::string text;
      for (int i = 0; i < 1 + round % 12; ++i) utf8::append(text, pool[pick(rng)]);
      std::string ours = text;
      normalizer.normalize(ours);
      int options = UTF8PROC_STABLE;
      if (form == UnicodeForm::NFC || form == UnicodeForm::NFKC) options |= UTF8PROC_COMPOSE;
      if (form == UnicodeForm::NFD || form == UnicodeForm::NFKD) options |= UTF8PROC_DECOMPOSE;
      if (form == UnicodeForm::NFKC || form == UnicodeForm::NFKD) options |= UTF8PROC_COMPAT;
      utf8proc_uint8_t* full = nullptr;
      const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                                  &full, static_cast<utf8proc_option_t>(options));
      ASSERT_GE(n, 0);
      const std::string expected(reinterpret_cast<const char*>(full), static_cast<size_t>(n));
      std::free(full);
      ASSERT_EQ(ours, expected) << json(text).dump();
    }
  }
}

TEST(Normalizers, ReplacePrependLowercaseStripSequence) {
  EXPECT_EQ(normalized("lower", {{"type", "Lowercase"}}, "HeLLo ÄÖ", {"hello äö"}), (Strings{"hello äö"}));
  EXPECT_EQ(normalized("replace", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}, "a b c", {"a▁b▁c"}),
            (Strings{"a▁b▁c"}));
  EXPECT_EQ(normalized("replace_re", {{"type", "Replace"}, {"pattern", {{"Regex", R"(\s+)"}}}, {"content", " "}}, "a \t\n b",
                       {"a b"}),
            (Strings{"a b"}));
  EXPECT_EQ(normalized("prepend", {{"type", "Prepend"}, {"prepend", "▁"}}, "hi", {"▁hi"}), (Strings{"▁hi"}));
  EXPECT_EQ(normalized("strip", {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, " \u3000hi \n", {"hi"}),
            (Strings{"hi"}));
  const json sequence = {{"type", "Sequence"},
                         {"normalizers", json::array({{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}},
                                                      {{"type", "Prepend"}, {"prepend", "▁"}},
                                                      {{"type", "Lowercase"}}})}};
  EXPECT_EQ(normalized("norm_seq", sequence, "Hi There", {"▁hi▁there"}), (Strings{"▁hi▁there"}));
  EXPECT_EQ(normalized("norm_null", nullptr, "Hi", {"Hi"}), (Strings{"Hi"}));
  EXPECT_EQ(normalized("prepend_empty", {{"type", "Prepend"}, {"prepend", "▁"}}, "", {"▁"}), (Strings{}));
}

TEST(Model, MergesInStringAndArrayFormGiveTheSameIds) {
  json model = test::chain_bpe_model({"hello", "help"});
  const Tokenizer strings = test::load_json("merges_strings", tokenizer_json(model));
  json pairs = json::array();
  for (const json& m : model["merges"]) {
    const std::string s = m.get<std::string>();
    pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  model["merges"] = pairs;
  const Tokenizer arrays = test::load_json("merges_arrays", tokenizer_json(model));
  EXPECT_EQ(tokens_of(strings, "hello"), (Strings{"hello"}));
  EXPECT_EQ(strings.encode("helphello"), arrays.encode("helphello"));
  EXPECT_EQ(tokens_of(arrays, "hellp"), (Strings{"hell", "p"}));
}

TEST(Model, MergeRankOrderDecides) {
  // "b c" outranks "a b": abc -> a + bc, although "ab" is also a token.
  const json model = {{"type", "BPE"},
                      {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}}},
                      {"merges", {"b c", "a b", "a bc"}}};
  const Tokenizer t = test::load_json("merge_rank", tokenizer_json(model));
  EXPECT_EQ(tokens_of(t, "abc"), (Strings{"abc"}));
  EXPECT_EQ(tokens_of(t, "abab"), (Strings{"ab", "ab"}));
  EXPECT_EQ(tokens_of(t, "bcab"), (Strings{"bc", "ab"}));
}

TEST(Model, ByteFallbackUnknownAndIgnoreMerges) {
  json vocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"abab", 4}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 10 + b;
  }
  json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}, {"unk_token", "<unk>"}, {"byte_fallback", true}};
  const Tokenizer fallback = test::load_json("byte_fallback", tokenizer_json(model));
  EXPECT_EQ(tokens_of(fallback, "a你"), (Strings{"a", "<0xE4>", "<0xBD>", "<0xA0>"}));

  model["byte_fallback"] = false;
  const Tokenizer unk = test::load_json("unk", tokenizer_json(model));
  EXPECT_EQ(tokens_of(unk, "a你好b"), (Strings{"a", "<unk>", "<unk>", "b"}));
  model["fuse_unk"] = true;
  const Tokenizer fused = test::load_json("fuse_unk", tokenizer_json(model));
  EXPECT_EQ(tokens_of(fused, "a你好b"), (Strings{"a", "<unk>", "b"}));
  model["unk_token"] = nullptr;
  const Tokenizer dropped = test::load_json("no_unk", tokenizer_json(model));
  EXPECT_EQ(tokens_of(dropped, "a你b"), (Strings{"ab"}));

  EXPECT_EQ(tokens_of(unk, "abab"), (Strings{"ab", "ab"}));
  model["ignore_merges"] = true;
  const Tokenizer whole = test::load_json("ignore_merges", tokenizer_json(model));
  EXPECT_EQ(tokens_of(whole, "abab"), (Strings{"abab"}));
}

TEST(Model, SubwordPrefixAndWordSuffix) {
  const json prefixed = {{"type", "BPE"},
                         {"vocab", {{"a", 0}, {"##b", 1}, {"##c", 2}, {"ab", 3}}},
                         {"merges", {"a ##b"}},
                         {"continuing_subword_prefix", "##"}};
  EXPECT_EQ(tokens_of(test::load_json("subword_prefix", tokenizer_json(prefixed)), "abc"), (Strings{"ab", "##c"}));
  const json suffixed = {{"type", "BPE"},
                         {"vocab", {{"a", 0}, {"b</w>", 1}, {"ab</w>", 2}, {"b", 3}}},
                         {"merges", {"a b</w>"}},
                         {"end_of_word_suffix", "</w>"}};
  EXPECT_EQ(tokens_of(test::load_json("word_suffix", tokenizer_json(suffixed)), "ab"), (Strings{"ab</w>"}));
}

TEST(PostProcessors, RobertaAndTokenizerConfigBos) {
  json j = tokenizer_json(test::chain_bpe_model({"hi"}, {"<s>", "</s>"}));
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"</s>", 1}}, {"cls", {"<s>", 0}}};
  const Tokenizer roberta = test::load_json("roberta", j);
  EXPECT_EQ(tokens_of(roberta, "hi"), (Strings{"hi"}));
  EXPECT_EQ(test::token_strings(roberta, roberta.encode("hi", true)), (Strings{"<s>", "hi", "</s>"}));

  j["post_processor"] = nullptr;
  j["added_tokens"] = json::array({test::added_token(0, "<s>", true), test::added_token(1, "</s>", true)});
  const auto dir = test::write_json_file("config_bos", j);
  test::write_json_file("config_bos",
                        {{"add_bos_token", true},
                         {"add_eos_token", false},
                         {"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
                         {"eos_token", "</s>"},
                         {"added_tokens_decoder", {{"7", {{"content", "<extra>"}, {"special", true}}}}}},
                        "tokenizer_config.json");
  const Tokenizer llama = Tokenizer::load(dir);
  EXPECT_EQ(llama.bos_token_id(), 0);
  EXPECT_EQ(llama.eos_token_id(), 1);
  EXPECT_EQ(test::token_strings(llama, llama.encode("hi", true)), (Strings{"<s>", "hi"}));
  EXPECT_EQ(llama.token_to_id("<extra>"), 7);
  EXPECT_TRUE(llama.is_special(7));
  EXPECT_EQ(tokens_of(llama, "hi<extra>"), (Strings{"hi", "<extra>"}));
}

void expect_load_error(const std::string& name, const std::string& content, const std::string& what) {
  const auto dir = test::write_json_file(name, json());
  {
    std::ofstream out(dir / "tokenizer.json", std::ios::binary | std::ios::trunc);
    out << content;
  }
  try {
    Tokenizer::load(dir / "tokenizer.json");
    ADD_FAILURE() << name << ": expected glms::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find((dir / "tokenizer.json").string()), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

TEST(LoadErrors, NameTheFileAndTheProblem) {
  const std::string model = test::chain_bpe_model({"ab"}).dump();
  expect_load_error("err_syntax", "{\"model\": ", "not valid JSON");
  expect_load_error("err_no_model", "{}", "missing field \"model\"");
  expect_load_error("err_wordpiece", R"({"model": {"type": "WordPiece", "vocab": {}}})", "unsupported model type \"WordPiece\"");
  expect_load_error("err_merge", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})", "not in the vocab");
  expect_load_error("err_merge_form", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [1]}})", "model.merges[0]");
  expect_load_error("err_regex", R"({"model": )" + model + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated"}})",
                    "invalid regex");
  expect_load_error("err_decoder", R"({"model": )" + model + R"(, "decoder": {"type": "Nope"}})", "unsupported decoder type");
  expect_load_error("err_added", R"({"model": )" + model + R"(, "added_tokens": [{"content": "x"}]})", "added_tokens[0]");
  EXPECT_THROW(Tokenizer::load("/nonexistent/tokenizer.json"), Error);
}

TEST(Encode, InvalidUtf8IsAnError) {
  const Tokenizer t = test::load_json("utf8_check", tokenizer_json(test::chain_bpe_model({"ab"})));
  for (const std::string& bad : {std::string("a\xFF"), std::string("\xC3"), std::string("\xED\xA0\x80"), std::string("\xC0\xAF")}) {
    EXPECT_THROW(t.encode(bad), Error) << json::binary({bad.begin(), bad.end()}).dump();
  }
  EXPECT_TRUE(t.encode("").empty());
}

}  // namespace
}  // namespace glms::text
