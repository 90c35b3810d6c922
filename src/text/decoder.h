// Decoders as in Hugging Face tokenizer.json "decoder": they turn token strings back into
// text. A decoder rewrites the chain of strings in place; the caller concatenates the result.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/regex.h"

namespace glms::text {

// What a decoder chain knows about where its tokens sit in the whole sequence. The
// incremental detokenizer decodes windows of a sequence, so "first token" is a property of the
// window, not of chain position 0 alone.
struct DecodeContext {
  bool at_sequence_start = true;  // chain position 0 is the first token of the sequence
  bool fused = false;             // the chain was joined into one string (ByteLevel, Fuse)
  bool open_byte_run = false;     // the chain ended inside a run of <0xXX> byte tokens
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const = 0;
};

using DecoderPtr = std::unique_ptr<const Decoder>;

// GPT-2 byte-level: maps each character back to its byte (a token with a character outside
// the alphabet contributes its own UTF-8 bytes), then converts the bytes to UTF-8 lossily.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const override;
};

// Runs of <0xXX> tokens become the UTF-8 text they spell, or one U+FFFD per byte when invalid.
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const override;
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const override;
};

// Removes up to `start` leading and `stop` trailing `content` characters from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const override;

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const override;

 private:
  Regex pattern_;
  std::string content_;
};

// The replacement character becomes a space; in the first token of the sequence it is dropped
// unless the prepend scheme is "never".
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_in_first) : replacement_(std::move(replacement)), drop_in_first_(drop_in_first) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const override;

 private:
  std::string replacement_;
  bool drop_in_first_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<DecoderPtr> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeContext& context) const override;

 private:
  std::vector<DecoderPtr> steps_;
};

}  // namespace glms::text
