#include "test_helpers.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "text/pre_tokenizer.h"
#include "text/utf8.h"

namespace glms::text::test {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> chars;
  for (size_t pos = 0; pos < s.size();) {
    const size_t begin = pos;
    utf8::decode_at(s, pos);
    chars.push_back(s.substr(begin, pos - begin));
  }
  return chars;
}

void add_chain(const std::string& word, json& vocab, json& merges, std::set<std::pair<std::string, std::string>>& seen) {
  const std::vector<std::string> chars = utf8_chars(word);
  std::string prefix;
  for (size_t i = 0; i < chars.size(); ++i) {
    if (!vocab.contains(chars[i])) vocab[chars[i]] = vocab.size();
    if (i > 0 && seen.insert({prefix, chars[i]}).second) {
      const std::string merged = prefix + chars[i];
      if (!vocab.contains(merged)) vocab[merged] = vocab.size();
      merges.push_back(prefix + " " + chars[i]);
    }
    prefix += chars[i];
  }
}

}  // namespace

json chain_bpe_model(const std::vector<std::string>& words, const std::vector<std::string>& extra_tokens) {
  json vocab = json::object();
  json merges = json::array();
  std::set<std::pair<std::string, std::string>> seen;
  for (const std::string& t : extra_tokens) {
    if (!vocab.contains(t)) vocab[t] = vocab.size();
  }
  for (const std::string& w : words) add_chain(w, vocab, merges, seen);
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"unk_token", nullptr}};
}

json pieces_model(const std::vector<std::string>& pieces, bool byte_level_alphabet) {
  json vocab = json::object();
  if (byte_level_alphabet) {
    for (int b = 0; b < 256; ++b) vocab[std::string(ByteLevelAlphabet::get().encode(static_cast<uint8_t>(b)))] = b;
  }
  for (const std::string& piece : pieces) {
    for (const std::string& ch : utf8_chars(piece)) {
      if (!vocab.contains(ch)) vocab[ch] = vocab.size();
    }
    if (!vocab.contains(piece)) vocab[piece] = vocab.size();
  }
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"ignore_merges", true}};
}

std::string byte_level(std::string_view raw) {
  std::string out;
  for (char c : raw) out.append(ByteLevelAlphabet::get().encode(static_cast<uint8_t>(c)));
  return out;
}

json byte_level_bpe_model(const std::vector<std::string>& raw_words) {
  std::vector<std::string> alphabet;
  for (int b = 0; b < 256; ++b) alphabet.emplace_back(ByteLevelAlphabet::get().encode(static_cast<uint8_t>(b)));
  std::vector<std::string> words;
  for (const std::string& w : raw_words) words.push_back(byte_level(w));
  return chain_bpe_model(words, alphabet);
}

json tokenizer_json(json model, json normalizer, json pre_tokenizer, json decoder) {
  return {{"version", "1.0"},          {"truncation", nullptr},      {"padding", nullptr},
          {"added_tokens", json::array()}, {"normalizer", normalizer}, {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr}, {"decoder", decoder},         {"model", model}};
}

json added_token(int id, std::string content, bool special, bool single_word, bool lstrip, bool rstrip,
                 std::optional<bool> normalized) {
  return {{"id", id},          {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized.value_or(!special)},
          {"special", special}};
}

fs::path write_json_file(const std::string& name, const json& j, const std::string& file_name) {
  const fs::path dir = fs::path(GLMS_BINARY_DIR) / "tests" / "text" / "scratch" / name;
  fs::create_directories(dir);
  std::ofstream(dir / file_name, std::ios::binary) << j.dump(1);
  return dir;
}

Tokenizer load_json(const std::string& name, const json& j) {
  const fs::path dir = write_json_file(name, j);
  fs::remove(dir / "tokenizer_config.json");
  return Tokenizer::load(dir / "tokenizer.json");
}

std::vector<std::string> token_strings(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(tokenizer.id_to_token(id));
  return out;
}

std::vector<std::string> tokens_of(const Tokenizer& tokenizer, std::string_view text) {
  return token_strings(tokenizer, tokenizer.encode(text));
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<fs::path> corpus_files() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(fs::path(GLMS_SOURCE_DIR) / "tests" / "text" / "corpus")) {
    if (entry.path().extension() == ".txt") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t start = 0; start < text.size();) {
    const size_t nl = text.find('\n', start);
    const size_t end = nl == std::string::npos ? text.size() : nl + 1;
    lines.push_back(text.substr(start, end - start));
    start = end;
  }
  return lines;
}

std::optional<ReferenceData> load_reference(const std::string& name) {
#ifdef GLMS_TEXT_REFERENCE_DIR
  const fs::path file = fs::path(GLMS_TEXT_REFERENCE_DIR) / "ids" / (name + ".json");
  if (!fs::exists(file)) {
    ADD_FAILURE() << file << " is missing: run the test through ctest so that the fixtures "
                  << "text_reference_npm_ci and text_reference_ids_" << name << " generate it";
    return std::nullopt;
  }
  ReferenceData data;
  data.ids = json::parse(read_file(file));
  data.tokenizer_json = data.ids.at("tokenizer_json").get<std::string>();
  return data;
#else
  (void)name;
  return std::nullopt;
#endif
}

}  // namespace glms::text::test
