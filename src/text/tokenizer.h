// Hugging Face tokenizer.json loader, encoder and decoder (BPE models: GLM, Qwen, DeepSeek,
// Llama 3 and GPT-2 style files). A Tokenizer is immutable after load, cheap to copy (copies
// share state) and safe to use from many threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace glms::text {

namespace detail {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  // `file_or_dir` is a tokenizer.json file or a directory holding one. A tokenizer_config.json
  // next to it, when present, adds or overrides added tokens (added_tokens_decoder) and names
  // the bos/eos tokens. Throws glms::Error naming the file and the problem when the file is
  // missing, malformed or uses a component that is not supported.
  static Tokenizer load(const std::filesystem::path& file_or_dir);

  // Throws glms::Error when `text` is not valid UTF-8. Added tokens are matched in the raw
  // text before normalization; with `add_special_tokens` the post-processor's tokens are added.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;

  // Ids without a token are skipped; the result is always valid UTF-8 (ill-formed byte
  // sequences become U+FFFD).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // -1 when the token is neither an added token nor in the model's vocabulary.
  int32_t token_to_id(std::string_view token) const;
  // Empty when no token has this id.
  std::string id_to_token(int32_t id) const;
  // One past the largest id of any token (model vocabulary and added tokens).
  size_t vocab_size() const;
  bool is_special(int32_t id) const;
  // A lower bound on encode(text).size() from text.size() alone: no token stands for more bytes
  // than the longest one's decoded text (a normalizer may shrink the text: then 4 times that).
  // Lets a caller refuse a prompt far past a context limit without tokenizing it.
  size_t min_tokens_for_bytes(size_t bytes) const;

  // Ids of the bos/eos tokens named by tokenizer_config.json, or -1.
  int32_t bos_token_id() const;
  int32_t eos_token_id() const;

  const std::filesystem::path& source() const;

 private:
  friend class IncrementalDetokenizer;
  explicit Tokenizer(std::shared_ptr<const detail::TokenizerImpl> impl) : impl_(std::move(impl)) {}

  // Decodes `ids` as the continuation of a longer sequence; `at_sequence_start` says whether
  // ids[0] is the first token. Sets `open_byte_run` when the text of the last ids may still
  // change with the tokens that follow (an unfinished run of byte-fallback tokens).
  std::string decode_window(std::span<const int32_t> ids, bool at_sequence_start, bool skip_special_tokens,
                            bool& open_byte_run) const;

  std::shared_ptr<const detail::TokenizerImpl> impl_;
};

}  // namespace glms::text
