// Byte-pair-encoding model as in Hugging Face tokenizer.json "model": {"type": "BPE"}.
// Immutable after construction; encode_word is thread-safe (the word cache is sharded and
// locked).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace glms::text {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // Merges are applied in list order (index = rank). Throws glms::Error when a merge or the
  // unk token refers to a token that is not in the vocabulary.
  BpeModel(std::vector<std::pair<std::string, int32_t>> vocab,
           std::vector<std::pair<std::string, std::string>> merges, BpeOptions options);
  ~BpeModel();
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-tokenized word to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  // -1 when the token is not in the vocabulary.
  int32_t token_to_id(std::string_view token) const;
  // nullptr when no token has this id.
  const std::string* id_to_token(int32_t id) const;
  // One past the largest id in the vocabulary.
  size_t id_limit() const { return id_to_token_.size(); }

 private:
  struct Impl;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  int32_t char_id(std::string_view ch, bool first, bool last) const;

  std::unique_ptr<Impl> impl_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> id_used_;
  BpeOptions options_;
  int32_t unk_id_ = -1;
};

}  // namespace glms::text
