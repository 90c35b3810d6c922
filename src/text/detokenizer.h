// Streaming detokenization: feed token ids one at a time and get back only the new text.
//
// Contract: every returned piece is valid UTF-8 (bytes of a character split across tokens are
// held back until the character is complete), and the concatenation of all pieces returned by
// feed() plus flush() equals tokenizer.decode(all fed ids, skip_special_tokens).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace glms::text {

class IncrementalDetokenizer {
 public:
  struct Options {
    bool skip_special_tokens = false;
  };

  explicit IncrementalDetokenizer(Tokenizer tokenizer) : IncrementalDetokenizer(std::move(tokenizer), Options{}) {}
  IncrementalDetokenizer(Tokenizer tokenizer, Options options);

  // Returns the text that became final with this token (often empty for a partial character).
  std::string feed(int32_t id);
  // Returns whatever is still held back (an unfinished character becomes U+FFFD) and starts a
  // continuation: later feeds continue the same sequence.
  std::string flush();

 private:
  Tokenizer tokenizer_;
  Options options_;
  std::vector<int32_t> window_;  // ids whose text is not entirely emitted yet
  bool window_at_start_ = true;  // window_[0] is the first token of the sequence
  size_t emitted_ = 0;           // bytes of the window's text already returned
};

}  // namespace glms::text
