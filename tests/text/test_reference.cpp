// Real tokenizers (Qwen3, DeepSeek-V3 and a GLM-style variant of Qwen3) against reference ids
// from @lenml/tokenizers, plus round trips and streaming detokenization on the same files.
// These tests need the ctest fixtures defined in tests/text/CMakeLists.txt.
#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include "test_helpers.h"
#include "text/detokenizer.h"
#include "text/normalizer.h"
#include "text/utf8.h"

namespace glms::text {
namespace {

using test::json;

std::string describe(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s.push_back(' ');
    s.append(std::to_string(ids[i]));
  }
  return s;
}

// Compares our ids with the reference for every line and every whole corpus file.
void expect_reference_ids(const std::string& name) {
  const auto reference = test::load_reference(name);
  if (!reference) GTEST_SKIP() << "reference ids were not generated (node/npm not found at configure time)";
  const Tokenizer tokenizer = Tokenizer::load(reference->tokenizer_json);
  size_t lines = 0, lines_ok = 0, files = 0, files_ok = 0;
  for (const json& file : reference->ids.at("files")) {
    const std::string file_name = file.at("name").get<std::string>();
    const std::string text = test::read_file(std::filesystem::path(GLMS_SOURCE_DIR) / "tests/text/corpus" / file_name);
    const std::vector<std::string> our_lines = test::split_lines(text);
    const json& ref_lines = file.at("lines");
    ASSERT_EQ(our_lines.size(), ref_lines.size()) << file_name << ": line split differs from the reference script";
    for (size_t i = 0; i < our_lines.size(); ++i) {
      ASSERT_EQ(our_lines[i], ref_lines[i].at("text").get<std::string>()) << file_name << " line " << i + 1;
      const auto expected = ref_lines[i].at("ids").get<std::vector<int32_t>>();
      const auto actual = tokenizer.encode(our_lines[i]);
      ++lines;
      if (actual == expected) {
        ++lines_ok;
      } else {
        ADD_FAILURE() << name << " " << file_name << " line " << i + 1 << ": " << json(our_lines[i]).dump()
                      << "\n  expected: " << describe(expected) << "\n  actual:   " << describe(actual);
      }
    }
    ++files;
    const auto expected = file.at("ids").get<std::vector<int32_t>>();
    if (tokenizer.encode(text) == expected) {
      ++files_ok;
    } else {
      ADD_FAILURE() << name << " " << file_name << ": whole-file ids differ from the reference";
    }
  }
  std::cout << "[ reference ] " << name << ": " << lines_ok << "/" << lines << " lines and " << files_ok << "/"
            << files << " files match\n";
  EXPECT_GT(files, 10u);
}

TEST(ReferenceIds, Qwen3) { expect_reference_ids("qwen3"); }
TEST(ReferenceIds, DeepSeekV3) { expect_reference_ids("deepseek_v3"); }
TEST(ReferenceIds, GlmStyle) { expect_reference_ids("glm_style"); }

// decode(encode(x)) == x for every line and file; Qwen3 normalizes to NFC, so for the files
// with a normalizer the expectation is NFC(x).
void expect_round_trip(const std::string& name, bool nfc) {
  const auto reference = test::load_reference(name);
  if (!reference) GTEST_SKIP() << "real tokenizer files are not available";
  const Tokenizer tokenizer = Tokenizer::load(reference->tokenizer_json);
  const UnicodeNormalizer normalize_nfc(UnicodeForm::NFC);
  for (const auto& path : test::corpus_files()) {
    const std::string text = test::read_file(path);
    std::vector<std::string> samples = test::split_lines(text);
    samples.push_back(text);
    for (const std::string& sample : samples) {
      std::string expected = sample;
      if (nfc) normalize_nfc.normalize(expected);
      EXPECT_EQ(tokenizer.decode(tokenizer.encode(sample)), expected) << name << " " << path.filename();
    }
  }
}

TEST(RealTokenizers, RoundTripQwen3) { expect_round_trip("qwen3", true); }
TEST(RealTokenizers, RoundTripDeepSeekV3) { expect_round_trip("deepseek_v3", false); }
TEST(RealTokenizers, RoundTripGlmStyle) { expect_round_trip("glm_style", true); }

// Feeds `ids` one at a time; every piece must be valid UTF-8 and all pieces plus flush() must
// equal decode(ids).
void expect_streaming_matches(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detokenizer(tokenizer, {.skip_special_tokens = skip_special});
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = detokenizer.feed(id);
    ASSERT_TRUE(utf8::is_valid(piece)) << "broken UTF-8 piece after id " << id;
    streamed += piece;
  }
  const std::string rest = detokenizer.flush();
  ASSERT_TRUE(utf8::is_valid(rest));
  streamed += rest;
  ASSERT_EQ(streamed, tokenizer.decode(ids, skip_special)) << "ids: " << describe(ids);
}

void expect_streaming(const std::string& name) {
  const auto reference = test::load_reference(name);
  if (!reference) GTEST_SKIP() << "real tokenizer files are not available";
  const Tokenizer tokenizer = Tokenizer::load(reference->tokenizer_json);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> any_id(0, static_cast<int32_t>(tokenizer.vocab_size()) - 1);
  std::uniform_int_distribution<int> length(1, 120);
  for (int stream = 0; stream < 300; ++stream) {
    std::vector<int32_t> ids(static_cast<size_t>(length(rng)));
    for (int32_t& id : ids) id = any_id(rng);
    expect_streaming_matches(tokenizer, ids, stream % 2 == 0);
  }
  // Real text: CJK, emoji with ZWJ sequences and skin tones split over byte-level tokens.
  for (const auto& path : test::corpus_files()) {
    const std::vector<int32_t> ids = tokenizer.encode(test::read_file(path));
    expect_streaming_matches(tokenizer, ids, false);
    expect_streaming_matches(tokenizer, ids, true);
  }
}

TEST(RealTokenizers, StreamingDetokenizerQwen3) { expect_streaming("qwen3"); }
TEST(RealTokenizers, StreamingDetokenizerDeepSeekV3) { expect_streaming("deepseek_v3"); }

TEST(RealTokenizers, SpecialTokensAndPostProcessing) {
  const auto qwen = test::load_reference("qwen3");
  const auto deepseek = test::load_reference("deepseek_v3");
  if (!qwen || !deepseek) GTEST_SKIP() << "real tokenizer files are not available";
  const Tokenizer q = Tokenizer::load(qwen->tokenizer_json.parent_path());  // a directory works too
  EXPECT_EQ(q.vocab_size(), 151669u);
  EXPECT_EQ(q.token_to_id("<|endoftext|>"), 151643);
  EXPECT_TRUE(q.is_special(151643));
  EXPECT_FALSE(q.is_special(q.token_to_id("<think>")));
  EXPECT_EQ(q.eos_token_id(), q.token_to_id("<|im_end|>"));
  EXPECT_EQ(q.encode("hi", true), q.encode("hi", false));  // ByteLevel post-processor adds nothing
  EXPECT_EQ(q.decode(q.encode("a<|im_end|>b"), true), "ab");

  const Tokenizer d = Tokenizer::load(deepseek->tokenizer_json);
  EXPECT_EQ(d.bos_token_id(), 0);
  const std::vector<int32_t> with = d.encode("hi", true);
  ASSERT_FALSE(with.empty());
  EXPECT_EQ(with.front(), 0);  // add_bos_token in tokenizer_config.json
  EXPECT_EQ(std::vector<int32_t>(with.begin() + 1, with.end()), d.encode("hi"));
}

// Reports encoding speed; not asserted (speed is measured, never asserted in unit tests).
}  // namespace
}  // namespace glms::text
