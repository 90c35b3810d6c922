// Pre-tokenizers as in Hugging Face tokenizer.json "pre_tokenizer". They cut a normalized
// section of text into pieces ("words") that the model encodes independently.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/regex.h"

namespace glms::text {

// Pieces of one section: non-empty byte ranges into `text`, in order.
struct PreTokens {
  std::string text;
  std::vector<ByteRange> pieces;

  std::string_view piece(size_t i) const {
    return std::string_view(text).substr(pieces[i].begin, pieces[i].end - pieces[i].begin);
  }
  void reset(std::string_view section) {
    text.assign(section);
    pieces.clear();
    if (!text.empty()) pieces.push_back({0, text.size()});
  }
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // `at_text_start` says the section begins at offset 0 of the encoded text (what HF's
  // "first" prepend scheme looks at).
  virtual void pre_tokenize(PreTokens& tokens, bool at_text_start) const = 0;
};

using PreTokenizerPtr = std::unique_ptr<const PreTokenizer>;

// What happens to the matches of a Split pattern (HF SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(PreTokens& tokens, bool at_text_start) const override;

 private:
  Regex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2 byte-to-unicode mapping: each byte becomes one printable code point.
class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get();
  // UTF-8 encoding of the code point that stands for byte b (1 or 2 bytes).
  std::string_view encode(uint8_t b) const { return {encoded_[b].data(), encoded_length_[b]}; }
  // The byte a code point stands for, or -1 when it is not part of the alphabet.
  int decode(char32_t cp) const { return cp < decoded_.size() ? decoded_[cp] : -1; }

 private:
  ByteLevelAlphabet();
  std::array<std::array<char, 2>, 256> encoded_{};
  std::array<uint8_t, 256> encoded_length_{};
  std::array<int16_t, 324> decoded_{};
};

inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex);
  void pre_tokenize(PreTokens& tokens, bool at_text_start) const override;

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitPreTokenizer> regex_split_;
};

enum class PrependScheme { Always, First, Never };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split);
  void pre_tokenize(PreTokens& tokens, bool at_text_start) const override;

 private:
  std::string replacement_;
  PrependScheme scheme_;
  std::unique_ptr<SplitPreTokenizer> split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<PreTokenizerPtr> steps) : steps_(std::move(steps)) {}
  void pre_tokenize(PreTokens& tokens, bool at_text_start) const override;

 private:
  std::vector<PreTokenizerPtr> steps_;
};

}  // namespace glms::text
