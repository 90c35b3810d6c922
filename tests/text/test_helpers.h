// Helpers for tests/text: hand-made tokenizer.json files and access to the reference data
// produced by tests/text/reference (see tests/text/CMakeLists.txt).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace glms::text::test {

using nlohmann::json;

// A BPE model whose merges spell each word of `words` character by character (prefix + next
// character), so a word is one token when a piece equals it. The vocabulary holds every
// character used plus `extra_tokens`.
json chain_bpe_model(const std::vector<std::string>& words, const std::vector<std::string>& extra_tokens = {});

// A model that turns each pre-tokenized piece listed in `pieces` into exactly one token
// (ignore_merges with the whole piece in the vocabulary); other text is spelled character by
// character. Lets tests observe pre-tokenization and normalization through encode().
json pieces_model(const std::vector<std::string>& pieces, bool byte_level_alphabet = false);

// GPT-2 byte-level spelling of raw bytes ("a b" -> "aĠb").
std::string byte_level(std::string_view raw);

// A byte-level BPE model: all 256 byte characters, plus chain merges for `raw_words` spelled
// in byte-level form.
json byte_level_bpe_model(const std::vector<std::string>& raw_words);

// A tokenizer.json skeleton: the given model and components, no added tokens.
json tokenizer_json(json model, json normalizer = nullptr, json pre_tokenizer = nullptr, json decoder = nullptr);

json added_token(int id, std::string content, bool special, bool single_word = false, bool lstrip = false,
                 bool rstrip = false, std::optional<bool> normalized = std::nullopt);

// Writes `j` as DIR/`file_name` under a fresh directory named after `name`; returns DIR.
std::filesystem::path write_json_file(const std::string& name, const json& j, const std::string& file_name = "tokenizer.json");
Tokenizer load_json(const std::string& name, const json& j);

std::vector<std::string> token_strings(const Tokenizer& tokenizer, const std::vector<int32_t>& ids);
// Encodes and returns the token strings (byte-level files show "Ġ" for spaces).
std::vector<std::string> tokens_of(const Tokenizer& tokenizer, std::string_view text);

std::string read_file(const std::filesystem::path& path);
std::vector<std::filesystem::path> corpus_files();
// Stretches of `text` up to and including each "\n" (as the reference script splits lines).
std::vector<std::string> split_lines(const std::string& text);

// Reference data for one real tokenizer: where its tokenizer.json is and the reference ids.
struct ReferenceData {
  std::filesystem::path tokenizer_json;
  json ids;  // {"files": [{"name", "ids", "lines": [{"text", "ids"}]}]}
};
// nullopt when the reference data was not generated (no node/npm at configure time); fails
// the current test when it should have been generated but is missing.
std::optional<ReferenceData> load_reference(const std::string& name);

}  // namespace glms::text::test
