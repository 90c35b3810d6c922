#include "text/detokenizer.h"

#include "text/utf8.h"

namespace glms::text {

IncrementalDetokenizer::IncrementalDetokenizer(Tokenizer tokenizer, Options options)
    : tokenizer_(std::move(tokenizer)), options_(options) {}

// The window's text is decoded anew on every feed. Everything but a trailing U+FFFD (which may
// be an unfinished character) is final, unless the decoder reports an unfinished run of byte
// tokens, whose text can still change as a whole. Once the window's text is entirely emitted,
// the window restarts empty: the decoders keep no state across such a boundary, so decoding
// window by window gives the same text as decoding everything at once.
std::string IncrementalDetokenizer::feed(int32_t id) {
  if (options_.skip_special_tokens && tokenizer_.is_special(id)) return {};
  window_.push_back(id);
  bool open_byte_run = false;
  const std::string text = tokenizer_.decode_window(window_, window_at_start_, false, open_byte_run);
  if (open_byte_run) return {};
  size_t settled = text.size();
  if (text.ends_with(utf8::kReplacementUtf8)) settled -= utf8::kReplacementUtf8.size();
  std::string piece;
  if (settled > emitted_) {
    piece = text.substr(emitted_, settled - emitted_);
    emitted_ = settled;
  }
  if (settled == text.size()) {
    window_.clear();
    window_at_start_ = false;
    emitted_ = 0;
  }
  return piece;
}

std::string IncrementalDetokenizer::flush() {
  bool open_byte_run = false;
  const std::string text = tokenizer_.decode_window(window_, window_at_start_, false, open_byte_run);
  std::string piece = emitted_ < text.size() ? text.substr(emitted_) : std::string();
  if (!window_.empty()) window_at_start_ = false;
  window_.clear();
  emitted_ = 0;
  return piece;
}

}  // namespace glms::text
