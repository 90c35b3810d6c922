// Internal state of a loaded Tokenizer, shared by tokenizer.cpp (encode/decode) and
// tokenizer_json.cpp (loading). Not part of the public API.
#pragma once

#include <mutex>

#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/decoder.h"
#include "text/normalizer.h"
#include "text/pre_tokenizer.h"

namespace glms::text::detail {

// Ids that add_special_tokens=true puts around the encoded text.
struct PostProcessor {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

struct TokenizerImpl {
  std::filesystem::path source;
  // The most bytes any one token's decoded text has (Tokenizer::min_tokens_for_bytes), found at
  // first use.
  mutable std::once_flag longest_token_once;
  mutable size_t longest_token_bytes = 1;
  std::unique_ptr<BpeModel> model;
  NormalizerPtr normalizer;        // may be null
  PreTokenizerPtr pre_tokenizer;   // may be null
  DecoderPtr decoder;              // may be null: tokens are then joined with spaces
  PostProcessor post_processor;

  std::vector<AddedToken> added_tokens;
  std::unordered_map<int32_t, size_t> added_by_id;              // id -> index in added_tokens
  std::unordered_map<std::string, int32_t> added_by_content;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized=false
  AddedTokenMatcher normalized_matcher;  // added tokens with normalized=true
  std::vector<bool> special;             // indexed by id
  size_t vocab_size = 0;
  int32_t bos_id = -1;
  int32_t eos_id = -1;

  // Sets added_by_id, added_by_content, the matchers, special and vocab_size from
  // added_tokens and the model.
  void index_added_tokens();
  int32_t token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
};

std::shared_ptr<TokenizerImpl> load_tokenizer_json(const std::filesystem::path& file);

}  // namespace glms::text::detail
